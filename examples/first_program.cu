// README.md's first program, word for word (the `readme first program` test keeps them equal).
#include <cunvme/facade/copy.cuh>      // cunvme::device, cunvme::copy_n
#include <cunvme/host/gpu/gpu_reach.cuh>   // cunvme::host::prepare_cuda_environment
#include <cunvme/host/backend/uri_options.cuh> // cunvme::host::pattern_word: what emu:pattern wrote

#include <thrust/device_vector.h>

#include <cstdint>
#include <cstdio>

int main() {
  cunvme::host::prepare_cuda_environment();  // first in main: kernels will wait for the emulator's threads
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) return 77;  // no CUDA GPU: skipped

  cunvme::device dev("emu:pattern");                    // the embedded emulator: 64 MiB, every word known
  thrust::device_vector<std::uint64_t> words(1 << 17);  // 1 MiB of GPU memory
  // GPU threads submit the commands and poll the completions; the data lands in `words` by DMA.
  cunvme::io_result r = cunvme::copy_n(dev, /*lba*/ 0, /*blocks*/ 2048, words).wait();
  if (!r) {
    std::printf("copy_n failed: %s\n", cunvme::to_string(r).c_str());
    return 1;
  }
  const std::uint64_t last = words.back();  // the namespace's word at byte 1 MiB - 8
  std::printf("read 1 MiB into GPU memory; last word %s\n", last == cunvme::host::pattern_word((1 << 20) - 8) ? "matches" : "differs");
  return last == cunvme::host::pattern_word((1 << 20) - 8) ? 0 : 1;
}
