// GPU threads over a striped volume of four emulated controllers: warps gather random
// elements of an array<T> through a page cache whose bookkeeping is in GPU memory, threads
// write elements and a flush sends them to the right member — every word verified against the
// member and place the layout gives. Skipped (exit 77) without a GPU.
#define DOCTEST_CONFIG_IMPLEMENT
#include <cunvme/cache/array.cuh>
#include <cunvme/cache/page_cache.cuh>
#include <cunvme/host/owners/page_cache_memory.cuh>
#include <cunvme/host/owners/volume_members.cuh>
#include <cunvme/policy/device_group.cuh>
#include <cunvme/volume/volume.cuh>

#include "gpu_fixture.cuh"

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

namespace {

using namespace cunvme;
using test::account;
using test::count;
using test::gpu_rig;
using test::mix;
using test::tally;
using test::volume_word_at;
using test::word_at;
using test::scaled;
using test::queue_timeout;
using host::tier;

using cache_queue = queue_policies<slots::multi_producer, completion::cooperative>;
using volume_cache = page_cache<cache_queue, doorbell::mmio>;
using words = array<std::uint64_t, volume_cache>;

/// Each warp gathers `rounds` × 32 random elements (of the first `span` when non-zero) and
/// checks each.
__global__ void gather_words(words a, volume_view shape, std::uint64_t span, unsigned rounds, std::uint64_t seed, std::uint64_t* scratch,
                             tally* t) {
  __shared__ warp_group::temp_storage storage[8];
  warp_group warp(storage[threadIdx.x / 32]);
  const std::uint64_t thread = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const std::uint64_t warp_base = thread / 32 * 32;
  std::uint64_t* indices = scratch + warp_base * 2;
  std::uint64_t* out = indices + 32;
  for (unsigned r = 0; r < rounds; ++r) {
    indices[warp.rank()] = mix(seed ^ (thread << 16) ^ r) % (span != 0 ? span : a.size());
    __syncwarp();
    const io_result res = a.gather(warp, indices, 32, out);
    account(res, t);
    if (res.ok() && out[warp.rank()] != volume_word_at(shape, indices[warp.rank()])) count(t->mismatched);
    __syncwarp();
  }
}

/// Thread i writes element i × `stride` (its own value), reads it back through the cache.
__global__ void write_words(words a, std::uint64_t stride, tally* t) {
  const std::uint64_t i = (std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) * stride;
  const std::uint64_t mine = mix(i) | 1;
  account(a.set(i, mine), t);
  const element<std::uint64_t> back = a[i];
  if (back.ok() && back.value != mine) count(t->mismatched);
}

__global__ void flush_cache(volume_cache c, io_result* out) { *out = c.flush(); }

/// Four emulated controllers of `blocks` 512-byte blocks, member m's namespace `word_at(o, m)`,
/// two GPU queue pairs each, striped by `stripe_bytes`.
struct volume_rig {
  explicit volume_rig(std::uint64_t stripe_bytes, std::uint64_t blocks = 1 << 15) {
    for (std::uint64_t m = 0; m < 4; ++m) {
      rigs.push_back(std::make_unique<gpu_rig>(tier::host_queues_host_data, std::vector<emu::fault_rule>{}, blocks));
      std::vector<std::uint64_t> w(blocks * 64);
      for (std::size_t i = 0; i < w.size(); ++i) w[i] = word_at(i * 8, m);
      rigs.back()->emulator->store(1).write(0, w.data(), w.size() * 8);
      for (int k = 0; k < 2; ++k) queues.push_back(rigs.back()->queue(1024, queue_timeout()));
    }
    std::vector<host::volume::member> members;
    for (std::size_t m = 0; m < 4; ++m) members.push_back({{queues[2 * m].get(), queues[2 * m + 1].get()}, 1});
    vol = std::make_unique<host::volume>(host::volume::striped(std::move(members), stripe_bytes, host::gpu_bookkeeping(*rigs[0]->ctrl, tier::host_queues_host_data)));
  }
  [[nodiscard]] std::uint64_t stored(unsigned m, std::uint64_t offset) const {
    std::uint64_t w = 0;
    rigs[m]->emulator->store(1).read(offset, &w, 8);
    return w;
  }
  std::vector<std::unique_ptr<gpu_rig>> rigs;
  std::vector<std::unique_ptr<host::io_queue>> queues;
  std::unique_ptr<host::volume> vol;
};

/// Where a test's cache slots go: GPU memory (`host::allocate_gpu`) or the controller's DMA memory.
host::slot_allocator slots_in(bool gpu) { return gpu ? host::slot_allocator(host::allocate_gpu) : host::slot_allocator{}; }

}  // namespace

namespace {
/// Warps gather random words through 512 slots over a striped volume of four controllers.
void gather_random_words(bool gpu_slots) {
  CAPTURE(gpu_slots);
  volume_rig r(16384);
  host::page_cache_memory memory(*r.vol, 4096, 512, host::gpu_bookkeeping(*r.rigs[0]->ctrl, tier::host_queues_host_data), slots_in(gpu_slots));
  const volume_cache c(memory.device_view(), r.vol->device_view());
  const words a(c, 0, r.vol->blocks() * 512 / 8);
  const unsigned blocks = scaled(66);
  constexpr unsigned threads = 256, rounds = 8;
  std::uint64_t* scratch = nullptr;
  REQUIRE_CUDA(cudaMalloc(&scratch, std::uint64_t{blocks} * threads * 2 * sizeof(std::uint64_t)));
  gather_words<<<blocks, threads>>>(a, r.vol->view(), 0, rounds, 5, scratch, r.rigs[0]->counts);
  REQUIRE_CUDA(cudaGetLastError());
  REQUIRE_CUDA(cudaDeviceSynchronize());
  const tally& t = *r.rigs[0]->counts;
  CHECK(t.ok == std::uint64_t{blocks} * threads * rounds);
  CHECK(t.failed == 0);
  CHECK(t.mismatched == 0);
  const page_cache_counters n = memory.counters();
  CHECK(n.evictions > 0);
  for (auto& rig : r.rigs) CHECK(rig->emulator->stats().io_commands > 0);
  MESSAGE(n.hits << " hits, " << n.misses << " misses, " << n.evictions << " evictions over 4 controllers");
  cudaFree(scratch);
}
}  // namespace

TEST_CASE("warps gather random words through a cache over a striped volume of four controllers: every word from its member") {
  // Each member's DMA reaches the slots in pinned host memory, then in GPU memory (peer-to-peer).
  for (const bool gpu_slots : {false, true}) gather_random_words(gpu_slots);
}

TEST_CASE("a grid gathering from eight hot pages of a striped volume reads each page once") {
  volume_rig r(16384);
  host::page_cache_memory memory(*r.vol, 4096, 64, host::gpu_bookkeeping(*r.rigs[0]->ctrl, tier::host_queues_host_data));
  const volume_cache c(memory.device_view(), r.vol->device_view());
  const words a(c, 0, r.vol->blocks() * 512 / 8);
  constexpr unsigned blocks = 132, threads = 256, rounds = 4;
  std::uint64_t* scratch = nullptr;
  REQUIRE_CUDA(cudaMalloc(&scratch, std::uint64_t{blocks} * threads * 2 * sizeof(std::uint64_t)));
  gather_words<<<blocks, threads>>>(a, r.vol->view(), 8 * 4096 / 8, rounds, 9, scratch, r.rigs[0]->counts);
  REQUIRE_CUDA(cudaGetLastError());
  REQUIRE_CUDA(cudaDeviceSynchronize());
  const tally& t = *r.rigs[0]->counts;
  CHECK(t.ok == std::uint64_t{blocks} * threads * rounds);
  CHECK(t.mismatched == 0);
  const page_cache_counters n = memory.counters();
  CHECK(n.misses == 8);
  CHECK(n.evictions == 0);
  cudaFree(scratch);
}

namespace {
/// Every GPU thread writes a word of its own through 128 slots; a flush from the GPU; each checked in its member.
void write_and_flush_words(bool gpu_slots) {
  CAPTURE(gpu_slots);
  volume_rig r(8192);
  host::page_cache_memory memory(*r.vol, 4096, 128, host::gpu_bookkeeping(*r.rigs[0]->ctrl, tier::host_queues_host_data), slots_in(gpu_slots));
  const volume_cache c(memory.device_view(), r.vol->device_view());
  const words a(c, 0, r.vol->blocks() * 512 / 8);
  const unsigned blocks = scaled(16);
  constexpr unsigned threads = 128;
  constexpr std::uint64_t stride = 4096 / 8 + 1;  // a word in each page, at a different place in each
  io_result* flushed = nullptr;
  REQUIRE_CUDA(cudaHostAlloc(&flushed, sizeof *flushed, cudaHostAllocMapped));
  *flushed = io_result::failure(io_error::invalid_request, 0, 0);
  write_words<<<blocks, threads>>>(a, stride, r.rigs[0]->counts);
  flush_cache<<<1, 1>>>(c, flushed);
  REQUIRE_CUDA(cudaGetLastError());
  REQUIRE_CUDA(cudaDeviceSynchronize());
  MESSAGE(r.rigs[0]->counts->failed << " failed (" << r.rigs[0]->counts->timeouts << " timeouts, " << r.rigs[0]->counts->nvme_errors
                                    << " NVMe errors; the rest cache_full or other); flush: " << to_string(*flushed));
  CHECK(r.rigs[0]->counts->ok == std::uint64_t{blocks} * threads);
  CHECK(r.rigs[0]->counts->mismatched == 0);
  CHECK(flushed->ok());
  std::uint64_t wrong = 0;
  const volume_view shape = r.vol->view();
  for (std::uint64_t t = 0; t < std::uint64_t{blocks} * threads; ++t) {
    const std::uint64_t i = t * stride;
    const volume_run run = shape.locate(i * 8 / 512, 1);
    wrong += r.stored(run.member, run.lba * 512 + i * 8 % 512) != (mix(i) | 1);
  }
  CHECK(wrong == 0);
  cudaFreeHost(flushed);
}
}  // namespace

TEST_CASE("elements written by every GPU thread reach their members after a flush from the GPU") {
  for (const bool gpu_slots : {false, true}) write_and_flush_words(gpu_slots);
}

int main(int argc, char** argv) {
  emu::prepare_cuda_environment();  // the emulators' copies must not queue behind the kernels
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA GPU: the gpu volume suite is skipped\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
