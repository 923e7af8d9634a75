// GPU threads as drivers of a controller `host::open` brings up: an emulated controller built
// with its BAR in pinned, mapped memory and its DMA copying to and from GPU memory; a real
// controller's BAR and DMA memory registered for GPU threads (cudaHostRegister, the BAR as I/O
// memory); and the CUDA environment kernels that wait for emulated I/O need. CUDA host code:
// include from .cu files.
//
// Usage: examples/snippets/kernels.cu, `open_for_kernels`.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/emu/cuda_memory.cuh>
#include <cunvme/host/backend/emu_backend.cuh>
#include <cunvme/host/cuda_error.cuh>
#include <cunvme/host/gpu/gpu_allocation.cuh>
#include <cunvme/host/gpu/gpu_context.cuh>
#include <cunvme/host/memory/host_registration.cuh>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// Registers host mappings for GPU threads with CUDA (`host_registrar`): cudaHostRegister,
/// mapped and portable (every device and context), with cudaHostRegisterIoMemory for a BAR;
/// the GPU address from cudaHostGetDevicePointer. Undone with cudaHostUnregister, which
/// controllers run before their backend unmaps or unpins the memory.
[[nodiscard]] inline host_registrar gpu_registrar() {
  return [](void* host, std::size_t bytes, bool io_memory, const std::string& what, const std::string& device) {
    const unsigned flags = cudaHostRegisterMapped | cudaHostRegisterPortable | (io_memory ? cudaHostRegisterIoMemory : 0u);
    const std::string operation = "Register " + what + " for GPU threads";
    if (const cudaError_t e = cudaHostRegister(host, bytes, flags); e != cudaSuccess) {
      // cuda_error clears the (not sticky) error: none is left for the caller's next check.
      throw cuda_error(e, operation, device, "cudaHostRegister (" + std::to_string(bytes) + " bytes)",
                       io_memory ? "the GPU driver will not map this PCIe BAR for GPU stores. GPU-initiated doorbells need a GPU and driver that "
                                   "allow peer-to-peer MMIO (data-center GPUs; GeForce boards without P2P refuse), and a PCIe path that allows it "
                                   "(`nvme_info --doctor` says); otherwise drive the queues from CPU threads (host::queue_pair, or the readers on "
                                   "CPU threads over host::io_queue)"
                                 : "the GPU driver cannot pin and map this DMA memory (RLIMIT_MEMLOCK, or memory it cannot pin)");
    }
    void* gpu = nullptr;
    if (const cudaError_t e = cudaHostGetDevicePointer(&gpu, host, 0); e != cudaSuccess || gpu == nullptr) {
      (void)cudaHostUnregister(host);
      throw cuda_error(e, operation, device, "cudaHostGetDevicePointer: the registered range has no GPU address");
    }
    return host_registration(gpu, [host] {
      if (cudaHostUnregister(host) != cudaSuccess) (void)cudaGetLastError();
    });
  };
}

/// Exports GPU memory to the owner of a shared controller (host/sharing/): a CUDA IPC handle
/// of the allocation holding the range (cudaIpcGetMemHandle takes an allocation's base) and
/// the range's offset in it.
[[nodiscard]] inline gpu_exporter gpu_ipc_exporter() {
  return [](void* gpu, std::size_t bytes, const std::string& device) {
    const gpu_allocation_range range = gpu_allocation_range_of(gpu, device);
    const std::uint64_t offset = reinterpret_cast<std::uintptr_t>(gpu) - range.base;
    if (bytes > range.bytes - offset) {
      throw error("Export GPU memory", device, std::to_string(bytes) + " bytes run past the end of their GPU allocation");
    }
    const gpu_context_scope scope(range.gpu, device);
    cudaIpcMemHandle_t handle{};
    cuda_check(cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(range.base)), "Export GPU memory", device,
               "cudaIpcGetMemHandle (memory from cudaMalloc can be exported; a pool or VMM allocation cannot)");
    gpu_export e;
    static_assert(sizeof handle == sizeof e.handle);
    std::memcpy(e.handle, &handle, sizeof handle);
    e.offset = offset;
    return e;
  };
}

/// GPU threads store to the controller's doorbells, use its queues and its DMA reaches GPU
/// memory: an emulated controller gets `emu::cuda_memory()`'s hooks, a real controller's BAR
/// and DMA memory are registered (`gpu_registrar`), and a controller another process owns is
/// sent this process's GPU memory as CUDA IPC exports (`gpu_ipc_exporter`).
[[nodiscard]] inline memory_reach gpu_reach() { return memory_reach::for_gpu(&emu::cuda_memory, gpu_registrar(), gpu_ipc_exporter()); }

/// `gpu_reach` for an emulated controller made to take the real backends' path: its BAR and
/// DMA memory plain host memory registered by `gpu_registrar` (the BAR without the I/O
/// memory flag, being RAM), its copies to GPU memory through CUDA. What a real controller's
/// bring-up does, testable without an SSD: only the flag and the bus addresses differ.
[[nodiscard]] inline memory_reach gpu_reach_through_registration() {
  return memory_reach::for_gpu(
      [] {
        emu::memory_hooks hooks = emu::cuda_memory();
        hooks.allocate = nullptr;
        hooks.release = nullptr;
        hooks.register_bar = nullptr;  // the registrar registers the BAR, shared or not
        hooks.unregister_bar = nullptr;
        return hooks;
      },
      gpu_registrar());
}

/// Call first in `main`, before any CUDA call, in a program whose kernels wait for emulated
/// I/O: the driver settings such kernels need, read once at the first CUDA call
/// (`emu::prepare_cuda_environment` says which and why).
inline void prepare_cuda_environment() { emu::prepare_cuda_environment(); }

}  // namespace host
CUNVME_NAMESPACE_END
