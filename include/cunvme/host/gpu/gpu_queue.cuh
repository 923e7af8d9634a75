// Queue pairs for kernels: GPU memory the controller can reach, and io_queues placed in one of
// the three memory tiers, with their bookkeeping (counters, turns, CIDs, records) in GPU
// memory so the submitters' atomics never cross PCIe. CUDA host code: include from .cu files.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/checked.cuh>
#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/cuda_error.cuh>
#include <cunvme/host/queue/io_queue.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// Where queues and data live (DESIGN.md "Where memory lives").
enum class tier : std::uint8_t {
  host_queues_host_data = 1,  ///< any CUDA GPU: queues and data in pinned host memory
  host_queues_gpu_data = 2,   ///< queues in pinned host memory, data DMA'd straight into GPU memory
  gpu_queues_gpu_data = 3,    ///< queues and data in GPU memory: the controller reads SQEs from the GPU
};

namespace detail {
/// Runs `op(stream)` on a stream of its own and waits for it: the legacy default stream would
/// wait for (and be waited for by) every blocking stream of the process, so a copy of
/// bookkeeping could hang behind a user's kernel, and a memset issued there could still be
/// running when a kernel on a non-blocking stream reads the memory.
template <class Op>
void on_private_stream(Op&& op, const char* what, const std::string& name) {
  cudaStream_t s = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), what, name);
  const cudaError_t issued = op(s);
  const cudaError_t done = cudaStreamSynchronize(s);
  (void)cudaStreamDestroy(s);
  cuda_check(issued != cudaSuccess ? issued : done, what, name);
}
}  // namespace detail

/// `bytes` of zeroed GPU memory made reachable by the controller (`dma_allocator::map_gpu`:
/// peer-to-peer on real controllers, the emulator's IOMMU otherwise). Starts on a 64 KiB
/// boundary, as GPU pages do, or on the controller page (CC.MPS) where that is larger, so it
/// can hold queues and PRP lists. Released (unmapped and freed) with the buffer.
[[nodiscard]] inline dma_buffer allocate_gpu(controller& ctrl, std::size_t bytes) {
  if (bytes == 0) throw error("Allocate GPU memory", ctrl.name(), "0 bytes asked for");
  const std::size_t gpu_page = std::max<std::size_t>(64 * 1024, ctrl.page_bytes());
  std::size_t reserved = 0;
  if (cunvme::detail::add_overflows(bytes, gpu_page, reserved)) {
    throw error("Allocate GPU memory", ctrl.name(), std::to_string(bytes) + " bytes do not fit the address space");
  }
  void* raw = nullptr;
  cuda_check(cudaMalloc(&raw, reserved), "Allocate " + std::to_string(bytes) + " bytes of GPU memory", ctrl.name());
  auto* aligned = reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(raw) + gpu_page - 1) / gpu_page * gpu_page);
  try {
    detail::on_private_stream([&](cudaStream_t s) { return cudaMemsetAsync(aligned, 0, bytes, s); }, "Zero GPU memory", ctrl.name());
    auto mapped = std::make_shared<dma_buffer>(ctrl.memory().map_gpu(aligned, bytes));
    std::vector<std::uint64_t> pages = mapped->pages();
    const std::size_t page_size = mapped->page_size();
    return dma_buffer(nullptr, aligned, bytes, page_size, std::move(pages), memory_location::gpu, [mapped, raw]() mutable {
      mapped.reset();  // unmap before the memory goes
      (void)cudaFree(raw);
    });
  } catch (...) {
    (void)cudaFree(raw);
    throw;
  }
}

/// Bookkeeping in GPU memory, PRP lists where the tier puts data (GPU memory for tier 3).
[[nodiscard]] inline io_queue_memory gpu_bookkeeping(controller& ctrl, tier t) {
  io_queue_memory m;
  const std::string name = ctrl.name();
  m.bookkeeping = [name](std::size_t bytes) {
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, bytes), "Allocate queue bookkeeping in GPU memory", name);
    try {
      detail::on_private_stream([&](cudaStream_t s) { return cudaMemsetAsync(p, 0, bytes, s); }, "Zero queue bookkeeping", name);
    } catch (...) {
      (void)cudaFree(p);
      throw;
    }
    return dma_buffer(nullptr, p, bytes, 4096, {}, memory_location::gpu, [p] { (void)cudaFree(p); });
  };
  if (t == tier::gpu_queues_gpu_data) {
    controller* c = &ctrl;
    // allocate_gpu aligns to the controller page already.
    m.prp_lists = [c](std::size_t bytes, std::size_t) { return allocate_gpu(*c, bytes); };
  }
  m.copy_in = [name](void* to, const void* from, std::size_t bytes) {
    detail::on_private_stream([&](cudaStream_t s) { return cudaMemcpyAsync(to, from, bytes, cudaMemcpyHostToDevice, s); },
                              "Write the PRP list page table", name);
  };
  m.copy_out = [name](void* to, const void* from, std::size_t bytes) {
    detail::on_private_stream([&](cudaStream_t s) { return cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToHost, s); },
                              "Read queue bookkeeping", name);
  };
  return m;
}

/// An io_queue of `entries` for kernels, its queues placed as tier `t` asks.
///
/// Usage: examples/snippets/kernels.cu, `readers`.
[[nodiscard]] inline std::unique_ptr<io_queue> make_gpu_queue(controller& ctrl, std::uint32_t entries, tier t,
                                                              std::chrono::nanoseconds timeout = std::chrono::seconds(10)) {
  if (t == tier::gpu_queues_gpu_data) {
    dma_buffer sq = allocate_gpu(ctrl, std::size_t{entries} * sizeof(spec::submission_entry));
    dma_buffer cq = allocate_gpu(ctrl, std::size_t{entries} * sizeof(spec::completion_entry));
    return std::make_unique<io_queue>(ctrl, entries, std::move(sq), std::move(cq), timeout, gpu_bookkeeping(ctrl, t));
  }
  return std::make_unique<io_queue>(ctrl, entries, queue_placement::host, timeout, gpu_bookkeeping(ctrl, t));
}

}  // namespace host
CUNVME_NAMESPACE_END
