// Usage snippets of the façade (facade/device.cuh, facade/copy.cuh, facade/pending_copy.cuh) and
// of the loader in CUDA (loader/loader.cuh). Built by nvcc so they cannot drift from the
// headers; run on the emulator where a CUDA GPU is, skipped (exit 77) elsewhere. Each function is
// the snippet a header's comment points to by name.
#include "../example_support.hpp"

#include <cunvme/facade/copy.cuh>
#include <cunvme/facade/device.cuh>
#include <cunvme/facade/pending_copy.cuh>
#include <cunvme/host/backend/uri_options.cuh>
#include <cunvme/loader/loader.cuh>

#include <thrust/device_vector.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

__global__ void double_all(float* v, std::size_t n) {
  for (std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) v[i] *= 2;
}

/// `copy_n` and `copy_n_sync` (facade/copy.cuh): into GPU memory on a stream, and back out.
int copies() {
  cunvme::device dev("emu:pattern");  // or "kmod:0000:01:00.0" …
  example::stream stream;
  thrust::device_vector<float> v(1 << 20);
  cunvme::pending_copy c = cunvme::copy_n(dev, /*lba*/ 0, /*blocks*/ 8192, v, stream);  // enqueued, returns at once
  // `pending_copy` (facade/pending_copy.cuh): work enqueued after it on the stream sees its data.
  double_all<<<64, 256, 0, stream>>>(thrust::raw_pointer_cast(v.data()), v.size());
  if (cunvme::io_result r = c.wait(); !r) {
    std::puts(cunvme::to_string(r).c_str());
    return 1;
  }
  const cunvme::io_result back = cunvme::copy_n_sync(v, 8192, dev, /*lba*/ 65536);  // and back out, blocking
  std::uint64_t word = 0;
  float first = 0;
  example::check(cudaMemcpy(&first, thrust::raw_pointer_cast(v.data()), 4, cudaMemcpyDeviceToHost), "copy back");
  const std::uint64_t w = cunvme::host::pattern_word(0);
  float expected = 0;
  std::memcpy(&expected, &w, 4);
  std::memcpy(&word, &w, 8);
  std::printf("copies: %s, first float %g (expected %g)\n", back ? "ok" : cunvme::to_string(back).c_str(), first, expected * 2);
  return back && first == expected * 2 ? 0 : 1;
}

/// `device::register_buffer` (facade/device.cuh): map a buffer once, up front.
int registered() {
  cunvme::device dev("emu:pattern");
  void* gpu = nullptr;
  const std::size_t bytes = 1 << 20;
  example::check(cudaMalloc(&gpu, bytes), "cudaMalloc");
  dev.register_buffer(gpu, bytes);  // optional: map once, up front (cuFileBufRegister)
  const cunvme::io_result r = cunvme::copy_n(dev, 0, bytes / dev.block_bytes(), static_cast<std::byte*>(gpu)).wait();
  dev.deregister_buffer(gpu);  // before cudaFree(gpu)
  example::check(cudaFree(gpu), "cudaFree");
  return r ? 0 : 1;
}

/// `safetensors_file`, `loaded_tensors` and `layer_streamer` (loader/loader.cuh).
int load(const std::string& path, std::uint64_t file_bytes) {
  cunvme::device dev("emu:file=" + path + ",readonly");
  auto where = cunvme::loader::file_placement::contiguous(dev.block_bytes(), 0, file_bytes, dev.ns().lba_count);
  cunvme::loader::safetensors_file file(dev, where, path);
  example::stream stream;
  cunvme::loader::loaded_tensors all = file.load({}, stream);  // enqueued; all.wait() throws for a failed read
  all.wait();
  cunvme::loader::layer_streamer layers(file);  // or layer by layer, the next one read meanwhile:
  int seen = 0;
  while (auto layer = layers.next(stream)) {
    const auto* w = layer->find(std::string(layer->key) + ".w");
    if (w != nullptr) double_all<<<1, 32, 0, stream>>>(w->as<float>(), 4);
    ++seen;
  }
  example::check(cudaStreamSynchronize(stream), "layers");
  std::printf("load: %zu tensors, %d layers\n", all.tensors().size(), seen);
  return all.tensors().size() == 2 && seen == 2 ? 0 : 1;
}

}  // namespace

int main() {
  return example::run_main("snippets_facade", [] {
    const std::string json =
        R"({"layers.0.w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"layers.1.w":{"dtype":"F32","shape":[4],"data_offsets":[16,32]}})";
    std::vector<char> file(8 + json.size() + 32, 0);
    const std::uint64_t n = json.size();
    std::memcpy(file.data(), &n, 8);
    std::memcpy(file.data() + 8, json.data(), json.size());
    const std::string path = "/tmp/cunvme-snippet-facade.safetensors";
    std::FILE* f = std::fopen(path.c_str(), "wb");
    std::fwrite(file.data(), 1, file.size(), f);
    std::fclose(f);
    const int rc = copies() | registered() | load(path, file.size());
    std::remove(path.c_str());
    return rc;
  });
}
