// The GPU allocation a pointer lies in, as the CUDA driver describes it: its range
// (host::gpu_allocation_range_of) and its process-unique buffer ID (CU_POINTER_ATTRIBUTE_BUFFER_ID).
// Reached through the runtime's driver entry points, so programs need not link libcuda
// themselves; run in a context of the GPU the memory is on (`host::gpu_context_scope`), which a
// thread that made no CUDA call yet does not have. CUDA host code.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/facade/registration_cache.cuh>
#include <cunvme/host/cuda_error.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/gpu/gpu_allocation.cuh>
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
  using get_attribute = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);  // cuPointerGetAttribute (CUDA 4.0+)
  static const auto get_pointer_attribute = reinterpret_cast<get_attribute>(host::driver_entry_point("cuPointerGetAttribute"));
  if (get_pointer_attribute == nullptr) throw host::error("Find the GPU allocation", device, "the CUDA driver offers no cuPointerGetAttribute");
  const host::gpu_allocation_range range = host::gpu_allocation_range_of(gpu, device);
  const host::gpu_context_scope scope(range.gpu, device);
  unsigned long long id = 0;
  host::driver_check(get_pointer_attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, reinterpret_cast<CUdeviceptr>(gpu)), "Find the GPU allocation", device,
                     "address " + std::to_string(reinterpret_cast<std::uintptr_t>(gpu)) + " has no buffer ID (cuPointerGetAttribute)");
  return gpu_allocation{range.base, range.bytes, id};
}

}  // namespace detail
CUNVME_NAMESPACE_END
