// Writes the doctor's answer (doctor.hpp) as text, like gdscheck -p: the facts, then a
// verdict per backend and tier with its reasons.
#pragma once

#include "doctor.hpp"

#include <cstdint>
#include <cstdio>
#include <string>

namespace cunvme_doctor {

[[nodiscard]] inline std::string human_bytes(std::uint64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  std::size_t unit = 0;
  while (unit + 1 < std::size(units) && bytes >= 1024 && bytes % 1024 == 0) bytes /= 1024, ++unit;
  return std::to_string(bytes) + " " + units[unit];
}

[[nodiscard]] inline std::string describe_link(const pci_function& f) {
  if (!f.capabilities_readable) return "unknown (config space past 64 bytes needs root)";
  if (!f.link) return f.type ? "none (root complex integrated)" : "none (no PCI Express capability)";
  const auto& l = *f.link;
  std::string text = speed_name(l.speed) + " x" + std::to_string(l.width) + " (max " + speed_name(l.max_speed) + " x" + std::to_string(l.max_width) + ")";
  if (l.below_max()) text += ": below what the device can do";
  return text;
}

[[nodiscard]] inline std::string describe_acs(const pci_function& f) {
  if (!f.capabilities_readable) return "ACS unknown";
  if (!f.acs) return "no ACS";
  char text[96];
  std::snprintf(text, sizeof text, "ACS ctrl 0x%04x: P2P Request Redirect %s, Completion Redirect %s", f.acs->control,
                f.acs->request_redirect() ? "on" : "off", f.acs->completion_redirect() ? "on" : "off");
  return text;
}

inline void print_gpu_line(std::FILE* out, const gpu_facts& g) {
  const auto bar1 = g.bar1_bytes();
  std::fprintf(out, "  GPU %zu  %s  %04x:%04x  driver %s  BAR1 %s  link %s\n", g.index, g.pci.bdf.c_str(), g.pci.vendor, g.pci.device,
               g.driver.empty() ? "none" : g.driver.c_str(), bar1 ? human_bytes(*bar1).c_str() : "unknown", describe_link(g.pci).c_str());
}

inline void print_report(std::FILE* out, const report& r) {
  const auto& c = r.controller;
  std::fprintf(out, "\ncontroller %s  %04x:%04x  driver %s\n", c.pci.bdf.c_str(), c.pci.vendor, c.pci.device,
               c.driver.empty() ? "none" : c.driver.c_str());
  std::fprintf(out, "  BAR0              %s\n", c.pci.bar_bytes ? human_bytes((*c.pci.bar_bytes)[0]).c_str() : "unknown (no readable resource file)");
  std::fprintf(out, "  link              %s\n", describe_link(c.pci).c_str());

  std::string units;
  for (const auto& u : r.iommu.units) units += (units.empty() ? "" : ", ") + u;
  std::fprintf(out, "  IOMMU             %s (%zu groups%s%s)\n", r.iommu.enabled() ? "on" : "off", r.iommu.group_count,
               units.empty() ? "" : "; units ", units.c_str());
  if (c.group) {
    std::fprintf(out, "  IOMMU group       %s, type %s: %s\n", c.group->number.c_str(), c.group->type.empty() ? "unknown" : c.group->type.c_str(),
                 to_string(translation_of(c.group)).c_str());
    for (const auto& m : c.group->members) std::fprintf(out, "    member %s (driver %s)\n", m.bdf.c_str(), m.driver.empty() ? "none" : m.driver.c_str());
  } else {
    std::fprintf(out, "  IOMMU group       none: %s\n", to_string(dma_translation::no_iommu).c_str());
  }

  if (r.gpu) {
    std::fprintf(out, "  against\n");
    print_gpu_line(out, *r.gpu);
    std::fprintf(out, "  GPU maps BAR0     not checked here (needs CUDA: cudaHostRegister with cudaHostRegisterIoMemory)\n");
    const auto& p = *r.path;
    std::fprintf(out, "  PCIe path         %s%s%s\n", to_string(p.route).c_str(), p.common.empty() ? "" : ": ", p.common.c_str());
    for (const auto& h : p.hops) {
      const std::string type = h.facts && h.facts->type ? to_string(*h.facts->type) : "not a PCI Express function";
      std::fprintf(out, "    %s  %-24s %s\n", h.bdf.c_str(), h.facts ? type.c_str() : "not listed by libpci",
                   h.facts ? describe_acs(*h.facts).c_str() : "");
    }
  } else {
    std::fprintf(out, "  GPU               no NVIDIA GPU found (vendor 0x10de, class 0x0300/0x0302)\n");
  }

  if (r.hugepages.known) {
    std::fprintf(out, "  huge pages        %llu free of %llu (%s pages)\n", static_cast<unsigned long long>(r.hugepages.free),
                 static_cast<unsigned long long>(r.hugepages.total), human_bytes(r.hugepages.page_bytes).c_str());
  } else {
    std::fprintf(out, "  huge pages        unknown (no readable /proc/meminfo)\n");
  }
  std::fprintf(out, "  RLIMIT_MEMLOCK    %s%s\n", r.process.memlock_bytes ? human_bytes(*r.process.memlock_bytes).c_str() : "unlimited",
               r.process.cap_ipc_lock ? " (CAP_IPC_LOCK: not charged)" : "");
  std::string parameters;
  for (const auto& [name, value] : r.cunvme_module.parameters) parameters += (parameters.empty() ? "" : ", ") + name + "=" + value;
  if (r.cunvme_module.loaded) {
    std::fprintf(out, "  cunvme module     loaded (%s); nvidia_p2p %s; dma-buf not checked here\n", parameters.c_str(),
                 r.cunvme_uses_nvidia_p2p ? "yes" : "no");
  } else {
    std::fprintf(out, "  cunvme module     not loaded\n");
  }
  std::fprintf(out, "  nvidia module     %s\n", r.nvidia_module_loaded ? "loaded" : "not loaded");

  std::fprintf(out, "  verdicts\n");
  for (const auto& v : r.verdicts) {
    std::fprintf(out, "    %-5s  %-42s %s\n", to_string(v.on).c_str(), to_string(v.what).c_str(), to_string(v.result).c_str());
    for (const auto& reason : v.reasons) std::fprintf(out, "             - %s\n", reason.c_str());
  }
}

inline void print_answer(std::FILE* out, const doctor_answer& a) {
  std::fprintf(out, "NVIDIA GPUs (PCI bus order, which is CUDA's only with CUDA_DEVICE_ORDER=PCI_BUS_ID): %zu\n", a.gpus.size());
  for (const auto& g : a.gpus) print_gpu_line(out, g);
  if (a.reports.empty()) {
    std::fprintf(out, "no NVMe controller found (PCI class 0x010802)\n");
    return;
  }
  for (const auto& r : a.reports) print_report(out, r);
}

}  // namespace cunvme_doctor
