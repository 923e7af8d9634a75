// file_to_gpu — read a file into GPU memory through NVMe, and check it: a checksum computed on
// the GPU from what arrived against one computed on the host from the file.
//
//   build/examples/file_to_gpu model.bin                          through the emulator, backed by the file
//   build/examples/file_to_gpu model.bin kmod:0000:01:00.0         through a real controller: the file's
//   build/examples/file_to_gpu model.bin kmod:0000:01:00.0 2048    bytes at LBA 0 (or 2048) of namespace 1
//
// With the emulator ("emu:file=PATH") the file *is* the namespace: 512-byte blocks, enough to
// hold the whole file, the last one's bytes past the file's end reading as zeros. The emulator
// maps the file read-write (nothing is written).
//
// With a real controller the file must already be on the raw namespace (for instance
// `dd if=model.bin of=/dev/nvme0n1 oflag=direct` before the device is handed to cunvme).
// Either way the last block is read whole and its bytes past the file's end are ignored.
//
// Exits 0 when the checksums agree, 1 otherwise, 77 (Meson's "skipped") without a CUDA GPU.
#include "example_support.hpp"

#include <cunvme/facade/copy.cuh>

#include <thrust/device_vector.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

using example::term;  // the sum (mod 2^64) of one term per little-endian word; a last partial word is padded with zeros

/// The checksum of the first `bytes` bytes of `data`, added to `*sum`.
__global__ void checksum(const std::uint64_t* data, std::uint64_t bytes, unsigned long long* sum) {
  const std::uint64_t words = (bytes + 7) / 8;
  unsigned long long local = 0;
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < words; i += std::uint64_t{gridDim.x} * blockDim.x) {
    std::uint64_t w = data[i];
    if (const std::uint64_t kept = bytes - i * 8; kept < 8) w &= (std::uint64_t{1} << (kept * 8)) - 1;  // bytes past the end: zeros
    local += term(w, i);
  }
  // A warp adds its lanes' sums, then one atomic per warp.
  for (int lanes = 16; lanes > 0; lanes /= 2) local += __shfl_down_sync(0xffffffffu, local, lanes);
  if (threadIdx.x % 32 == 0) atomicAdd(sum, local);
}

/// The same checksum on the host, reading the file from its start.
std::uint64_t host_checksum(std::FILE* f, std::uint64_t bytes) {
  std::vector<unsigned char> chunk(1 << 20);  // a multiple of 8: words never straddle chunks
  std::uint64_t sum = 0, index = 0;
  for (std::uint64_t at = 0; at < bytes;) {
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), bytes - at));
    if (std::fread(chunk.data(), 1, want, f) != want) throw std::runtime_error("reading the file on the host failed");
    for (std::size_t o = 0; o < want; o += 8) {
      std::uint64_t w = 0;
      std::memcpy(&w, chunk.data() + o, std::min<std::size_t>(8, want - o));
      sum += term(w, index++);
    }
    at += want;
  }
  return sum;
}

int run(const std::string& path, const std::string& uri_arg, std::uint64_t start_lba) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) return std::fprintf(stderr, "file_to_gpu: cannot open '%s': %s\n", path.c_str(), std::strerror(errno)), 1;
  std::fseek(file.get(), 0, SEEK_END);
  const long end = std::ftell(file.get());
  std::rewind(file.get());
  if (end <= 0) return std::fprintf(stderr, "file_to_gpu: '%s' is empty or not a regular file\n", path.c_str()), 1;
  const auto size = static_cast<std::uint64_t>(end);

  const bool emulated = uri_arg.empty();
  // The emulator's URI separates options with ','.
  if (emulated && path.find(',') != std::string::npos) {
    return std::fprintf(stderr, "file_to_gpu: the emulator needs a path without ',' ('%s')\n", path.c_str()), 1;
  }
  const std::string uri = emulated ? "emu:file=" + path : uri_arg;
  cunvme::device dev(uri);
  const std::uint64_t block = dev.block_bytes();
  const std::uint64_t padded = (size + block - 1) / block * block;  // whole blocks around the file
  // The last block is partly beyond the file on the emulator and on a real namespace alike.
  const std::uint64_t blocks = padded / block;
  if (start_lba > dev.ns().lba_count || blocks > dev.ns().lba_count - start_lba) {
    return std::fprintf(stderr, "file_to_gpu: %llu blocks from LBA %llu do not fit in %s (%llu blocks)\n", static_cast<unsigned long long>(blocks),
                        static_cast<unsigned long long>(start_lba), uri.c_str(), static_cast<unsigned long long>(dev.ns().lba_count)), 1;
  }

  // GPU memory for the file, rounded up to whole blocks (DMA moves whole blocks).
  thrust::device_vector<std::uint64_t> gpu(padded / 8);
  example::stream stream;
  const example::timer timer;
  // The whole blocks, straight from the device into GPU memory; copy_n_sync waits for its kernel.
  if (const cunvme::io_result r = cunvme::copy_n_sync(dev, start_lba, blocks, gpu, stream); !r) {
    return std::fprintf(stderr, "file_to_gpu: reading %s failed: %s\n", uri.c_str(), cunvme::to_string(r).c_str()), 1;
  }
  const double read_s = timer.seconds();

  thrust::device_vector<unsigned long long> sum(1, 0);
  checksum<<<1024, 256, 0, stream>>>(thrust::raw_pointer_cast(gpu.data()), size, thrust::raw_pointer_cast(sum.data()));
  example::check(cudaGetLastError(), "launch the checksum");
  example::check(cudaStreamSynchronize(stream), "run the checksum");
  const std::uint64_t on_gpu = sum[0];
  const std::uint64_t on_host = host_checksum(file.get(), size);

  std::printf("file_to_gpu: '%s' (%llu bytes) through %s\n", path.c_str(), static_cast<unsigned long long>(size), uri.c_str());
  std::printf("  NVMe:  %llu blocks of %llu bytes from LBA %llu in %.1f ms: %.2f GB/s\n", static_cast<unsigned long long>(blocks),
              static_cast<unsigned long long>(block), static_cast<unsigned long long>(start_lba), read_s * 1e3,
              static_cast<double>(blocks * block) / read_s / 1e9);
  std::printf("  checksum on the GPU  %016llx\n  checksum on the host %016llx\n", static_cast<unsigned long long>(on_gpu),
              static_cast<unsigned long long>(on_host));
  if (on_gpu != on_host) return std::fprintf(stderr, "file_to_gpu: FAILED: the bytes in GPU memory are not the file's\n"), 1;
  std::printf("file_to_gpu: OK\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return example::run_main("file_to_gpu", [&] {
    if (argc < 2 || argc > 4) return std::fprintf(stderr, "usage: file_to_gpu FILE [URI [LBA]]\n"), 1;
    return run(argv[1], argc > 2 ? argv[2] : "", argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 0);
  });
}
