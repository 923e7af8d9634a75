// Soak: every SM's threads read and write random verified data through the emulator for a
// given number of operations, with faults injected (read errors, late and lost completions).
// Not in the default test run (suite 'soak'):
//
//   build/test/gpu_soak [--ops N] [--tier 1|2|3] [--queues Q (64)] [--entries E (1024)] [--workers W (8)] [--timeout-ms T (5000)]
//
// Prints counts and exits 0 when no data mismatched, every failure was an injected one (an
// NVMe error or a timeout), and the kernel ended; 77 without a GPU. A thread that sees a
// timeout retires (its buffer may still be written by the late command); the others use up
// the operation budget.
#include <cunvme/emu/cuda_memory.cuh>
#include <cunvme/host/cuda_error.cuh>
#include <cunvme/emu/fault_injection.cuh>
#include <cunvme/host/backend/emu_backend.cuh>
#include <cunvme/host/gpu/gpu_queue.cuh>
#include <cunvme/io/reader.cuh>

#include "../pattern.hpp"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace cunvme;

using test::mix;
using test::word_at;

struct tally {
  unsigned long long reads, writes, mismatched, nvme_errors, timeouts, other_failures, operations;
  unsigned long long by_error[16];  ///< failures by io_error
};

__device__ void count_failure(const io_result& r, tally* t) {
  atomicAdd(r.error == io_error::timeout ? &t->timeouts : r.error == io_error::nvme_status ? &t->nvme_errors : &t->other_failures, 1ull);
  atomicAdd(&t->by_error[static_cast<unsigned>(r.error) & 15u], 1ull);
}

constexpr std::uint32_t region_blocks = 8;  // each thread owns 8 blocks (4 KiB) of the namespace

using queue_t = queue_policies<slots::warp_aggregated, completion::cooperative>;
using reader_t = block_reader<queue_t, prp::contiguous, doorbell::coalescing<doorbell::mmio>>;
using writer_t = block_writer<queue_t, prp::contiguous, doorbell::coalescing<doorbell::mmio>>;

/// Each thread: until the shared operation budget is spent, write its region with the next
/// version (1 in 4) or read 1–8 of its blocks and check them against the version it knows.
/// A failed write leaves the region unknown until the next successful write.
__global__ void soak(const queue_view* queues, unsigned queue_count, namespace_view ns, prp::contiguous buf, std::uint64_t* data,
                     unsigned long long budget, tally* t) {
  const std::uint64_t id = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const queue_view& q = queues[blockIdx.x % queue_count];
  const reader_t reader(q, ns);
  const writer_t writer(q, ns);
  std::uint64_t* mine = data + id * region_blocks * 64;
  const std::uint64_t lba = id * region_blocks;
  std::uint64_t version = 0;
  bool known = true;  // the namespace starts filled with version 0
  for (std::uint64_t i = 0;; ++i) {
    if (atomicAdd(&t->operations, 1ull) >= budget) break;
    const std::uint64_t h = mix(id * 0x100000001b3ull ^ i);
    if (!known || h % 4 == 0) {
      for (std::uint32_t w = 0; w < region_blocks * 64; ++w) mine[w] = word_at((lba * 512) + w * 8, version + 1);
      __threadfence_system();
      const io_result r = writer.write(lba, region_blocks, buf, id * region_blocks * 512);
      atomicAdd(&t->writes, 1ull);
      if (r.ok()) {
        ++version;
        known = true;
      } else {
        known = false;  // the write may or may not have reached the media
        count_failure(r, t);
        if (r.error == io_error::timeout) break;  // the late command may still read the slice: retire
      }
      continue;
    }
    const std::uint32_t blocks = 1 + (h >> 8) % region_blocks;
    const std::uint32_t first = (h >> 16) % (region_blocks - blocks + 1);
    const io_result r = reader.read(lba + first, blocks, buf, id * region_blocks * 512);
    atomicAdd(&t->reads, 1ull);
    if (!r.ok()) {
      count_failure(r, t);
      if (r.error == io_error::timeout) break;  // a late completion may still move data into the slice: retire
      continue;
    }
    std::uint64_t bad = 0;
    for (std::uint32_t w = 0; w < blocks * 64; ++w) bad += mine[w] != word_at((lba + first) * 512 + w * 8, version);
    if (bad != 0) atomicAdd(&t->mismatched, bad);
  }
}

std::uint64_t arg(int argc, char** argv, const char* name, std::uint64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::strtoull(argv[i + 1], nullptr, 10);
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  cunvme::emu::prepare_cuda_environment();  // before any CUDA call: kernels wait for emulated I/O
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA GPU: soak skipped\n");
    return 77;
  }
  const std::uint64_t ops = arg(argc, argv, "--ops", 10'000'000);
  const auto where = static_cast<host::tier>(arg(argc, argv, "--tier", 1));
  const unsigned queue_count = static_cast<unsigned>(arg(argc, argv, "--queues", 64));  // 64 × 1023 CIDs: one per thread
  const std::uint32_t entries = static_cast<std::uint32_t>(arg(argc, argv, "--entries", 1024));
  // Long enough for a queue's whole backlog under full load; a thread retires after a timeout.
  const std::uint64_t timeout_ms = arg(argc, argv, "--timeout-ms", 5000);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const unsigned blocks = static_cast<unsigned>(prop.multiProcessorCount), threads = 256;
  const std::uint64_t thread_count = std::uint64_t{blocks} * threads;

  emu::controller_config config;
  config.memory = emu::cuda_memory();
  config.workers = static_cast<unsigned>(arg(argc, argv, "--workers", 8));
  config.max_io_queues = static_cast<std::uint16_t>(queue_count);
  config.namespaces = {emu::namespace_config::in_memory(512, thread_count * region_blocks)};
  emu::fault_rule read_errors;
  read_errors.status = spec::status::unrecovered_read_error;
  read_errors.fraction = 1e-4;
  emu::fault_rule late;
  late.action = emu::fault_action::add_delay;
  late.delay_ns = (timeout_ms + 1000) * 1'000'000;  // past the timeout: a timeout, then a late completion
  late.fraction = 2e-6;
  emu::fault_rule lost;
  lost.action = emu::fault_action::lose_completion;
  lost.fraction = 1e-6;
  lost.max_fires = 32;  // each lost command holds its CID for good
  config.faults = {read_errors, late, lost};
  auto backend = std::make_unique<host::emu_backend>(std::move(config));
  emu::controller& emulator = backend->controller();
  {
    std::vector<std::uint64_t> words(thread_count * region_blocks * 64);
    for (std::size_t i = 0; i < words.size(); ++i) words[i] = word_at(i * 8, 0);
    emulator.store(1).write(0, words.data(), words.size() * 8);
  }
  host::controller_options options;
  options.io_queue_pairs = static_cast<std::uint16_t>(queue_count);
  host::controller ctrl(std::move(backend), options);
  std::vector<std::unique_ptr<host::io_queue>> queues;
  std::vector<queue_view> views;
  for (unsigned i = 0; i < queue_count; ++i) {
    queues.push_back(host::make_gpu_queue(ctrl, entries, where, std::chrono::milliseconds(timeout_ms)));
    views.push_back(queues.back()->view());
  }
  queue_view* device_views = nullptr;
  cudaMalloc(&device_views, views.size() * sizeof(queue_view));
  cudaMemcpy(device_views, views.data(), views.size() * sizeof(queue_view), cudaMemcpyHostToDevice);
  host::dma_buffer data = where == host::tier::host_queues_host_data ? ctrl.memory().allocate(thread_count * region_blocks * 512)
                                                                     : host::allocate_gpu(ctrl, thread_count * region_blocks * 512);
  tally* t = nullptr;
  cudaHostAlloc(&t, sizeof(tally), cudaHostAllocMapped);
  std::memset(t, 0, sizeof *t);
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  const auto start = std::chrono::steady_clock::now();
  soak<<<blocks, threads, 0, stream>>>(device_views, queue_count, queues[0]->namespace_view(1), prp::contiguous{data.bus()},
                                      static_cast<std::uint64_t*>(data.device_data()), ops, t);
  const cudaError_t e = cudaStreamSynchronize(stream);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (e != cudaSuccess) {
    std::printf("soak: kernel failed: %s\n", cunvme::host::cuda_error_text(e).c_str());
    return 1;
  }
  const auto injected = emulator.injected_faults();
  std::uint32_t held = 0;
  for (auto& q : queues) held += q->cids_in_use();
  const unsigned long long done = t->reads + t->writes;
  std::printf("soak: %s on %s, %u SMs x %u threads, %u queues x %u entries, %u emulator workers\n",
              where == host::tier::host_queues_host_data ? "tier 1" : where == host::tier::host_queues_gpu_data ? "tier 2" : "tier 3", prop.name,
              blocks, threads, queue_count, entries, emulator.config().workers);
  std::printf("soak: %llu operations (%llu reads, %llu writes) in %.1f s = %.0f ops/s\n", done, t->reads, t->writes, seconds, done / seconds);
  std::printf("soak: mismatched words %llu, NVMe errors %llu (injected statuses %llu), timeouts %llu (delays %llu, lost %llu), other failures %llu\n",
              t->mismatched, t->nvme_errors, static_cast<unsigned long long>(injected.statuses), t->timeouts,
              static_cast<unsigned long long>(injected.delays), static_cast<unsigned long long>(injected.lost_completions), t->other_failures);
  std::printf("soak: CIDs still held (lost completions) %u\n", held);
  for (unsigned e = 0; e < 16; ++e) {
    if (t->by_error[e] != 0) std::printf("soak:   %s: %llu\n", to_string(static_cast<io_error>(e)), t->by_error[e]);
  }
  // Every failure must be an injected one: an injected status seen as such (or, when a delay or
  // a loss hit the same command, as a timeout), a delay or a loss seen as a timeout.
  const bool pass = t->mismatched == 0 && t->other_failures == 0 && done >= ops && t->nvme_errors <= injected.statuses &&
                    t->nvme_errors + t->timeouts <= injected.statuses + injected.delays + injected.lost_completions &&
                    held <= injected.lost_completions + injected.delays;  // lost for good, or late and not back yet
  std::printf("soak: %s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
