// The doctor's view of PCI functions through libpci (pciutils): identity, class, BAR sizes,
// the PCI Express capability (port type, link speed and width) and the ACS extended
// capability. libpci reads them from sysfs under a root the caller chooses (a fake tree in
// tests), so nothing here parses config-space bytes by hand.
//
// libpci is a dependency of this tool only, never of the header-only library.
#pragma once

extern "C" {
#include <pci/pci.h>
}

#include <array>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace cunvme_doctor {

/// Link speed and width from the PCI Express capability (PCIe Base 6.0, 7.5.3.6 Link
/// Capabilities, 7.5.3.8 Link Status). Speeds are the encodings of the Supported Link Speeds
/// vector: 1 = 2.5 GT/s ... 6 = 64 GT/s.
struct pcie_link {
  unsigned speed = 0, width = 0;          // negotiated now
  unsigned max_speed = 0, max_width = 0;  // what the port can do
  [[nodiscard]] bool below_max() const { return speed < max_speed || width < max_width; }
};

[[nodiscard]] inline std::string speed_name(unsigned code) {
  static constexpr const char* names[] = {"unknown speed", "2.5 GT/s", "5 GT/s", "8 GT/s", "16 GT/s", "32 GT/s", "64 GT/s"};
  return code < std::size(names) ? names[code] : "speed code " + std::to_string(code);
}

/// The ACS controls that matter for peer-to-peer (PCIe Base 6.0, 7.7.8.3): with P2P Request
/// Redirect or Completion Redirect enabled on a port, peer-to-peer TLPs go up to the root
/// complex (and through the IOMMU) instead of turning in the switch.
struct acs_state {
  std::uint16_t capability = 0, control = 0;
  [[nodiscard]] bool request_redirect() const { return (control & PCI_ACS_CTRL_REQ_RED) != 0; }
  [[nodiscard]] bool completion_redirect() const { return (control & PCI_ACS_CTRL_CMPLT_RED) != 0; }
  [[nodiscard]] bool redirects() const { return request_redirect() || completion_redirect(); }
};

/// PCI Express Device/Port Type (PCIe Base 6.0, 7.5.3.2).
enum class port_type : unsigned {
  endpoint = PCI_EXP_TYPE_ENDPOINT,
  legacy_endpoint = PCI_EXP_TYPE_LEG_END,
  root_port = PCI_EXP_TYPE_ROOT_PORT,
  switch_upstream = PCI_EXP_TYPE_UPSTREAM,
  switch_downstream = PCI_EXP_TYPE_DOWNSTREAM,
  pcie_to_pci_bridge = PCI_EXP_TYPE_PCI_BRIDGE,
  pci_to_pcie_bridge = PCI_EXP_TYPE_PCIE_BRIDGE,
  root_complex_integrated = PCI_EXP_TYPE_ROOT_INT_EP,
  root_complex_event_collector = PCI_EXP_TYPE_ROOT_EC,
};

[[nodiscard]] inline std::string to_string(port_type type) {
  switch (type) {
    case port_type::endpoint: return "endpoint";
    case port_type::legacy_endpoint: return "legacy endpoint";
    case port_type::root_port: return "root port";
    case port_type::switch_upstream: return "switch upstream port";
    case port_type::switch_downstream: return "switch downstream port";
    case port_type::pcie_to_pci_bridge: return "PCIe-to-PCI bridge";
    case port_type::pci_to_pcie_bridge: return "PCI-to-PCIe bridge";
    case port_type::root_complex_integrated: return "root complex integrated endpoint";
    case port_type::root_complex_event_collector: return "root complex event collector";
  }
  return "port type " + std::to_string(static_cast<unsigned>(type));
}

/// What libpci says about one PCI function.
struct pci_function {
  std::string bdf;  // DDDD:BB:DD.F
  std::uint16_t vendor = 0, device = 0;
  std::uint32_t class_code = 0;  // base class, sub class, programming interface: 0x010802 for NVMe
  /// Config space past the first 64 bytes could be read: Linux shows the rest (and so the
  /// capabilities) to root only.
  bool capabilities_readable = false;
  std::optional<port_type> type;  // absent: no PCI Express capability
  std::optional<pcie_link> link;  // absent: no link (root complex integrated) or not readable
  std::optional<acs_state> acs;   // absent: no ACS capability
  /// Bytes of each BAR as the kernel's `resource` file gives them; absent where unreadable.
  std::optional<std::array<std::uint64_t, 6>> bar_bytes;
};

[[nodiscard]] inline std::string bdf_of(const pci_dev& d) {
  char text[16];
  std::snprintf(text, sizeof text, "%04x:%02x:%02x.%u", static_cast<unsigned>(d.domain) & 0xffffu, d.bus, d.dev, d.func);
  return text;
}

/// libpci over the linux-sysfs access method, rooted at `root` (normally "/").
///
/// What libpci 3.9 (Debian 12) reads, found by trying it on fake trees: the entries of
/// sys/bus/pci/devices when scanning; a function's `vendor`, `device` and `class` files when
/// identifying it (a missing one is fatal); `resource` only for BAR sizes; `config` for the
/// capabilities (4096 bytes for root, 64 for others, as Linux shows it).
///
/// libpci reports fatal problems through `pci_access::error`, which must not return; its
/// default exits the process. This one throws std::runtime_error instead, so a malformed tree
/// (a `resource` file missing, an entry that is no PCI address) becomes an answer, not an exit.
class pci_bus {
 public:
  explicit pci_bus(const std::filesystem::path& root) : sysfs_path_((root / "sys" / "bus" / "pci").string()) {
    access_ = pci_alloc();
    access_->method = PCI_ACCESS_SYS_BUS_PCI;
    access_->error = throw_error;
    access_->warning = ignore_warning;  // a read that fails is seen by its caller (capabilities_readable)
    // libpci 3.x names the linux-sysfs method's directory "sysfs.path" (lib/sysfs.c).
    if (pci_set_param(access_, const_cast<char*>("sysfs.path"), sysfs_path_.data()) != 0) {
      pci_cleanup(access_);
      throw std::runtime_error("libpci has no sysfs.path parameter");
    }
    try {
      pci_init(access_);
      pci_scan_bus(access_);
    } catch (...) {
      pci_cleanup(access_);
      throw;
    }
  }
  pci_bus(const pci_bus&) = delete;
  pci_bus& operator=(const pci_bus&) = delete;
  ~pci_bus() { pci_cleanup(access_); }

  /// Every function's address with its class code, for finding controllers and GPUs.
  struct listed {
    std::string bdf;
    std::uint16_t vendor;
    std::uint32_t class_code;
  };
  [[nodiscard]] std::vector<listed> list() {
    std::vector<listed> all;
    for (pci_dev* d = access_->devices; d != nullptr; d = d->next) {
      pci_fill_info(d, PCI_FILL_IDENT | PCI_FILL_CLASS | PCI_FILL_CLASS_EXT);
      all.push_back({bdf_of(*d), d->vendor_id, class_code_of(*d)});
    }
    return all;
  }

  /// The facts of the function at `bdf`; nullopt where libpci does not list it.
  [[nodiscard]] std::optional<pci_function> examine(const std::string& bdf) {
    pci_dev* d = find(bdf);
    if (d == nullptr) return std::nullopt;
    pci_function f;
    f.bdf = bdf;
    pci_fill_info(d, PCI_FILL_IDENT | PCI_FILL_CLASS | PCI_FILL_CLASS_EXT);
    f.vendor = d->vendor_id;
    f.device = d->device_id;
    f.class_code = class_code_of(*d);
    try {
      pci_fill_info(d, PCI_FILL_BASES | PCI_FILL_SIZES);
      std::array<std::uint64_t, 6> sizes{};
      for (std::size_t i = 0; i < sizes.size(); ++i) sizes[i] = d->size[i];
      f.bar_bytes = sizes;
    } catch (const std::runtime_error&) {
      // No readable `resource` file: the BAR sizes stay unknown, and the report says so.
    }
    std::uint8_t probe[4];
    f.capabilities_readable = pci_read_block(d, 0xfc, probe, sizeof probe) != 0;
    if (!f.capabilities_readable) return f;
    if (const pci_cap* exp = pci_find_cap(d, PCI_CAP_ID_EXP, PCI_CAP_NORMAL)) {
      const unsigned flags = pci_read_word(d, static_cast<int>(exp->addr) + PCI_EXP_FLAGS);
      f.type = static_cast<port_type>((flags & PCI_EXP_FLAGS_TYPE) >> 4);
      if (*f.type != port_type::root_complex_integrated && *f.type != port_type::root_complex_event_collector) {
        const std::uint32_t caps = pci_read_long(d, static_cast<int>(exp->addr) + PCI_EXP_LNKCAP);
        const unsigned status = pci_read_word(d, static_cast<int>(exp->addr) + PCI_EXP_LNKSTA);
        f.link = pcie_link{status & PCI_EXP_LNKSTA_SPEED, (status & PCI_EXP_LNKSTA_WIDTH) >> 4u, caps & PCI_EXP_LNKCAP_SPEED,
                           (caps & PCI_EXP_LNKCAP_WIDTH) >> 4u};
      }
    }
    if (const pci_cap* acs = pci_find_cap(d, PCI_EXT_CAP_ID_ACS, PCI_CAP_EXTENDED)) {
      f.acs = acs_state{pci_read_word(d, static_cast<int>(acs->addr) + PCI_ACS_CAP), pci_read_word(d, static_cast<int>(acs->addr) + PCI_ACS_CTRL)};
    }
    return f;
  }

 private:
  [[noreturn]] static void throw_error(char* format, ...) {
    char message[512];
    va_list args;
    va_start(args, format);
    std::vsnprintf(message, sizeof message, format, args);
    va_end(args);
    throw std::runtime_error(std::string("libpci: ") + message);
  }
  static void ignore_warning(char*, ...) {}

  static std::uint32_t class_code_of(const pci_dev& d) { return (static_cast<std::uint32_t>(d.device_class) << 8) | d.prog_if; }

  pci_dev* find(const std::string& bdf) {
    for (pci_dev* d = access_->devices; d != nullptr; d = d->next) {
      if (bdf_of(*d) == bdf) return d;
    }
    return nullptr;
  }

  std::string sysfs_path_;  // outlives access_: libpci keeps the pointer
  pci_access* access_ = nullptr;
};

}  // namespace cunvme_doctor
