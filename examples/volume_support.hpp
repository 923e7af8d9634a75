// What the volume examples (gather, bfs) share and nobody needs to copy: controllers opened for
// GPU threads and striped into two volumes over the same namespaces — one on host queue pairs,
// through which the host writes the example's input, one on GPU queue pairs for the kernels —
// writing bytes through a volume from the host, and their command-line numbers.
#pragma once

#include "example_support.hpp"

#include <cunvme/host/gpu/gpu_queue.cuh>
#include <cunvme/host/queue/io_queue.cuh>
#include <cunvme/host/open.cuh>
#include <cunvme/host/owners/volume_members.cuh>
#include <cunvme/volume/volume.cuh>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace example {

/// Where the examples' queues and data live: pinned host memory (tier 1).
inline constexpr cunvme::host::tier where = cunvme::host::tier::host_queues_host_data;
/// The queue pairs every example thread's I/O goes through.
using volume_queue = cunvme::queue_policies<cunvme::slots::multi_producer, cunvme::completion::cooperative>;

/// One controller a URI, a host queue pair and two GPU queue pairs on each, and the volumes
/// striped by `stripe` bytes over their namespace 1.
struct striped_volumes {
  striped_volumes(const std::vector<std::string>& uris, std::uint64_t stripe) {
    std::vector<cunvme::host::volume::member> host_members, gpu_members;
    for (const std::string& uri : uris) {
      ctrls.push_back(cunvme::host::open(uri, {}, cunvme::host::gpu_reach()));
      host_queues.push_back(std::make_unique<cunvme::host::io_queue>(*ctrls.back(), 256));
      host_members.push_back({{host_queues.back().get()}, 1});
      gpu_members.push_back({});
      for (int k = 0; k < 2; ++k) {
        gpu_queues.push_back(cunvme::host::make_gpu_queue(*ctrls.back(), 1024, where));
        gpu_members.back().queues.push_back(gpu_queues.back().get());
      }
    }
    host = std::make_unique<cunvme::host::volume>(cunvme::host::volume::striped(host_members, stripe));
    gpu = std::make_unique<cunvme::host::volume>(cunvme::host::volume::striped(gpu_members, stripe, cunvme::host::gpu_bookkeeping(*ctrls[0], where)));
  }
  [[nodiscard]] std::uint64_t bytes() const { return gpu->blocks() * gpu->block_bytes(); }

  std::vector<std::unique_ptr<cunvme::host::controller>> ctrls;
  std::vector<std::unique_ptr<cunvme::host::io_queue>> host_queues, gpu_queues;
  std::unique_ptr<cunvme::host::volume> host, gpu;  // released before the queues they list
};

/// Writes `bytes` from `data` at byte `at` (block aligned) of `vol` from the host, a MiB at a
/// time, then flushes; `what` names the data in errors.
inline void write_volume(const cunvme::host::volume& vol, std::uint64_t at, const void* data, std::uint64_t bytes, const std::string& what) {
  constexpr std::size_t chunk = 1 << 20;
  cunvme::host::volume_memory staging(vol, chunk);
  const cunvme::volume_io<volume_queue, cunvme::doorbell::mmio> io(vol.view());
  for (std::uint64_t done = 0; done < bytes; done += chunk) {
    const std::uint64_t n = std::min<std::uint64_t>(chunk, bytes - done);
    std::memset(staging.data(), 0, chunk);
    std::memcpy(staging.data(), static_cast<const std::byte*>(data) + done, n);
    const std::uint64_t blocks = (n + vol.block_bytes() - 1) / vol.block_bytes();
    if (const cunvme::io_result r = io.write((at + done) / vol.block_bytes(), blocks, staging.buffers(), 0); !r.ok()) {
      throw std::runtime_error("writing the " + what + ": " + cunvme::to_string(r));
    }
  }
  if (const cunvme::io_result r = io.flush(); !r.ok()) throw std::runtime_error("flushing the " + what + ": " + cunvme::to_string(r));
}

/// The positive decimal after option `argv[i]` (advancing `i`); throws std::invalid_argument.
inline std::uint64_t positive_number(int argc, char** argv, int& i) {
  const std::string option = argv[i];
  if (i + 1 >= argc) throw std::invalid_argument(option + " needs a number");
  char* end = nullptr;
  const std::uint64_t n = std::strtoull(argv[++i], &end, 10);
  if (*end != '\0' || n == 0) throw std::invalid_argument(option + ": '" + argv[i] + "' is not a positive number");
  return n;
}

}  // namespace example
