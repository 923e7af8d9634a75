// Thrust-style entry points for users who just want bytes in GPU memory: open a device, then
// `cunvme::copy_n(dev, lba, blocks, dst)` reads into GPU memory and `copy_n(src, blocks, dev,
// lba)` writes from it. Each call launches a suitably sized kernel on the given stream (warps
// split the request into commands of at most MDTS, 32 in flight per warp), waits for it, and
// returns the status of the first failing command by LBA. CUDA host code: include from .cu.
//
// ```
// cunvme::device dev("emu");                          // or "kmod:0000:01:00.0" …
// thrust::device_vector<float> v(1 << 20);
// cunvme::io_result r = cunvme::copy_n(dev, /*lba*/ 0, /*blocks*/ 8192, v);
// ```
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/policy/device_group.cuh>
#include <cunvme/emu/cuda_memory.cuh>
#include <cunvme/detail/checked.cuh>
#include <cunvme/host/gpu_queue.cuh>
#include <cunvme/host/gpu_window.cuh>
#include <cunvme/host/open.cuh>
#include <cunvme/io/reader.cuh>

#include <thrust/memory.h>

#include <cuda.h>
#include <cuda_runtime.h>

#include <cuda/std/span>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

CUNVME_NAMESPACE_BEGIN

struct device_options {
  std::uint32_t nsid = 1;
  /// Queue pairs `copy_n` spreads its warps over: a controller (and the emulator, one worker
  /// thread per queue) serves queues in parallel. At most `device::max_queues`.
  std::uint32_t queues = 8;
  std::uint32_t queue_entries = 1024;
  std::chrono::nanoseconds timeout = std::chrono::seconds(10);
  host::controller_options controller{};
};

/// A controller, GPU queue pairs (queues in pinned host memory, data straight into GPU memory:
/// tier 2) and a namespace, ready for `copy_n`. The emulator (`"emu…"`) is opened with CUDA
/// memory, so its BAR takes GPU doorbell stores and its DMA reaches GPU memory.
class device {
 public:
  using queue_policy = queue<slots::warp_aggregated, completion::cooperative>;
  using reader = block_reader<queue_policy, prp::page_list, doorbell::coalescing<doorbell::mmio>>;
  using writer = block_writer<queue_policy, prp::page_list, doorbell::coalescing<doorbell::mmio>>;
  static constexpr std::uint32_t max_queues = 16;

  /// A kernel argument: the queue pairs and the namespace; warp w reads or writes with `at(w)`.
  template <class Io>
  struct io_set {
    queue_view views[max_queues];
    namespace_view ns;
    std::uint32_t count;
    [[nodiscard]] __device__ Io at(std::uint64_t warp) const { return Io(views[warp % count], ns); }
  };

  explicit device(std::string_view uri = "emu", device_options options = {}) : ctrl_(host::open(uri, options.controller, emu::cuda_memory())) {
    if (options.queues == 0 || options.queues > max_queues) {
      throw host::error("Open", std::string(uri), "device_options::queues must be 1.." + std::to_string(max_queues));
    }
    const std::uint32_t entries = std::min<std::uint32_t>(options.queue_entries, ctrl_->cap().max_queue_entries());
    for (std::uint32_t q = 0; q < options.queues; ++q) {
      queues_.push_back(host::make_gpu_queue(*ctrl_, entries, host::tier::host_queues_gpu_data, options.timeout));
    }
    ns_ = queues_.front()->namespace_view(options.nsid);
  }

  [[nodiscard]] host::controller& controller() noexcept { return *ctrl_; }
  /// The first queue pair (examples that launch their own kernels use this one).
  [[nodiscard]] host::io_queue& queue() noexcept { return *queues_.front(); }
  [[nodiscard]] std::uint32_t queue_count() const noexcept { return static_cast<std::uint32_t>(queues_.size()); }
  [[nodiscard]] const namespace_view& ns() const noexcept { return ns_; }
  /// Bytes per block in the caller's buffer: data, and with extended LBAs the block's metadata.
  [[nodiscard]] std::uint64_t block_bytes() const noexcept { return ns_.block_bytes(); }
  [[nodiscard]] reader make_reader() const { return reader(queues_.front()->view(), ns_); }
  [[nodiscard]] writer make_writer() const { return writer(queues_.front()->view(), ns_); }
  [[nodiscard]] io_set<reader> readers() const { return make_set<reader>(); }
  [[nodiscard]] io_set<writer> writers() const { return make_set<writer>(); }

 private:
  template <class Io>
  [[nodiscard]] io_set<Io> make_set() const {
    io_set<Io> set{};
    for (std::uint32_t q = 0; q < queues_.size(); ++q) set.views[q] = queues_[q]->view();
    set.ns = ns_;
    set.count = static_cast<std::uint32_t>(queues_.size());
    return set;
  }

  std::unique_ptr<host::controller> ctrl_;
  std::vector<std::unique_ptr<host::io_queue>> queues_;
  namespace_view ns_{};
};

namespace detail {

inline constexpr int copy_warps_per_block = 4;

/// Each warp moves `per_warp` blocks (the last warp fewer) with the per-warp form, through
/// queue pair warp % queues.
template <class Io, bool Write>
__global__ void __launch_bounds__(copy_warps_per_block * 32)
    copy_kernel(device::io_set<Io> set, cuda::std::uint64_t lba, cuda::std::uint64_t blocks, prp::page_list buffer, cuda::std::uint64_t offset,
                cuda::std::uint64_t per_warp, io_result* results) {
  __shared__ warp_group::temp_storage storage[copy_warps_per_block];
  warp_group g(storage[threadIdx.x / 32]);
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

/// The GPU allocation `gpu` lies in, [base, base + size), from the driver's
/// cuMemGetAddressRange. Reached through the runtime's driver entry point, so programs need
/// not link libcuda themselves. Throws `host::error` when `gpu` is in no allocation.
[[nodiscard]] inline std::pair<std::uintptr_t, std::size_t> gpu_allocation_of(const void* gpu, const std::string& device) {
  using get_address_range = CUresult (*)(CUdeviceptr*, std::size_t*, CUdeviceptr);  // cuMemGetAddressRange_v2 (CUDA 3.2+)
  static const get_address_range get_range = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<get_address_range>(fn);
  }();
  if (get_range == nullptr) throw host::error("Find the GPU allocation", device, "the CUDA driver offers no cuMemGetAddressRange");
  // Host memory (pageable or pinned) is refused here, without asking the driver for a range it
  // does not have: that failed call would stay a reported error under compute-sanitizer.
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, gpu) != cudaSuccess) (void)cudaGetLastError();
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
    throw host::error("Find the GPU allocation", device,
                      "address " + std::to_string(reinterpret_cast<std::uintptr_t>(gpu)) + " is not GPU memory (cudaPointerGetAttributes)");
  }
  CUdeviceptr base = 0;
  std::size_t size = 0;
  const CUresult r = get_range(&base, &size, reinterpret_cast<CUdeviceptr>(gpu));
  if (r != CUDA_SUCCESS) {
    throw host::error("Find the GPU allocation", device,
                      "address " + std::to_string(reinterpret_cast<std::uintptr_t>(gpu)) + " is in no GPU allocation (cuMemGetAddressRange: CUresult " +
                          std::to_string(static_cast<int>(r)) + ")");
  }
  return {static_cast<std::uintptr_t>(base), size};
}

template <bool Write>
[[nodiscard]] io_result transfer(device& dev, cuda::std::uint64_t lba, cuda::std::uint64_t blocks, void* gpu, std::size_t capacity,
                                 cudaStream_t stream) {
  const namespace_view& ns = dev.ns();
  // Refused before anything is mapped or launched: separate metadata needs MPTR (metadata).
  if (!ns.transferable()) return io_result::failure(io_error::metadata_unsupported, lba, 0);
  if (blocks == 0 || gpu == nullptr) return io_result::failure(io_error::invalid_request, lba, 0);
  // The byte count (block_bytes() per block: extended LBAs carry their metadata) must fit the
  // buffer (a division: no wrap), and the LBA range must not wrap.
  if (blocks > capacity / ns.block_bytes() || lba > ~cuda::std::uint64_t{0} - (blocks - 1)) return io_result::failure(io_error::invalid_request, lba, 0);
  // Commands after the first start max_blocks x block_bytes() apart: not whole dwords, a later
  // one would be refused (PRP1 unaligned) after other warps' commands ran.
  if (blocks > ns.max_blocks && (std::uint64_t{ns.max_blocks} * ns.block_bytes()) % 4 != 0) return io_result::failure(io_error::invalid_request, lba, 0);
  const std::uint64_t bytes = blocks * ns.block_bytes();
  // Map the buffer's pages for the controller for the duration of the call: only pages of
  // its own allocation (a GPU page below it, or past its end, may belong to another one,
  // and peer-to-peer pinning of it fails or pins someone else's memory).
  const std::string& name = dev.controller().name();
  const auto address = reinterpret_cast<std::uintptr_t>(gpu);
  const auto [base, size] = gpu_allocation_of(gpu, name);
  constexpr std::size_t gpu_page = 64 * 1024;
  const host::gpu_window window = host::gpu_window::of(address, static_cast<std::size_t>(bytes), base, size, gpu_page, name);
  host::dma_buffer mapped = dev.controller().memory().map_gpu_range(reinterpret_cast<void*>(window.start), window.bytes);
  const host::gpu_page_table table = host::gpu_page_table::of(mapped, window, address, name);
  // The page table and the per-warp results in pinned, mapped memory the kernel reads. A warp
  // takes 32 commands of MDTS, or less so that every queue pair gets warps.
  std::uint64_t per_warp = std::max<std::uint64_t>(ns.max_blocks, std::min<std::uint64_t>(std::uint64_t{32} * ns.max_blocks,
                                                                                          (blocks + dev.queue_count() - 1) / dev.queue_count()));
  // Warps start per_warp x block_bytes() apart: whole dwords, as each one's PRP1 must be
  // (extended LBAs make block_bytes() any size). At most three steps.
  while ((per_warp * ns.block_bytes()) % 4 != 0) ++per_warp;
  const std::uint64_t warps = (blocks + per_warp - 1) / per_warp;
  std::uint64_t* pages = nullptr;
  io_result* results = nullptr;
  host::detail::check_cuda(cudaHostAlloc(&pages, table.pages.size() * 8, cudaHostAllocMapped), "Allocate a page table", dev.controller().name());
  std::unique_ptr<std::uint64_t, decltype(&cudaFreeHost)> pages_owner(pages, &cudaFreeHost);
  host::detail::check_cuda(cudaHostAlloc(&results, warps * sizeof(io_result), cudaHostAllocMapped), "Allocate results", dev.controller().name());
  std::unique_ptr<io_result, decltype(&cudaFreeHost)> results_owner(results, &cudaFreeHost);
  std::copy(table.pages.begin(), table.pages.end(), pages);
  const prp::page_list buffer{pages, table.page_shift};
  const auto grid = static_cast<unsigned>((warps + copy_warps_per_block - 1) / copy_warps_per_block);
  if constexpr (Write) {
    copy_kernel<device::writer, true><<<grid, copy_warps_per_block * 32, 0, stream>>>(dev.writers(), lba, blocks, buffer, table.offset,
                                                                                     per_warp, results);
  } else {
    copy_kernel<device::reader, false><<<grid, copy_warps_per_block * 32, 0, stream>>>(dev.readers(), lba, blocks, buffer, table.offset,
                                                                                      per_warp, results);
  }
  host::detail::check_cuda(cudaGetLastError(), Write ? "Launch the write kernel" : "Launch the read kernel", dev.controller().name());
  host::detail::check_cuda(cudaStreamSynchronize(stream), Write ? "Run the write kernel" : "Run the read kernel", dev.controller().name());
  io_result first{};
  for (std::uint64_t w = 0; w < warps; ++w) {
    if (!results[w].ok() && (first.ok() || results[w].lba < first.lba)) first = results[w];
  }
  return first;
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

/// Reads `blocks` logical blocks at `lba` into GPU memory at `dst` (a raw pointer or a
/// thrust::device_ptr). Only pages of `dst`'s own allocation are mapped for the controller: a
/// transfer running past the allocation's end (or a pointer outside any allocation) throws
/// `host::error` naming the allocation.
template <class Pointer>
  requires(!detail::contiguous_device_range<Pointer>)
[[nodiscard]] io_result copy_n(device& dev, std::uint64_t lba, std::uint64_t blocks, Pointer dst, cudaStream_t stream = nullptr) {
  return detail::transfer<false>(dev, lba, blocks, static_cast<void*>(detail::raw(dst)), ~std::size_t{0}, stream);
}

/// Reads into a GPU container (thrust::device_vector, cuda::std::span over GPU memory); a
/// request larger than the container is refused (invalid_request).
template <detail::contiguous_device_range Range>
[[nodiscard]] io_result copy_n(device& dev, std::uint64_t lba, std::uint64_t blocks, Range&& dst, cudaStream_t stream = nullptr) {
  using value = std::remove_reference_t<decltype(*detail::raw(dst.data()))>;
  return detail::transfer<false>(dev, lba, blocks, static_cast<void*>(detail::raw(dst.data())), detail::container_bytes(dst.size(), sizeof(value)), stream);
}

/// Writes `blocks` logical blocks from GPU memory at `src` to `lba`; a range outside `src`'s
/// allocation throws `host::error`, as for reads.
template <class Pointer>
  requires(!detail::contiguous_device_range<Pointer>)
[[nodiscard]] io_result copy_n(Pointer src, std::uint64_t blocks, device& dev, std::uint64_t lba, cudaStream_t stream = nullptr) {
  return detail::transfer<true>(dev, lba, blocks, const_cast<void*>(static_cast<const void*>(detail::raw(src))), ~std::size_t{0}, stream);
}

/// Writes from a GPU container; more blocks than it holds is refused.
template <detail::contiguous_device_range Range>
[[nodiscard]] io_result copy_n(const Range& src, std::uint64_t blocks, device& dev, std::uint64_t lba, cudaStream_t stream = nullptr) {
  using value = std::remove_reference_t<decltype(*detail::raw(src.data()))>;
  return detail::transfer<true>(dev, lba, blocks, const_cast<void*>(static_cast<const void*>(detail::raw(src.data()))), detail::container_bytes(src.size(), sizeof(value)), stream);
}

CUNVME_NAMESPACE_END
