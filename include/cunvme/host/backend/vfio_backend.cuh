// A controller bound to vfio-pci: BAR0 through the VFIO region mmap, DMA through the IOMMU
// (classic container/group API, type-1 IOMMU). "vfio:0000:01:00.0" in `host::open`. Correct
// with an IOMMU on, and needs no root, only access to /dev/vfio/<group>.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/file_descriptor.cuh>
#include <cunvme/host/memory/dma_memory.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/memory/iova_space.cuh>
#include <cunvme/host/backend/register_backend.cuh>
#include <cunvme/host/backend/sysfs_backend.cuh>

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

/// DMA memory mapped into a VFIO container: anonymous host memory at IOVAs from a
/// `iova_space`, so each buffer is one contiguous bus range whatever its physical pages
/// (`pages()[i] == bus(0) + 4096·i`). VFIO pins the pages while they are mapped.
///
/// Every buffer shares ownership of the container, so one that outlives the backend still
/// unmaps its IOVA range from the right container, never from a descriptor number reused since.
class vfio_allocator final : public dma_allocator {
 public:
  vfio_allocator(std::shared_ptr<const cunvme::detail::file_descriptor> container, std::string device, std::vector<iova_range> valid = {})
      : container_(std::move(container)), device_(std::move(device)), iovas_(std::move(valid)) {}

  /// Maps `bytes` of a BAR mapping at `host` into the IOMMU at `iova` (peer-to-peer: VFIO
  /// follows the mapping to its MMIO pages), after taking the range out of the buffers' IOVA
  /// space. Throws `host::error` when the range collides with buffers or the kernel refuses.
  void map_mmio(void* host, std::uint64_t bytes, std::uint64_t iova) {
    if (bytes == 0 || bytes % page != 0 || iova % page != 0 || iova > std::numeric_limits<std::uint64_t>::max() - bytes) {
      throw error("Map the CMB into the IOMMU", device_, "the range is not whole pages");
    }
    if (!iovas_.reserve(iova, iova + bytes - 1)) {
      throw error("Map the CMB into the IOMMU", device_, "its bus addresses overlap DMA buffers mapped already (map the CMB first)");
    }
    vfio_iommu_type1_dma_map map{};
    map.argsz = sizeof map;
    map.flags = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE;
    map.vaddr = reinterpret_cast<std::uintptr_t>(host);
    map.iova = iova;
    map.size = bytes;
    if (::ioctl(container_->get(), VFIO_IOMMU_MAP_DMA, &map) != 0) throw os_error("Map the CMB into the IOMMU", device_);
  }
  /// Undoes `map_mmio` (the range stays reserved: IOVAs are never reused).
  void unmap_mmio(std::uint64_t bytes, std::uint64_t iova) noexcept {
    vfio_iommu_type1_dma_unmap unmap{};
    unmap.argsz = sizeof unmap;
    unmap.iova = iova;
    unmap.size = bytes;
    (void)::ioctl(container_->get(), VFIO_IOMMU_UNMAP_DMA, &unmap);
  }

  /// Maps the pages of `bytes` at `host` (any memory this process can write: another
  /// controller's buffer, plain anonymous memory, huge pages) at a fresh IOVA range, whole 4 KiB
  /// pages from `host`. VFIO pins the pages for as long as they are mapped, so they stay where
  /// they are for this controller; the returned buffer unmaps them from the IOMMU (and with it
  /// unpins them) and leaves the memory to its owner. The pin counts against RLIMIT_MEMLOCK
  /// again even where another mapping pins the same pages. Pinning is long-term: the kernel
  /// first migrates pages out of ZONE_MOVABLE and CMA, so memory that only an mlock held (a
  /// pagemap allocator's) may change its physical address: check it with that allocator's
  /// `still_at`.
  [[nodiscard]] dma_buffer map_host(void* host, std::size_t bytes) override {
    const std::size_t mapped = host_range(host, bytes);
    const auto iova = iovas_.take(mapped);
    if (!iova) throw error("Map host memory into the IOMMU", device_, "the IOMMU's address space has no room left for " + std::to_string(mapped) + " bytes");
    vfio_iommu_type1_dma_map map{};
    map.argsz = sizeof map;
    map.flags = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE;
    map.vaddr = reinterpret_cast<std::uintptr_t>(host);
    map.iova = *iova;
    map.size = mapped;
    if (::ioctl(container_->get(), VFIO_IOMMU_MAP_DMA, &map) != 0) {
      const int e = errno;
      throw os_error("Map host memory into the IOMMU", device_,
                     e == ENOMEM   ? std::string(memlock_hint)
                     : e == EFAULT ? "the range must be memory this process has mapped and may write, page by page (VFIO pins it for writing)"
                                   : std::string{});
    }
    std::vector<std::uint64_t> pages = bus_range_pages(*iova, mapped);
    return dma_buffer(static_cast<std::byte*>(host), nullptr, bytes, page, std::move(pages), memory_location::pinned_host,
                      [container = container_, mapped, at = *iova] {
                        vfio_iommu_type1_dma_unmap unmap{};
                        unmap.argsz = sizeof unmap;
                        unmap.iova = at;
                        unmap.size = mapped;
                        (void)::ioctl(container->get(), VFIO_IOMMU_UNMAP_DMA, &unmap);
                      });
  }
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
                     e == ENOMEM ? std::string(memlock_hint) : std::string{});
    }
    std::vector<std::uint64_t> pages = bus_range_pages(*iova, mapped);
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
  static constexpr const char* memlock_hint = "VFIO pins mapped pages against RLIMIT_MEMLOCK: raise it (ulimit -l) to cover all DMA buffers";
  std::shared_ptr<const cunvme::detail::file_descriptor> container_;
  std::string device_;
  iova_space iovas_;
};

/// An NVMe controller bound to vfio-pci, its DMA confined by the IOMMU to the buffers this
/// process mapped. Choose it wherever an IOMMU is on; it needs no root, only read/write access
/// to /dev/vfio/<group>.
///
/// Usage: examples/snippets/host.cpp, `vfio`.
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
  // The CMB leaves the IOMMU before its mapping goes; then members go in reverse order: the
  // CMB and BAR mappings, the allocator, the device, the group; the container closes when the
  // last buffer sharing it is gone.
  ~vfio_backend() override {
    if (cmb_.data() != nullptr) memory_->unmap_mmio(cmb_iommu_bytes_, cmb_iommu_iova_);
  }

  [[nodiscard]] std::string name() const override { return bdf_; }
  [[nodiscard]] std::byte* bar() const override { return bar0_.data(); }
  [[nodiscard]] std::size_t bar_size() const override { return bar0_.size(); }
  /// The VFIO device file at BAR0's region, for processes attached to this one (host/sharing/).
  [[nodiscard]] shareable_bar bar_for_other_processes() const override { return {device_.get(), bar0_offset_, bar0_.size()}; }
  [[nodiscard]] dma_allocator& memory() override { return *memory_; }
  [[nodiscard]] std::byte* cmb() const override { return cmb_.data(); }
  [[nodiscard]] std::size_t cmb_size() const override { return cmb_.size(); }
  [[nodiscard]] std::uint64_t cmb_bus_address() const override { return cmb_.bus(); }
  /// The IOMMU group number (the N of /dev/vfio/N).
  [[nodiscard]] const std::string& iommu_group() const noexcept { return group_number_; }

  /// Maps BAR `bar_index` through its VFIO region and keeps `bytes` at `offset` as the CMB. Its
  /// bus address (CMBMSC.CBA) is the BAR's own address plus `offset`, as without an IOMMU: the
  /// controller recognises addresses in its CMB itself, and, so that a PRP or queue base there
  /// means the CMB also to whatever translates DMA first, the BAR's pages are mapped into the
  /// IOMMU at that same IOVA, a range no DMA buffer may then take. Call it before DMA memory
  /// is allocated high enough to collide (the controller maps its CMB during bring-up).
  void map_cmb(unsigned bar_index, std::uint64_t offset, std::uint64_t bytes) override {
    const std::string bar = "BAR " + std::to_string(bar_index);
    if (bar_index > 5) throw error("Map CMB", bdf_, "CMBLOC.BIR " + std::to_string(bar_index) + " names no BAR");
    if (bytes == 0) throw error("Map CMB", bdf_, "CMBSZ describes an empty CMB");
    vfio_region_info region{};
    region.argsz = sizeof region;
    region.index = VFIO_PCI_BAR0_REGION_INDEX + bar_index;
    if (::ioctl(device_.get(), VFIO_DEVICE_GET_REGION_INFO, &region) != 0) throw os_error("Query " + bar, bdf_);
    if ((region.flags & VFIO_REGION_INFO_FLAG_MMAP) == 0 || region.size == 0) throw error("Map CMB", bdf_, "VFIO does not let " + bar + " be mapped");
    if (offset > region.size || bytes > region.size - offset) {
      throw error("Map CMB", bdf_,
                  "CMBLOC/CMBSZ describe " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) + ", beyond " + bar + "'s " +
                      std::to_string(region.size) + " bytes");
    }
    const std::uint64_t start = bar_address(bar_index);
    void* p = ::mmap(nullptr, region.size, PROT_READ | PROT_WRITE, MAP_SHARED, device_.get(), static_cast<off_t>(region.offset));
    if (p == MAP_FAILED) throw os_error("Map " + bar, bdf_);
    // The IOMMU maps whole pages: the pages that hold the CMB.
    const std::uint64_t first_page = offset / page * page;
    const std::uint64_t mapped = (offset + bytes + page - 1) / page * page - first_page;
    if (cmb_.data() != nullptr) memory_->unmap_mmio(cmb_iommu_bytes_, cmb_iommu_iova_);
    cmb_.assign(nullptr, 0, 0, 0, 0);
    try {
      memory_->map_mmio(static_cast<std::byte*>(p) + first_page, mapped, start + first_page);
    } catch (...) {
      ::munmap(p, region.size);
      throw;
    }
    cmb_iommu_iova_ = start + first_page;
    cmb_iommu_bytes_ = mapped;
    cmb_.assign(static_cast<std::byte*>(p), region.size, offset, bytes, start + offset);
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
    cunvme::detail::file_descriptor container(::open("/dev/vfio/vfio", O_RDWR | O_CLOEXEC));
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
    group_ = cunvme::detail::file_descriptor(::open(group_path.c_str(), O_RDWR | O_CLOEXEC));
    if (!group_) {
      const int e = errno;
      std::string hint = "needs permission on " + group_path + " (chown it to this user or run as root)";
      if (e == ENOENT) {
        hint = ::access(("/dev/vfio/noiommu-" + group_number_).c_str(), F_OK) == 0
                   ? "VFIO runs in no-IOMMU mode, which translates no DMA: use sysfs:" + bdf_ + " as root instead"
                   : "the device is not bound to vfio-pci";
      } else if (e == EBUSY) {
        // VFIO lets a group be opened once: another process, or another handle in this one.
        hint = "group " + group_number_ + " is open already (by another process, or another controller handle in this one)";
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

    device_ = cunvme::detail::file_descriptor(::ioctl(group_.get(), VFIO_GROUP_GET_DEVICE_FD, bdf_.c_str()));
    if (!device_) throw os_error("Get the VFIO device", bdf_, "the device is not bound to vfio-pci");
    memory_ = std::make_unique<vfio_allocator>(std::make_shared<const cunvme::detail::file_descriptor>(std::move(container)), bdf_, std::move(ranges));
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
    bar0_offset_ = region.offset;
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

  /// BAR `index`'s bus address from the config space VFIO shows (it reports the BAR as the
  /// kernel assigned it): a memory BAR, 64-bit ones over two registers (PCI 3.0 section 6.2.5.1).
  [[nodiscard]] std::uint64_t bar_address(unsigned index) const {
    vfio_region_info config{};
    config.argsz = sizeof config;
    config.index = VFIO_PCI_CONFIG_REGION_INDEX;
    if (::ioctl(device_.get(), VFIO_DEVICE_GET_REGION_INFO, &config) != 0) throw os_error("Query PCI config space", bdf_);
    const auto read = [&](unsigned i) {
      std::uint32_t v = 0;
      if (::pread(device_.get(), &v, sizeof v, static_cast<off_t>(config.offset + 0x10 + 4 * i)) != sizeof v) {
        throw os_error("Read BAR " + std::to_string(i) + " from PCI config space", bdf_);
      }
      return v;
    };
    const std::uint32_t low = read(index);
    if ((low & 1u) != 0) throw error("Map CMB", bdf_, "BAR " + std::to_string(index) + " is an I/O BAR, not memory");
    std::uint64_t address = low & ~std::uint64_t{0xf};
    if (((low >> 1) & 3u) == 2u) {
      if (index == 5) throw error("Map CMB", bdf_, "BAR 5 claims 64 bits, with no BAR 6 for the upper half");
      address |= std::uint64_t{read(index + 1)} << 32;
    }
    if (address == 0) throw error("Map CMB", bdf_, "BAR " + std::to_string(index) + " has no address assigned");
    return address;
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
  cunvme::detail::file_descriptor group_;
  cunvme::detail::file_descriptor device_;
  std::unique_ptr<vfio_allocator> memory_;
  bar_window bar0_;
  std::uint64_t bar0_offset_ = 0;  ///< BAR0's region in the device file
  bar_window cmb_;
  std::uint64_t cmb_iommu_iova_ = 0, cmb_iommu_bytes_ = 0;  // the CMB's pages in the IOMMU
};

}  // namespace host
CUNVME_NAMESPACE_END
