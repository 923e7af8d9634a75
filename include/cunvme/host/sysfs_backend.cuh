// A controller reached through sysfs: BAR0 via `resource0`, bus mastering via the `config`
// file, DMA memory via pagemap (no IOMMU; root). "sysfs:0000:01:00.0" in `host::open`.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/pagemap_memory.cuh>
#include <cunvme/host/register_backend.cuh>

#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// Whether `bdf` is a PCI address in the DDDD:BB:DD.F form sysfs uses.
[[nodiscard]] inline bool valid_bdf(const std::string& bdf) {
  if (bdf.size() != 12 || bdf[4] != ':' || bdf[7] != ':' || bdf[10] != '.') return false;
  for (std::size_t i : {0, 1, 2, 3, 5, 6, 8, 9, 11}) {
    if (!std::isxdigit(static_cast<unsigned char>(bdf[i]))) return false;
  }
  return true;
}

/// BAR0 of an NVMe controller that no kernel driver owns, mapped through sysfs.
///
/// ```
/// host::controller ctrl(std::make_unique<host::sysfs_backend>("0000:01:00.0"));
/// ```
class sysfs_backend final : public register_backend {
 public:
  explicit sysfs_backend(std::string bdf, std::string sysfs_root = "/sys/bus/pci/devices") : bdf_(std::move(bdf)), memory_(bdf_) {
    if (!valid_bdf(bdf_)) throw error("Open", bdf_, "not a PCI address of the form 0000:01:00.0");
    dir_ = std::filesystem::path(sysfs_root) / bdf_;
    if (!std::filesystem::exists(dir_)) throw error("Open", bdf_, "no such PCI device (" + dir_.string() + " is missing)");
    std::ifstream class_file(dir_ / "class");
    std::string pci_class;
    class_file >> pci_class;
    if (pci_class != "0x010802") throw error("Open", bdf_, "PCI class " + pci_class + " is not an NVMe controller (0x010802)");
    if (std::filesystem::exists(dir_ / "driver")) {
      throw error("Open", bdf_, "a kernel driver owns the device; unbind it: echo " + bdf_ + " > " + (dir_ / "driver" / "unbind").string());
    }
    enable_bus_mastering();
    bar_ = map_resource(0, bar_size_);
  }

  sysfs_backend(const sysfs_backend&) = delete;
  sysfs_backend& operator=(const sysfs_backend&) = delete;
  ~sysfs_backend() override {
    if (bar_ != nullptr) ::munmap(bar_, bar_size_);
  }

  [[nodiscard]] std::string name() const override { return bdf_; }
  [[nodiscard]] std::byte* bar() const override { return bar_; }
  [[nodiscard]] std::size_t bar_size() const override { return bar_size_; }
  [[nodiscard]] std::byte* cmb() const override { return cmb_.data(); }
  [[nodiscard]] std::size_t cmb_size() const override { return cmb_.size(); }
  [[nodiscard]] std::uint64_t cmb_bus_address() const override { return cmb_.bus(); }
  [[nodiscard]] dma_allocator& memory() override { return memory_; }

  /// Maps `resource<bar_index>`; the CMB's bus address is that BAR's start (from `resource`)
  /// plus `offset`.
  void map_cmb(unsigned bar_index, std::uint64_t offset, std::uint64_t bytes) override {
    if (bar_index > 5) throw error("Map CMB", bdf_, "CMBLOC.BIR " + std::to_string(bar_index) + " names no BAR");
    std::size_t size = 0;
    std::byte* p = map_resource(bar_index, size);
    if (offset > size || bytes > size - offset) {
      ::munmap(p, size);
      throw error("Map CMB", bdf_, "CMBLOC/CMBSZ describe more than BAR " + std::to_string(bar_index) + "'s " + std::to_string(size) + " bytes");
    }
    std::uint64_t start = 0;
    try {
      start = bar_start(bar_index);
    } catch (...) {
      ::munmap(p, size);
      throw;
    }
    cmb_.assign(p, size, offset, bytes, start + offset);
  }

 private:
  /// PCI command register: Memory Space (bit 1), Bus Master (bit 2) on; INTx off (bit 10),
  /// since the host polls.
  void enable_bus_mastering() {
    const auto path = (dir_ / "config").string();
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) throw os_error("Enable bus mastering", bdf_, "needs root to write " + path);
    std::uint16_t command = 0;
    if (::pread(fd, &command, 2, 4) != 2) {
      ::close(fd);
      throw os_error("Read the PCI command register", bdf_);
    }
    command = static_cast<std::uint16_t>(command | (1u << 1) | (1u << 2) | (1u << 10));
    const bool ok = ::pwrite(fd, &command, 2, 4) == 2;
    ::close(fd);
    if (!ok) throw os_error("Write the PCI command register", bdf_, "needs root");
  }

  [[nodiscard]] std::byte* map_resource(unsigned index, std::size_t& size) const {
    const auto path = (dir_ / ("resource" + std::to_string(index))).string();
    const int fd = ::open(path.c_str(), O_RDWR | O_SYNC | O_CLOEXEC);
    if (fd < 0) throw os_error("Map BAR " + std::to_string(index), bdf_, "needs root to map " + path);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size <= 0) {
      ::close(fd);
      throw error("Map BAR " + std::to_string(index), bdf_, path + " has no size");
    }
    size = static_cast<std::size_t>(st.st_size);
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int e = errno;
    ::close(fd);
    if (p == MAP_FAILED) {
      errno = e;
      throw os_error("Map BAR " + std::to_string(index), bdf_);
    }
    return static_cast<std::byte*>(p);
  }

  /// The BAR's bus address: line `index` of `resource` is "start end flags" in hex.
  [[nodiscard]] std::uint64_t bar_start(unsigned index) const {
    std::ifstream in(dir_ / "resource");
    std::string line;
    for (unsigned i = 0; i <= index; ++i) {
      if (!std::getline(in, line)) throw error("Map CMB", bdf_, "no line " + std::to_string(index) + " in " + (dir_ / "resource").string());
    }
    std::istringstream fields(line);
    std::uint64_t start = 0;
    fields >> std::hex >> start;
    if (!fields || start == 0) throw error("Map CMB", bdf_, "BAR " + std::to_string(index) + " has no address");
    return start;
  }

  std::string bdf_;
  std::filesystem::path dir_;
  pagemap_allocator memory_;
  std::byte* bar_ = nullptr;
  std::size_t bar_size_ = 0;
  bar_window cmb_;
};

}  // namespace host
CUNVME_NAMESPACE_END
