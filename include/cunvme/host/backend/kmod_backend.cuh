// A controller bound to the cunvme kernel module: BARs mapped through /dev/cunvme/<BDF>,
// host and GPU memory pinned by the module with DMA addresses as the controller sees them
// (correct with or without an IOMMU), dma-bufs (GPU memory exported by the NVIDIA driver)
// mapped for the controller, and pinned GPU memory mapped for the CPU. "kmod:0000:01:00.0" in
// `host::open`.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/memory/gpu_mapping.cuh>
#include <cunvme/host/backend/kmod_abi.cuh>
#include <cunvme/host/backend/register_backend.cuh>
#include <cunvme/host/backend/sysfs_backend.cuh>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// Memory pinned by the kernel module for one controller.
///
/// Buffers larger than 4 KiB come from 2 MiB huge pages while the pool
/// (/proc/sys/vm/nr_hugepages) has free ones: without an IOMMU the module hands out physical
/// addresses, and only huge pages make a queue larger than 4 KiB contiguous in bus address
/// space (with an IOMMU the module maps any pages contiguously). Otherwise 4 KiB pages.
///
/// GPU memory (`map_gpu`) goes through dma-buf where the module imports dma-bufs and a
/// `dma_buf_exporter` is installed (`host::use_gpu_dma_buf` in <cunvme/host/gpu/gpu_dma_buf.cuh>
/// installs CUDA's), else through nvidia_p2p where the module was built with it.
class kmod_allocator final : public dma_allocator {
 public:
  /// Exports `bytes` of GPU memory at `gpu` as a dma-buf and returns its file descriptor, which
  /// the caller closes; throws `host::error` where it cannot.
  using dma_buf_exporter = std::function<int(void* gpu, std::size_t bytes)>;

  /// `info_flags`: the module's `kmod::device_info::flags`.
  kmod_allocator(int fd, std::string device, std::uint32_t info_flags)
      : fd_(fd), link_(std::make_shared<link>(fd)), device_(std::move(device)), gpu_((info_flags & kmod::info_gpu_pinning) != 0),
        dma_buf_((info_flags & kmod::info_dma_buf) != 0), maps_gpu_for_cpu_((info_flags & kmod::info_gpu_mapping) != 0) {}
  kmod_allocator(const kmod_allocator&) = delete;
  kmod_allocator& operator=(const kmod_allocator&) = delete;
  /// Goes before the backend closes the descriptor: buffers released later unpin nothing (the
  /// module unpins everything at close) and never reach a descriptor number reused since.
  ~kmod_allocator() override { link_->sever(); }

  [[nodiscard]] bool imports_dma_bufs() const noexcept { return dma_buf_; }
  /// Makes `map_gpu` export GPU memory with `exporter` and map the dma-buf (preferred over
  /// nvidia_p2p: it needs no NVIDIA sources at module build time).
  /// Installs the exporter once: devices of several GPUs sharing this controller each ask, while
  /// another's copies may be mapping through it (the exporter exports any GPU's memory).
  void use_dma_buf_exporter(dma_buf_exporter exporter) {
    std::call_once(exporter_set_, [&] { exporter_ = std::move(exporter); });
  }

  /// Maps bytes [offset, offset + bytes) of the dma-buf `dma_buf_fd` for the controller.
  /// `device_pointer` is what the buffer's `device_data()` reports (the GPU address the dma-buf
  /// was exported from; nullptr where there is none). The module keeps its own reference to
  /// the dma-buf: the caller may close `dma_buf_fd` at once. Should the exporter revoke the
  /// buffer while mapped, the module stops the controller's DMA (`kmod::info_dma_revoked`).
  [[nodiscard]] dma_buffer map_dma_buf(int dma_buf_fd, std::uint64_t offset, std::size_t bytes, void* device_pointer) {
    if (!dma_buf_) throw error("Map a dma-buf", device_, "the loaded cunvme module does not import dma-bufs (kernel without CONFIG_DMA_SHARED_BUFFER, or an older module)");
    if (bytes == 0 || offset % 4096 != 0) throw error("Map a dma-buf", device_, "the range must start on a 4 KiB page and not be empty");
    if (bytes > std::size_t{1} << 43) throw error("Map a dma-buf", device_, std::to_string(bytes) + " bytes asked for");
    const std::size_t mapped = (bytes + 4095) / 4096 * 4096;
    std::vector<std::uint64_t> pages(mapped / 4096);
    kmod::dma_buf_request r{};
    r.fd = dma_buf_fd;
    r.offset = offset;
    r.bytes = mapped;
    r.addresses = reinterpret_cast<std::uintptr_t>(pages.data());
    r.max_addresses = static_cast<std::uint32_t>(pages.size());
    if (::ioctl(fd_, kmod::ioctl_map_dma_buf, &r) != 0) {
      throw os_error("Map a dma-buf", device_,
                     errno == ENOMEM    ? "over the module's max_pinned_mb or RLIMIT_MEMLOCK (ulimit -l; CAP_IPC_LOCK lifts it)"
                     : errno == ERANGE  ? "the range runs past the end of the dma-buf"
                     : errno == ENOLINK ? "a dma-buf of this device was revoked: its DMA is off until the device is closed and opened again"
                     : errno == EBADF || errno == EINVAL ? "the file descriptor is no dma-buf, or the range is not whole pages"
                                                         : "");
    }
    pages.resize(r.count);
    return dma_buffer(nullptr, device_pointer, bytes, std::size_t{1} << r.page_shift, std::move(pages), memory_location::gpu,
                      [l = link_, handle = r.handle] { unpin(*l, handle); });
  }

  /// Pins `bytes` of GPU memory at `gpu` (64 KiB aligned; nvidia_p2p) and maps it into the
  /// process, write-combined, for CPU copies (gdrcopy's role); the mapping owns the pin. Needs
  /// a module built with nvidia_p2p: a dma-buf yields DMA addresses only, nothing the CPU can
  /// map.
  [[nodiscard]] gpu_for_cpu_mapping map_gpu_for_cpu(void* gpu, std::size_t bytes) {
    if (!maps_gpu_for_cpu_) {
      throw error("Map GPU memory for the CPU", device_,
                  gpu_ ? "the loaded cunvme module pins GPU memory but cannot map it: an older module, rebuild it"
                       : "the cunvme module was built without nvidia_p2p (NVIDIA driver sources); dma-buf import gives the controller DMA addresses, nothing the CPU can map");
    }
    if (reinterpret_cast<std::uintptr_t>(gpu) % 65536 != 0 || bytes == 0) {
      throw error("Map GPU memory for the CPU", device_, "GPU memory must start on a 64 KiB GPU page (cudaMalloc of 2 MiB or more does) and not be empty");
    }
    if (bytes > std::size_t{1} << 46) throw error("Map GPU memory for the CPU", device_, std::to_string(bytes) + " bytes asked for");
    const std::size_t mapped = (bytes + 65535) / 65536 * 65536;
    const pinned pins = pin(gpu, mapped, kmod::pin_gpu_memory);
    const std::uint64_t handle = pins.handle;
    void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, static_cast<off_t>(kmod::gpu_mmap_offset(handle)));
    if (p == MAP_FAILED) {
      const int e = errno;
      kmod::unpin_request u{handle};
      (void)::ioctl(fd_, kmod::ioctl_unpin, &u);
      errno = e;
      throw os_error("Map GPU memory for the CPU", device_,
                     e == ENOLINK ? "the NVIDIA driver revoked the memory (freed while pinned)"
                     : e == EBUSY ? "the GPU pages' memory type conflicts with another mapping of them (x86 PAT)"
                                  : "");
    }
    return gpu_for_cpu_mapping(static_cast<std::byte*>(p), bytes, device_, [l = link_, handle, p, mapped] {
      ::munmap(p, mapped);
      unpin(*l, handle);
    });
  }

  /// Pins the pages of `bytes` at `host` through the module (the same ioctl as its own
  /// buffers: it pins any memory this process may write, whoever allocated it) and returns
  /// their DMA addresses as this controller sees them, 4 KiB page by page; the returned buffer
  /// unpins them and leaves the memory to its owner. The pin is long-term (FOLL_LONGTERM): the
  /// kernel first migrates pages out of ZONE_MOVABLE and CMA, so memory that only an mlock
  /// held (a pagemap allocator's) may change its physical address: check it with that
  /// allocator's `still_at`. Kernels before 5.11 move a pinned page that a fork() child
  /// shares: the memory's owner excludes it from fork (MADV_DONTFORK), as every cunvme
  /// allocator does for its own.
  [[nodiscard]] dma_buffer map_host(void* host, std::size_t bytes) override {
    const std::size_t mapped = host_range(host, bytes);
    pinned pins = pin(host, mapped, 0, "Map host memory");
    return dma_buffer(static_cast<std::byte*>(host), nullptr, bytes, std::size_t{1} << pins.shift, std::move(pins.pages), memory_location::pinned_host,
                      [l = link_, handle = pins.handle] { unpin(*l, handle); });
  }
  [[nodiscard]] dma_buffer map_gpu(void* gpu, std::size_t bytes) override {
    if (dma_buf_ && exporter_) {
      if (reinterpret_cast<std::uintptr_t>(gpu) % 4096 != 0 || bytes == 0) {
        throw error("Map GPU memory", device_, "GPU memory for a dma-buf must start on a 4 KiB page (cudaMalloc's allocations do)");
      }
      const int dma_buf_fd = exporter_(gpu, (bytes + 4095) / 4096 * 4096);
      try {
        dma_buffer b = map_dma_buf(dma_buf_fd, 0, bytes, gpu);
        ::close(dma_buf_fd);
        return b;
      } catch (...) {
        ::close(dma_buf_fd);
        throw;
      }
    }
    if (!gpu_) {
      throw error("Map GPU memory", device_,
                  dma_buf_ ? "no dma-buf exporter installed (host::use_gpu_dma_buf from <cunvme/host/gpu/gpu_dma_buf.cuh>) and the cunvme module was built without nvidia_p2p"
                           : "the cunvme module was built without nvidia_p2p (NVIDIA driver sources) and does not import dma-bufs");
    }
    if (reinterpret_cast<std::uintptr_t>(gpu) % 65536 != 0 || bytes == 0) {
      throw error("Map GPU memory", device_, "GPU memory must start on a 64 KiB GPU page (cudaMalloc of 2 MiB or more does)");
    }
    pinned pins = pin(gpu, (bytes + 65535) / 65536 * 65536, kmod::pin_gpu_memory);
    return dma_buffer(nullptr, gpu, bytes, std::size_t{1} << pins.shift, std::move(pins.pages), memory_location::gpu,
                      [l = link_, handle = pins.handle] { unpin(*l, handle); });
  }

 protected:
  [[nodiscard]] std::string name() const override { return device_; }

  /// Without an IOMMU the pins are physical pages: huge pages are aligned to 2 MiB, 4 KiB
  /// pages to 4 KiB only, so an alignment above 4 KiB takes huge pages whatever the size
  /// (`dma_allocator::allocate` refuses a buffer whose bus address misses the alignment).
  [[nodiscard]] dma_buffer allocate_aligned(std::size_t bytes, std::size_t alignment) override {
    if (bytes == 0) throw error("Allocate DMA memory", device_, "0 bytes asked for");
    if (bytes > std::size_t{1} << 46) throw error("Allocate DMA memory", device_, std::to_string(bytes) + " bytes asked for");
    constexpr std::size_t huge_page = std::size_t{2} << 20;
    constexpr int two_mib = 21 << MAP_HUGE_SHIFT;  // not the default size, which may be 1 GiB
    std::size_t mapped = (bytes + huge_page - 1) / huge_page * huge_page;
    void* p = bytes <= 4096 && alignment <= 4096 ? MAP_FAILED
                            : ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | two_mib | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
      mapped = (bytes + 4095) / 4096 * 4096;
      p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    }
    if (p == MAP_FAILED) throw os_error("Allocate DMA memory", device_);
    try {
      // A child sharing the pages copy-on-write must not make the parent's next write move
      // them (kernels before 5.11 do not copy pinned pages at fork).
      if (::madvise(p, mapped, MADV_DONTFORK) != 0) throw os_error("Exclude DMA memory from fork", device_);
      pinned pins = pin(p, mapped, 0);
      return dma_buffer(static_cast<std::byte*>(p), nullptr, bytes, std::size_t{1} << pins.shift, std::move(pins.pages), memory_location::pinned_host,
                        [l = link_, handle = pins.handle, p, mapped] {
                          unpin(*l, handle);
                          ::munmap(p, mapped);
                        });
    } catch (...) {
      ::munmap(p, mapped);
      throw;
    }
  }

 private:
  using link = backend_link<int>;
  /// Unpins `handle` while the device is open; once closed, the module unpinned it already.
  static void unpin(link& l, std::uint64_t handle) noexcept {
    l.if_alive([handle](int fd) {
      kmod::unpin_request u{handle};
      (void)::ioctl(fd, kmod::ioctl_unpin, &u);
    });
  }

  struct pinned {
    std::uint64_t handle;
    std::vector<std::uint64_t> pages;
    unsigned shift;
  };
  /// `operation` names the pin in errors (default: by the kind of memory).
  [[nodiscard]] pinned pin(void* address, std::size_t bytes, std::uint32_t flags, const char* operation = nullptr) const {
    std::vector<std::uint64_t> pages(bytes / 4096 + 1);
    kmod::pin_request r{};
    r.address = reinterpret_cast<std::uintptr_t>(address);
    r.bytes = bytes;
    r.addresses = reinterpret_cast<std::uintptr_t>(pages.data());
    r.max_addresses = static_cast<std::uint32_t>(pages.size());
    r.flags = flags;
    if (::ioctl(fd_, kmod::ioctl_pin, &r) != 0) {
      throw os_error(operation != nullptr ? operation : flags & kmod::pin_gpu_memory ? "Pin GPU memory" : "Pin host memory", device_,
                     errno == ENOMEM    ? "over the module's max_pinned_mb or RLIMIT_MEMLOCK (ulimit -l; CAP_IPC_LOCK lifts it)"
                     : errno == ENOLINK ? "a dma-buf of this device was revoked: its DMA is off until the device is closed and opened again"
                     : errno == EFAULT && (flags & kmod::pin_gpu_memory) == 0
                         ? "the range must be memory this process has mapped and may write, page by page (the module pins it for writing)"
                         : "");
    }
    pages.resize(r.count);
    return pinned{r.handle, std::move(pages), r.page_shift};
  }

  int fd_;
  std::shared_ptr<link> link_;  // shared with every buffer's release
  std::string device_;
  bool gpu_;
  bool dma_buf_;
  bool maps_gpu_for_cpu_;
  dma_buf_exporter exporter_;
  std::once_flag exporter_set_;
};

/// An NVMe controller bound to the cunvme kernel module.
///
/// Usage: examples/snippets/host.cpp, `kmod`.
class kmod_backend final : public register_backend {
 public:
  explicit kmod_backend(std::string bdf, std::string device_dir = "/dev/cunvme") : bdf_(std::move(bdf)) {
    if (!valid_bdf(bdf_)) throw error("Open", bdf_, "not a PCI address of the form 0000:01:00.0");
    const std::string node = device_dir + "/" + bdf_;
    fd_ = ::open(node.c_str(), O_RDWR | O_CLOEXEC);
    if (fd_ < 0) {
      throw os_error("Open " + node, bdf_,
                     errno == ENOENT  ? "load the cunvme kernel module (kmod/) and bind the controller to it"
                     : errno == EBUSY ? "another process has the controller open (one at a time)"
                                      : "the device node's permissions decide who may use the controller");
    }
    if (::ioctl(fd_, kmod::ioctl_info, &info_) != 0) {
      const int e = errno;
      ::close(fd_);
      errno = e;
      throw os_error("Query the cunvme module", bdf_);
    }
    if (info_.abi_version != kmod::abi_version) {
      ::close(fd_);
      throw error("Open", bdf_, "the cunvme module speaks ABI " + std::to_string(info_.abi_version) + ", this cunvme " +
                                    std::to_string(kmod::abi_version) + ": rebuild one to match the other");
    }
    bar_ = map_bar(0);
    memory_ = std::make_unique<kmod_allocator>(fd_, bdf_, info_.flags);
  }

  kmod_backend(const kmod_backend&) = delete;
  kmod_backend& operator=(const kmod_backend&) = delete;
  ~kmod_backend() override {
    memory_.reset();
    if (bar_ != nullptr) ::munmap(bar_, info_.bar_size[0]);
    if (fd_ >= 0) ::close(fd_);
  }

  [[nodiscard]] std::string name() const override { return bdf_; }
  [[nodiscard]] std::byte* bar() const override { return bar_; }
  /// The module's file at BAR0's mmap offset, for processes attached to this one (host/sharing/).
  [[nodiscard]] shareable_bar bar_for_other_processes() const override { return {fd_, kmod::bar_mmap_offset(0), info_.bar_size[0]}; }
  [[nodiscard]] std::size_t bar_size() const override { return info_.bar_size[0]; }
  [[nodiscard]] std::byte* cmb() const override { return cmb_.data(); }
  [[nodiscard]] std::size_t cmb_size() const override { return cmb_.size(); }
  [[nodiscard]] std::uint64_t cmb_bus_address() const override { return cmb_.bus(); }
  [[nodiscard]] dma_allocator& memory() override { return *memory_; }
  /// The allocator with the module's own calls (`map_dma_buf`, `use_dma_buf_exporter`).
  [[nodiscard]] kmod_allocator& kmod_memory() noexcept { return *memory_; }
  [[nodiscard]] const kmod::device_info& info() const noexcept { return info_; }
  /// What the module reports now: `info()` as of opening, plus what changed since, such as
  /// `kmod::info_dma_revoked` once an exporter revoked a mapped dma-buf.
  [[nodiscard]] kmod::device_info query_info() const {
    kmod::device_info now{};
    if (::ioctl(fd_, kmod::ioctl_info, &now) != 0) throw os_error("Query the cunvme module", bdf_);
    return now;
  }

  void map_cmb(unsigned bar_index, std::uint64_t offset, std::uint64_t bytes) override {
    if (bar_index > 5 || info_.bar_size[bar_index] == 0) throw error("Map CMB", bdf_, "CMBLOC.BIR names BAR " + std::to_string(bar_index) + ", which is absent");
    if (offset > info_.bar_size[bar_index] || bytes > info_.bar_size[bar_index] - offset) {
      throw error("Map CMB", bdf_, "CMBLOC/CMBSZ describe more than BAR " + std::to_string(bar_index));
    }
    cmb_.assign(map_bar(bar_index), info_.bar_size[bar_index], offset, bytes, info_.bar_bus_address[bar_index] + offset);
  }

 private:
  [[nodiscard]] std::byte* map_bar(unsigned index) const {
    void* p = ::mmap(nullptr, info_.bar_size[index], PROT_READ | PROT_WRITE, MAP_SHARED, fd_, static_cast<off_t>(kmod::bar_mmap_offset(index)));
    if (p == MAP_FAILED) throw os_error("Map BAR " + std::to_string(index), bdf_);
    return static_cast<std::byte*>(p);
  }

  std::string bdf_;
  int fd_ = -1;
  kmod::device_info info_{};
  std::byte* bar_ = nullptr;
  std::unique_ptr<kmod_allocator> memory_;
  bar_window cmb_;
};

}  // namespace host
CUNVME_NAMESPACE_END
