// A controller reached through sysfs: BAR0 via `resource0`, bus mastering via the `config`
// file, DMA memory via pagemap (no IOMMU; root). "sysfs:0000:01:00.0" in `host::open`.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/file_descriptor.cuh>
#include <cunvme/detail/file_lock.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/memory/pagemap_memory.cuh>
#include <cunvme/host/backend/register_backend.cuh>

#include <cctype>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// Whether `bdf` is a PCI address in the DDDD:BB:DD.F form (hex digits) sysfs names devices by.
[[nodiscard]] inline bool valid_bdf(std::string_view bdf) noexcept {
  if (bdf.size() != 12 || bdf[4] != ':' || bdf[7] != ':' || bdf[10] != '.') return false;
  for (std::size_t i : {0, 1, 2, 3, 5, 6, 8, 9, 11}) {
    if (!std::isxdigit(static_cast<unsigned char>(bdf[i]))) return false;
  }
  // The device number is 5 bits (00..1f), the function number 3 bits.
  return (bdf[8] == '0' || bdf[8] == '1') && bdf[11] >= '0' && bdf[11] <= '7';
}

/// BAR0 of an NVMe controller that no kernel driver owns, mapped through sysfs; DMA memory from
/// `pagemap_allocator`. Choose it on a machine without an IOMMU (or with it in passthrough),
/// as root — QEMU guests, lab machines; prefer `vfio_backend` wherever an IOMMU is on, since
/// the controller can then reach only the memory it was given.
///
/// One owner at a time: opening takes an exclusive flock on `resource0` and holds it while the
/// backend lives; a second opener — another process, or another backend in this one — is
/// refused with a `host::error` naming the device and the holder, before it touches the
/// controller (bringing it up would reset the controller under the first owner's I/O). The
/// kernel drops the lock when its descriptor closes, so a holder that dies frees the device.
/// Only cunvme's openers take it: a program poking resource0 by hand is not kept out.
///
/// Opening enables memory space and bus mastering and disables INTx in the PCI command
/// register (the host polls). Closing restores nothing: the controller layer has disabled the
/// controller by then, and a driver bound later (nvme, vfio-pci) programs the command
/// register itself.
///
/// Usage: examples/snippets/host.cpp, `sysfs`.
class sysfs_backend final : public register_backend {
 public:
  /// Opens the controller at `bdf` ("0000:01:00.0") under `sysfs_root` (a fake tree in tests).
  explicit sysfs_backend(std::string bdf, std::string sysfs_root = "/sys/bus/pci/devices") : bdf_(std::move(bdf)), memory_(bdf_) {
    if (!valid_bdf(bdf_)) throw error("Open", bdf_, "'" + bdf_ + "' is not a PCI address of the form DDDD:BB:DD.F (hex), e.g. 0000:01:00.0");
    dir_ = std::filesystem::path(std::move(sysfs_root)) / bdf_;
    std::error_code ec;
    if (!std::filesystem::is_directory(dir_, ec)) throw error("Open", bdf_, "no such PCI device (" + dir_.string() + " is missing)");
    check_class();
    check_unbound();
    claim();
    std::size_t size = 0;
    std::byte* p = map_resource(0, size);
    bar0_.assign(p, size, 0, size, 0);
    // Register set (4 KiB) plus the admin queue's two doorbells (DSTRD 0) at least.
    if (size < 0x1008) throw error("Open", bdf_, "resource0 is " + std::to_string(size) + " bytes, too small for NVMe registers and doorbells");
    enable_command_bits();
  }

  sysfs_backend(const sysfs_backend&) = delete;
  sysfs_backend& operator=(const sysfs_backend&) = delete;
  ~sysfs_backend() override = default;  // the BAR windows unmap themselves, then the claim goes

  [[nodiscard]] std::string name() const override { return bdf_; }
  [[nodiscard]] std::byte* bar() const override { return bar0_.data(); }
  [[nodiscard]] std::size_t bar_size() const override { return bar0_.size(); }
  /// resource0, kept open read-write for processes attached to this one (host/sharing/).
  [[nodiscard]] shareable_bar bar_for_other_processes() const override { return {bar0_file_.get(), 0, bar0_.size()}; }
  [[nodiscard]] std::byte* cmb() const override { return cmb_.data(); }
  [[nodiscard]] std::size_t cmb_size() const override { return cmb_.size(); }
  [[nodiscard]] std::uint64_t cmb_bus_address() const override { return cmb_.bus(); }
  [[nodiscard]] dma_allocator& memory() override { return memory_; }

  /// Maps `resource<bar_index>` (CMBLOC.BIR) and keeps `bytes` at `offset` as the CMB, whose bus
  /// address is the BAR's start in `resource` plus `offset`. That start is the CPU physical
  /// address, which equals the PCI bus address on x86 and wherever the host bridge does not
  /// translate. Replaces an earlier CMB mapping.
  void map_cmb(unsigned bar_index, std::uint64_t offset, std::uint64_t bytes) override {
    const std::string bar = "BAR " + std::to_string(bar_index);
    if (bar_index > 5) throw error("Map CMB", bdf_, "CMBLOC.BIR " + std::to_string(bar_index) + " names no BAR");
    if (bytes == 0) throw error("Map CMB", bdf_, "CMBSZ describes an empty CMB");
    const std::uint64_t start = bar_start(bar_index);
    std::size_t size = 0;
    std::byte* p = map_resource(bar_index, size);
    if (offset > size || bytes > size - offset) {
      ::munmap(p, size);
      throw error("Map CMB", bdf_,
                  "CMBLOC/CMBSZ describe " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) + ", beyond " + bar + "'s " +
                      std::to_string(size) + " bytes");
    }
    cmb_.assign(p, size, offset, bytes, start + offset);
  }

 private:
  /// Only an NVMe controller (class 01h, subclass 08h, programming interface 02h) has the
  /// register map the controller layer drives.
  void check_class() const {
    const auto path = dir_ / "class";
    std::ifstream in(path);
    std::string pci_class;
    if (!(in >> pci_class)) throw error("Open", bdf_, "cannot read the PCI class from " + path.string());
    if (pci_class != "0x010802") throw error("Open", bdf_, "PCI class " + pci_class + " is not an NVMe controller (0x010802)");
  }

  /// A bound driver owns the BAR and the DMA setup; both of us driving it corrupts both.
  void check_unbound() const {
    const auto link = dir_ / "driver";
    std::error_code ec;
    if (!std::filesystem::exists(std::filesystem::symlink_status(link, ec))) return;
    const auto target = std::filesystem::read_symlink(link, ec);
    const std::string driver = ec ? std::string("a kernel driver") : "driver " + target.filename().string();
    throw error("Open", bdf_, "the device is bound to " + driver + "; unbind it: echo " + bdf_ + " > " + (link / "unbind").string());
  }

  /// The exclusive lock on resource0 that makes this backend the controller's one owner.
  void claim() {
    const auto path = (dir_ / "resource0").string();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const bool denied = errno == EACCES || errno == EPERM;
      throw os_error("Open", bdf_, denied ? "needs root (CAP_SYS_ADMIN) to open " + path : "cannot open " + path);
    }
    claim_ = cunvme::detail::file_claim(fd);
    std::string holder;
    switch (cunvme::detail::try_lock_file(claim_.fd(), true, holder)) {
      case cunvme::detail::lock_outcome::taken: return;
      case cunvme::detail::lock_outcome::failed: throw os_error("Open", bdf_, "cannot lock " + path);
      case cunvme::detail::lock_outcome::held_elsewhere: break;
    }
    throw error("Open", bdf_,
                "in use by another owner (" + (holder.empty() ? std::string("a process holds the lock on ") + path : holder + " holds " + path) +
                    "): one process and one controller handle at a time drive a sysfs: controller; close the other first");
  }

  /// Memory Space (bit 1) and Bus Master (bit 2) on, so BAR accesses reach the controller and
  /// its DMA reaches memory; Interrupt Disable (bit 10) on, since the host polls completions.
  void enable_command_bits() const {
    const auto path = (dir_ / "config").string();
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) throw os_error("Enable bus mastering", bdf_, "needs root to write " + path);
    std::uint16_t command = 0;
    if (::pread(fd, &command, sizeof command, 4) != sizeof command) {
      const int e = errno;
      ::close(fd);
      errno = e == 0 ? EIO : e;
      throw os_error("Read the PCI command register", bdf_, "needs root to read all of " + path);
    }
    command = static_cast<std::uint16_t>(command | (1u << 1) | (1u << 2) | (1u << 10));
    const bool ok = ::pwrite(fd, &command, sizeof command, 4) == sizeof command;
    const int e = errno;
    ::close(fd);
    if (!ok) {
      errno = e == 0 ? EIO : e;
      throw os_error("Write the PCI command register", bdf_, "needs root to write " + path);
    }
  }

  /// mmaps `resource<index>` whole; `size` is its length (sysfs reports the BAR's size).
  [[nodiscard]] std::byte* map_resource(unsigned index, std::size_t& size) {
    const std::string operation = "Map BAR " + std::to_string(index);
    const auto path = (dir_ / ("resource" + std::to_string(index))).string();
    const int fd = ::open(path.c_str(), O_RDWR | O_SYNC | O_CLOEXEC);
    if (fd < 0) {
      const bool denied = errno == EACCES || errno == EPERM;
      throw os_error(operation, bdf_, denied ? "needs root (CAP_SYS_ADMIN) to map " + path : "cannot open " + path);
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size <= 0) {
      ::close(fd);
      throw error(operation, bdf_, path + " has no size (not a memory BAR?)");
    }
    size = static_cast<std::size_t>(st.st_size);
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int e = errno;
    // The mapping stays valid without the descriptor; BAR0's is kept for attached processes.
    if (index == 0 && p != MAP_FAILED) {
      bar0_file_ = cunvme::detail::file_descriptor(fd);
    } else {
      ::close(fd);
    }
    if (p == MAP_FAILED) {
      errno = e;
      throw os_error(operation, bdf_, e == EACCES || e == EPERM ? "needs root (CAP_SYS_ADMIN) to map " + path : std::string{});
    }
    return static_cast<std::byte*>(p);
  }

  /// The BAR's address: line `index` of `resource` reads "start end flags" in hex.
  [[nodiscard]] std::uint64_t bar_start(unsigned index) const {
    const auto path = dir_ / "resource";
    std::ifstream in(path);
    std::string line;
    for (unsigned i = 0; i <= index; ++i) {
      if (!std::getline(in, line)) throw error("Map CMB", bdf_, "no line for BAR " + std::to_string(index) + " in " + path.string());
    }
    std::istringstream fields(line);
    std::uint64_t start = 0, end = 0;
    fields >> std::hex >> start >> end;
    if (!fields || start == 0 || end <= start) {
      throw error("Map CMB", bdf_, "BAR " + std::to_string(index) + " has no address in " + path.string() + " ('" + line + "')");
    }
    return start;
  }

  std::string bdf_;
  std::filesystem::path dir_;
  // Holds the flock on resource0 (`claim`): closed last, after the BARs are unmapped, and on a
  // constructor's throw.
  cunvme::detail::file_claim claim_;
  cunvme::detail::file_descriptor bar0_file_;
  pagemap_allocator memory_;
  bar_window bar0_;
  bar_window cmb_;
};

}  // namespace host
CUNVME_NAMESPACE_END
