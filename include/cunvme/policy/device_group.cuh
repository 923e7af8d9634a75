// GPU groups for the collective reader forms: a whole warp, or a whole thread block, built on
// CUB's warp and block primitives. Device code only (include from .cu files).
//
// Usage: examples/snippets/kernels.cu, `read_per_block`.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/policy/group.cuh>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/warp/warp_reduce.cuh>
#include <cub/warp/warp_scan.cuh>

#include <cuda/functional>
#include <cuda/std/cstdint>

CUNVME_NAMESPACE_BEGIN

/// All 32 lanes of a warp, converged: every lane must call each collective operation.
///
/// When to choose it: the per-warp reader form (a warp splits one request into up to 32
/// commands issued together); with `slots::warp_aggregated` the warp takes its SQ slots with
/// one atomic.
class warp_group {
 public:
  struct temp_storage {
    typename cub::WarpScan<cuda::std::uint32_t>::TempStorage scan;
    typename cub::WarpReduce<cuda::std::uint64_t>::TempStorage reduce;
  };
  __device__ explicit warp_group(temp_storage& storage) noexcept : storage_(storage) {}

  [[nodiscard]] __device__ cuda::std::uint32_t rank() const noexcept { return threadIdx.x % 32u; }
  [[nodiscard]] __device__ constexpr cuda::std::uint32_t size() const noexcept { return 32; }
  __device__ void sync() const noexcept { __syncwarp(); }
  [[nodiscard]] __device__ cuda::std::uint32_t exclusive_sum(cuda::std::uint32_t count, cuda::std::uint32_t& total) noexcept {
    cuda::std::uint32_t below = 0;
    cub::WarpScan<cuda::std::uint32_t>(storage_.scan).ExclusiveSum(count, below, total);
    __syncwarp();  // the scan's storage is reused by the next call
    return below;
  }
  [[nodiscard]] __device__ cuda::std::uint64_t broadcast(cuda::std::uint64_t value, cuda::std::uint32_t source) const noexcept {
    return __shfl_sync(0xffffffffu, value, static_cast<int>(source));
  }
  [[nodiscard]] __device__ cuda::std::uint64_t min(cuda::std::uint64_t value) noexcept {
    const cuda::std::uint64_t lowest = cub::WarpReduce<cuda::std::uint64_t>(storage_.reduce).Reduce(value, ::cuda::minimum<>{});
    __syncwarp();
    return __shfl_sync(0xffffffffu, lowest, 0);  // WarpReduce leaves the result in lane 0
  }
  [[nodiscard]] __device__ bool any(bool flag) const noexcept { return __any_sync(0xffffffffu, flag) != 0; }

 private:
  temp_storage& storage_;
};
static_assert(thread_group<warp_group>);

/// All threads of a thread block of `BlockThreads` (1-D) threads: every thread must call each
/// collective operation (each is a __syncthreads barrier).
///
/// When to choose it: the per-thread-block form, for large requests split across up to
/// `BlockThreads` commands at once (one thread block streaming a file region, say). Named
/// as cooperative groups name it (`thread_block`): in this library a bare "block" is a
/// logical block (LBA), as in `block_reader`.
/// @tparam BlockThreads the thread-block size the kernel is launched with
template <int BlockThreads>
class thread_block_group {
  static_assert(BlockThreads > 0 && BlockThreads <= 1024, "a thread block has 1 to 1024 threads");
  using scan = cub::BlockScan<cuda::std::uint32_t, BlockThreads>;
  using reduce = cub::BlockReduce<cuda::std::uint64_t, BlockThreads>;

 public:
  struct temp_storage {
    union {
      typename scan::TempStorage scan;
      typename reduce::TempStorage reduce;
    } cub;
    cuda::std::uint64_t shared;
  };
  __device__ explicit thread_block_group(temp_storage& storage) noexcept : storage_(storage) {}

  [[nodiscard]] __device__ cuda::std::uint32_t rank() const noexcept { return threadIdx.x; }
  [[nodiscard]] __device__ constexpr cuda::std::uint32_t size() const noexcept { return BlockThreads; }
  __device__ void sync() const noexcept { __syncthreads(); }
  [[nodiscard]] __device__ cuda::std::uint32_t exclusive_sum(cuda::std::uint32_t count, cuda::std::uint32_t& total) noexcept {
    cuda::std::uint32_t below = 0;
    scan(storage_.cub.scan).ExclusiveSum(count, below, total);
    __syncthreads();
    return below;
  }
  [[nodiscard]] __device__ cuda::std::uint64_t broadcast(cuda::std::uint64_t value, cuda::std::uint32_t source) noexcept {
    if (threadIdx.x == source) storage_.shared = value;
    __syncthreads();
    const cuda::std::uint64_t result = storage_.shared;
    __syncthreads();
    return result;
  }
  [[nodiscard]] __device__ cuda::std::uint64_t min(cuda::std::uint64_t value) noexcept {
    const cuda::std::uint64_t lowest = reduce(storage_.cub.reduce).Reduce(value, ::cuda::minimum<>{});
    __syncthreads();
    return broadcast(lowest, 0);  // BlockReduce leaves the result in thread 0
  }
  [[nodiscard]] __device__ bool any(bool flag) const noexcept { return __syncthreads_or(flag) != 0; }

 private:
  temp_storage& storage_;
};
static_assert(thread_group<thread_block_group<128>>);

CUNVME_NAMESPACE_END
