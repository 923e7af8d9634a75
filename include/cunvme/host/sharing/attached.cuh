// A process attached to a controller another process owns (`sharing::controller_owner`): its
// BAR0 mapped from the owner's memory file, DMA memory in memory files the owner maps for the
// controller, and the admin queue reached through the owner. `host::open("attach:PATH")`.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/file_descriptor.cuh>
#include <cunvme/host/backend/register_backend.cuh>
#include <cunvme/host/controller/admin_link.cuh>
#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/memory/dma_memory.cuh>
#include <cunvme/host/memory/gpu_export.cuh>
#include <cunvme/host/sharing/wire.cuh>
#include <cunvme/spec/registers.cuh>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <linux/memfd.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

CUNVME_NAMESPACE_BEGIN
namespace host::sharing {

/// The socket to the owner: one request in flight at a time, each answered within `wait`.
class owner_connection {
 public:
  owner_connection(const std::string& path, std::chrono::milliseconds wait) : path_(path), name_("attach:" + path) {
    socket_ = cunvme::detail::file_descriptor(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (!socket_) throw error("Attach", name_, std::system_error(errno, std::generic_category(), "socket").what());
    const sockaddr_un address = socket_address(path, "Attach");
    if (::connect(socket_.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
      throw error("Attach", name_, std::string(std::system_error(errno, std::generic_category(), "connect").what()) +
                                       ": no owner serves this socket (start one: examples/cunvme_share, host::sharing::controller_owner, or Python's Device.serve)");
    }
    const timeval tv{static_cast<time_t>(wait.count() / 1000), static_cast<suseconds_t>(wait.count() % 1000 * 1000)};
    wait_ = wait;
    (void)::setsockopt(socket_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    request hello{request_kind::hello};
    hello.a = wire_version;
    int bar = -1;
    const reply r = call(hello, "Attach", -1, &bar);
    bar_file_ = cunvme::detail::file_descriptor(bar);
    if (!bar_file_) throw error("Attach", name_, "the owner sent no BAR0 file");
    bar_bytes_ = static_cast<std::size_t>(r.a);
    bar_is_io_memory_ = (r.b >> 24 & 1) != 0;
    huge_pages_ = (r.b >> 25 & 1) != 0;
    bar_offset_ = r.c;
    granted_ = static_cast<std::uint16_t>(r.b & 0xffff);
    page_shift_ = static_cast<unsigned>((r.b >> 16) & 0xff);
    owner_pid_ = static_cast<std::uint32_t>(r.b >> 32);
  }

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] std::string owner() const { return "process " + std::to_string(owner_pid_) + " at " + path_; }
  [[nodiscard]] int bar_file() const noexcept { return bar_file_.get(); }
  [[nodiscard]] std::size_t bar_bytes() const noexcept { return bar_bytes_; }
  [[nodiscard]] bool bar_is_io_memory() const noexcept { return bar_is_io_memory_; }
  /// Whether memory given to the owner must be 2 MiB huge pages (`dma_allocator::shared_memory_needs_huge_pages`).
  [[nodiscard]] bool huge_pages() const noexcept { return huge_pages_; }
  /// Where BAR0 starts in `bar_file()`.
  [[nodiscard]] std::uint64_t bar_offset() const noexcept { return bar_offset_; }
  [[nodiscard]] std::uint16_t granted() const noexcept { return granted_; }
  [[nodiscard]] unsigned page_shift() const noexcept { return page_shift_; }

  /// Sends `q` (with `fd`) and returns the owner's reply; throws `host::error` for `operation`
  /// when the owner refuses, does not answer within the wait, or is gone.
  reply call(const request& q, const std::string& operation, int fd = -1, int* received_fd = nullptr) {
    const std::scoped_lock lock(mutex_);
    if (broken_) throw error(operation, name_, "the connection to the owner (" + owner() + ") broke earlier: " + broken_why_);
    if (!send_message(socket_.get(), q, fd)) throw error(operation, name_, "the owner (" + owner() + ") is gone");
    reply r;
    int got = -1;
    const receive_status status = receive_message(socket_.get(), r, got);
    if (status != receive_status::message) {
      // A reply that comes later would be taken for the next request's: the connection ends
      // here, and the owner, seeing it close, deletes this process's queues.
      broken_ = true;
      broken_why_ = status == receive_status::timed_out ? "the owner did not answer within " + std::to_string(wait_.count()) + " ms"
                                                        : "the owner (" + owner() + ") is gone";
      ::shutdown(socket_.get(), SHUT_RDWR);
      throw error(operation, name_, broken_why_);
    }
    cunvme::detail::file_descriptor keep(got);
    if (r.failed != 0) throw error(operation, name_, std::string(r.text, ::strnlen(r.text, sizeof r.text)));
    if (received_fd != nullptr) *received_fd = keep.release();
    return r;
  }

 private:
  std::string path_, name_;
  cunvme::detail::file_descriptor socket_, bar_file_;
  std::chrono::milliseconds wait_{};
  std::size_t bar_bytes_ = 0;
  std::uint64_t bar_offset_ = 0;
  bool bar_is_io_memory_ = false;
  bool huge_pages_ = false;
  std::uint16_t granted_ = 0;
  unsigned page_shift_ = 12;
  std::uint32_t owner_pid_ = 0;
  std::mutex mutex_;
  bool broken_ = false;  ///< a call went unanswered: no more calls (under mutex_)
  std::string broken_why_;
};

/// DMA memory of an attached process: each buffer a memory file both processes map, which the
/// owner places on the controller's bus; GPU memory through the exporter. Memory the process
/// made on its own (`map_host`) cannot be reached by the owner's controller and is refused.
class attached_allocator final : public dma_allocator {
 public:
  attached_allocator(std::shared_ptr<owner_connection> owner, gpu_exporter exporter) : owner_(std::move(owner)), exporter_(std::move(exporter)) {}

  [[nodiscard]] dma_buffer map_gpu(void* gpu, std::size_t bytes) override {
    if (reinterpret_cast<std::uintptr_t>(gpu) % 4096 != 0) throw error("Map GPU memory", owner_->name(), "GPU memory must start on a 4 KiB boundary");
    return map_gpu_range(gpu, bytes);
  }
  [[nodiscard]] dma_buffer map_gpu_range(void* gpu, std::size_t bytes) override {
    if (gpu == nullptr || bytes == 0) throw error("Map GPU memory", owner_->name(), "empty range");
    if (!exporter_) throw error("Map GPU memory", owner_->name(), "this process attached without GPU reach (host::gpu_reach()): its GPU memory cannot be exported");
    const gpu_export e = exporter_(gpu, bytes, owner_->name());
    request q{request_kind::map_gpu};
    std::memcpy(q.handle, e.handle, sizeof q.handle);
    q.a = bytes;
    q.b = e.offset;
    const std::uint64_t bus = owner_->call(q, "Map GPU memory").a;
    return dma_buffer(nullptr, gpu, bytes, 4096, bus_range_pages(bus, bytes), memory_location::gpu, [o = owner_, bus] { unmap_quietly(*o, bus); });
  }
  [[nodiscard]] dma_buffer map_host(void*, std::size_t) override {
    throw error("Map host memory", owner_->name(),
                "the owner's controller reaches only memory this process shares with it: allocate DMA memory through memory().allocate");
  }

 protected:
  [[nodiscard]] std::string name() const override { return owner_->name(); }

  [[nodiscard]] dma_buffer allocate_aligned(std::size_t bytes, std::size_t alignment) override {
    if (bytes == 0) throw error("Allocate DMA memory", owner_->name(), "0 bytes asked for");
    // Whole 2 MiB huge pages where the owner's backend reaches shared memory only in those.
    const std::size_t unit = owner_->huge_pages() ? std::size_t{2} << 20 : 4096;
    const std::size_t rounded = (bytes + unit - 1) / unit * unit;
    if (rounded < bytes) throw error("Allocate DMA memory", owner_->name(), std::to_string(bytes) + " bytes do not fit the address space");
    // Sealed at its size: the owner maps it for the controller, and a file cut short under that
    // mapping would fault the owner or free pages the controller still reaches.
    cunvme::detail::file_descriptor file(
        ::memfd_create("cunvme-dma", MFD_CLOEXEC | MFD_ALLOW_SEALING | (owner_->huge_pages() ? MFD_HUGETLB | MFD_HUGE_2MB : 0u)));
    if (!file || ::ftruncate(file.get(), static_cast<off_t>(rounded)) != 0 ||
        ::fcntl(file.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
      throw error("Allocate DMA memory", owner_->name(),
                  std::string(std::system_error(errno, std::generic_category(), "memory file of " + std::to_string(rounded) + " bytes").what()) +
                      (owner_->huge_pages() ? ": the owner's controller reaches shared memory in 2 MiB huge pages only (raise /proc/sys/vm/nr_hugepages)" : ""));
    }
    void* p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, file.get(), 0);
    if (p == MAP_FAILED) {
      throw error("Allocate DMA memory", owner_->name(),
                  std::string(std::system_error(errno, std::generic_category(), "mmap").what()) + (owner_->huge_pages() ? " (no 2 MiB huge page left?)" : ""));
    }
    request q{request_kind::map_memory};
    q.a = rounded;
    q.b = alignment;
    std::vector<std::uint64_t> pages;
    std::size_t page_size = 4096;
    try {
      int list = -1;
      const reply r = owner_->call(q, "Allocate DMA memory", file.get(), &list);
      const cunvme::detail::file_descriptor page_file(list);
      if (page_file) {
        // Pages scattered on the bus (the owner's backend pins physical pages): their list.
        const auto bad_list = [&](const char* why) {
          unmap_quietly(*owner_, r.a);  // the owner mapped it: it leaves the bus again
          return error("Allocate DMA memory", owner_->name(), why);
        };
        if (r.b == 0 || r.b > rounded / 4096 || r.c < 4096 || r.b * r.c < rounded) throw bad_list("the owner sent a page list that does not cover the buffer");
        pages.resize(static_cast<std::size_t>(r.b));
        const auto want = static_cast<ssize_t>(pages.size() * sizeof(std::uint64_t));
        if (::pread(page_file.get(), pages.data(), static_cast<std::size_t>(want), 0) != want || pages.front() != r.a) {
          throw bad_list("the owner's page list is short or does not start at its bus address");
        }
        page_size = static_cast<std::size_t>(r.c);
      } else {
        pages = bus_range_pages(r.a, rounded);
      }
    } catch (...) {
      ::munmap(p, rounded);
      throw;
    }
    const std::uint64_t bus = pages.front();
    return dma_buffer(static_cast<std::byte*>(p), nullptr, bytes, page_size, std::move(pages), memory_location::pinned_host,
                      [o = owner_, bus, p, rounded] {
                        unmap_quietly(*o, bus);  // the owner's controller lets go first …
                        ::munmap(p, rounded);    // … then the memory goes
                      });
  }

 private:
  /// The owner takes a region off the controller's bus; where the owner is gone, so is the
  /// controller, and there is nothing left to undo. Never throws: runs in a buffer's release.
  static void unmap_quietly(owner_connection& o, std::uint64_t bus) noexcept {
    try {
      request q{request_kind::unmap_memory};
      q.a = bus;
      (void)o.call(q, "Release DMA memory");
    } catch (...) {
    }
  }

  std::shared_ptr<owner_connection> owner_;
  gpu_exporter exporter_;
};

/// BAR0 of a shared controller as an attached process sees it, mapped from the file the owner
/// sent (the emulator's memory file, resource0, the VFIO device, the module's file). Doorbells are this process's to ring (its own queues'); the
/// registers below them are the owner's, and a write to one is refused.
class attached_backend final : public register_backend {
 public:
  attached_backend(std::shared_ptr<owner_connection> owner, gpu_exporter exporter) : owner_(std::move(owner)), memory_(owner_, std::move(exporter)) {
    void* p = ::mmap(nullptr, owner_->bar_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, owner_->bar_file(), static_cast<off_t>(owner_->bar_offset()));
    if (p == MAP_FAILED) throw error("Attach", owner_->name(), std::system_error(errno, std::generic_category(), "map BAR0").what());
    bar_ = static_cast<std::byte*>(p);
  }
  attached_backend(const attached_backend&) = delete;
  attached_backend& operator=(const attached_backend&) = delete;
  ~attached_backend() override { ::munmap(bar_, owner_->bar_bytes()); }

  [[nodiscard]] std::string name() const override { return owner_->name(); }
  [[nodiscard]] std::byte* bar() const override { return bar_; }
  [[nodiscard]] std::size_t bar_size() const override { return owner_->bar_bytes(); }
  void map_cmb(unsigned, std::uint64_t, std::uint64_t) override {
    throw error("Map CMB", owner_->name(), "the CMB of a shared controller is its owner's");
  }
  [[nodiscard]] dma_allocator& memory() override { return memory_; }
  /// The emulator's BAR is memory; a real controller's is MMIO (cudaHostRegisterIoMemory).
  [[nodiscard]] bool bar_is_io_memory() const override { return owner_->bar_is_io_memory(); }
  void write32(std::uint32_t offset, std::uint32_t value) const override {
    if (offset < spec::to_underlying(spec::register_offset::doorbells)) {
      throw error("Write register", owner_->name(), "register " + std::to_string(offset) + " is the owner's (" + owner_->owner() + "); an attached process rings doorbells only");
    }
    register_backend::write32(offset, value);
  }
  [[nodiscard]] owner_connection& owner() const noexcept { return *owner_; }

 private:
  std::shared_ptr<owner_connection> owner_;
  attached_allocator memory_;
  std::byte* bar_ = nullptr;
};

/// `admin_link` over the owner's socket.
class owner_admin_link final : public admin_link {
 public:
  explicit owner_admin_link(std::shared_ptr<owner_connection> owner) : owner_(std::move(owner)) {}
  [[nodiscard]] std::string owner() const override { return owner_->owner(); }
  [[nodiscard]] std::uint16_t queue_pairs_granted() const override { return owner_->granted(); }
  [[nodiscard]] unsigned page_shift() const override { return owner_->page_shift(); }
  [[nodiscard]] spec::completion_entry admin(const spec::submission_entry& sqe, const std::string& operation) override {
    request q{request_kind::admin};
    q.sqe = sqe;
    return owner_->call(q, operation).cqe;
  }
  [[nodiscard]] std::uint16_t take_queue_id(const std::string& operation) override {
    return static_cast<std::uint16_t>(owner_->call(request{request_kind::take_queue_id}, operation).a);
  }
  void release_queue_id(std::uint16_t qid) noexcept override {
    try {
      request q{request_kind::release_queue_id};
      q.a = qid;
      (void)owner_->call(q, "Release I/O queue " + std::to_string(qid));
    } catch (...) {
      // The owner is gone (and the identifier with it), or refuses an identifier it reclaimed.
    }
  }

 private:
  std::shared_ptr<owner_connection> owner_;
};

/// Attaches to the controller whose owner serves `path`. Answers from the owner are awaited at
/// most the admin timeout plus 5 s (it may be running a command of that length for us).
[[nodiscard]] inline std::unique_ptr<controller> attach(const std::string& path, controller_options options = {}, const host_registrar& gpu = {},
                                                        gpu_exporter exporter = {}) {
  options.check("attach:" + path);
  const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(options.admin_command_timeout()) + std::chrono::seconds(5);
  auto owner = std::make_shared<owner_connection>(path, wait);
  auto backend = std::make_unique<attached_backend>(owner, std::move(exporter));
  return std::make_unique<controller>(std::move(backend), std::make_unique<owner_admin_link>(owner), options, gpu);
}

}  // namespace host::sharing
CUNVME_NAMESPACE_END
