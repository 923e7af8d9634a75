// The CUDA context a library call runs in. The driver API (cuMemGetAddressRange,
// cuPointerGetAttribute, cuMemGetHandleForAddressRange) works on the calling thread's current
// context and fails with CUDA_ERROR_INVALID_CONTEXT on a thread that has none: any thread that
// made no CUDA runtime call yet — a data-loader worker, a `std::thread` whose first call is
// `copy_n`. The runtime API, on such a thread, picks GPU 0 whatever the device serves. So every
// library entry point that talks to CUDA for a GPU opens a `gpu_context_scope` on it first: the
// one place that decides which context is current. Reached through the runtime's driver entry
// points (host/cuda_error.cuh), as the other driver calls are, so programs need not link
// libcuda. CUDA host code. Usage: facade/device.cuh (`make_current`), loader/loader.cuh.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/cuda_error.cuh>
#include <cunvme/host/error.cuh>

#include <cuda.h>
#include <cuda_runtime.h>

#include <new>
#include <string>
#include <string_view>

CUNVME_NAMESPACE_BEGIN
namespace host {

namespace detail {

/// The driver's context calls, looked up once.
struct context_api {
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*get_current)(CUcontext*) = nullptr;
  CUresult (*set_current)(CUcontext) = nullptr;
  CUresult (*context_device)(CUdevice*) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*retain_primary)(CUcontext*, CUdevice) = nullptr;
  CUresult (*release_primary)(CUdevice) = nullptr;

  [[nodiscard]] bool complete() const noexcept {
    return init && get_current && set_current && context_device && device_get && retain_primary && release_primary;
  }
  [[nodiscard]] static const context_api& get() {
    static const context_api api = [] {
      context_api a;
      a.init = reinterpret_cast<decltype(a.init)>(driver_entry_point("cuInit"));
      a.get_current = reinterpret_cast<decltype(a.get_current)>(driver_entry_point("cuCtxGetCurrent"));
      a.set_current = reinterpret_cast<decltype(a.set_current)>(driver_entry_point("cuCtxSetCurrent"));
      a.context_device = reinterpret_cast<decltype(a.context_device)>(driver_entry_point("cuCtxGetDevice"));
      a.device_get = reinterpret_cast<decltype(a.device_get)>(driver_entry_point("cuDeviceGet"));
      a.retain_primary = reinterpret_cast<decltype(a.retain_primary)>(driver_entry_point("cuDevicePrimaryCtxRetain"));
      a.release_primary = reinterpret_cast<decltype(a.release_primary)>(driver_entry_point("cuDevicePrimaryCtxRelease"));
      return a;
    }();
    return api;
  }
};

}  // namespace detail

/// For its lifetime, the calling thread runs in a context of GPU `ordinal`: the one current
/// already where it is of that GPU (the runtime's primary context, or one the caller made with
/// the driver API: left alone), else the GPU's primary context — the runtime's, the one its
/// allocations, streams and events live in — retained and made current, and on destruction the
/// thread's previous context (none, or another GPU's) current again and the primary context
/// released. Nothing a caller set up on the thread is changed for good. Throws `host::error`
/// naming `device` where the driver refuses.
class gpu_context_scope {
 public:
  gpu_context_scope(int ordinal, std::string_view device) { enter(ordinal, device); }
  /// For destructors and other code that must not throw: where the context cannot be made
  /// current, the scope does nothing and the calls in it run in whatever context the runtime
  /// gives the thread (waits and frees work across contexts).
  gpu_context_scope(int ordinal, std::string_view device, std::nothrow_t) noexcept {
    try {
      enter(ordinal, device);
    } catch (...) {
      switched_ = false;
    }
  }
  gpu_context_scope(const gpu_context_scope&) = delete;
  gpu_context_scope& operator=(const gpu_context_scope&) = delete;
  ~gpu_context_scope() {
    if (!switched_) return;
    const detail::context_api& api = detail::context_api::get();
    (void)api.set_current(previous_);
    (void)api.release_primary(device_);
  }

  /// Whether the scope made a context current (the thread had none of that GPU's).
  [[nodiscard]] bool switched() const noexcept { return switched_; }

  /// The GPU the runtime's calls on this thread go to now (cudaGetDevice; 0 where it fails).
  [[nodiscard]] static int current_gpu() noexcept {
    int gpu = 0;
    if (cudaGetDevice(&gpu) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return gpu;
  }

 private:
  void enter(int ordinal, std::string_view device) {
    const detail::context_api& api = detail::context_api::get();
    if (!api.complete()) fail(device, "the CUDA driver lacks its context calls (cuCtxGetCurrent, cuDevicePrimaryCtxRetain, …)", CUDA_SUCCESS);
    if (const CUresult r = api.init(0); r != CUDA_SUCCESS) fail(device, "cuInit", r);
    if (const CUresult r = api.device_get(&device_, ordinal); r != CUDA_SUCCESS) fail(device, "cuDeviceGet(" + std::to_string(ordinal) + ")", r);
    if (const CUresult r = api.get_current(&previous_); r != CUDA_SUCCESS) fail(device, "cuCtxGetCurrent", r);
    if (previous_ != nullptr) {
      CUdevice current = 0;
      if (api.context_device(&current) == CUDA_SUCCESS && current == device_) return;  // already in that GPU's context
    }
    CUcontext primary = nullptr;
    if (const CUresult r = api.retain_primary(&primary, device_); r != CUDA_SUCCESS) fail(device, "cuDevicePrimaryCtxRetain", r);
    if (const CUresult r = api.set_current(primary); r != CUDA_SUCCESS) {
      (void)api.release_primary(device_);
      fail(device, "cuCtxSetCurrent", r);
    }
    switched_ = true;
  }

  [[noreturn]] static void fail(std::string_view device, const std::string& call, CUresult r) {
    if (r == CUDA_SUCCESS) throw error("Make the GPU's context current", std::string(device), call);
    throw driver_error(r, "Make the GPU's context current", std::string(device), call);
  }

  CUcontext previous_ = nullptr;
  CUdevice device_ = 0;
  bool switched_ = false;
};

}  // namespace host
CUNVME_NAMESPACE_END
