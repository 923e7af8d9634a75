// The page cache's device side — acquire, release, page_ref, read, write and flush — compiled
// for the device (sm_80 and sm_90 by the build's -gencode flags) with two queue compositions.
// Building this file is the test; running it checks on the host that each kernel got code for
// this GPU architecture list. No GPU runs it here: the cache's behaviour is tested on CPU threads
// (page_cache_test.cpp) through the same code.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <cunvme/cache/array.cuh>
#include <cunvme/cache/page_cache.cuh>
#include <cunvme/io/reader.cuh>
#include <cunvme/policy/device_group.cuh>
#include <cunvme/volume/volume.cuh>

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <type_traits>

namespace {

using namespace cunvme;

/// Each thread takes a page for writing and marks it, reads and writes a word through the
/// cache, holds another page by page_ref, and thread 0 flushes.
template <class Cache>
__global__ void use_cache(Cache cache, cuda::std::uint64_t* sums, io_result* out) {
  const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
  const cuda::std::uint64_t page = t % cache.pages();
  io_result first{};
  const cached_page p = cache.acquire(page, page_access::write);
  if (p.ok()) {
    p.data[t % cache.page_bytes()] = static_cast<unsigned char>(t);
    cache.release(page);
  } else {
    first = p.result;
  }
  cuda::std::uint64_t value = 0;
  const io_result r = cache.read(page * cache.page_bytes() + 8, sizeof value, &value);
  const io_result w = cache.write(page * cache.page_bytes() + 16, sizeof value, &value);
  {
    page_ref held(cache, (page + 1) % cache.pages(), page_access::read);
    if (held.ok()) sums[t] = value + held.data()[0];
    else if (first.ok()) first = held.result();
  }
  if (first.ok()) first = !r ? r : w;
  if (t == 0 && first.ok()) first = cache.flush();
  out[t] = first;
}

/// array<T> over a cache: an element per thread, a write, and a warp's gather.
template <class Cache>
__global__ void use_array(array<float, Cache> a, const cuda::std::uint64_t* indices, float* out, io_result* results) {
  __shared__ warp_group::temp_storage storage[4];
  warp_group warp(storage[threadIdx.x / 32]);
  const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
  const element<float> x = a[t];
  io_result r = x.result;
  if (r.ok()) r = a.set(t, x.value + 1.0f);
  const cuda::std::uint64_t first = t / 32 * 32;
  const io_result g = a.gather(warp, indices + first, 32, out + first);
  results[t] = r.ok() ? g : r;
}

/// volume_io per thread: a read, a write and a flush over member buffers.
template <class Io>
__global__ void use_volume(Io io, member_buffers<prp::page_list> buffers, io_result* results) {
  const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
  io_result r = io.read(t * 8ull, 8, buffers, t * 4096ull);
  if (r.ok()) r = io.write(t * 8ull, 8, buffers, t * 4096ull);
  if (r.ok() && t == 0) r = io.flush();
  results[t] = r;
}

template <class Slots, class Completion, class Doorbell>
const void* instantiate_array() {
  return reinterpret_cast<const void*>(&use_array<page_cache<queue_policies<Slots, Completion>, Doorbell>>);
}
template <class Slots, class Completion, class Doorbell>
const void* instantiate_volume() {
  return reinterpret_cast<const void*>(&use_volume<volume_io<queue_policies<Slots, Completion>, Doorbell>>);
}

template <class Slots, class Completion, class Doorbell>
const void* instantiate() {
  return reinterpret_cast<const void*>(&use_cache<page_cache<queue_policies<Slots, Completion>, Doorbell>>);
}

}  // namespace

TEST_CASE("the page cache compiles for the device with a shared queue, cooperative or polled, MMIO or coalesced shadow doorbells") {
  const void* kernels[] = {
      instantiate<slots::multi_producer, completion::cooperative, doorbell::mmio>(),
      instantiate<slots::warp_aggregated, completion::dedicated_poller, doorbell::coalescing<doorbell::shadow>>(),
  };
  for (const void* k : kernels) CHECK(k != nullptr);
}

TEST_CASE("array<T> and volume_io compile for the device, per thread and per warp") {
  const void* kernels[] = {
      instantiate_array<slots::multi_producer, completion::cooperative, doorbell::mmio>(),
      instantiate_array<slots::warp_aggregated, completion::dedicated_poller, doorbell::coalescing<doorbell::shadow>>(),
      instantiate_volume<slots::multi_producer, completion::cooperative, doorbell::mmio>(),
      instantiate_volume<slots::warp_aggregated, completion::dedicated_poller, doorbell::coalescing<doorbell::shadow>>(),
  };
  for (const void* k : kernels) CHECK(k != nullptr);
}

TEST_CASE("a page cache is trivially copyable, so kernels take it by value") {
  using cache = page_cache<queue_policies<slots::multi_producer, completion::cooperative>, doorbell::mmio>;
  CHECK(std::is_trivially_copyable_v<cache>);
  CHECK(std::is_trivially_copyable_v<page_cache_view>);
  CHECK(std::is_trivially_copyable_v<cached_page>);
  CHECK(std::is_trivially_copyable_v<array<float, cache>>);
  CHECK(std::is_trivially_copyable_v<volume_view>);
  CHECK(std::is_trivially_copyable_v<volume_io<queue_policies<slots::multi_producer, completion::cooperative>, doorbell::mmio>>);
}
