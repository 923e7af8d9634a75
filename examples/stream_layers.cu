// stream_layers (C++) — a safetensors model read layer by layer into GPU memory with
// cunvme::loader::layer_streamer, a kernel per tensor running on the compute stream while the
// next layer's reads run on the loader's stream; prints GB/s and checks every tensor the kernels
// saw against the file.
//
//   python3 examples/make_safetensors.py /tmp/model.safetensors --layers 16 --dim 2048
//   build/examples/stream_layers /tmp/model.safetensors                       emu:file=PATH,readonly,lba=4096
//   build/examples/stream_layers /tmp/model.safetensors kmod:0000:01:00.0 2048   the file raw at LBA 2048
//
// Exits 0 when every tensor matched, 1 otherwise, 77 (Meson's "skipped") without a CUDA GPU.
#include "example_support.hpp"

#include <cunvme/loader/loader.cuh>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

using example::term;

/// The checksum of a tensor's bytes, whole 64-bit words padded with zeros; `passes` times, so
/// the compute of a layer lasts long enough for the next layer's reads to run under it.
__global__ void checksum(const unsigned char* data, std::uint64_t bytes, int passes, unsigned long long* sum) {
  const std::uint64_t words = (bytes + 7) / 8;
  unsigned long long local = 0;
  for (int p = 0; p < passes; ++p) {
    for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < words; i += std::uint64_t{gridDim.x} * blockDim.x) {
      std::uint64_t w = 0;
      for (std::uint64_t b = 0; b < 8 && i * 8 + b < bytes; ++b) w |= std::uint64_t{data[i * 8 + b]} << (8 * b);  // any alignment
      local += term(w, i);
    }
  }
  atomicAdd(sum, local);
}

unsigned long long host_checksum(const std::vector<char>& file, std::uint64_t offset, std::uint64_t bytes, int passes) {
  unsigned long long s = 0;
  for (std::uint64_t i = 0; i < (bytes + 7) / 8; ++i) {
    std::uint64_t w = 0;
    for (std::uint64_t b = 0; b < 8 && i * 8 + b < bytes; ++b) w |= std::uint64_t{static_cast<unsigned char>(file[offset + i * 8 + b])} << (8 * b);
    s += term(w, i);
  }
  return s * static_cast<unsigned long long>(passes);
}

}  // namespace

int main(int argc, char** argv) {
  return example::run_main("stream_layers", [&] {
    if (argc < 2) {
      std::fprintf(stderr, "usage: stream_layers MODEL.safetensors [URI [FIRST_LBA]]\n");
      return 2;
    }
    const std::string path = argv[1];
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open '" + path + "'");
    const std::vector<char> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string uri = argc > 2 ? argv[2] : "emu:file=" + path + ",readonly,lba=4096";
    const std::uint64_t first_lba = argc > 3 ? std::stoull(argv[3]) : 0;

    cunvme::device dev(uri);
    namespace ld = cunvme::loader;
    ld::safetensors_file model(dev, ld::file_placement::contiguous(dev.block_bytes(), first_lba, file.size(), dev.ns().lba_count), path);
    ld::layer_streamer layers(model);  // three buffers the size of the largest layer, registered now
    example::stream compute;
    const int passes = 8;
    unsigned long long* sums = nullptr;
    std::size_t tensors = model.header().tensors.size();
    example::check(cudaMalloc(&sums, tensors * sizeof(unsigned long long)), "cudaMalloc");
    example::check(cudaMemset(sums, 0, tensors * sizeof(unsigned long long)), "cudaMemset");
    std::vector<unsigned long long> want;

    example::timer t;
    std::size_t slot = 0;
    while (auto layer = layers.next(compute)) {
      for (const ld::gpu_tensor& g : layer->tensors) {
        checksum<<<132, 256, 0, compute>>>(g.as<unsigned char>(), g.info->bytes(), passes, sums + slot++);
        want.push_back(host_checksum(file, model.header().file_offset(*g.info), g.info->bytes(), passes));
      }
    }
    example::check(cudaStreamSynchronize(compute), "the compute stream");
    const double seconds = t.seconds();
    std::vector<unsigned long long> got(want.size());
    example::check(cudaMemcpy(got.data(), sums, got.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost), "cudaMemcpy");
    (void)cudaFree(sums);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < got.size(); ++i) bad += got[i] != want[i];
    std::printf("%s on %s: %zu layers, %zu tensors, %.1f MB read in %.1f ms while computing: %.2f GB/s; %zu of %zu tensors match the file\n",
                path.c_str(), dev.controller().name().c_str(), layers.size(), got.size(), layers.bytes_read() / 1e6, seconds * 1e3,
                layers.bytes_read() / seconds / 1e9, got.size() - bad, got.size());
    return bad == 0 ? 0 : 1;
  });
}
