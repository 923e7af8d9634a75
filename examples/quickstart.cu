// quickstart — the main job: open the emulator, fill it, read it from kernels into GPU memory,
// verify on the GPU, print GB/s and IOPS.
//
//   build/examples/quickstart                                   a 256 MiB emulated namespace
//   build/examples/quickstart emu:blocks=2097152,workers=4      1 GiB, four emulator threads
//   build/examples/quickstart emu:timing=gen4-tlc 16            a modelled SSD; 16 reads per thread
//
// Two ways to read: `cunvme::copy_n`, which hides its kernel the way Thrust does, and a kernel
// of our own in which every thread reads with a `block_reader`. Exits 0 when every byte read
// matched what was written, 1 on any failure, and 77 (what Meson reports as "skipped") where
// there is no CUDA GPU.
#include <cunvme/facade/copy.cuh>

#include <thrust/device_vector.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

namespace {

/// What the namespace holds: word `i` (bytes 8i..8i+7). Every word differs, so a block read
/// into the wrong place, or not at all, cannot pass the check.
__host__ __device__ constexpr std::uint64_t word_at(std::uint64_t i) { return (i * 0x9e3779b97f4a7c15ull) ^ 0x5a5a5a5a5a5a5a5aull; }

/// splitmix64's finaliser: picks the random LBAs below.
__host__ __device__ constexpr std::uint64_t mix(std::uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// What the kernels report back.
struct outcome {
  unsigned long long mismatches;  // words that differed from word_at
  unsigned failed;                // set by the first thread whose read failed …
  cunvme::io_result failure;      // … which leaves its result here
};

/// Counts the words of `data` (its word 0 is namespace word `first`) that differ from what was
/// written. A grid-stride loop: any grid size covers any buffer.
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
    const std::uint64_t piece = mix(t << 32 | i) % pieces;
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

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

/// The outcome of the kernels so far, read once `stream` has finished.
outcome result_of(const thrust::device_vector<outcome>& out, cudaStream_t stream) {
  check(cudaStreamSynchronize(stream), "run the kernels");
  return out[0];
}

/// What went wrong with a read, for messages: why, the NVMe status if a command failed, where.
std::string describe(const cunvme::io_result& r) {
  std::string s = cunvme::to_string(r.error);
  if (r.error == cunvme::io_error::nvme_status) s += ": " + cunvme::spec::to_string(r.status);
  return s + " at LBA " + std::to_string(r.lba) + " (" + std::to_string(r.blocks) + " blocks)";
}

void print_failure(const char* what, const cunvme::io_result& r) {
  std::fprintf(stderr, "quickstart: %s failed: %s\n", what, describe(r).c_str());
}

int run(const std::string& uri, std::uint32_t per_thread) {
  // A controller, one queue pair for kernels (queues in pinned host memory, data straight into
  // GPU memory) and namespace 1. "emu…" is the emulator, run by threads of this process.
  cunvme::device dev(uri);
  // The emulator behind the controller: its namespaces' bytes are ours to fill.
  auto& emulator = dynamic_cast<cunvme::host::emu_backend&>(dev.controller().backend());
  const cunvme::namespace_view& ns = dev.ns();
  const std::uint64_t bytes = ns.lba_count * ns.block_bytes();
  std::printf("quickstart: %s: %llu blocks of %u bytes (%.0f MiB), up to %u blocks per command\n", uri.c_str(),
              static_cast<unsigned long long>(ns.lba_count), ns.lba_size(), static_cast<double>(bytes) / (1 << 20), ns.max_blocks);

  // 1. Fill. The emulator's backing store is plain host memory: write it directly (with a real
  //    SSD, write from GPU memory with `cunvme::copy_n(src, blocks, dev, lba)`).
  cunvme::emu::backing_store& store = emulator.controller().store(ns.nsid);
  {
    std::vector<std::uint64_t> chunk(1 << 17);  // 1 MiB at a time
    for (std::uint64_t at = 0; at < bytes; at += chunk.size() * 8) {
      const std::uint64_t n = std::min<std::uint64_t>(chunk.size() * 8, bytes - at);
      for (std::uint64_t w = 0; w < n / 8; ++w) chunk[w] = word_at(at / 8 + w);
      store.write(at, chunk.data(), n);
    }
  }

  // Our own stream, non-blocking: nothing we queue waits on the legacy default stream, and
  // nothing there (Thrust's allocations and copies) waits on our kernels while they poll.
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "create a stream");
  thrust::device_vector<outcome> out(1, outcome{});

  // 2. The whole namespace into GPU memory with one call, then a check on the GPU.
  thrust::device_vector<std::uint64_t> all(bytes / 8);  // zeros: nothing there matches word_at
  // Timed as the caller sees it: mapping the buffer for the controller is part of the call.
  const auto start = std::chrono::steady_clock::now();
  const cunvme::io_result copied = cunvme::copy_n(dev, /*lba*/ 0, ns.lba_count, all, stream);
  const double copy_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!copied) {
    print_failure("copy_n", copied);
    return 1;
  }
  verify<<<1024, 256, 0, stream>>>(thrust::raw_pointer_cast(all.data()), all.size(), 0, thrust::raw_pointer_cast(out.data()));
  check(cudaGetLastError(), "launch verify");
  const outcome whole = result_of(out, stream);
  const std::uint64_t commands = (ns.lba_count + ns.max_blocks - 1) / ns.max_blocks;
  std::printf("copy_n:       %.0f MiB in %.1f ms: %.2f GB/s (%llu commands, %.0f IOPS); %llu words differ\n",
              static_cast<double>(bytes) / (1 << 20), copy_s * 1e3, static_cast<double>(bytes) / copy_s / 1e9,
              static_cast<unsigned long long>(commands), static_cast<double>(commands) / copy_s, whole.mismatches);
  if (whole.mismatches != 0) {
    std::fprintf(stderr, "quickstart: FAILED: %llu words read by copy_n differ from what was written\n", whole.mismatches);
    return 1;
  }
  all.clear();
  all.shrink_to_fit();
  out[0] = outcome{};

  // 3. Random 4 KiB reads from a kernel of our own, each checked at once. Every thread has one
  //    command in flight at a time; no more threads than the queue has command identifiers
  //    (1023 for 1024 entries), so none has to wait for one.
  constexpr unsigned per_block = 32;
  const unsigned threads = std::max(per_block, std::min(1024u, dev.queue().view().cids()) / per_block * per_block);
  // GPU memory the controller can DMA into, and its page table in GPU memory for the reader.
  cunvme::host::dma_buffer buffer = cunvme::host::allocate_gpu(dev.controller(), std::size_t{threads} * 4096);
  thrust::device_vector<std::uint64_t> pages(buffer.pages());
  const cunvme::prp::page_list dst{thrust::raw_pointer_cast(pages.data()), static_cast<unsigned>(std::countr_zero(buffer.page_size()))};
  const std::uint64_t pieces = bytes / 4096;
  cudaEvent_t begin = nullptr, end = nullptr;
  check(cudaEventCreate(&begin), "create an event");
  check(cudaEventCreate(&end), "create an event");
  check(cudaEventRecord(begin, stream), "record an event");
  random_reads<<<threads / per_block, per_block, 0, stream>>>(dev.make_reader(), dst, static_cast<const std::uint64_t*>(buffer.device_data()),
                                                               per_thread, pieces, thrust::raw_pointer_cast(out.data()));
  check(cudaGetLastError(), "launch random_reads");
  check(cudaEventRecord(end, stream), "record an event");
  const outcome random = result_of(out, stream);
  float ms = 0;
  check(cudaEventElapsedTime(&ms, begin, end), "time random_reads");
  const double reads = static_cast<double>(threads) * per_thread;
  std::printf("random reads: %.0f of 4 KiB from %u threads in %.1f ms: %.0f IOPS, %.2f GB/s; %llu words differ\n", reads, threads, ms,
              reads / (ms * 1e-3), reads * 4096 / (ms * 1e-3) / 1e9, random.mismatches);
  (void)cudaEventDestroy(begin);
  (void)cudaEventDestroy(end);
  (void)cudaStreamDestroy(stream);

  if (random.failed != 0) {
    print_failure("a random read", random.failure);
    return 1;
  }
  if (random.mismatches != 0) {
    std::fprintf(stderr, "quickstart: FAILED: %llu words read differ from what was written\n", random.mismatches);
    return 1;
  }
  std::printf("quickstart: OK, every word read matched\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  cunvme::emu::prepare_cuda_environment();  // before any CUDA call: kernels wait for emulated I/O
  // No GPU (or no driver): say so instead of failing somewhere inside the bring-up.
  int gpus = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&gpus); e != cudaSuccess || gpus == 0) {
    std::printf("quickstart: no CUDA GPU (%s): skipped\n", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    return 77;
  }
  const std::string uri = argc > 1 ? argv[1] : "emu:blocks=524288";  // 256 MiB of 512-byte blocks
  if (uri.rfind("emu", 0) != 0) {
    std::fprintf(stderr, "quickstart: %s is not the emulator; this example fills the namespace itself, so it needs \"emu…\"\n", uri.c_str());
    return 1;
  }
  const long per_thread = argc > 2 ? std::strtol(argv[2], nullptr, 10) : 64;
  if (per_thread <= 0 || per_thread > 1'000'000) {
    std::fprintf(stderr, "usage: quickstart [emu:OPTIONS] [reads per thread, 1..1000000]\n");
    return 1;
  }
  try {
    return run(uri, static_cast<std::uint32_t>(per_thread));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "quickstart: %s\n", e.what());
    return 1;
  }
}
