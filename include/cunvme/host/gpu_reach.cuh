// GPU threads as drivers of a controller `host::open` brings up: the reach an emulated
// controller needs to be built with (its BAR in pinned, mapped memory for doorbell stores, its
// DMA copying to and from GPU memory), and the CUDA environment kernels that wait for
// emulated I/O need. CUDA host code: include from .cu files.
//
// ```
// cunvme::host::prepare_cuda_environment();  // first in main
// auto ctrl = cunvme::host::open("emu", {}, cunvme::host::gpu_reach());
// ```
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/emu/cuda_memory.cuh>
#include <cunvme/host/emu_backend.cuh>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// GPU threads store to the controller's doorbells and its DMA reaches GPU memory: for an
/// emulated controller, `emu::cuda_memory()`'s hooks; real controllers need nothing at open.
[[nodiscard]] inline memory_reach gpu_reach() { return memory_reach::through_emulator_hooks(&emu::cuda_memory); }

/// Call first in `main`, before any CUDA call, in a program whose kernels wait for emulated
/// I/O: the driver settings such kernels need, read once at the first CUDA call
/// (`emu::prepare_cuda_environment` says which and why).
inline void prepare_cuda_environment() { emu::prepare_cuda_environment(); }

}  // namespace host
CUNVME_NAMESPACE_END
