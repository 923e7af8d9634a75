// cunvme — the device-side library in one include: `#include <cunvme/cunvme.cuh>`.
//
// The layers, bottom to top (an include never runs upward; test/layers checks it):
//   spec/    NVMe structures, registers, opcodes, statuses — constexpr data, nothing else
//   detail/  the access layer (the only inline PTX and fences) and checked arithmetic
//   policy/  small composable types: SQ slots, completion, doorbells, PRP build/walk, CIDs,
//            thread groups, the queue pair's shared state (queue_view)
//   io/      readers and writers over a queue pair and a namespace, io_result
//   volume/  namespaces on several controllers as one, striped or mirrored
//   cache/   a page cache over a namespace or a volume, and array<T> through it
// Host bring-up (`host/`), the emulator (`emu/`), the stream-ordered façade (`facade/`) and
// the safetensors loader over it (`loader/`, which also needs nlohmann-json) are included on
// their own: they need the host toolchain's headers.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/spec/spec.cuh>

#include <cunvme/policy/cid_pool.cuh>
#include <cunvme/policy/completion.cuh>
#include <cunvme/policy/doorbell.cuh>
#include <cunvme/policy/group.cuh>
#include <cunvme/policy/prp.cuh>
#include <cunvme/policy/prp_walk.cuh>
#include <cunvme/policy/queue.cuh>
#include <cunvme/policy/queue_view.cuh>
#include <cunvme/policy/slots.cuh>
#if defined(__CUDACC__)
#include <cunvme/policy/device_group.cuh>  // CUB's warp and block primitives: device code only
#endif

#include <cunvme/io/io_result.cuh>
#include <cunvme/io/namespace_view.cuh>
#include <cunvme/io/reader.cuh>

#include <cunvme/volume/volume.cuh>

#include <cunvme/cache/array.cuh>
#include <cunvme/cache/page_cache.cuh>
#include <cunvme/cache/page_table.cuh>
