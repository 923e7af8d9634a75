// The GPU allocation a pointer lies in (cuMemGetAddressRange), reached through the runtime's
// driver entry points, so programs need not link libcuda themselves. CUDA host code.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/cuda_error.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/gpu/gpu_context.cuh>

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// Where an allocation starts, how large it is, and the GPU it is on.
struct gpu_allocation_range {
  std::uintptr_t base = 0;
  std::size_t bytes = 0;
  int gpu = 0;
};

/// The allocation `gpu` lies in, asked in a context of the memory's own GPU. Throws
/// `host::error` naming `device` when `gpu` is not GPU memory or in no allocation.
[[nodiscard]] inline gpu_allocation_range gpu_allocation_range_of(const void* gpu, const std::string& device) {
  using get_address_range = CUresult (*)(CUdeviceptr*, std::size_t*, CUdeviceptr);  // cuMemGetAddressRange_v2 (CUDA 3.2+)
  static const auto get_range = reinterpret_cast<get_address_range>(driver_entry_point("cuMemGetAddressRange"));
  if (get_range == nullptr) throw error("Find the GPU allocation", device, "the CUDA driver offers no cuMemGetAddressRange");
  // Host memory (pageable or pinned) is refused here, without asking the driver for a range it
  // does not have: that failed call would stay a reported error under compute-sanitizer.
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, gpu) != cudaSuccess) (void)cudaGetLastError();
  const std::string where = "address " + std::to_string(reinterpret_cast<std::uintptr_t>(gpu));
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
    throw error("Find the GPU allocation", device, where + " is not GPU memory (cudaPointerGetAttributes)");
  }
  // The driver's calls need a context: the memory's own GPU's (a no-op where the caller's
  // scope has made it current already).
  const gpu_context_scope scope(attributes.device, device);
  CUdeviceptr base = 0;
  std::size_t size = 0;
  driver_check(get_range(&base, &size, reinterpret_cast<CUdeviceptr>(gpu)), "Find the GPU allocation", device,
               where + " is in no GPU allocation (cuMemGetAddressRange)");
  return gpu_allocation_range{static_cast<std::uintptr_t>(base), size, attributes.device};
}

}  // namespace host
CUNVME_NAMESPACE_END
