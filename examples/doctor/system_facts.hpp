// The doctor's facts that are files, not config space: IOMMU units and groups, the driver
// bound to a function, the sysfs device path (the PCIe hierarchy), huge pages, loaded
// modules and their parameters. Every path is under a root (normally "/") so that tests can
// hand the doctor a fake tree. The calling process's own limits come from the process.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <sys/resource.h>

namespace cunvme_doctor {

namespace fs = std::filesystem;

/// How the IOMMU treats a group's DMA (/sys/kernel/iommu_groups/N/type, Linux 5.11+).
enum class dma_translation {
  no_iommu,     // no group: the controller's DMA addresses are physical addresses
  translated,   // "DMA" or "DMA-FQ": bus addresses are IOVAs the kernel mapped
  passthrough,  // "identity": grouped, but bus addresses are physical addresses
  unknown,      // a group whose type file is missing or says something else
};

[[nodiscard]] inline std::string to_string(dma_translation t) {
  switch (t) {
    case dma_translation::no_iommu: return "no IOMMU group (DMA to physical addresses)";
    case dma_translation::translated: return "translated (IOVAs)";
    case dma_translation::passthrough: return "passthrough (identity: DMA to physical addresses)";
    case dma_translation::unknown: return "unknown";
  }
  return "unknown";
}

struct group_member {
  std::string bdf, driver;  // driver "" when none is bound
};

struct iommu_group {
  std::string number;
  std::string type;  // the type file's text, "" where there is none
  std::vector<group_member> members;
};

/// The machine-wide IOMMU facts.
struct iommu_facts {
  std::vector<std::string> units;  // /sys/class/iommu entries (dmar0, ivhd0, ...)
  std::size_t group_count = 0;     // entries of /sys/kernel/iommu_groups
  [[nodiscard]] bool enabled() const { return group_count > 0; }
};

struct hugepage_facts {
  bool known = false;  // /proc/meminfo was readable
  std::uint64_t total = 0, free = 0, page_bytes = 0;
};

struct module_facts {
  bool loaded = false;
  std::vector<std::pair<std::string, std::string>> parameters;  // name, value (sorted by name)
};

/// The calling process's limits that decide how much memory it may pin.
struct process_facts {
  std::optional<std::uint64_t> memlock_bytes;  // RLIMIT_MEMLOCK; nullopt = unlimited
  bool cap_ipc_lock = false;                   // pinning is not charged to RLIMIT_MEMLOCK
  bool cap_sys_admin = false;                  // pagemap shows physical frame numbers

  /// This process's: getrlimit and the effective capability set in /proc/self/status.
  static process_facts of_this_process() {
    process_facts p;
    rlimit limit{};
    if (getrlimit(RLIMIT_MEMLOCK, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) p.memlock_bytes = limit.rlim_cur;
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("CapEff:", 0) != 0) continue;
      const std::uint64_t caps = std::stoull(line.substr(7), nullptr, 16);
      constexpr unsigned cap_ipc_lock_bit = 14, cap_sys_admin_bit = 21;  // linux/capability.h
      p.cap_ipc_lock = (caps >> cap_ipc_lock_bit) & 1u;
      p.cap_sys_admin = (caps >> cap_sys_admin_bit) & 1u;
    }
    return p;
  }
};

/// Reads the doctor's file facts under `root`.
class system_tree {
 public:
  explicit system_tree(fs::path root) : root_(std::move(root)) {}

  [[nodiscard]] const fs::path& root() const { return root_; }
  [[nodiscard]] fs::path devices() const { return root_ / "sys" / "bus" / "pci" / "devices"; }
  [[nodiscard]] bool has_function(const std::string& bdf) const {
    std::error_code ec;
    return fs::is_directory(devices() / bdf, ec);
  }

  /// The driver bound to `bdf` ("nvme", "vfio-pci", "cunvme", "nvidia"), "" where none is.
  [[nodiscard]] std::string driver(const std::string& bdf) const { return link_name(devices() / bdf / "driver"); }

  [[nodiscard]] iommu_facts iommu() const {
    iommu_facts f;
    f.units = entries(root_ / "sys" / "class" / "iommu");
    f.group_count = entries(groups_dir()).size();
    return f;
  }

  /// The IOMMU group of `bdf`, with every member and its driver (VFIO needs them all bound to
  /// vfio-pci or to nothing); nullopt without one.
  [[nodiscard]] std::optional<iommu_group> group_of(const std::string& bdf) const {
    const std::string number = link_name(devices() / bdf / "iommu_group");
    if (number.empty()) return std::nullopt;
    iommu_group g;
    g.number = number;
    g.type = first_line(groups_dir() / number / "type");
    for (const auto& member : entries(groups_dir() / number / "devices")) g.members.push_back({member, driver(member)});
    return g;
  }

  /// The PCI functions from the root complex down to `bdf`, from its sysfs device path
  /// (/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0): first the host bridge's name
  /// ("pci0000:00"), then each function's address, `bdf` last. Empty where the link is missing.
  [[nodiscard]] std::vector<std::string> hierarchy(const std::string& bdf) const {
    std::error_code ec;
    const fs::path real = fs::canonical(devices() / bdf, ec);
    if (ec) return {};
    std::vector<std::string> chain;
    for (const auto& part : real) {
      const std::string name = part.string();
      if (name.rfind("pci", 0) == 0 && name.find(':') != std::string::npos) {
        chain.assign(1, name);  // a host bridge: the hierarchy starts here
      } else if (!chain.empty() && looks_like_bdf(name)) {
        chain.push_back(name);
      }
    }
    return chain;
  }

  /// HugePages_Total, HugePages_Free and Hugepagesize from /proc/meminfo.
  [[nodiscard]] hugepage_facts hugepages() const {
    hugepage_facts h;
    std::ifstream meminfo(root_ / "proc" / "meminfo");
    for (std::string line; std::getline(meminfo, line);) {
      std::istringstream fields(line);
      std::string key;
      std::uint64_t value = 0;
      if (!(fields >> key >> value)) continue;
      if (key == "HugePages_Total:") h.total = value, h.known = true;
      if (key == "HugePages_Free:") h.free = value;
      if (key == "Hugepagesize:") h.page_bytes = value * 1024;  // the file says kB
    }
    return h;
  }

  /// Whether /sys/module/`name` exists, and what its parameters directory shows.
  [[nodiscard]] module_facts module(const std::string& name) const {
    module_facts m;
    const fs::path dir = root_ / "sys" / "module" / name;
    std::error_code ec;
    m.loaded = fs::is_directory(dir, ec);
    if (!m.loaded) return m;
    for (const auto& parameter : entries(dir / "parameters")) m.parameters.emplace_back(parameter, first_line(dir / "parameters" / parameter));
    return m;
  }

  /// Whether module `user` links against symbols of module `provider`: the kernel then lists it
  /// in /sys/module/`provider`/holders.
  [[nodiscard]] bool module_uses(const std::string& user, const std::string& provider) const {
    std::error_code ec;
    return fs::exists(root_ / "sys" / "module" / provider / "holders" / user, ec);
  }

  static bool looks_like_bdf(const std::string& name) {
    unsigned domain = 0, bus = 0, device = 0, function = 0;
    char tail = 0;
    return name.size() == 12 && std::sscanf(name.c_str(), "%4x:%2x:%2x.%1u%c", &domain, &bus, &device, &function, &tail) == 4;
  }

 private:
  [[nodiscard]] fs::path groups_dir() const { return root_ / "sys" / "kernel" / "iommu_groups"; }

  /// The sorted names in `dir`; empty where it is missing.
  static std::vector<std::string> entries(const fs::path& dir) {
    std::vector<std::string> names;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) names.push_back(it->path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  /// The last component of a symbolic link's target, "" where it is no link.
  static std::string link_name(const fs::path& link) {
    std::error_code ec;
    const fs::path target = fs::read_symlink(link, ec);
    return ec ? std::string() : target.filename().string();
  }

  static std::string first_line(const fs::path& file) {
    std::ifstream in(file);
    std::string line;
    std::getline(in, line);
    return line;
  }

  fs::path root_;
};

[[nodiscard]] inline dma_translation translation_of(const std::optional<iommu_group>& group) {
  if (!group) return dma_translation::no_iommu;
  if (group->type == "DMA" || group->type == "DMA-FQ") return dma_translation::translated;
  if (group->type == "identity") return dma_translation::passthrough;
  return dma_translation::unknown;
}

}  // namespace cunvme_doctor
