// The GPU allocation a pointer lies in, as the CUDA driver describes it: its range
// (cuMemGetAddressRange) and its process-unique buffer ID (CU_POINTER_ATTRIBUTE_BUFFER_ID).
// Reached through the runtime's driver entry points, so programs need not link libcuda
// themselves; run in a context of the GPU the memory is on (`host::gpu_context_scope`), which a
// thread that made no CUDA call yet does not have. CUDA host code.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/facade/registration_cache.cuh>
#include <cunvme/host/cuda_error.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/gpu/gpu_context.cuh>

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

CUNVME_NAMESPACE_BEGIN
namespace detail {

/// The GPU allocation `gpu` lies in. Throws `host::error` when `gpu` is not GPU memory or in
/// no allocation.
[[nodiscard]] inline gpu_allocation gpu_allocation_of(const void* gpu, const std::string& device) {
  using get_address_range = CUresult (*)(CUdeviceptr*, std::size_t*, CUdeviceptr);  // cuMemGetAddressRange_v2 (CUDA 3.2+)
  using get_attribute = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);      // cuPointerGetAttribute (CUDA 4.0+)
  static const auto get_range = reinterpret_cast<get_address_range>(host::driver_entry_point("cuMemGetAddressRange"));
  static const auto get_pointer_attribute = reinterpret_cast<get_attribute>(host::driver_entry_point("cuPointerGetAttribute"));
  if (get_range == nullptr || get_pointer_attribute == nullptr) {
    throw host::error("Find the GPU allocation", device, "the CUDA driver offers no cuMemGetAddressRange or cuPointerGetAttribute");
  }
  // Host memory (pageable or pinned) is refused here, without asking the driver for a range it
  // does not have: that failed call would stay a reported error under compute-sanitizer.
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, gpu) != cudaSuccess) (void)cudaGetLastError();
  const std::string where = "address " + std::to_string(reinterpret_cast<std::uintptr_t>(gpu));
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
    throw host::error("Find the GPU allocation", device, where + " is not GPU memory (cudaPointerGetAttributes)");
  }
  // The driver's calls need a context: the memory's own GPU's (a no-op where the caller's
  // scope has made it current already).
  const host::gpu_context_scope scope(attributes.device, device);
  CUdeviceptr base = 0;
  std::size_t size = 0;
  host::driver_check(get_range(&base, &size, reinterpret_cast<CUdeviceptr>(gpu)), "Find the GPU allocation", device,
                     where + " is in no GPU allocation (cuMemGetAddressRange)");
  unsigned long long id = 0;
  host::driver_check(get_pointer_attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, reinterpret_cast<CUdeviceptr>(gpu)), "Find the GPU allocation", device,
                     where + " has no buffer ID (cuPointerGetAttribute)");
  return gpu_allocation{static_cast<std::uintptr_t>(base), size, id};
}

}  // namespace detail
CUNVME_NAMESPACE_END
