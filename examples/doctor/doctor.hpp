// The P2P doctor, like NVIDIA's gdscheck: for an NVMe controller and a GPU it gathers the
// facts that decide which memory tier each cunvme backend can use (DESIGN.md, "Where memory
// lives"), into a `report` that `print_report` (report_print.hpp) writes out.
//
//   examine({.root = "/"})                        every NVMe controller, against NVIDIA GPU 0
//   examine({.controller = "0000:01:00.0", .gpu = "1"})
//
// The facts come from sysfs under `root` (libpci for config space): tests pass a fake tree.
#pragma once

#include "pci_facts.hpp"
#include "system_facts.hpp"

#include <cunvme/host/error.cuh>
#include <cunvme/host/backend/sysfs_backend.cuh>  // host::valid_bdf

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cunvme_doctor {

namespace host = cunvme::host;

inline constexpr std::uint32_t nvme_class_code = 0x010802;  // mass storage, NVM, NVM Express
inline constexpr std::uint16_t nvidia_vendor = 0x10de;

/// VGA-compatible (0x0300) or 3D controller (0x0302): the classes NVIDIA's GPUs report.
[[nodiscard]] inline bool is_nvidia_gpu(std::uint16_t vendor, std::uint32_t class_code) {
  const std::uint32_t base_and_sub = class_code >> 8;
  return vendor == nvidia_vendor && (base_and_sub == 0x0300 || base_and_sub == 0x0302);
}

/// Where peer-to-peer TLPs between the controller and the GPU turn around.
enum class p2p_route {
  common_switch,             // below a PCIe switch both sit under: the best case
  common_root_port,          // below one root port, no switch: they turn in the root port
  root_complex,              // under different root ports of one host bridge
  different_root_complexes,  // under different host bridges (often different CPU sockets)
  unknown,                   // a sysfs device path was missing
};

[[nodiscard]] inline std::string to_string(p2p_route r) {
  switch (r) {
    case p2p_route::common_switch: return "common PCIe switch";
    case p2p_route::common_root_port: return "common root port";
    case p2p_route::root_complex: return "only the root complex in common (different root ports)";
    case p2p_route::different_root_complexes: return "different root complexes";
    case p2p_route::unknown: return "unknown";
  }
  return "unknown";
}

/// One PCI function on the way from the controller to the GPU.
struct hop {
  std::string bdf;
  std::optional<pci_function> facts;  // nullopt: libpci does not list it
};

struct pcie_path {
  p2p_route route = p2p_route::unknown;
  std::string common;                    // the deepest common function, or host bridge ("pci0000:00")
  std::vector<hop> hops;                 // controller, bridges up to `common` and down, GPU
  std::vector<std::string> redirecting;  // hops with ACS P2P Request/Completion Redirect enabled
  std::vector<std::string> acs_unknown;  // hops whose capabilities could not be read
};

struct controller_facts {
  pci_function pci;
  std::string driver;  // "" where none is bound
  std::optional<iommu_group> group;
};

struct gpu_facts {
  pci_function pci;
  std::string driver;
  std::size_t index = 0;  // among NVIDIA GPUs in PCI bus order
  /// BAR1 is the window through which the GPU exposes its memory to peers: every byte of GPU
  /// memory pinned for the controller is mapped there. NVIDIA counts its memory BARs in order
  /// (BAR0 registers, BAR1 memory, BAR3 …), while a 64-bit BAR takes two resource lines, the
  /// second empty: BAR1 is the second BAR with a size — resource 1 on bare metal (BAR0 32-bit),
  /// resource 2 where BAR0 is 64-bit (a VM's H100: read on the GPU machine).
  [[nodiscard]] std::optional<std::uint64_t> bar1_bytes() const {
    if (!pci.bar_bytes) return std::nullopt;
    int seen = 0;
    for (const std::uint64_t bytes : *pci.bar_bytes) {
      if (bytes != 0 && ++seen == 2) return bytes;
    }
    return std::uint64_t{0};  // no second BAR: nothing a peer can reach
  }
};

enum class backend { sysfs, vfio, kmod };
/// Doorbells from the GPU are needed by every tier; tiers 1-3 as in DESIGN.md.
enum class tier { doorbells, one, two, three };

/// Ordered from best to worst: a verdict is the worst of its conditions.
enum class outcome {
  works,         // as the machine stands
  limited,       // works, with a limit said in the reasons
  not_checked,   // decided by something this tool cannot look at (CUDA)
  needs_setup,   // works after the steps in the reasons (bind a driver, load the module, ...)
  not_possible,  // this backend cannot, here; the reasons name what can
};

[[nodiscard]] inline std::string to_string(backend b) {
  switch (b) {
    case backend::sysfs: return "sysfs";
    case backend::vfio: return "vfio";
    case backend::kmod: return "kmod";
  }
  return "?";
}
[[nodiscard]] inline std::string to_string(tier t) {
  switch (t) {
    case tier::doorbells: return "doorbells from the GPU";
    case tier::one: return "tier 1 (queues, data: pinned host memory)";
    case tier::two: return "tier 2 (data: GPU memory)";
    case tier::three: return "tier 3 (queues, data: GPU memory)";
  }
  return "?";
}
[[nodiscard]] inline std::string to_string(outcome o) {
  switch (o) {
    case outcome::works: return "yes";
    case outcome::limited: return "yes, limited";
    case outcome::not_checked: return "not checked";
    case outcome::needs_setup: return "after setup";
    case outcome::not_possible: return "no";
  }
  return "?";
}

struct verdict {
  backend on;
  tier what;
  outcome result = outcome::works;
  std::vector<std::string> reasons;

  /// Adds a condition; the verdict becomes the worse of the two.
  void add(outcome o, std::string reason) {
    result = std::max(result, o);
    reasons.push_back(std::move(reason));
  }
};

struct report {
  controller_facts controller;
  std::optional<gpu_facts> gpu;
  std::optional<pcie_path> path;  // with a GPU
  iommu_facts iommu;
  hugepage_facts hugepages;
  module_facts cunvme_module;
  bool nvidia_module_loaded = false;
  /// cunvme links against nvidia's nvidia_p2p_* symbols: it was built with nvidia_p2p.
  bool cunvme_uses_nvidia_p2p = false;
  process_facts process;
  std::vector<verdict> verdicts;  // backend-major: sysfs, vfio, kmod; each doorbells, tiers 1-3

  [[nodiscard]] const verdict& at(backend b, tier t) const {
    for (const auto& v : verdicts) {
      if (v.on == b && v.what == t) return v;
    }
    throw std::out_of_range("no verdict for " + to_string(b) + ", " + to_string(t));
  }
};

}  // namespace cunvme_doctor

#include "verdicts.hpp"

namespace cunvme_doctor {

struct doctor_request {
  fs::path root = "/";
  std::optional<std::string> controller;  // a BDF; nullopt: every NVMe controller
  std::optional<std::string> gpu;         // an index among NVIDIA GPUs, or a BDF; nullopt: GPU 0 if any
  process_facts process;
};

struct doctor_answer {
  std::vector<gpu_facts> gpus;  // every NVIDIA GPU, in PCI bus order
  std::vector<report> reports;  // one per controller; empty: no NVMe controller found
};

namespace detail {

[[nodiscard]] inline pcie_path trace_path(const system_tree& tree, pci_bus& bus, const std::string& from, const std::string& to) {
  pcie_path path;
  const auto a = tree.hierarchy(from), b = tree.hierarchy(to);
  if (a.empty() || b.empty()) return path;
  std::size_t common = 0;  // length of the shared prefix
  while (common < a.size() && common < b.size() && a[common] == b[common]) ++common;
  auto visit = [&](const std::string& bdf) {
    hop h{bdf, bus.examine(bdf)};
    if (!h.facts || !h.facts->capabilities_readable) {
      path.acs_unknown.push_back(bdf);
    } else if (h.facts->acs && h.facts->acs->redirects()) {
      path.redirecting.push_back(bdf);
    }
    path.hops.push_back(std::move(h));
  };
  // Up from the controller to the common function (inclusive), then down to the GPU; the
  // host bridge (index 0) is no PCI function. Linux's p2pdma looks at the same functions for ACS.
  const std::size_t up_to = std::max<std::size_t>(common, 2) - 1;
  for (std::size_t i = a.size() - 1; i >= up_to; --i) visit(a[i]);
  for (std::size_t i = std::max<std::size_t>(common, 1); i < b.size(); ++i) visit(b[i]);
  if (common == 0) {
    path.route = p2p_route::different_root_complexes;
    path.common.clear();
  } else if (common == 1) {
    path.route = p2p_route::root_complex;
    path.common = a[0];
  } else {
    path.common = a[common - 1];
    const auto it = std::find_if(path.hops.begin(), path.hops.end(), [&](const hop& h) { return h.bdf == path.common; });
    const bool root_port = it != path.hops.end() && it->facts && it->facts->type == port_type::root_port;
    path.route = root_port ? p2p_route::common_root_port : p2p_route::common_switch;
  }
  return path;
}

[[nodiscard]] inline bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

/// sysfs names functions in lower case; users copy addresses from tools that may not.
[[nodiscard]] inline std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

[[nodiscard]] inline std::string hex(std::uint32_t value, int digits) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%0*x", digits, value);
  return text;
}

}  // namespace detail

/// Gathers the facts and the verdicts. Throws host::error for a controller BDF that is
/// malformed, missing or no NVMe controller, and for a GPU selector that names no NVIDIA GPU.
[[nodiscard]] inline doctor_answer examine(const doctor_request& request) {
  const system_tree tree(request.root);
  std::error_code ec;
  if (!fs::is_directory(tree.devices(), ec)) {
    if (request.controller) throw host::error("Doctor", *request.controller, tree.devices().string() + " is missing: no PCI bus to look at");
    if (request.gpu) throw host::error("Doctor", "GPU " + *request.gpu, tree.devices().string() + " is missing: no PCI bus to look at");
    return {};  // no PCI bus, so no controller: the same clean answer as an empty one
  }
  pci_bus bus(request.root);

  doctor_answer answer;
  std::vector<std::string> controllers;
  auto functions = bus.list();
  // PCI bus order, which is CUDA's device order only under CUDA_DEVICE_ORDER=PCI_BUS_ID.
  std::sort(functions.begin(), functions.end(), [](const auto& x, const auto& y) { return x.bdf < y.bdf; });
  for (const auto& f : functions) {
    if (is_nvidia_gpu(f.vendor, f.class_code)) {
      gpu_facts g{*bus.examine(f.bdf), tree.driver(f.bdf), answer.gpus.size()};
      answer.gpus.push_back(std::move(g));
    }
    if (f.class_code == nvme_class_code && !request.controller) controllers.push_back(f.bdf);
  }

  if (request.controller) {
    const std::string bdf = detail::lower(*request.controller);
    if (!host::valid_bdf(bdf)) throw host::error("Doctor", bdf, "'" + bdf + "' is not a PCI address of the form DDDD:BB:DD.F (hex), e.g. 0000:01:00.0");
    const auto f = tree.has_function(bdf) ? bus.examine(bdf) : std::nullopt;
    if (!f) throw host::error("Doctor", bdf, "no such PCI device (" + (tree.devices() / bdf).string() + " is missing)");
    if (f->class_code != nvme_class_code) {
      throw host::error("Doctor", bdf, "not an NVMe controller: class " + detail::hex(f->class_code, 6) + ", NVMe is 0x010802");
    }
    controllers.push_back(bdf);
  }

  const gpu_facts* gpu = nullptr;
  if (request.gpu) {
    const std::string which = detail::lower(*request.gpu);
    for (const auto& g : answer.gpus) {
      if (detail::all_digits(which) ? std::to_string(g.index) == which : g.pci.bdf == which) gpu = &g;
    }
    if (gpu == nullptr) {
      throw host::error("Doctor", "GPU " + which,
                        "no such NVIDIA GPU (" + std::to_string(answer.gpus.size()) + " found; --gpu takes an index among them or a BDF)");
    }
  } else if (!answer.gpus.empty()) {
    gpu = &answer.gpus.front();
  }

  for (const auto& bdf : controllers) {
    report r;
    r.controller = {*bus.examine(bdf), tree.driver(bdf), tree.group_of(bdf)};
    if (gpu != nullptr) {
      r.gpu = *gpu;
      r.path = detail::trace_path(tree, bus, bdf, gpu->pci.bdf);
    }
    r.iommu = tree.iommu();
    r.hugepages = tree.hugepages();
    r.cunvme_module = tree.module("cunvme");
    r.nvidia_module_loaded = tree.module("nvidia").loaded;
    r.cunvme_uses_nvidia_p2p = r.cunvme_module.loaded && tree.module_uses("cunvme", "nvidia");
    r.process = request.process;
    r.verdicts = judge(r);
    answer.reports.push_back(std::move(r));
  }
  return answer;
}

}  // namespace cunvme_doctor
