// A controller bound to vfio-pci: BAR0 through the VFIO region mmap, DMA through the IOMMU
// (classic container/group API, type-1 IOMMU). "vfio:0000:01:00.0" in `host::open`. Correct
// with an IOMMU on, and needs no root, only access to /dev/vfio/<group>.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/dma_memory.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/register_backend.cuh>
#include <cunvme/host/sysfs_backend.cuh>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <linux/vfio.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// An inclusive range of I/O virtual addresses the IOMMU translates, as VFIO reports them.
struct iova_range {
  std::uint64_t first = 0;
  std::uint64_t last = 0;
};

/// Hands out IOVA ranges upwards from 1 MiB, skipping what the IOMMU cannot translate (on x86
/// the MSI window at 0xfee00000 is one hole). IOVAs are never reused: a 48-bit space outlasts
/// any process, and a stale PRP from a buffer already freed then faults in the IOMMU instead
/// of landing in a newer buffer. A 4 KiB unmapped guard follows every range for the same
/// reason. Thread-safe.
class iova_space {
 public:
  /// `valid`: the translatable ranges (everything when empty); `start`: the lowest IOVA handed
  /// out — 0 is kept free, so a zero PRP faults.
  explicit iova_space(std::vector<iova_range> valid = {}, std::uint64_t start = std::uint64_t{1} << 20) : next_(start) {
    if (valid.empty()) valid.push_back({0, std::numeric_limits<std::uint64_t>::max()});
    std::sort(valid.begin(), valid.end(), [](const iova_range& a, const iova_range& b) { return a.first < b.first; });
    ranges_ = std::move(valid);
  }

  /// An IOVA aligned to `alignment` (a power of two, at least 4 KiB) for `bytes` (a multiple
  /// of 4 KiB), or nothing when no valid range above the last one handed out has room.
  [[nodiscard]] std::optional<std::uint64_t> take(std::uint64_t bytes, std::uint64_t alignment = page) {
    if (bytes == 0 || bytes % page != 0 || alignment < page || (alignment & (alignment - 1)) != 0) return std::nullopt;
    const std::lock_guard lock(mutex_);
    for (const auto& r : ranges_) {
      if (r.last < next_ || r.last - r.first < bytes - 1) continue;
      const std::uint64_t from = std::max(next_, r.first);
      if (from > std::numeric_limits<std::uint64_t>::max() - (alignment - 1)) continue;
      const std::uint64_t at = (from + alignment - 1) / alignment * alignment;
      if (at > r.last || r.last - at < bytes - 1) continue;
      // The next range starts past a guard page (saturating at the top of the space).
      const std::uint64_t end = at + (bytes - 1);
      next_ = end > std::numeric_limits<std::uint64_t>::max() - page - 1 ? std::numeric_limits<std::uint64_t>::max() : end + 1 + page;
      return at;
    }
    return std::nullopt;
  }

 private:
  static constexpr std::uint64_t page = 4096;
  std::mutex mutex_;
  std::vector<iova_range> ranges_;
  std::uint64_t next_;
};

/// An owned file descriptor (closed when dropped).
class vfio_fd {
 public:
  vfio_fd() = default;
  explicit vfio_fd(int fd) noexcept : fd_(fd) {}
  vfio_fd(vfio_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  vfio_fd& operator=(vfio_fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  vfio_fd(const vfio_fd&) = delete;
  vfio_fd& operator=(const vfio_fd&) = delete;
  ~vfio_fd() { reset(); }

  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] explicit operator bool() const noexcept { return fd_ >= 0; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

/// DMA memory mapped into a VFIO container: anonymous host memory at IOVAs from a
/// `iova_space`, so each buffer is one contiguous bus range whatever its physical pages
/// (`pages()[i] == bus(0) + 4096·i`). VFIO pins the pages while they are mapped.
///
/// Every buffer shares ownership of the container, so one that outlives the backend still
/// unmaps its IOVA range from the right container, never from a descriptor number reused since.
class vfio_allocator final : public dma_allocator {
 public:
  vfio_allocator(std::shared_ptr<const vfio_fd> container, std::string device, std::vector<iova_range> valid = {})
      : container_(std::move(container)), device_(std::move(device)), iovas_(std::move(valid)) {}

  [[nodiscard]] dma_buffer map_gpu(void*, std::size_t) override {
    throw error("Map GPU memory", device_,
                "GPU memory through VFIO needs a dma-buf import into the IOMMU, which cunvme does not do yet; use kmod: for "
                "peer-to-peer DMA");
  }

 protected:
  [[nodiscard]] std::string name() const override { return device_; }

  /// `bytes` of zeroed memory (fresh anonymous pages are zero) mapped for the controller to read
  /// and write. The IOMMU maps any pages at an IOVA this process picks: aligning the IOVA is
  /// enough.
  [[nodiscard]] dma_buffer allocate_aligned(std::size_t bytes, std::size_t alignment) override {
    if (bytes == 0) throw error("Allocate DMA memory", device_, "0 bytes asked for");
    if (bytes > std::numeric_limits<std::size_t>::max() / 2) throw error("Allocate DMA memory", device_, std::to_string(bytes) + " bytes asked for");
    const std::size_t mapped = (bytes + page - 1) / page * page;
    const auto iova = iovas_.take(mapped, alignment);
    if (!iova) throw error("Allocate DMA memory", device_, "the IOMMU's address space has no room left for " + std::to_string(mapped) + " bytes");
    void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) throw os_error("Allocate DMA memory", device_);
    // A child sharing the pages copy-on-write would make our next write move them away from the
    // pinned, mapped ones.
    (void)::madvise(p, mapped, MADV_DONTFORK);
    vfio_iommu_type1_dma_map map{};
    map.argsz = sizeof map;
    map.flags = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE;
    map.vaddr = reinterpret_cast<std::uintptr_t>(p);
    map.iova = *iova;
    map.size = mapped;
    if (::ioctl(container_->get(), VFIO_IOMMU_MAP_DMA, &map) != 0) {
      const int e = errno;
      ::munmap(p, mapped);
      errno = e;
      throw os_error("Map DMA memory into the IOMMU", device_,
                     e == ENOMEM ? "VFIO pins mapped pages against RLIMIT_MEMLOCK: raise it (ulimit -l) to cover all DMA buffers" : std::string{});
    }
    std::vector<std::uint64_t> pages(mapped / page);
    for (std::size_t i = 0; i < pages.size(); ++i) pages[i] = *iova + page * i;
    return dma_buffer(static_cast<std::byte*>(p), nullptr, bytes, page, std::move(pages), memory_location::pinned_host,
                      [container = container_, p, mapped, at = *iova] {
                        // Unmap from the IOMMU before the pages go back to the kernel.
                        vfio_iommu_type1_dma_unmap unmap{};
                        unmap.argsz = sizeof unmap;
                        unmap.iova = at;
                        unmap.size = mapped;
                        (void)::ioctl(container->get(), VFIO_IOMMU_UNMAP_DMA, &unmap);
                        ::munmap(p, mapped);
                      });
  }

 private:
  static constexpr std::size_t page = 4096;
  std::shared_ptr<const vfio_fd> container_;
  std::string device_;
  iova_space iovas_;
};

/// An NVMe controller bound to vfio-pci, its DMA confined by the IOMMU to the buffers this
/// process mapped. Choose it wherever an IOMMU is on; it needs no root, only read/write access
/// to /dev/vfio/<group>.
///
/// ```
/// // echo 0000:01:00.0 > /sys/bus/pci/devices/0000:01:00.0/driver/unbind
/// // echo vfio-pci > /sys/bus/pci/devices/0000:01:00.0/driver_override
/// // echo 0000:01:00.0 > /sys/bus/pci/drivers_probe
/// host::controller ctrl(std::make_unique<host::vfio_backend>("0000:01:00.0"));
/// ```
class vfio_backend final : public register_backend {
 public:
  /// Opens the controller at `bdf` ("0000:01:00.0"); `sysfs_root` is where its IOMMU group and
  /// driver are looked up (a fake tree in tests).
  explicit vfio_backend(std::string bdf, std::string sysfs_root = "/sys/bus/pci/devices") : bdf_(std::move(bdf)) {
    if (!valid_bdf(bdf_)) throw error("Open", bdf_, "'" + bdf_ + "' is not a PCI address of the form DDDD:BB:DD.F (hex), e.g. 0000:01:00.0");
    const auto dir = std::filesystem::path(std::move(sysfs_root)) / bdf_;
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) throw error("Open", bdf_, "no such PCI device (" + dir.string() + " is missing)");
    const auto group_link = std::filesystem::read_symlink(dir / "iommu_group", ec);
    if (ec) {
      throw error("Open", bdf_,
                  "no IOMMU group (" + (dir / "iommu_group").string() +
                      " is missing): boot with intel_iommu=on or amd_iommu=on and enable VT-d/AMD-Vi in the firmware");
    }
    group_number_ = group_link.filename().string();
    check_driver(dir);
    open_container();
    map_bar0();
    enable_command_bits();
  }

  vfio_backend(const vfio_backend&) = delete;
  vfio_backend& operator=(const vfio_backend&) = delete;
  // Members go in reverse order: the allocator, the BAR mapping, the device, the group; the
  // container closes when the last buffer sharing it is gone.
  ~vfio_backend() override = default;

  [[nodiscard]] std::string name() const override { return bdf_; }
  [[nodiscard]] std::byte* bar() const override { return bar0_.data(); }
  [[nodiscard]] std::size_t bar_size() const override { return bar0_.size(); }
  [[nodiscard]] dma_allocator& memory() override { return *memory_; }
  /// The IOMMU group number (the N of /dev/vfio/N).
  [[nodiscard]] const std::string& iommu_group() const noexcept { return group_number_; }

  /// Not supported: the controller would reach its CMB at an IOVA, so the BAR would have to be
  /// mapped into the IOMMU (peer-to-peer through VFIO_IOMMU_MAP_DMA of an MMIO mapping) and
  /// CMBMSC.CBA set to that IOVA; no one needs it yet. Always throws `host::error`.
  void map_cmb(unsigned, std::uint64_t, std::uint64_t) override {
    throw error("Map CMB", bdf_, "CMB through VFIO is not supported; use sysfs: or kmod: for queues in the controller memory buffer");
  }

 private:
  /// VFIO only hands out devices vfio-pci owns; saying so beats the ENODEV that follows.
  void check_driver(const std::filesystem::path& dir) const {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(dir / "driver", ec);
    const std::string driver = ec ? std::string{} : target.filename().string();
    if (driver == "vfio-pci") return;
    throw error("Open", bdf_,
                "the device is not bound to vfio-pci (" + (driver.empty() ? std::string("no driver") : "driver " + driver) +
                    "); bind it: echo " + bdf_ + " > " + (dir / "driver" / "unbind").string() + "; echo vfio-pci > " +
                    (dir / "driver_override").string() + "; echo " + bdf_ + " > /sys/bus/pci/drivers_probe");
  }

  void open_container() {
    vfio_fd container(::open("/dev/vfio/vfio", O_RDWR | O_CLOEXEC));
    if (!container) {
      throw os_error("Open /dev/vfio/vfio", bdf_, errno == ENOENT ? "load the vfio-pci module (modprobe vfio-pci)" : "needs permission on /dev/vfio/vfio");
    }
    if (::ioctl(container.get(), VFIO_GET_API_VERSION) != VFIO_API_VERSION) {
      throw error("Open VFIO", bdf_, "the kernel's VFIO API version is not " + std::to_string(VFIO_API_VERSION));
    }
    const int type = ::ioctl(container.get(), VFIO_CHECK_EXTENSION, VFIO_TYPE1v2_IOMMU) > 0 ? VFIO_TYPE1v2_IOMMU
                     : ::ioctl(container.get(), VFIO_CHECK_EXTENSION, VFIO_TYPE1_IOMMU) > 0 ? VFIO_TYPE1_IOMMU
                                                                                             : -1;
    if (type < 0) throw error("Open VFIO", bdf_, "the kernel offers no type-1 IOMMU (VFIO_TYPE1v2_IOMMU or VFIO_TYPE1_IOMMU)");

    const std::string group_path = "/dev/vfio/" + group_number_;
    group_ = vfio_fd(::open(group_path.c_str(), O_RDWR | O_CLOEXEC));
    if (!group_) {
      const int e = errno;
      std::string hint = "needs permission on " + group_path + " (chown it to this user or run as root)";
      if (e == ENOENT) {
        hint = ::access(("/dev/vfio/noiommu-" + group_number_).c_str(), F_OK) == 0
                   ? "VFIO runs in no-IOMMU mode, which translates no DMA: use sysfs:" + bdf_ + " as root instead"
                   : "the device is not bound to vfio-pci";
      } else if (e == EBUSY) {
        hint = "group " + group_number_ + " is in use by another process";
      }
      errno = e;
      throw os_error("Open " + group_path, bdf_, hint);
    }
    vfio_group_status status{};
    status.argsz = sizeof status;
    if (::ioctl(group_.get(), VFIO_GROUP_GET_STATUS, &status) != 0) throw os_error("Query VFIO group " + group_number_, bdf_);
    if ((status.flags & VFIO_GROUP_FLAGS_VIABLE) == 0) {
      throw error("Open VFIO", bdf_,
                  "group not viable: bind every device of group " + group_number_ + " to vfio-pci (see /sys/kernel/iommu_groups/" + group_number_ +
                      "/devices)");
    }
    int container_fd = container.get();
    if (::ioctl(group_.get(), VFIO_GROUP_SET_CONTAINER, &container_fd) != 0) throw os_error("Attach VFIO group " + group_number_, bdf_);
    if (::ioctl(container.get(), VFIO_SET_IOMMU, type) != 0) {
      // vfio_iommu_type1 refuses a group with EPERM where MSIs are not remapped, since the
      // device could then raise any interrupt (its dmesg line says the same).
      throw os_error("Set the VFIO IOMMU type", bdf_,
                     errno == EPERM ? "the IOMMU does not remap interrupts: turn interrupt remapping on (firmware, intremap), or load "
                                      "vfio_iommu_type1 with allow_unsafe_interrupts=1 if every device in the group is trusted"
                                    : std::string{});
    }
    std::vector<iova_range> ranges = iova_ranges(container.get());

    device_ = vfio_fd(::ioctl(group_.get(), VFIO_GROUP_GET_DEVICE_FD, bdf_.c_str()));
    if (!device_) throw os_error("Get the VFIO device", bdf_, "the device is not bound to vfio-pci");
    memory_ = std::make_unique<vfio_allocator>(std::make_shared<const vfio_fd>(std::move(container)), bdf_, std::move(ranges));
  }

  /// The IOVA ranges the IOMMU translates (VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE, Linux 5.4+);
  /// empty (everything) where the kernel does not say. Also refuses IOMMUs whose smallest page is
  /// over 4 KiB, since buffers are mapped per 4 KiB.
  [[nodiscard]] std::vector<iova_range> iova_ranges(int container) const {
    vfio_iommu_type1_info head{};
    head.argsz = sizeof head;
    if (::ioctl(container, VFIO_IOMMU_GET_INFO, &head) != 0) return {};
    const std::uint64_t smallest_page = head.iova_pgsizes & (~head.iova_pgsizes + 1);
    if ((head.flags & VFIO_IOMMU_INFO_PGSIZES) != 0 && smallest_page > page) {
      throw error("Open VFIO", bdf_, "the IOMMU's smallest page is over 4 KiB (page sizes 0x" + to_hex(head.iova_pgsizes) + ")");
    }
    if ((head.flags & VFIO_IOMMU_INFO_CAPS) == 0 || head.argsz <= sizeof head) return {};
    // Again with room for the capability chain, which the kernel sized in argsz.
    std::vector<std::byte> buffer(head.argsz);
    vfio_iommu_type1_info info{};
    info.argsz = head.argsz;
    std::memcpy(buffer.data(), &info, sizeof info);
    if (::ioctl(container, VFIO_IOMMU_GET_INFO, buffer.data()) != 0) return {};
    std::memcpy(&info, buffer.data(), sizeof info);
    if ((info.flags & VFIO_IOMMU_INFO_CAPS) == 0) return {};
    std::uint32_t at = info.cap_offset;
    // Each capability names the next; a bounded walk, in case a chain ever loops.
    for (int hops = 0; at != 0 && hops < 64; ++hops) {
      vfio_info_cap_header cap{};
      if (at + sizeof cap > buffer.size()) break;
      std::memcpy(&cap, buffer.data() + at, sizeof cap);
      if (cap.id == VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE) {
        std::uint32_t count = 0;
        const std::size_t count_at = at + sizeof cap, ranges_at = count_at + 8;  // nr_iovas, reserved, then the ranges
        if (count_at + sizeof count > buffer.size()) break;
        std::memcpy(&count, buffer.data() + count_at, sizeof count);
        std::vector<iova_range> ranges;
        for (std::uint32_t i = 0; i < count && ranges_at + (i + 1) * 16 <= buffer.size(); ++i) {
          iova_range r;
          std::memcpy(&r.first, buffer.data() + ranges_at + i * 16, 8);
          std::memcpy(&r.last, buffer.data() + ranges_at + i * 16 + 8, 8);
          ranges.push_back(r);
        }
        if (ranges.empty()) throw error("Open VFIO", bdf_, "the IOMMU reports no usable IOVA range");
        return ranges;
      }
      at = cap.next;
    }
    return {};
  }

  void map_bar0() {
    vfio_region_info region{};
    region.argsz = sizeof region;
    region.index = VFIO_PCI_BAR0_REGION_INDEX;
    if (::ioctl(device_.get(), VFIO_DEVICE_GET_REGION_INFO, &region) != 0) throw os_error("Query BAR0", bdf_);
    if ((region.flags & VFIO_REGION_INFO_FLAG_MMAP) == 0 || region.size == 0) {
      throw error("Map BAR0", bdf_, "VFIO does not let BAR0 be mapped (Linux before 4.16 keeps the MSI-X table in it unmappable)");
    }
    void* p = ::mmap(nullptr, region.size, PROT_READ | PROT_WRITE, MAP_SHARED, device_.get(), static_cast<off_t>(region.offset));
    if (p == MAP_FAILED) throw os_error("Map BAR0", bdf_);
    bar0_.assign(static_cast<std::byte*>(p), region.size, 0, region.size, 0);
  }

  /// Memory Space (bit 1) and Bus Master (bit 2) on, Interrupt Disable (bit 10) on since the host
  /// polls — in the command register, offset 4 of the config region.
  void enable_command_bits() {
    vfio_region_info config{};
    config.argsz = sizeof config;
    config.index = VFIO_PCI_CONFIG_REGION_INDEX;
    if (::ioctl(device_.get(), VFIO_DEVICE_GET_REGION_INFO, &config) != 0) throw os_error("Query PCI config space", bdf_);
    const auto at = static_cast<off_t>(config.offset + 4);
    std::uint16_t command = 0;
    if (::pread(device_.get(), &command, sizeof command, at) != sizeof command) throw os_error("Read the PCI command register", bdf_);
    command = static_cast<std::uint16_t>(command | (1u << 1) | (1u << 2) | (1u << 10));
    if (::pwrite(device_.get(), &command, sizeof command, at) != sizeof command) throw os_error("Write the PCI command register", bdf_);
  }

  [[nodiscard]] static std::string to_hex(std::uint64_t v) {
    constexpr char digits[] = "0123456789abcdef";
    std::string s;
    do {
      s.insert(s.begin(), digits[v & 0xf]);
      v >>= 4;
    } while (v != 0);
    return s;
  }

  static constexpr std::uint64_t page = 4096;
  std::string bdf_;
  std::string group_number_;
  vfio_fd group_;
  vfio_fd device_;
  bar_window bar0_;
  std::unique_ptr<vfio_allocator> memory_;
};

}  // namespace host
CUNVME_NAMESPACE_END
