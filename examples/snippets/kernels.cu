// Usage snippets of the device side in kernels (io/reader.cuh, policy/device_group.cuh,
// cache/page_cache.cuh, cache/array.cuh, volume/volume.cuh) and of the host calls that set them
// up (host/gpu/gpu_queue.cuh, host/gpu/gpu_reach.cuh, emu/cuda_memory.cuh). Built by nvcc so they cannot
// drift from the headers; run on the emulator where a CUDA GPU is (each checks the words it read
// against `emu:pattern`), skipped (exit 77) elsewhere. Each kernel or function is the snippet a
// header's comment points to by name.
#include "../example_support.hpp"

#include <cunvme/cunvme.cuh>
#include <cunvme/emu/cuda_memory.cuh>
#include <cunvme/host/gpu/gpu_queue.cuh>
#include <cunvme/host/gpu/gpu_reach.cuh>
#include <cunvme/host/open.cuh>
#include <cunvme/host/owners/page_cache_memory.cuh>
#include <cunvme/host/backend/uri_options.cuh>
#include <cunvme/host/owners/volume_members.cuh>

#include <thrust/device_vector.h>

#include <bit>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace host = cunvme::host;

namespace {

using queue = cunvme::queue_policies<cunvme::slots::warp_aggregated, cunvme::completion::cooperative>;
using reader = cunvme::block_reader<queue, cunvme::prp::page_list, cunvme::doorbell::mmio>;
using shared_queue = cunvme::queue_policies<cunvme::slots::multi_producer, cunvme::completion::cooperative>;
using cache = cunvme::page_cache<shared_queue, cunvme::doorbell::mmio>;

/// Counts the 8-byte words of `data` (namespace bytes from `first_byte`) that are not `pattern_word`.
__global__ void count_mismatches(const std::uint64_t* data, std::uint64_t words, std::uint64_t first_byte, unsigned long long* bad) {
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < words; i += std::uint64_t{gridDim.x} * blockDim.x) {
    if (data[i] != host::pattern_word(first_byte + i * 8)) atomicAdd(bad, 1ull);
  }
}

// ---- io/reader.cuh: the per-thread form ----------------------------------------------------------

/// `block_reader`: every thread reads its own 8 blocks.
__global__ void read_per_thread(reader r, cunvme::prp::page_list dst, unsigned* failed) {
  const auto t = blockIdx.x * blockDim.x + threadIdx.x;
  cunvme::io_result s = r.read(/*lba*/ t * 8ull, /*blocks*/ 8, dst, /*byte offset*/ t * 4096ull);
  if (!s) atomicAdd(failed, 1u);
}

// ---- policy/device_group.cuh: the per-group form ---------------------------------------------------

/// `thread_block_group`: the block's threads split one request into commands of at most MDTS.
__global__ void read_per_block(reader r, cunvme::prp::page_list dst, unsigned* failed) {
  using group = cunvme::thread_block_group<256>;
  __shared__ group::temp_storage storage;
  group g(storage);
  cunvme::io_result s = r.read(g, blockIdx.x * 2048ull, 2048, dst, blockIdx.x * (2048ull << 9));
  if (threadIdx.x == 0 && !s) atomicAdd(failed, 1u);
}

// ---- cache/page_cache.cuh ------------------------------------------------------------------------

/// `page_cache` in a kernel: a value within one page each.
__global__ void read_through_cache(cache c, std::uint64_t* out) {
  const auto i = blockIdx.x * blockDim.x + threadIdx.x;
  std::uint64_t v = 0;
  if (cunvme::io_result r = c.read(i * 4096ull, sizeof v, &v); r) out[i] = v;  // else r says why
}

// ---- cache/array.cuh ------------------------------------------------------------------------------

/// `array<T>`: a warp's gather, and one element with its io_result.
__global__ void gather(cunvme::array<std::uint64_t, cache> a, const std::uint64_t* idx, std::uint64_t* out, std::uint64_t n) {
  __shared__ cunvme::warp_group::temp_storage storage[8];  // policy/device_group.cuh; blocks of 256 threads
  cunvme::warp_group warp(storage[threadIdx.x / 32]);
  const std::uint64_t first = (blockIdx.x * blockDim.x + threadIdx.x) / 32 * 32;
  if (first < n) (void)a.gather(warp, idx + first, n - first < 32 ? n - first : 32, out + first);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    if (auto x = a[7]; x) out[n] = x.value;  // one element, with its io_result
  }
}

// ---- volume/volume.cuh ----------------------------------------------------------------------------

using volume_io = cunvme::volume_io<shared_queue, cunvme::doorbell::mmio>;

/// `volume_io`: 8 blocks per thread, whichever controller holds them.
__global__ void read_volume(volume_io v, cunvme::member_buffers<cunvme::prp::page_list> dst, unsigned* failed) {
  const auto i = blockIdx.x * blockDim.x + threadIdx.x;
  cunvme::io_result r = v.read(i * 8ull, 8, dst, i * 4096ull);
  if (!r) atomicAdd(failed, 1u);
}

/// `prepare_cuda_environment` and `gpu_reach` (host/gpu/gpu_reach.cuh): a controller GPU threads reach.
std::unique_ptr<host::controller> open_for_kernels(const char* uri) {
  // cunvme::host::prepare_cuda_environment() ran first in main (example::run_main).
  return cunvme::host::open(uri, {}, cunvme::host::gpu_reach());
}

/// A GPU buffer as one controller reaches it: its page list in GPU memory.
struct gpu_buffer {
  host::dma_buffer memory;
  thrust::device_vector<std::uint64_t> pages;
  gpu_buffer(host::controller& ctrl, std::size_t bytes) : memory(host::allocate_gpu(ctrl, bytes)), pages(memory.pages()) {}
  [[nodiscard]] cunvme::prp::page_list list() const {
    return {thrust::raw_pointer_cast(pages.data()), static_cast<unsigned>(std::countr_zero(memory.page_size()))};
  }
  [[nodiscard]] const std::uint64_t* words() const { return static_cast<const std::uint64_t*>(memory.device_data()); }
};

unsigned long long mismatches(const std::uint64_t* data, std::uint64_t words, std::uint64_t first_byte) {
  thrust::device_vector<unsigned long long> bad(1, 0);
  count_mismatches<<<64, 256>>>(data, words, first_byte, thrust::raw_pointer_cast(bad.data()));
  example::check(cudaDeviceSynchronize(), "count mismatches");
  return bad[0];
}

/// `make_gpu_queue` (host/gpu/gpu_queue.cuh): a queue for kernels; then the reader forms above.
int readers() {
  auto ctrl = open_for_kernels("emu:pattern");
  auto q = cunvme::host::make_gpu_queue(*ctrl, 1024, cunvme::host::tier::host_queues_gpu_data);
  gpu_buffer dst(*ctrl, 4 * (2048ull << 9));
  thrust::device_vector<unsigned> failed(1, 0);
  read_per_thread<<<8, 128>>>(reader(q->view(), q->namespace_view(1)), dst.list(), thrust::raw_pointer_cast(failed.data()));
  example::check(cudaDeviceSynchronize(), "read_per_thread");
  const auto bad_thread = mismatches(dst.words(), 1024 * 4096 / 8, 0);
  read_per_block<<<4, 256>>>(reader(q->view(), q->namespace_view(1)), dst.list(), thrust::raw_pointer_cast(failed.data()));
  example::check(cudaDeviceSynchronize(), "read_per_block");
  const auto bad_block = mismatches(dst.words(), 4 * (2048ull << 9) / 8, 0);
  std::printf("readers: %u failed, %llu + %llu wrong words\n", static_cast<unsigned>(failed[0]), bad_thread, bad_block);
  return failed[0] == 0 && bad_thread == 0 && bad_block == 0 ? 0 : 1;
}

/// `page_cache_memory::device_view` with bookkeeping in GPU memory, and `array<T>` over it.
int caches() {
  auto ctrl = open_for_kernels("emu:pattern");
  const auto t = cunvme::host::tier::host_queues_gpu_data;
  auto q = cunvme::host::make_gpu_queue(*ctrl, 1024, t);
  cunvme::host::page_cache_memory m(*ctrl, q->namespace_view(1), 4096, 1024, cunvme::host::gpu_bookkeeping(*ctrl, t));
  const cache c(m.device_view(), q->view(), q->namespace_view(1));
  thrust::device_vector<std::uint64_t> out(1025, 0);
  read_through_cache<<<4, 256>>>(c, thrust::raw_pointer_cast(out.data()));
  example::check(cudaDeviceSynchronize(), "read_through_cache");
  unsigned bad = 0;
  for (std::uint64_t i = 0; i < 1024; ++i) bad += out[i] != host::pattern_word(i * 4096);

  const std::uint64_t n = 1024;
  std::vector<std::uint64_t> host_idx(n);
  for (std::uint64_t i = 0; i < n; ++i) host_idx[i] = example::mix(i) % (q->namespace_view(1).lba_count * 512 / 8);
  thrust::device_vector<std::uint64_t> idx(host_idx);
  thrust::device_vector<std::uint64_t> got(n + 1, 0);
  gather<<<n / 256, 256>>>(cunvme::array<std::uint64_t, cache>(c, 0, q->namespace_view(1).lba_count * 512 / 8), thrust::raw_pointer_cast(idx.data()),
                           thrust::raw_pointer_cast(got.data()), n);
  example::check(cudaDeviceSynchronize(), "gather");
  for (std::uint64_t i = 0; i < n; ++i) bad += got[i] != host::pattern_word(host_idx[i] * 8);
  bad += got[n] != host::pattern_word(7 * 8);
  std::printf("caches: %u wrong words\n", bad);
  return bad == 0 ? 0 : 1;
}

/// `host::volume` for kernels: the member table in GPU memory, a buffer mapped for every member.
int volumes() {
  auto a = open_for_kernels("emu:pattern"), b = open_for_kernels("emu:pattern");
  const auto t = cunvme::host::tier::host_queues_gpu_data;
  auto qa = cunvme::host::make_gpu_queue(*a, 1024, t), qb = cunvme::host::make_gpu_queue(*b, 1024, t);
  auto vol = cunvme::host::volume::striped({{{qa.get()}, 1}, {{qb.get()}, 1}}, 64 * 1024, cunvme::host::gpu_bookkeeping(*a, t));
  const std::size_t bytes = 256 * 4096;
  gpu_buffer on_a(*a, bytes);
  host::dma_buffer on_b = b->memory().map_gpu(on_a.memory.device_data(), bytes);
  thrust::device_vector<std::uint64_t> b_pages(on_b.pages());
  thrust::device_vector<cunvme::prp::page_list> lists(std::vector<cunvme::prp::page_list>{
      on_a.list(), {thrust::raw_pointer_cast(b_pages.data()), static_cast<unsigned>(std::countr_zero(on_b.page_size()))}});
  thrust::device_vector<unsigned> failed(1, 0);
  read_volume<<<1, 256>>>(volume_io(vol.device_view()), {thrust::raw_pointer_cast(lists.data())}, thrust::raw_pointer_cast(failed.data()));
  example::check(cudaDeviceSynchronize(), "read_volume");
  // Volume block 8i lies in stripe 8i / 128 (64 KiB stripes of 512 B blocks), on member
  // stripe % 2 at that member's row stripe / 2.
  std::vector<std::uint64_t> words(bytes / 8);
  example::check(cudaMemcpy(words.data(), on_a.words(), bytes, cudaMemcpyDeviceToHost), "copy back");
  unsigned bad = 0;
  for (std::uint64_t w = 0; w < words.size(); ++w) {
    const std::uint64_t volume_byte = w * 8, stripe = volume_byte / (64 * 1024);
    const std::uint64_t member_byte = stripe / 2 * (64 * 1024) + volume_byte % (64 * 1024);
    bad += words[w] != host::pattern_word(member_byte);
  }
  std::printf("volumes: %u failed, %u wrong words\n", static_cast<unsigned>(failed[0]), bad);
  return failed[0] == 0 && bad == 0 ? 0 : 1;
}

/// `cuda_memory` (emu/cuda_memory.cuh): an emulator whose BAR GPU threads ring and which DMAs
/// into GPU memory, built by hand (what `host::open(uri, {}, gpu_reach())` does for `emu`).
int emulator_with_cuda_memory() {
  cunvme::emu::controller_config config;
  config.memory = cunvme::emu::cuda_memory();
  cunvme::emu::controller ctrl(config);
  void* device_buffer = nullptr;
  const std::size_t bytes = 1 << 20;
  example::check(cudaMalloc(&device_buffer, bytes), "cudaMalloc");
  const std::uint64_t bus = ctrl.dma().map(device_buffer, bytes, cunvme::emu::memory_kind::device);
  ctrl.dma().unmap(bus);
  example::check(cudaFree(device_buffer), "cudaFree");
  return 0;
}

}  // namespace

int main() {
  return example::run_main("snippets_kernels", [] { return readers() | caches() | volumes() | emulator_with_cuda_memory(); });
}
