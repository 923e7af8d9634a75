// Thrust-style entry points for users who just want bytes in GPU memory: open a device, then
// `cunvme::copy_n(dev, lba, blocks, dst, stream)` reads into GPU memory and `copy_n(src, blocks,
// dev, lba, stream)` writes from it. Each call enqueues one kernel on `stream` (warps split the
// request into commands of at most MDTS, `copy_tuning` says how many in flight per warp) and
// returns a `pending_copy` at once; `copy_n_sync` waits for it. CUDA host code: include from .cu.
//
// Errors, one channel each: what stops a copy from being enqueued (memory outside one GPU
// allocation, a freed registered buffer, CUDA failing to allocate or launch) throws
// `host::error`; the outcome of the I/O (an NVMe status, a timeout, a request the namespace or
// the buffer cannot take) is the `io_result` that `pending_copy::wait()` returns, that of the
// first failing command by LBA.
//
// Usage: examples/snippets/facade.cu, `copies`.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/checked.cuh>
#include <cunvme/facade/device.cuh>
#include <cunvme/facade/pending_copy.cuh>
#include <cunvme/io/reader.cuh>
#include <cunvme/io/request_plan.cuh>
#include <cunvme/policy/device_group.cuh>

#include <thrust/memory.h>

#include <cuda_runtime.h>

#include <cuda/std/span>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <type_traits>
#include <utility>

CUNVME_NAMESPACE_BEGIN

namespace detail {

/// Each warp moves `per_warp` blocks (the last warp fewer) with the per-warp form, through
/// queue pair warp % queues. Shared memory: one `warp_group::temp_storage` per warp, sized at
/// launch from the tuning's warps per block.
template <class Io, bool Write>
__global__ void __launch_bounds__(copy_tuning::max_warps_per_block * 32)
    copy_kernel(device::io_set<Io> set, cuda::std::uint64_t lba, cuda::std::uint64_t blocks, prp::page_list buffer, cuda::std::uint64_t offset,
                cuda::std::uint64_t per_warp, io_result* results) {
  extern __shared__ warp_group::temp_storage copy_storage[];
  warp_group g(copy_storage[threadIdx.x / 32]);
  const cuda::std::uint64_t warp = (cuda::std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  const Io io = set.at(warp);
  const cuda::std::uint64_t first = warp * per_warp;
  if (first >= blocks) return;  // whole warps only: `first` is the same for every lane
  const cuda::std::uint64_t n = blocks - first < per_warp ? blocks - first : per_warp;
  const cuda::std::uint64_t at = offset + first * io.ns().block_bytes();
  io_result r;
  if constexpr (Write) {
    r = io.write(g, lba + first, n, buffer, at);
  } else {
    r = io.read(g, lba + first, n, buffer, at);
  }
  if (g.rank() == 0) results[warp] = r;
}

/// A raw pointer from a pointer, a thrust::device_ptr, or a container's data().
template <class P>
[[nodiscard]] auto raw(P p) {
  return thrust::raw_pointer_cast(p);
}

template <bool Write>
[[nodiscard]] pending_copy transfer(device& dev, cuda::std::uint64_t lba, cuda::std::uint64_t blocks, void* gpu, std::size_t capacity,
                                   cudaStream_t stream) {
  const namespace_view& ns = dev.ns();
  // Refused before anything is mapped or launched: separate metadata needs MPTR (metadata).
  if (!ns.transferable()) return pending_copy(io_result::failure(io_error::metadata_unsupported, lba, 0));
  if (gpu == nullptr) return pending_copy(io_result::failure(io_error::invalid_request, lba, 0));
  // The byte count (block_bytes() per block: extended LBAs carry their metadata) must fit the
  // buffer (a division: no wrap).
  if (blocks > capacity / ns.block_bytes()) return pending_copy(io_result::failure(io_error::invalid_request, lba, 0));
  // Zero blocks, a wrapping range, a split that could not start every command dword aligned (a
  // later one would be refused after other warps' commands ran) or a range past the end:
  // refused before anything is mapped or launched.
  const request_plan plan = plan_request(ns, lba, blocks);
  if (!plan.ok()) return pending_copy(to_io_result(plan));
  const copy_tuning& tuning = dev.tuning();
  // A warp takes commands_per_warp commands of MDTS, or less so that every queue pair gets warps.
  std::uint64_t per_warp = std::max<std::uint64_t>(
      plan.per_command, std::min<std::uint64_t>(tuning.commands_per_warp * plan.per_command, (blocks + dev.queue_count() - 1) / dev.queue_count()));
  // Warps start per_warp x block_bytes() apart: whole dwords, as each one's PRP1 must be
  // (extended LBAs make block_bytes() any size). At most three steps.
  while ((per_warp * ns.block_bytes()) % 4 != 0) ++per_warp;
  const std::uint64_t warps = (blocks + per_warp - 1) / per_warp;
  const auto grid = static_cast<unsigned>((warps + tuning.warps_per_block - 1) / tuning.warps_per_block);
  const auto threads = static_cast<unsigned>(tuning.warps_per_block * 32);
  const std::size_t shared = static_cast<std::size_t>(tuning.warps_per_block) * sizeof(warp_group::temp_storage);
  return dev.enqueue(gpu, static_cast<std::size_t>(blocks * ns.block_bytes()), warps, stream, Write ? "Run the write kernel" : "Run the read kernel",
                     [&](prp::page_list buffer, std::uint64_t offset, io_result* results) {
                       if constexpr (Write) {
                         copy_kernel<device::writer, true><<<grid, threads, shared, stream>>>(dev.writers(), lba, blocks, buffer, offset, per_warp, results);
                       } else {
                         copy_kernel<device::reader, false><<<grid, threads, shared, stream>>>(dev.readers(), lba, blocks, buffer, offset, per_warp, results);
                       }
                     });
}

/// Bytes of `count` elements of `element` bytes; a product past 2^64 cannot be a real
/// container and reads as "no limit" (the allocation check still bounds the transfer).
[[nodiscard]] inline std::size_t container_bytes(std::size_t count, std::size_t element) noexcept {
  std::size_t bytes = 0;
  return cunvme::detail::mul_overflows(count, element, bytes) ? ~std::size_t{0} : bytes;
}

template <class C>
concept contiguous_device_range = requires(C& c) {
  c.data();
  { c.size() } -> std::convertible_to<std::size_t>;
};

}  // namespace detail

/// Enqueues a read of `blocks` logical blocks at `lba` into GPU memory at `dst` (a raw pointer
/// or a thrust::device_ptr) on `stream`. Only pages of `dst`'s own allocation are mapped for
/// the controller: a transfer running past the allocation's end (or a pointer outside any
/// allocation) throws `host::error` naming the allocation.
template <class Pointer>
  requires(!detail::contiguous_device_range<Pointer>)
[[nodiscard]] pending_copy copy_n(device& dev, std::uint64_t lba, std::uint64_t blocks, Pointer dst, cudaStream_t stream = nullptr) {
  return detail::transfer<false>(dev, lba, blocks, static_cast<void*>(detail::raw(dst)), ~std::size_t{0}, stream);
}

/// Enqueues a read into a GPU container (thrust::device_vector, cuda::std::span over GPU
/// memory); a request larger than the container is refused (invalid_request).
template <detail::contiguous_device_range Range>
[[nodiscard]] pending_copy copy_n(device& dev, std::uint64_t lba, std::uint64_t blocks, Range&& dst, cudaStream_t stream = nullptr) {
  using value = std::remove_reference_t<decltype(*detail::raw(dst.data()))>;
  return detail::transfer<false>(dev, lba, blocks, static_cast<void*>(detail::raw(dst.data())), detail::container_bytes(dst.size(), sizeof(value)), stream);
}

/// Enqueues a write of `blocks` logical blocks from GPU memory at `src` to `lba`; a range
/// outside `src`'s allocation throws `host::error`, as for reads.
template <class Pointer>
  requires(!detail::contiguous_device_range<Pointer>)
[[nodiscard]] pending_copy copy_n(Pointer src, std::uint64_t blocks, device& dev, std::uint64_t lba, cudaStream_t stream = nullptr) {
  return detail::transfer<true>(dev, lba, blocks, const_cast<void*>(static_cast<const void*>(detail::raw(src))), ~std::size_t{0}, stream);
}

/// Enqueues a write from a GPU container; more blocks than it holds is refused.
template <detail::contiguous_device_range Range>
[[nodiscard]] pending_copy copy_n(const Range& src, std::uint64_t blocks, device& dev, std::uint64_t lba, cudaStream_t stream = nullptr) {
  using value = std::remove_reference_t<decltype(*detail::raw(src.data()))>;
  return detail::transfer<true>(dev, lba, blocks, const_cast<void*>(static_cast<const void*>(detail::raw(src.data()))),
                                detail::container_bytes(src.size(), sizeof(value)), stream);
}

/// `copy_n`, then `wait()`: blocks until `stream` has run the copy, and returns its outcome.
template <class... Args>
[[nodiscard]] io_result copy_n_sync(Args&&... args) {
  return cunvme::copy_n(std::forward<Args>(args)...).wait();
}

CUNVME_NAMESPACE_END
