// The doctor's verdicts: which tier each backend can run here, and why (DESIGN.md, "Where
// memory lives (tiers) and which backend can do what"). Included by doctor.hpp after the
// report's types; a pure function of the facts, so tests check it on fake trees.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cunvme_doctor {

/// Below this a GPU's BAR1 is the small legacy window (256 MiB on GPUs without Resizable BAR)
/// rather than one that covers GPU memory (datacenter GPUs and Resizable BAR: tens of GiB).
inline constexpr std::uint64_t small_bar1_bytes = std::uint64_t{1} << 30;

[[nodiscard]] inline std::string mib(std::uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

namespace detail {

/// The conditions every tier of backend `b` shares: driver binding, IOMMU, privileges.
inline void backend_conditions(const report& r, backend b, verdict& v) {
  const std::string& bdf = r.controller.pci.bdf;
  const std::string& driver = r.controller.driver;
  const std::string dev = "/sys/bus/pci/devices/" + bdf;
  const std::string unbind = driver.empty() ? "" : "echo " + bdf + " > " + dev + "/driver/unbind; ";
  const auto translation = translation_of(r.controller.group);
  const std::string group = r.controller.group ? "IOMMU group " + r.controller.group->number + " (type " +
                                                     (r.controller.group->type.empty() ? "unknown" : r.controller.group->type) + ")"
                                               : "no IOMMU group";
  switch (b) {
    case backend::sysfs:
      if (!driver.empty()) v.add(outcome::needs_setup, "held by " + driver + ": unbind it (" + unbind + "as root)");
      if (translation == dma_translation::translated) {
        v.add(outcome::not_possible, "the IOMMU translates the controller's DMA (" + group +
                                         "): pagemap's physical addresses are not its bus addresses; use vfio or kmod, or boot with iommu=pt");
      } else if (translation == dma_translation::unknown) {
        v.add(outcome::limited, group + ": whether DMA is translated is unknown; sysfs needs it untranslated");
      } else {
        v.add(outcome::works, "DMA untranslated (" + to_string(translation) + "): pagemap's physical addresses are bus addresses");
      }
      if (!r.process.cap_sys_admin) v.add(outcome::needs_setup, "run as root: pagemap shows physical addresses only with CAP_SYS_ADMIN");
      break;
    case backend::vfio:
      if (translation == dma_translation::no_iommu) {
        v.add(outcome::not_possible, "no IOMMU group: VFIO needs the IOMMU on (intel_iommu=on or amd_iommu=on); use sysfs or kmod");
        break;
      }
      v.add(outcome::works, group + ": VFIO gives the group a domain of its own");
      if (driver != "vfio-pci") {
        v.add(outcome::needs_setup, (driver.empty() ? std::string("bound to no driver") : "held by " + driver) + ": bind vfio-pci (" + unbind +
                                        "echo vfio-pci > " + dev + "/driver_override; echo " + bdf + " > /sys/bus/pci/drivers_probe)");
      }
      for (const auto& m : r.controller.group ? r.controller.group->members : std::vector<group_member>{}) {
        if (m.bdf != bdf && !m.driver.empty() && m.driver != "vfio-pci" && m.driver != "pcieport") {
          v.add(outcome::needs_setup, "group " + r.controller.group->number + " also holds " + m.bdf + " (driver " + m.driver +
                                          "): VFIO needs every device of a group bound to vfio-pci or to none");
        }
      }
      break;
    case backend::kmod:
      if (!r.cunvme_module.loaded) v.add(outcome::needs_setup, "the cunvme module is not loaded (insmod kmod/cunvme.ko)");
      if (driver != "cunvme") {
        v.add(outcome::needs_setup, (driver.empty() ? std::string("bound to no driver") : "held by " + driver) + ": bind cunvme (" + unbind +
                                        "echo cunvme > " + dev + "/driver_override; echo " + bdf + " > /sys/bus/pci/drivers_probe)");
      }
      v.add(outcome::works, group + ": fine, the module maps memory through the kernel's DMA API, which works with or without an IOMMU");
      break;
  }
}

/// Pinned host memory is charged to RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK
/// (VFIO's type-1 IOMMU driver, the cunvme module, mlock for pagemap memory).
inline void memlock_condition(const report& r, verdict& v) {
  if (r.process.cap_ipc_lock || !r.process.memlock_bytes) return;
  v.add(outcome::limited, "RLIMIT_MEMLOCK is " + mib(*r.process.memlock_bytes) +
                              ": that much pinned host memory at most (raise ulimit -l, or run with CAP_IPC_LOCK)");
}

/// What every GPU-side tier needs of the GPU itself.
inline bool gpu_conditions(const report& r, verdict& v) {
  if (!r.gpu) {
    v.add(outcome::not_possible, "no NVIDIA GPU found (the host's own I/O on CPU threads still works)");
    return false;
  }
  if (r.gpu->driver != "nvidia") {
    v.add(outcome::not_possible, "the GPU " + r.gpu->pci.bdf + " is " + (r.gpu->driver.empty() ? "bound to no driver" : "driven by " + r.gpu->driver) +
                                     ": CUDA needs NVIDIA's driver (nvidia)");
    return false;
  }
  return true;
}

/// The PCIe path for traffic between the controller and the GPU: the controller's DMA into
/// GPU memory (tiers 2, 3) and the GPU's stores to the controller's doorbells.
inline void path_conditions(const report& r, verdict& v) {
  const pcie_path& p = *r.path;
  switch (p.route) {
    case p2p_route::common_switch:
      v.add(outcome::works, "peer-to-peer turns in the common switch below " + p.common);
      break;
    case p2p_route::common_root_port:
    case p2p_route::root_complex:
      v.add(outcome::limited, "no common switch (" + to_string(p.route) + ", " + p.common +
                                  "): peer-to-peer goes through the root complex, which forwards it on AMD Zen and recent Intel Xeon "
                                  "(Linux's p2pdma allow-list), slower than a switch, and not at all on others");
      break;
    case p2p_route::different_root_complexes:
      v.add(outcome::not_possible, "the controller and the GPU are under different root complexes: peer-to-peer between host bridges "
                                   "is not supported by most platforms (Linux's p2pdma refuses it); use tier 1");
      return;
    case p2p_route::unknown:
      v.add(outcome::limited, "the PCIe path is unknown (a sysfs device path is missing)");
      break;
  }
  if (!p.redirecting.empty()) {
    std::string names;
    for (const auto& bdf : p.redirecting) names += (names.empty() ? "" : ", ") + bdf;
    v.add(outcome::limited, "ACS P2P redirect is enabled on " + names +
                                ": peer-to-peer goes up to the root complex (and through the IOMMU) instead of across, slower, and "
                                "only where the root complex forwards it");
  }
  if (!p.acs_unknown.empty()) {
    v.add(outcome::limited, "ACS unknown on " + std::to_string(p.acs_unknown.size()) + " function(s) on the way (config space past 64 bytes needs root)");
  }
}

inline verdict judge_one(const report& r, backend b, tier t) {
  verdict v{b, t, outcome::works, {}};
  const bool gpu_memory = t == tier::two || t == tier::three;
  if (gpu_memory && b != backend::kmod) {
    v.add(outcome::not_possible, b == backend::sysfs ? "sysfs cannot learn GPU memory's bus addresses: only kmod pins GPU memory (nvidia_p2p or dma-buf)"
                                                     : "VFIO cannot map GPU memory for the controller: only kmod pins GPU memory (nvidia_p2p or dma-buf)");
    return v;
  }
  backend_conditions(r, b, v);
  if (v.result == outcome::not_possible || !gpu_conditions(r, v)) return v;
  if (t == tier::doorbells) {
    v.add(outcome::not_checked, "whether the GPU can map the controller's BAR0 is not checked here (needs CUDA: cudaHostRegister with "
                                "cudaHostRegisterIoMemory; GeForce GPUs and old drivers refuse)");
    path_conditions(r, v);
    return v;
  }
  memlock_condition(r, v);
  if (t == tier::one) {
    if (b == backend::sysfs && r.hugepages.known && r.hugepages.free == 0) {
      v.add(outcome::limited, "no free huge pages: queues are limited to 4 KiB (64 entries) and data to scattered 4 KiB pages "
                              "(reserve some: echo 64 > /proc/sys/vm/nr_hugepages)");
    }
    v.add(outcome::works, "the GPU reaches pinned host memory through cudaHostRegister");
    return v;
  }
  // Tiers 2 and 3 through the module: GPU memory pinned for the controller, peer-to-peer.
  if (!r.nvidia_module_loaded) v.add(outcome::needs_setup, "NVIDIA's kernel module (nvidia) is not loaded");
  if (r.cunvme_uses_nvidia_p2p) {
    v.add(outcome::works, "the cunvme module was built with nvidia_p2p (it holds the nvidia module)");
  } else if (r.cunvme_module.loaded) {
    v.add(outcome::not_checked, "the cunvme module was built without nvidia_p2p (it does not hold the nvidia module); whether it imports "
                                "dma-bufs is not checked here: CUNVME_IOCTL_INFO says, but opening /dev/cunvme/" + r.controller.pci.bdf +
                                " takes the controller");
  }
  const auto bar1 = r.gpu->bar1_bytes();
  if (!bar1) {
    v.add(outcome::limited, "the GPU's BAR1 size is unknown (no readable resource file)");
  } else if (*bar1 < small_bar1_bytes) {
    v.add(outcome::limited, "the GPU's BAR1 is " + mib(*bar1) + ": at most that much GPU memory (less what the driver keeps) can be pinned "
                            "for the controller at a time; enable Resizable BAR / Above 4G Decoding in the firmware");
  }
  path_conditions(r, v);
  return v;
}

}  // namespace detail

/// Every backend's verdict for the doorbells and each tier, backend-major.
[[nodiscard]] inline std::vector<verdict> judge(const report& r) {
  std::vector<verdict> all;
  for (backend b : {backend::sysfs, backend::vfio, backend::kmod}) {
    for (tier t : {tier::doorbells, tier::one, tier::two, tier::three}) all.push_back(detail::judge_one(r, b, t));
  }
  return all;
}

}  // namespace cunvme_doctor
