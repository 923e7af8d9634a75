// GPU memory handed to another process: what a process attached to a shared controller sends
// its owner so that the owner's controller can DMA into this process's GPU memory.
#pragma once

#include <cunvme/config.cuh>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// The export (a CUDA IPC handle) of the allocation holding a range, and where the range starts in it.
struct gpu_export {
  std::byte handle[64]{};
  std::uint64_t offset = 0;  ///< of the range's first byte from the exported allocation's base
};

/// Exports `bytes` of GPU memory at `gpu`; throws `host::error` naming `device` where CUDA
/// refuses. Set by CUDA code (`host::gpu_reach()`); without one, no GPU memory is exported.
using gpu_exporter = std::function<gpu_export(void* gpu, std::size_t bytes, const std::string& device)>;

}  // namespace host
CUNVME_NAMESPACE_END
