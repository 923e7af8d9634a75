// quickstart — the main job: open the emulator, fill it, read it from kernels into GPU memory,
// verify on the GPU, print GB/s and IOPS.
//
//   build/examples/quickstart                                   a 256 MiB emulated namespace
//   build/examples/quickstart emu:blocks=2097152,workers=4      1 GiB, four emulator threads
//   build/examples/quickstart emu:timing=gen4-tlc 16            a modelled SSD; 16 reads per thread
//
// Two ways to read: `cunvme::copy_n`, which hides its kernel the way Thrust does, and a kernel
// of our own in which every thread reads with a `block_reader`. Exits 0 when every byte read
// matched what was written, 1 on any failure, 77 (Meson's "skipped") without a CUDA GPU.
#include "example_support.hpp"

#include <cunvme/facade/copy.cuh>

#include <thrust/device_vector.h>

#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

/// What the namespace holds: word `i` (bytes 8i..8i+7). Every word differs, so a block read
/// into the wrong place, or not at all, cannot pass the check.
__host__ __device__ constexpr std::uint64_t word_at(std::uint64_t i) { return (i * 0x9e3779b97f4a7c15ull) ^ 0x5a5a5a5a5a5a5a5aull; }

struct outcome {
  unsigned long long mismatches;  // words that differed from word_at
  unsigned failed;                // set by the first thread whose read failed …
  cunvme::io_result failure;      // … which leaves its result here
};

/// Counts the words of `data` (its word 0 is namespace word `first`) that differ from word_at.
__global__ void verify(const std::uint64_t* data, std::uint64_t words, std::uint64_t first, outcome* out) {
  unsigned long long bad = 0;
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < words; i += std::uint64_t{gridDim.x} * blockDim.x) {
    bad += data[i] != word_at(first + i);
  }
  if (bad != 0) atomicAdd(&out->mismatches, bad);
}

/// Every thread reads `per_thread` random 4 KiB pieces of the namespace into its own 4 KiB of
/// `buffer` (the per-thread reader form: many threads share one queue pair) and checks each.
__global__ void random_reads(cunvme::device::reader r, cunvme::prp::page_list buffer, const std::uint64_t* data, std::uint32_t per_thread,
                             std::uint64_t pieces, outcome* out) {
  const std::uint64_t t = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const auto blocks = static_cast<std::uint32_t>(4096 / r.ns().block_bytes());  // 8 blocks of 512 bytes, or 1 of 4 KiB
  const std::uint64_t* mine = data + t * 512;               // this thread's 4 KiB, as 512 words
  unsigned long long bad = 0;
  for (std::uint32_t i = 0; i < per_thread; ++i) {
    const std::uint64_t piece = example::mix(t << 32 | i) % pieces;
    // Returns once the data is in `mine` (the completion's acquire orders our loads after it).
    const cunvme::io_result s = r.read(piece * blocks, blocks, buffer, t * 4096);
    if (!s) {
      if (atomicExch(&out->failed, 1u) == 0) out->failure = s;
      break;
    }
    for (std::uint32_t w = 0; w < 512; ++w) bad += mine[w] != word_at(piece * 512 + w);
  }
  if (bad != 0) atomicAdd(&out->mismatches, bad);
}

int run(const std::string& uri, std::uint32_t per_thread) {
  // A controller, queue pairs for kernels (queues in pinned host memory, data straight into GPU
  // memory) and namespace 1. "emu…" is the emulator, run by threads of this process.
  cunvme::device dev(uri);
  const cunvme::namespace_view& ns = dev.ns();
  const std::uint64_t bytes = ns.lba_count * ns.block_bytes();
  std::printf("quickstart: %s: %llu blocks of %u bytes (%.0f MiB), up to %u blocks per command\n", uri.c_str(),
              static_cast<unsigned long long>(ns.lba_count), ns.lba_size(), static_cast<double>(bytes) / (1 << 20), ns.max_blocks);
  // 1. Fill: the emulator's namespace is host memory (on a real SSD, write with copy_n(src, blocks, dev, lba)).
  example::fill(dev, word_at);

  example::stream stream;
  thrust::device_vector<outcome> out(1, outcome{});

  // 2. The whole namespace into GPU memory with one call, then a check on the GPU. copy_n only
  //    enqueues; wait() returns the outcome once the stream has run it.
  thrust::device_vector<std::uint64_t> all(bytes / 8);  // zeros: nothing there matches word_at
  const example::timer copy_timer;  // mapping the buffer is part of the call
  cunvme::pending_copy copy = cunvme::copy_n(dev, /*lba*/ 0, ns.lba_count, all, stream);
  verify<<<1024, 256, 0, stream>>>(thrust::raw_pointer_cast(all.data()), all.size(), 0, thrust::raw_pointer_cast(out.data()));
  example::check(cudaGetLastError(), "launch verify");
  if (const cunvme::io_result r = copy.wait(); !r) {
    std::fprintf(stderr, "quickstart: copy_n failed: %s\n", cunvme::to_string(r).c_str());
    return 1;
  }
  const double copy_s = copy_timer.seconds();
  example::check(cudaStreamSynchronize(stream), "run verify");
  const outcome whole = out[0];
  const std::uint64_t commands = (ns.lba_count + ns.max_blocks - 1) / ns.max_blocks;
  std::printf("copy_n:       %.0f MiB in %.1f ms: %.2f GB/s (%llu commands, %.0f IOPS); %llu words differ\n",
              static_cast<double>(bytes) / (1 << 20), copy_s * 1e3, static_cast<double>(bytes) / copy_s / 1e9,
              static_cast<unsigned long long>(commands), static_cast<double>(commands) / copy_s, whole.mismatches);
  if (whole.mismatches != 0) return std::fprintf(stderr, "quickstart: FAILED: copy_n's words differ from what was written\n"), 1;
  all.clear();
  all.shrink_to_fit();
  out[0] = outcome{};

  // 3. Random 4 KiB reads from a kernel of our own, each checked at once. One command in flight
  //    per thread; no more threads than the queue has command identifiers (1023 of 1024 entries).
  constexpr unsigned per_block = 32;
  const unsigned threads = std::max(per_block, std::min(1024u, dev.queue().view().cids()) / per_block * per_block);
  // GPU memory the controller can DMA into, and its page table in GPU memory for the reader.
  cunvme::host::dma_buffer buffer = cunvme::host::allocate_gpu(dev.controller(), std::size_t{threads} * 4096);
  thrust::device_vector<std::uint64_t> pages(buffer.pages());
  const cunvme::prp::page_list dst{thrust::raw_pointer_cast(pages.data()), static_cast<unsigned>(std::countr_zero(buffer.page_size()))};
  const example::timer timer;
  random_reads<<<threads / per_block, per_block, 0, stream>>>(dev.make_reader(), dst, static_cast<const std::uint64_t*>(buffer.device_data()),
                                                               per_thread, bytes / 4096, thrust::raw_pointer_cast(out.data()));
  example::check(cudaGetLastError(), "launch random_reads");
  example::check(cudaStreamSynchronize(stream), "run random_reads");
  const double s = timer.seconds();
  const outcome random = out[0];
  const double reads = static_cast<double>(threads) * per_thread;
  std::printf("random reads: %.0f of 4 KiB from %u threads in %.1f ms: %.0f IOPS, %.2f GB/s; %llu words differ\n", reads, threads, s * 1e3,
              reads / s, reads * 4096 / s / 1e9, random.mismatches);
  if (random.failed != 0) return std::fprintf(stderr, "quickstart: a random read failed: %s\n", cunvme::to_string(random.failure).c_str()), 1;
  if (random.mismatches != 0) return std::fprintf(stderr, "quickstart: FAILED: %llu words read differ\n", random.mismatches), 1;
  std::printf("quickstart: OK, every word read matched\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return example::run_main("quickstart", [&] {
    const std::string uri = argc > 1 ? argv[1] : "emu:blocks=524288";  // 256 MiB of 512-byte blocks
    const long per_thread = argc > 2 ? std::strtol(argv[2], nullptr, 10) : 64;
    if (uri.rfind("emu", 0) != 0 || per_thread <= 0 || per_thread > 1'000'000) {
      return std::fprintf(stderr, "usage: quickstart [emu:OPTIONS] [reads per thread, 1..1000000] (it fills the emulator's namespace)\n"), 1;
    }
    return run(uri, static_cast<std::uint32_t>(per_thread));
  });
}
