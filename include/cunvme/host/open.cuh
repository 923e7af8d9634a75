// One entry point for every way to reach a controller:
//   emu[:key=value,...]     the embedded emulator (keys: detail::parse_emu in emu_backend.cuh)
//   sysfs:0000:01:00.0      BAR0 through sysfs resource0, DMA through pagemap (root, no IOMMU)
//   vfio:0000:01:00.0       VFIO: BAR mapping and DMA through the IOMMU
//   kmod:0000:01:00.0       the cunvme kernel module
//   attach:PATH             a controller another process owns and serves at socket PATH
//                           (host/sharing/; the owner: `emu:shared` and sharing::controller_owner)
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/backend/emu_backend.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/backend/kmod_backend.cuh>
#include <cunvme/host/backend/sysfs_backend.cuh>
#include <cunvme/host/backend/uri_options.cuh>
#include <cunvme/host/backend/vfio_backend.cuh>
#include <cunvme/host/sharing/attached.cuh>
#include <cunvme/spec/registers.cuh>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace host {

namespace detail {
/// The PCI address of a `sysfs:`, `vfio:` or `kmod:` URI, checked before any device is touched.
[[nodiscard]] inline std::string parse_bdf(std::string_view bdf, std::string_view uri) {
  if (!valid_bdf(bdf)) {
    throw error("Open", std::string(uri), "'" + std::string(bdf) + "' is not a PCI address of the form DDDD:BB:DD.F (hex), e.g. 0000:01:00.0");
  }
  return std::string(bdf);
}

}  // namespace detail

/// Opens and brings up the controller `uri` names.
///
/// Usage: examples/snippets/host.cpp, `open_emulator`.
/// `reach` says who besides CPU threads drives the controller: `host::gpu_reach()`
/// (<cunvme/host/gpu/gpu_reach.cuh>) lets GPU threads ring its doorbells and use its queues —
/// an emulated controller's memory is placed for them when it is built, a real controller's
/// BAR and DMA memory are registered for them at bring-up — and its DMA reach GPU memory.
[[nodiscard]] inline std::unique_ptr<controller> open(std::string_view uri, controller_options options = {}, const memory_reach& reach = {}) {
  const auto colon = uri.find(':');
  const std::string_view scheme = uri.substr(0, colon);
  const std::string_view rest = colon == std::string_view::npos ? std::string_view{} : uri.substr(colon + 1);
  const host_registrar& gpu = reach.registrar();
  if (scheme == "emu") {
    auto backend = open_emulator(rest, uri, reach);
    // Shadow doorbells would live in the owner's memory, where attached processes cannot ring them.
    if (backend->controller().config().shared_bar) options.shadow_doorbells = false;
    return std::make_unique<controller>(std::move(backend), options, gpu);
  }
  if (scheme == "attach") return sharing::attach(std::string(rest), options, gpu, reach.exporter());
  if (scheme == "sysfs") return std::make_unique<controller>(std::make_unique<sysfs_backend>(detail::parse_bdf(rest, uri)), options, gpu);
  if (scheme == "vfio") return std::make_unique<controller>(std::make_unique<vfio_backend>(detail::parse_bdf(rest, uri)), options, gpu);
  if (scheme == "kmod") return std::make_unique<controller>(std::make_unique<kmod_backend>(detail::parse_bdf(rest, uri)), options, gpu);
  throw error("Open", std::string(uri), "unknown device URI: use emu:, sysfs:BDF, vfio:BDF, kmod:BDF or attach:PATH");
}

}  // namespace host
CUNVME_NAMESPACE_END
