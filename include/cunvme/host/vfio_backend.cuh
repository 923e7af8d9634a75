// A controller bound to vfio-pci: BAR0 through the VFIO region mmap, DMA through the IOMMU
// (type-1 container). "vfio:0000:01:00.0" in `host::open`. Correct with an IOMMU on, and
// needs no root, only access to /dev/vfio/<group>.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/register_backend.cuh>
#include <cunvme/host/sysfs_backend.cuh>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include <fcntl.h>
#include <linux/vfio.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// DMA memory mapped into a VFIO container at IOVAs handed out upwards from 1 MiB, so each
/// buffer is one contiguous IOVA range whatever its physical pages are.
class vfio_allocator final : public dma_allocator {
 public:
  vfio_allocator(int container, std::string device) : container_(container), device_(std::move(device)) {}

  [[nodiscard]] dma_buffer allocate(std::size_t bytes) override {
    if (bytes == 0) throw error("Allocate DMA memory", device_, "0 bytes asked for");
    const std::size_t mapped = (bytes + 4095) / 4096 * 4096;
    void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) throw os_error("Allocate DMA memory", device_);
    const std::uint64_t iova = next_iova_.fetch_add(mapped + 4096);  // a guard page between buffers
    vfio_iommu_type1_dma_map map{};
    map.argsz = sizeof map;
    map.flags = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE;
    map.vaddr = reinterpret_cast<std::uintptr_t>(p);
    map.iova = iova;
    map.size = mapped;
    if (::ioctl(container_, VFIO_IOMMU_MAP_DMA, &map) != 0) {
      const int e = errno;
      ::munmap(p, mapped);
      errno = e;
      throw os_error("Map DMA memory into the IOMMU", device_, "the locked-memory limit (ulimit -l) must cover DMA buffers");
    }
    std::vector<std::uint64_t> pages(mapped / 4096);
    for (std::size_t i = 0; i < pages.size(); ++i) pages[i] = iova + 4096 * i;
    const int container = container_;
    return dma_buffer(static_cast<std::byte*>(p), nullptr, bytes, 4096, std::move(pages), memory_location::pinned_host,
                      [container, p, mapped, iova] {
                        vfio_iommu_type1_dma_unmap unmap{};
                        unmap.argsz = sizeof unmap;
                        unmap.iova = iova;
                        unmap.size = mapped;
                        (void)::ioctl(container, VFIO_IOMMU_UNMAP_DMA, &unmap);
                        ::munmap(p, mapped);
                      });
  }

  [[nodiscard]] dma_buffer map_gpu(void*, std::size_t) override {
    throw error("Map GPU memory", device_, "GPU memory through VFIO needs a dma-buf import, which cunvme does not do yet; use kmod:");
  }

 private:
  int container_;
  std::string device_;
  std::atomic<std::uint64_t> next_iova_{1u << 20};
};

/// An NVMe controller bound to vfio-pci.
///
/// ```
/// // echo 0000:01:00.0 > /sys/bus/pci/devices/0000:01:00.0/driver/unbind
/// // echo vfio-pci > /sys/bus/pci/devices/0000:01:00.0/driver_override; echo 0000:01:00.0 > /sys/bus/pci/drivers_probe
/// host::controller ctrl(std::make_unique<host::vfio_backend>("0000:01:00.0"));
/// ```
class vfio_backend final : public register_backend {
 public:
  explicit vfio_backend(std::string bdf, std::string sysfs_root = "/sys/bus/pci/devices") : bdf_(std::move(bdf)) {
    if (!valid_bdf(bdf_)) throw error("Open", bdf_, "not a PCI address of the form 0000:01:00.0");
    const auto dir = std::filesystem::path(sysfs_root) / bdf_;
    if (!std::filesystem::exists(dir)) throw error("Open", bdf_, "no such PCI device (" + dir.string() + " is missing)");
    std::error_code ec;
    const auto group_link = std::filesystem::read_symlink(dir / "iommu_group", ec);
    if (ec) throw error("Open", bdf_, "no IOMMU group: boot with intel_iommu=on or amd_iommu=on, and bind the device to vfio-pci");
    const std::string group = group_link.filename().string();
    try {
      open_container(group);
      map_bar0();
    } catch (...) {
      close_all();
      throw;
    }
    memory_ = std::make_unique<vfio_allocator>(container_, bdf_);
  }

  vfio_backend(const vfio_backend&) = delete;
  vfio_backend& operator=(const vfio_backend&) = delete;
  ~vfio_backend() override {
    memory_.reset();
    close_all();
  }

  [[nodiscard]] std::string name() const override { return bdf_; }
  [[nodiscard]] std::byte* bar() const override { return bar_; }
  [[nodiscard]] std::size_t bar_size() const override { return bar_size_; }
  [[nodiscard]] dma_allocator& memory() override { return *memory_; }
  /// The CMB would have to be mapped into the IOMMU for peer access; not done yet.
  void map_cmb(unsigned, std::uint64_t, std::uint64_t) override {
    throw error("Map CMB", bdf_, "CMB through VFIO is not supported yet; use sysfs: on a machine without an IOMMU");
  }

 private:
  void open_container(const std::string& group) {
    container_ = ::open("/dev/vfio/vfio", O_RDWR | O_CLOEXEC);
    if (container_ < 0) throw os_error("Open /dev/vfio/vfio", bdf_, "load the vfio-pci module");
    if (::ioctl(container_, VFIO_GET_API_VERSION) != VFIO_API_VERSION) throw error("Open VFIO", bdf_, "unknown VFIO API version");
    const int type = ::ioctl(container_, VFIO_CHECK_EXTENSION, VFIO_TYPE1v2_IOMMU) > 0 ? VFIO_TYPE1v2_IOMMU
                     : ::ioctl(container_, VFIO_CHECK_EXTENSION, VFIO_TYPE1_IOMMU) > 0 ? VFIO_TYPE1_IOMMU
                                                                                       : -1;
    if (type < 0) throw error("Open VFIO", bdf_, "the kernel offers no type-1 IOMMU");
    const std::string group_path = "/dev/vfio/" + group;
    group_ = ::open(group_path.c_str(), O_RDWR | O_CLOEXEC);
    if (group_ < 0) throw os_error("Open " + group_path, bdf_, "bind the device to vfio-pci and give this user access to " + group_path);
    vfio_group_status status{};
    status.argsz = sizeof status;
    if (::ioctl(group_, VFIO_GROUP_GET_STATUS, &status) != 0) throw os_error("Query VFIO group " + group, bdf_);
    if (!(status.flags & VFIO_GROUP_FLAGS_VIABLE)) {
      throw error("Open VFIO", bdf_, "group " + group + " is not viable: bind every device of the group to vfio-pci");
    }
    if (::ioctl(group_, VFIO_GROUP_SET_CONTAINER, &container_) != 0) throw os_error("Attach VFIO group " + group, bdf_);
    if (::ioctl(container_, VFIO_SET_IOMMU, type) != 0) throw os_error("Set the VFIO IOMMU type", bdf_);
    device_ = ::ioctl(group_, VFIO_GROUP_GET_DEVICE_FD, bdf_.c_str());
    if (device_ < 0) throw os_error("Get the VFIO device", bdf_, "is the device bound to vfio-pci?");
  }

  void map_bar0() {
    vfio_region_info region{};
    region.argsz = sizeof region;
    region.index = VFIO_PCI_BAR0_REGION_INDEX;
    if (::ioctl(device_, VFIO_DEVICE_GET_REGION_INFO, &region) != 0) throw os_error("Query BAR0", bdf_);
    if (!(region.flags & VFIO_REGION_INFO_FLAG_MMAP) || region.size == 0) throw error("Map BAR0", bdf_, "VFIO does not let BAR0 be mapped");
    void* p = ::mmap(nullptr, region.size, PROT_READ | PROT_WRITE, MAP_SHARED, device_, static_cast<off_t>(region.offset));
    if (p == MAP_FAILED) throw os_error("Map BAR0", bdf_);
    bar_ = static_cast<std::byte*>(p);
    bar_size_ = region.size;
    // Memory space and bus mastering on, INTx off, through the config region.
    vfio_region_info config{};
    config.argsz = sizeof config;
    config.index = VFIO_PCI_CONFIG_REGION_INDEX;
    if (::ioctl(device_, VFIO_DEVICE_GET_REGION_INFO, &config) != 0) throw os_error("Query PCI config space", bdf_);
    std::uint16_t command = 0;
    if (::pread(device_, &command, 2, static_cast<off_t>(config.offset + 4)) != 2) throw os_error("Read the PCI command register", bdf_);
    command = static_cast<std::uint16_t>(command | (1u << 1) | (1u << 2) | (1u << 10));
    if (::pwrite(device_, &command, 2, static_cast<off_t>(config.offset + 4)) != 2) throw os_error("Write the PCI command register", bdf_);
  }

  void close_all() noexcept {
    if (bar_ != nullptr) ::munmap(bar_, bar_size_);
    bar_ = nullptr;
    for (int* fd : {&device_, &group_, &container_}) {
      if (*fd >= 0) ::close(*fd);
      *fd = -1;
    }
  }

  std::string bdf_;
  int container_ = -1;
  int group_ = -1;
  int device_ = -1;
  std::byte* bar_ = nullptr;
  std::size_t bar_size_ = 0;
  std::unique_ptr<vfio_allocator> memory_;
};

}  // namespace host
CUNVME_NAMESPACE_END
