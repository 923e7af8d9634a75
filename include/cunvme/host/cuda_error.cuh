// CUDA failures as `host::error`: one helper per error source, so every message names the
// error the same way — the runtime's cudaError_t and the driver's CUresult, each by its name
// and its description ("cudaErrorMemoryAllocation (out of memory)"). CUDA host code: include
// from .cu files (or where the CUDA runtime's headers and library are at hand).
//
// The driver is reached through the runtime's driver entry points, so programs need not link
// libcuda themselves; where the driver offers no entry point (none installed), a CUresult is
// named by its number.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/error.cuh>

#include <cuda.h>
#include <cuda_runtime.h>

#include <string>
#include <utility>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// The driver API function `name` (e.g. "cuMemGetAddressRange") by the CUDA 12.0 ABI, or
/// nullptr where the driver has none. Never leaves an error behind for cudaGetLastError.
[[nodiscard]] inline void* driver_entry_point(const char* name) noexcept {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) != cudaSuccess || found != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return fn;
}

/// A runtime error by name and description: "cudaErrorInvalidValue (invalid argument)".
[[nodiscard]] inline std::string cuda_error_text(cudaError_t e) { return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")"; }

/// A driver error by name and description: "CUDA_ERROR_NOT_SUPPORTED (operation not
/// supported)"; "CUresult 801" where the driver cannot name it.
[[nodiscard]] inline std::string driver_error_text(CUresult r) {
  using describe = CUresult (*)(CUresult, const char**);
  static const auto get_name = reinterpret_cast<describe>(driver_entry_point("cuGetErrorName"));
  static const auto get_string = reinterpret_cast<describe>(driver_entry_point("cuGetErrorString"));
  const char* name = nullptr;
  const char* text = nullptr;
  if (get_name == nullptr || get_name(r, &name) != CUDA_SUCCESS || name == nullptr) return "CUresult " + std::to_string(static_cast<int>(r));
  if (get_string == nullptr || get_string(r, &text) != CUDA_SUCCESS || text == nullptr) return name;
  return std::string(name) + " (" + text + ")";
}

/// The `host::error` for a runtime call failing with `e` while doing `operation` on `device`:
/// "<operation> on <device>: <context>: cudaErrorX (description)", where `context` says which
/// call or which part failed (may be empty); `hint`, where given, follows after "; " and says
/// what is needed. Clears the runtime's last error, so the failure is not reported again by the
/// next launch check.
[[nodiscard]] inline error cuda_error(cudaError_t e, std::string operation, std::string device, const std::string& context,
                                      const std::string& hint = {}) {
  (void)cudaGetLastError();
  return error(std::move(operation), std::move(device),
               (context.empty() ? "" : context + ": ") + cuda_error_text(e) + (hint.empty() ? "" : "; " + hint));
}

/// Throws `cuda_error(e, …)` unless `e` is cudaSuccess.
inline void cuda_check(cudaError_t e, std::string operation, std::string device, const std::string& context = {}) {
  if (e != cudaSuccess) throw cuda_error(e, std::move(operation), std::move(device), context);
}

/// The `host::error` for a driver call failing with `r`: "<operation> on <device>: <context>:
/// CUDA_ERROR_X (description); <hint>", as `cuda_error`.
[[nodiscard]] inline error driver_error(CUresult r, std::string operation, std::string device, const std::string& context,
                                        const std::string& hint = {}) {
  return error(std::move(operation), std::move(device),
               (context.empty() ? "" : context + ": ") + driver_error_text(r) + (hint.empty() ? "" : "; " + hint));
}

/// Throws `driver_error(r, …)` unless `r` is CUDA_SUCCESS.
inline void driver_check(CUresult r, std::string operation, std::string device, const std::string& context = {}) {
  if (r != CUDA_SUCCESS) throw driver_error(r, std::move(operation), std::move(device), context);
}

}  // namespace host
CUNVME_NAMESPACE_END
