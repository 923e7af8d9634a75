// GPU memory as a dma-buf, for the cunvme kernel module to map for a controller: the upstream
// path to peer-to-peer DMA into GPU memory with NVIDIA's open kernel modules, no nv-p2p.h.
// The CUDA half of `kmod_allocator::map_dma_buf`. CUDA host code: include from .cu files.
// Reaches cuMemGetHandleForAddressRange through the runtime's driver entry points, so
// programs need not link libcuda themselves, in the memory's GPU's context (gpu_context.cuh).
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/cuda_error.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/gpu/gpu_context.cuh>
#include <cunvme/host/backend/kmod_backend.cuh>

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include <unistd.h>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// Exports bytes [gpu, gpu + bytes) of a CUDA allocation (cudaMalloc, or cuMemAddressReserve
/// fully mapped) as a dma-buf and returns its file descriptor; the caller closes it. `gpu` and
/// `bytes` must be multiples of the host page size. Needs CUDA 11.7+, a driver whose GPU
/// supports dma-buf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: the open kernel modules, Linux
/// 5.12+). Throws `host::error` naming `device` where it cannot.
[[nodiscard]] inline int export_gpu_dma_buf(void* gpu, std::size_t bytes, const std::string& device) {
  // The driver refuses such a range too, but only with CUDA_ERROR_INVALID_VALUE; checked here so
  // the error says which rule was broken and no failing driver call is made.
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  if (bytes == 0 || reinterpret_cast<std::uintptr_t>(gpu) % page != 0 || bytes % page != 0) {
    throw error("Export GPU memory as a dma-buf", device,
                "the range (" + std::to_string(bytes) + " bytes at " + std::to_string(reinterpret_cast<std::uintptr_t>(gpu)) +
                    ") must be non-empty and start and end on host page boundaries (" + std::to_string(page) + " bytes)");
  }
  // cuMemGetHandleForAddressRange (CUDA 11.7+), by the 12.0 ABI as the other entry points.
  using get_handle = CUresult (*)(void*, CUdeviceptr, std::size_t, CUmemRangeHandleType, unsigned long long);
  static const auto get = reinterpret_cast<get_handle>(driver_entry_point("cuMemGetHandleForAddressRange"));
  if (get == nullptr) throw error("Export GPU memory as a dma-buf", device, "the CUDA driver offers no cuMemGetHandleForAddressRange (CUDA 11.7+)");
  // In a context of the GPU the memory is on (the runtime tells which without one): the
  // caller's thread may have none. Memory that is no GPU's is left to the driver to refuse.
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, gpu) != cudaSuccess) (void)cudaGetLastError();
  const gpu_context_scope scope(attributes.type == cudaMemoryTypeDevice ? attributes.device : gpu_context_scope::current_gpu(), device);
  int fd = -1;
  const CUresult r = get(&fd, reinterpret_cast<CUdeviceptr>(gpu), bytes, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (r != CUDA_SUCCESS) {
    throw driver_error(r, "Export GPU memory as a dma-buf", device, "cuMemGetHandleForAddressRange",
                       r == CUDA_ERROR_NOT_SUPPORTED   ? "no dma-buf support: NVIDIA's open kernel modules and Linux 5.12+ are needed"
                       : r == CUDA_ERROR_INVALID_VALUE ? "the range must be page aligned and lie in one allocation"
                                                       : "");
  }
  if (fd < 0) throw error("Export GPU memory as a dma-buf", device, "cuMemGetHandleForAddressRange succeeded but gave no file descriptor");
  return fd;
}

/// Makes `ctrl.memory().map_gpu` (and so `allocate_gpu`, tiers 2 and 3) map GPU memory through
/// dma-buf when `ctrl` is a controller bound to the cunvme module and the module imports
/// dma-bufs. Returns whether it did; other backends keep their own way (or refusal).
inline bool use_gpu_dma_buf(controller& ctrl) {
  auto* kmod = dynamic_cast<kmod_backend*>(&ctrl.backend());
  if (kmod == nullptr || !kmod->kmod_memory().imports_dma_bufs()) return false;
  const std::string device = ctrl.name();
  kmod->kmod_memory().use_dma_buf_exporter([device](void* gpu, std::size_t bytes) { return export_gpu_dma_buf(gpu, bytes, device); });
  return true;
}

}  // namespace host
CUNVME_NAMESPACE_END
