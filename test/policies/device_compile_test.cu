// Every policy combination, in every reader form, instantiated for the device (sm_80 and
// sm_90 by the build's -gencode flags). Building this file is the test; running it checks
// on the host side that each kernel got code for this GPU architecture list.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <cunvme/policy/device_group.cuh>
#include <cunvme/io/reader.cuh>

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <tuple>

namespace {

using namespace cunvme;

template <class Queue, class Prp, class Doorbell>
__global__ void per_thread(block_reader<Queue, Prp, Doorbell> r, block_writer<Queue, Prp, Doorbell> w, Prp buffer, io_result* out) {
  const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
  io_result a = r.read(t * 8ull, 8, buffer, t * 4096ull);
  io_result b = w.write(t * 8ull, 8, buffer, t * 4096ull);
  io_result c = w.flush();
  out[t] = !a ? a : !b ? b : c;
}

template <class Queue, class Prp, class Doorbell>
__global__ void per_warp(block_reader<Queue, Prp, Doorbell> r, block_writer<Queue, Prp, Doorbell> w, Prp buffer, io_result* out) {
  __shared__ warp_group::temp_storage storage[4];
  warp_group g(storage[threadIdx.x / 32]);
  const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  io_result a = r.read(g, warp * 4096ull, 4096, buffer, warp * (4096ull << 9));
  io_result b = w.write(g, warp * 4096ull, 4096, buffer, warp * (4096ull << 9));
  io_result c = w.flush(g);
  if (g.rank() == 0) out[warp] = !a ? a : !b ? b : c;
}

template <class Queue, class Prp, class Doorbell>
__global__ void per_block(block_reader<Queue, Prp, Doorbell> r, block_writer<Queue, Prp, Doorbell> w, Prp buffer, io_result* out) {
  using group = thread_block_group<128>;
  __shared__ group::temp_storage storage;
  group g(storage);
  io_result a = r.read(g, blockIdx.x * 65536ull, 65536, buffer, blockIdx.x * (65536ull << 9));
  io_result b = w.write(g, blockIdx.x * 65536ull, 65536, buffer, blockIdx.x * (65536ull << 9));
  if (threadIdx.x == 0) out[blockIdx.x] = !a ? a : b;
}

template <class Queue, class Prp, class Doorbell>
__global__ void asynchronous(block_reader<Queue, Prp, Doorbell> r, Prp buffer, io_result* out) {
  const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
  io_handle h[4];
  for (unsigned i = 0; i < 4; ++i) h[i] = r.submit_read((t * 4 + i) * 8ull, 8, buffer, (t * 4 + i) * 4096ull);
  io_result first{};
  for (auto& one : h) {
    // test() never blocks; wait() is bounded by the queue's timeout.
    const io_result done = r.test(one) ? one.result : r.wait(one);
    if (first.ok()) first = done;
  }
  out[t] = first;
}

template <class Slots, class Completion>
__global__ void poll(queue_view q, cuda::std::uint32_t* stop, unsigned long long* consumed) {
  *consumed = completion::poller<doorbell::mmio>::run(q, *stop);
}

/// Takes the address of each kernel (forcing its instantiation) and asks the runtime about it.
template <class Slots, class Completion, class Doorbell, class Prp>
int instantiate() {
  using queue_t = queue_policies<Slots, Completion>;
  const void* kernels[] = {
      reinterpret_cast<const void*>(&per_thread<queue_t, Prp, Doorbell>),
      reinterpret_cast<const void*>(&per_warp<queue_t, Prp, Doorbell>),
      reinterpret_cast<const void*>(&per_block<queue_t, Prp, Doorbell>),
      reinterpret_cast<const void*>(&asynchronous<queue_t, Prp, Doorbell>),
      reinterpret_cast<const void*>(&poll<Slots, Completion>),
  };
  int count = 0;
  for (const void* k : kernels) count += k != nullptr;
  return count;
}

template <class Slots, class Completion, class Prp>
int every_doorbell() {
  return instantiate<Slots, Completion, doorbell::mmio, Prp>() + instantiate<Slots, Completion, doorbell::shadow, Prp>() +
         instantiate<Slots, Completion, doorbell::coalescing<doorbell::mmio>, Prp>() +
         instantiate<Slots, Completion, doorbell::coalescing<doorbell::shadow>, Prp>();
}

template <class Slots, class Prp>
int every_completion() {
  return every_doorbell<Slots, completion::cooperative, Prp>() + every_doorbell<Slots, completion::dedicated_poller, Prp>();
}

template <class Prp>
int every_slot_policy() {
  return every_completion<slots::exclusive, Prp>() + every_completion<slots::warp_aggregated, Prp>() +
         every_completion<slots::multi_producer, Prp>();
}

}  // namespace

TEST_CASE("every slot × completion × doorbell × PRP combination compiles for the device in every reader form") {
  const int kernels = every_slot_policy<prp::contiguous>() + every_slot_policy<prp::page_list>();
  CHECK(kernels == 3 * 2 * 4 * 2 * 5);
}

TEST_CASE("a reader is trivially copyable, so kernels take it by value") {
  using reader = block_reader<queue_policies<slots::warp_aggregated, completion::cooperative>, prp::contiguous, doorbell::mmio>;
  CHECK(std::is_trivially_copyable_v<reader>);
  CHECK(std::is_trivially_copyable_v<io_handle>);
}
