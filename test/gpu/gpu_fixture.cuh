// What the GPU suites share: a rig of one emulated controller GPU threads can drive, and the
// counters kernels add their outcomes to.
#pragma once

#include <cunvme/emu/cuda_memory.cuh>
#include <cunvme/host/backend/emu_backend.cuh>
#include <cunvme/host/gpu/gpu_queue.cuh>
#include <cunvme/host/gpu/gpu_reach.cuh>
#include <cunvme/io/io_result.cuh>

#include "../pattern.hpp"

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <chrono>
#include <cstdlib>
#include <cstdint>
#include <memory>
#include <vector>

#define REQUIRE_CUDA(call) REQUIRE((call) == cudaSuccess)

namespace test {

namespace host = cunvme::host;
namespace emu = cunvme::emu;
using cunvme::io_error;
using cunvme::io_result;
using host::tier;

/// Counters the kernels add to, in mapped memory the host reads after the kernel.
struct tally {
  unsigned long long ok, failed, mismatched, timeouts, nvme_errors, unexpected;
};

/// How a rig's emulated controller is made usable by GPU threads.
enum class reach_path {
  emulator_hooks,  ///< built with CUDA memory (emu::cuda_memory): the emulator's own way
  registration,    ///< plain memory registered as a real controller's is (host::gpu_registrar)
};

/// An emulated controller with CUDA memory, a 64 MiB namespace of `word_at`, and queues in `t`.
/// Whether CUNVME_GPU_TEST_SMALL is set: a run under compute-sanitizer (10–100× slower).
inline bool under_sanitizer() {
  static const bool small = std::getenv("CUNVME_GPU_TEST_SMALL") != nullptr;
  return small;
}
/// Grid size for the larger cases: ÷8 under a sanitizer; the same code paths at a smaller scale.
inline unsigned scaled(unsigned blocks) { return under_sanitizer() ? (blocks + 7) / 8 : blocks; }
/// A queue pair's timeout for cases whose waits are bounded by it (a cache's fills, evictions):
/// 10 s, or 120 s under a sanitizer, whose slowdown would otherwise run the waits out.
inline std::chrono::nanoseconds queue_timeout() { return under_sanitizer() ? std::chrono::seconds(120) : std::chrono::seconds(10); }

struct gpu_rig {
  explicit gpu_rig(tier where, std::vector<emu::fault_rule> faults = {}, std::uint64_t blocks = 1 << 17,
                   reach_path path = reach_path::emulator_hooks)
      : t(where) {
    emu::controller_config config;
    // Through registration: BAR, CMB and DMA memory plain host memory, as a real backend maps them.
    const host::memory_reach reach = path == reach_path::registration ? host::gpu_reach_through_registration() : host::gpu_reach();
    reach.configure(config);
    config.workers = 4;
    config.namespaces = {emu::namespace_config::in_memory(512, blocks)};
    config.faults = std::move(faults);
    auto backend = std::make_unique<host::emu_backend>(std::move(config));
    emulator = &backend->controller();
    ctrl = std::make_unique<host::controller>(std::move(backend), host::controller_options{}, reach.registrar());
    auto& store = emulator->store(1);
    std::vector<std::uint64_t> words(blocks * 64);
    for (std::size_t i = 0; i < words.size(); ++i) words[i] = word_at(i * 8);
    store.write(0, words.data(), words.size() * 8);
    REQUIRE_CUDA(cudaHostAlloc(&counts, sizeof(tally), cudaHostAllocMapped));
    *counts = {};
  }
  ~gpu_rig() { cudaFreeHost(counts); }

  [[nodiscard]] std::unique_ptr<host::io_queue> queue(std::uint32_t entries, std::chrono::nanoseconds timeout = std::chrono::seconds(10)) {
    return host::make_gpu_queue(*ctrl, entries, t, timeout);
  }
  /// A data buffer where the tier puts data: pinned host memory (tier 1) or GPU memory.
  [[nodiscard]] host::dma_buffer data(std::size_t bytes) {
    return t == tier::host_queues_host_data ? ctrl->memory().allocate(bytes) : host::allocate_gpu(*ctrl, bytes);
  }

  tier t;
  emu::controller* emulator = nullptr;
  std::unique_ptr<host::controller> ctrl;
  tally* counts = nullptr;
};

inline __device__ void count(unsigned long long& c) { atomicAdd(&c, 1ull); }

/// Checks `words` words at `data` against the namespace bytes from `byte` on.
inline __device__ void verify(const std::uint64_t* data, std::uint64_t byte, std::uint64_t words, std::uint64_t round, tally* t) {
  std::uint64_t bad = 0;
  for (std::uint64_t i = 0; i < words; ++i) bad += data[i] != word_at(byte + i * 8, round);
  if (bad != 0) atomicAdd(&t->mismatched, bad);
}

inline __device__ void account(const io_result& r, tally* t) {
  if (r.ok()) return count(t->ok);
  count(t->failed);
  if (r.error == io_error::timeout) count(t->timeouts);
  if (r.error == io_error::nvme_status) count(t->nvme_errors);
}


}  // namespace test
