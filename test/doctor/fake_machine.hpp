// A fake machine for the doctor: a sysfs tree under a temp dir with what the kernel would show
// for PCI functions (config space with a PCI Express capability and ACS, resource, class,
// vendor, device, driver and iommu_group links), IOMMU groups, modules and /proc/meminfo.
#pragma once

#include <pci/header.h>

#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace fake {

namespace fs = std::filesystem;

struct link {
  unsigned speed, width, max_speed, max_width;
};

struct function {
  std::uint16_t vendor = 0x8086, device = 0x1234;
  std::uint32_t class_code = 0x060400;  // a PCI-to-PCI bridge
  std::optional<unsigned> port_type;    // PCI_EXP_TYPE_*; nullopt: no PCI Express capability
  link lnk{4, 16, 4, 16};
  std::optional<std::uint16_t> acs_control;  // nullopt: no ACS capability
  std::array<std::uint64_t, 6> bars{};
  std::string driver;       // "" = none
  std::string iommu_group;  // "" = none
  bool root_only_config = false;  // config shows 64 bytes, as sysfs does to non-root readers
};

inline function nvme(std::array<std::uint64_t, 6> bars = {16384}) {
  function f;
  f.vendor = 0x144d, f.device = 0xa808, f.class_code = 0x010802, f.port_type = PCI_EXP_TYPE_ENDPOINT;
  f.lnk = {3, 4, 4, 4};  // 8 GT/s x4 of 16 GT/s x4
  f.bars = bars;
  return f;
}

inline function gpu(std::uint64_t bar1_bytes, std::string driver = "nvidia") {
  function f;
  f.vendor = 0x10de, f.device = 0x2330, f.class_code = 0x030200, f.port_type = PCI_EXP_TYPE_ENDPOINT;
  f.lnk = {5, 16, 5, 16};
  f.bars = {16u << 20, bar1_bytes, 0, 32u << 20, 0, 0};
  f.driver = std::move(driver);
  return f;
}

inline function port(unsigned type, std::optional<std::uint16_t> acs_control = std::nullopt) {
  function f;
  f.port_type = type;
  f.acs_control = acs_control;
  return f;
}

class machine {
 public:
  machine() {
    std::string pattern = (fs::temp_directory_path() / "cunvme-doctor-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    root = pattern;
    fs::create_directories(bus());
    fs::create_directories(root / "sys" / "kernel" / "iommu_groups");
    fs::create_directories(root / "sys" / "class" / "iommu");
    fs::create_directories(root / "sys" / "module");
    hugepages(0, 0);
  }
  machine(const machine&) = delete;
  machine& operator=(const machine&) = delete;
  ~machine() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }

  /// Adds the function at the end of `path` ("pci0000:00/0000:00:01.0/0000:01:00.0").
  void add(const std::string& path, const function& f) {
    const fs::path dir = root / "sys" / "devices" / path;
    const std::string bdf = dir.filename().string();
    fs::create_directories(dir);
    write(dir / "config", config_space(f));
    write(dir / "class", hex(f.class_code, 6) + "\n");
    write(dir / "vendor", hex(f.vendor, 4) + "\n");
    write(dir / "device", hex(f.device, 4) + "\n");
    std::string resource;
    std::uint64_t next = 0xf000000000;
    for (std::size_t i = 0; i < 13; ++i) {  // 6 BARs, the ROM, then the bridge windows
      const std::uint64_t size = i < 6 ? f.bars[i] : 0;
      char line[80];
      std::snprintf(line, sizeof line, "0x%016llx 0x%016llx 0x%016llx\n", size ? static_cast<unsigned long long>(next) : 0ull,
                    size ? static_cast<unsigned long long>(next + size - 1) : 0ull, size ? 0x140204ull : 0ull);
      resource += line;
      next += size ? size : 0;
    }
    write(dir / "resource", resource);
    fs::create_directory_symlink(fs::relative(dir, bus()), bus() / bdf);
    if (!f.driver.empty()) {
      const fs::path drv = root / "sys" / "bus" / "pci" / "drivers" / f.driver;
      fs::create_directories(drv);
      fs::create_directory_symlink(fs::relative(drv, dir), dir / "driver");
    }
    if (!f.iommu_group.empty()) {
      const fs::path group = root / "sys" / "kernel" / "iommu_groups" / f.iommu_group;
      fs::create_directories(group / "devices");
      fs::create_directory_symlink(fs::relative(group, dir), dir / "iommu_group");
      fs::create_directory_symlink(fs::relative(dir, group / "devices"), group / "devices" / bdf);
    }
  }

  void iommu(const std::string& unit) { fs::create_directories(root / "sys" / "class" / "iommu" / unit); }
  void group_type(const std::string& group, const std::string& type) { write(root / "sys" / "kernel" / "iommu_groups" / group / "type", type + "\n"); }
  void hugepages(unsigned total, unsigned free) {
    fs::create_directories(root / "proc");
    write(root / "proc" / "meminfo", "MemTotal:       65536000 kB\nHugePages_Total:    " + std::to_string(total) +
                                         "\nHugePages_Free:     " + std::to_string(free) + "\nHugePages_Rsvd:        0\nHugepagesize:       2048 kB\n");
  }
  void module(const std::string& name, const std::vector<std::pair<std::string, std::string>>& parameters = {}) {
    fs::create_directories(root / "sys" / "module" / name / "holders");
    for (const auto& [key, value] : parameters) {
      fs::create_directories(root / "sys" / "module" / name / "parameters");
      write(root / "sys" / "module" / name / "parameters" / key, value + "\n");
    }
  }
  void module_uses(const std::string& user, const std::string& provider) {
    fs::create_directory_symlink(fs::relative(root / "sys" / "module" / user, root / "sys" / "module" / provider / "holders"),
                                 root / "sys" / "module" / provider / "holders" / user);
  }

  fs::path root;

 private:
  fs::path bus() const { return root / "sys" / "bus" / "pci" / "devices"; }

  static std::string hex(std::uint32_t value, int digits) {
    char text[16];
    std::snprintf(text, sizeof text, "0x%0*x", digits, value);
    return text;
  }
  static void write(const fs::path& file, const std::string& text) { std::ofstream(file, std::ios::binary) << text; }
  template <class T>
  static void put(std::string& config, std::size_t offset, T value) {
    std::memcpy(config.data() + offset, &value, sizeof value);
  }

  /// Config space as the PCIe Base spec lays it out: the header, a capability list holding
  /// the PCI Express capability at 0x40, and ACS as the first extended capability (0x100).
  static std::string config_space(const function& f) {
    std::string config(4096, '\0');
    put<std::uint16_t>(config, PCI_VENDOR_ID, f.vendor);
    put<std::uint16_t>(config, PCI_DEVICE_ID, f.device);
    put<std::uint8_t>(config, PCI_CLASS_PROG, static_cast<std::uint8_t>(f.class_code));
    put<std::uint16_t>(config, PCI_CLASS_DEVICE, static_cast<std::uint16_t>(f.class_code >> 8));
    put<std::uint8_t>(config, PCI_HEADER_TYPE, (f.class_code >> 8) == 0x0604 ? PCI_HEADER_TYPE_BRIDGE : PCI_HEADER_TYPE_NORMAL);
    if (f.port_type) {
      constexpr std::size_t exp = 0x40;
      put<std::uint16_t>(config, PCI_STATUS, PCI_STATUS_CAP_LIST);
      put<std::uint8_t>(config, PCI_CAPABILITY_LIST, exp);
      put<std::uint8_t>(config, exp + PCI_CAP_LIST_ID, PCI_CAP_ID_EXP);
      put<std::uint16_t>(config, exp + PCI_EXP_FLAGS, static_cast<std::uint16_t>(2u | (*f.port_type << 4)));
      put<std::uint32_t>(config, exp + PCI_EXP_LNKCAP, f.lnk.max_speed | (f.lnk.max_width << 4));
      put<std::uint16_t>(config, exp + PCI_EXP_LNKSTA, static_cast<std::uint16_t>(f.lnk.speed | (f.lnk.width << 4)));
      if (f.acs_control) {
        constexpr std::size_t acs = 0x100;
        put<std::uint32_t>(config, acs, PCI_EXT_CAP_ID_ACS | (1u << 16));  // version 1, no next capability
        put<std::uint16_t>(config, acs + PCI_ACS_CAP, PCI_ACS_CAP_VALID | PCI_ACS_CAP_BLOCK | PCI_ACS_CAP_REQ_RED | PCI_ACS_CAP_CMPLT_RED | PCI_ACS_CAP_FORWARD);
        put<std::uint16_t>(config, acs + PCI_ACS_CTRL, *f.acs_control);
      }
    }
    if (f.root_only_config) config.resize(64);
    return config;
  }
};

}  // namespace fake
