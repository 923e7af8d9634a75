// The owner of a shared controller's admin queue: serves the processes attached to it
// (`host::open("attach:PATH")`) over a Unix socket — queue identifiers, the admin commands on
// their own queues, their memory placed on the controller's bus — and, when a process is gone
// (exit, crash, SIGKILL: its socket closes), deletes its queues, which ends its commands and
// their DMA, before its memory leaves the controller's reach. The others keep running.
//
// Any backend that can hand its BAR0 to another process serves (`register_backend::
// bar_for_other_processes`): the emulator built with a shared BAR0 (`emu:shared`), `vfio:` (the
// device file), `sysfs:` (resource0) and `kmod:` (the module's file). An attached process's
// memory is a memory file the owner maps and gives to its own backend (`dma_allocator::
// map_host`: the emulator's IOMMU, a VFIO IOVA range, pinned physical pages), so the owner's
// backend decides how the controller reaches it; its GPU memory (CUDA IPC) reaches an emulated
// controller only. The owner is a process, not the kernel module: were it killed, the attached
// processes' queues would go with its controller.
//
// Isolation: the owner keeps processes to their own queue identifiers, queues and admin
// commands. A command a process submits on its own queue may still name any bus address the
// controller reaches, as on every NVMe controller shared this way (SPDK's multi-process mode
// too): processes sharing a controller trust one another's commands.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/file_descriptor.cuh>
#include <cunvme/emu/dma_space.cuh>
#include <cunvme/host/backend/emu_backend.cuh>
#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/sharing/wire.cuh>
#include <cunvme/spec/command_fields.cuh>
#include <cunvme/spec/opcodes.cuh>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

CUNVME_NAMESPACE_BEGIN
namespace host::sharing {

/// Serves `ctrl` (brought up by this process) to other processes at socket `path` until destroyed.
///
/// Usage: examples/snippets/host.cpp, `share_controller`; a serving process: examples/cunvme_share.cpp.
class controller_owner {
 public:
  controller_owner(controller& ctrl, std::string path) : ctrl_(ctrl), path_(std::move(path)) {
    if (ctrl_.attached()) throw error("Share", ctrl_.name(), "this process attached to the controller; only its owner serves it");
    bar_ = ctrl_.backend().bar_for_other_processes();
    if (auto* emu = dynamic_cast<emu_backend*>(&ctrl_.backend())) emu_ = &emu->controller();
    if (bar_.fd < 0) {
      throw error("Share", ctrl_.name(),
                  emu_ != nullptr ? "the emulator's BAR0 is private: open it with emu:shared (controller_config::shared_bar)"
                                  : "this backend cannot hand its BAR0 to another process");
    }
    if (ctrl_.shadow_doorbells()) {
      throw error("Share", ctrl_.name(), "shadow doorbells are in effect (in the owner's memory): open the controller with shadow_doorbells off to share it");
    }
    listener_ = cunvme::detail::file_descriptor(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (!listener_) throw error("Share", path_, std::system_error(errno, std::generic_category(), "socket").what());
    const sockaddr_un address = socket_address(path_, "Share");
    if (::bind(listener_.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
      const int e = errno;
      throw error("Share", path_, std::string(std::system_error(e, std::generic_category(), "bind").what()) +
                                      (e == EADDRINUSE ? ": the path exists (another owner, or one that died: remove the file if none runs)" : ""));
    }
    if (::listen(listener_.get(), 64) != 0) {
      const int e = errno;
      ::unlink(path_.c_str());
      throw error("Share", path_, std::system_error(e, std::generic_category(), "listen").what());
    }
    acceptor_ = std::thread([this] { accept_processes(); });
  }

  controller_owner(const controller_owner&) = delete;
  controller_owner& operator=(const controller_owner&) = delete;

  /// Stops serving: every attached process is let go as if it had died (its queues deleted,
  /// its memory off the bus), then the socket file goes.
  ~controller_owner() {
    stopping_.store(true, std::memory_order_release);
    ::shutdown(listener_.get(), SHUT_RDWR);
    acceptor_.join();
    {
      const std::scoped_lock lock(mutex_);
      for (attached_process& p : processes_) ::shutdown(p.socket.get(), SHUT_RDWR);
    }
    for (attached_process& p : processes_) {
      if (p.thread.joinable()) p.thread.join();
    }
    ::unlink(path_.c_str());
  }

  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// Processes attached now.
  [[nodiscard]] std::size_t processes() const {
    const std::scoped_lock lock(mutex_);
    return static_cast<std::size_t>(std::count_if(processes_.begin(), processes_.end(), [](const attached_process& p) { return !p.gone; }));
  }
  /// Queue identifiers attached processes hold now.
  [[nodiscard]] std::size_t queue_ids_held() const {
    const std::scoped_lock lock(mutex_);
    std::size_t n = 0;
    for (const attached_process& p : processes_) n += p.qids.size();
    return n;
  }
  /// Processes gone so far, each with its queues deleted and its memory off the bus.
  [[nodiscard]] std::uint64_t processes_reclaimed() const noexcept { return reclaimed_.load(std::memory_order_acquire); }
  /// Queue pairs of gone processes the owner had to delete (they had not deleted them).
  [[nodiscard]] std::uint64_t queues_reclaimed() const noexcept { return queues_reclaimed_.load(std::memory_order_acquire); }

 private:
  /// Memory a process placed on the bus: the owner's own mapping of its memory file, so the
  /// pages stay while the controller may reach them, whatever happens to the process.
  struct region {
    std::uint64_t bus = 0, bytes = 0;
    std::shared_ptr<dma_buffer> mapped;  ///< the owner's backend's mapping: released first
    void* reservation = nullptr;         ///< the owner's mapping (host memory) or the opened GPU export
    std::size_t reserved = 0;            ///< bytes of `reservation` for host memory; 0 for GPU memory
  };
  struct attached_process {
    cunvme::detail::file_descriptor socket;
    int pid = 0;
    std::thread thread;
    std::set<std::uint16_t> qids;
    std::map<std::uint64_t, region> regions;  ///< by bus address
    bool gone = false;
  };

  void accept_processes() {
    for (;;) {
      const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // shut down (EINVAL), or the listener failed
      }
      if (stopping_.load(std::memory_order_acquire)) {
        ::close(fd);
        return;
      }
      const std::scoped_lock lock(mutex_);
      attached_process& p = processes_.emplace_back();
      p.socket = cunvme::detail::file_descriptor(fd);
      ucred peer{};
      socklen_t len = sizeof peer;
      if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) == 0) p.pid = peer.pid;
      p.thread = std::thread([this, &p] { serve(p); });
    }
  }

  void serve(attached_process& p) {
    for (;;) {
      request q;
      int fd = -1;
      const receive_status status = receive_message(p.socket.get(), q, fd);
      if (status == receive_status::closed) break;
      cunvme::detail::file_descriptor file(fd);
      cunvme::detail::file_descriptor reply_file;  // a page list that goes with the reply
      reply r = status == receive_status::message ? answer(p, q, file, reply_file) : reply::refusal("malformed request");
      int send_fd = reply_file.get();
      if (status == receive_status::message && q.kind == request_kind::hello && r.failed == 0) send_fd = bar_.fd;
      if (!send_message(p.socket.get(), r, send_fd)) break;
    }
    reclaim(p);
  }

  [[nodiscard]] std::string who(const attached_process& p) const { return "process " + std::to_string(p.pid); }

  reply answer(attached_process& p, const request& q, cunvme::detail::file_descriptor& file, cunvme::detail::file_descriptor& reply_file) {
    try {
      switch (q.kind) {
        case request_kind::hello: {
          if (q.a != wire_version) return reply::refusal("wire version " + std::to_string(q.a) + " is not the owner's " + std::to_string(wire_version));
          reply r;
          r.a = bar_.bytes;
          r.b = std::uint64_t{ctrl_.io_queue_pairs_granted()} | std::uint64_t{ctrl_.page_shift()} << 16 |
                std::uint64_t{ctrl_.backend().bar_is_io_memory()} << 24 | std::uint64_t{ctrl_.backend().memory().shared_memory_needs_huge_pages()} << 25 |
                std::uint64_t(static_cast<std::uint32_t>(::getpid())) << 32;
          r.c = bar_.offset;
          return r;
        }
        case request_kind::map_memory: return map_memory(p, q, file, reply_file);
        case request_kind::map_gpu: return map_gpu(p, q);
        case request_kind::unmap_memory: {
          region gone;
          {
            const std::scoped_lock lock(mutex_);
            const auto it = p.regions.find(q.a);
            if (it == p.regions.end()) return reply::refusal("no region of " + who(p) + " at this bus address");
            gone = it->second;
            p.regions.erase(it);
          }
          release(gone);
          return reply{};
        }
        case request_kind::take_queue_id: return take_queue_id(p);
        case request_kind::release_queue_id: {
          const std::scoped_lock lock(mutex_);
          if (p.qids.erase(static_cast<std::uint16_t>(q.a)) == 0) return reply::refusal("queue " + std::to_string(q.a) + " is not " + who(p) + "'s");
          ctrl_.release_queue_id(static_cast<std::uint16_t>(q.a));
          return reply{};
        }
        case request_kind::admin: return admin(p, q.sqe);
      }
      return reply::refusal("unknown request " + std::to_string(static_cast<std::uint32_t>(q.kind)));
    } catch (const std::exception& e) {
      return reply::refusal(e.what());
    }
  }

  reply map_memory(attached_process& p, const request& q, const cunvme::detail::file_descriptor& file, cunvme::detail::file_descriptor& page_file) {
    if (!file) return reply::refusal("no memory file came with the request");
    const std::uint64_t bytes = q.a, alignment = q.b;
    struct stat st{};
    if (::fstat(file.get(), &st) != 0 || bytes == 0 || bytes % 4096 != 0 || static_cast<std::uint64_t>(st.st_size) < bytes) {
      return reply::refusal("the memory file does not hold " + std::to_string(bytes) + " bytes in whole 4 KiB pages");
    }
    if (alignment < 4096 || (alignment & (alignment - 1)) != 0 || alignment > (std::uint64_t{2} << 20)) {
      return reply::refusal("alignment " + std::to_string(alignment) + " is not a power of two from 4 KiB to 2 MiB");
    }
    // The owner's mapping starts on `alignment`, so the bus address does where the backend keeps
    // the offset within it (the emulator's IOMMU and VFIO IOVAs do): a reservation that much
    // larger, the file mapped inside it.
    // A huge-page file maps on its page size (st_blksize: 2 MiB for hugetlbfs, 4 KiB otherwise).
    const std::uint64_t map_alignment = std::max<std::uint64_t>(alignment, static_cast<std::uint64_t>(std::max<blksize_t>(st.st_blksize, 4096)));
    if (bytes % static_cast<std::uint64_t>(std::max<blksize_t>(st.st_blksize, 4096)) != 0) {
      return reply::refusal("the memory file's " + std::to_string(bytes) + " bytes are not whole pages of " + std::to_string(st.st_blksize) + " bytes");
    }
    const std::size_t reserved = static_cast<std::size_t>(bytes + map_alignment);
    void* reservation = ::mmap(nullptr, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (reservation == MAP_FAILED) return reply::refusal(std::system_error(errno, std::generic_category(), "reserve address space").what());
    const std::uintptr_t at = (reinterpret_cast<std::uintptr_t>(reservation) + map_alignment - 1) / map_alignment * map_alignment;
    // MAP_POPULATE: every page is there before the backend translates or pins it.
    if (::mmap(reinterpret_cast<void*>(at), static_cast<std::size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, file.get(), 0) ==
        MAP_FAILED) {
      const int e = errno;
      ::munmap(reservation, reserved);
      return reply::refusal(std::system_error(e, std::generic_category(), "map the memory file").what());
    }
    region r{0, bytes, nullptr, reservation, reserved};
    try {
      r.mapped = std::make_shared<dma_buffer>(ctrl_.backend().memory().map_host(reinterpret_cast<void*>(at), static_cast<std::size_t>(bytes)));
    } catch (const std::exception& e) {
      ::munmap(reservation, reserved);
      return reply::refusal(e.what());
    }
    reply out;
    const std::vector<std::uint64_t>& pages = r.mapped->pages();
    const std::uint64_t page = r.mapped->page_size();
    bool contiguous = !pages.empty();
    for (std::size_t i = 1; contiguous && i < pages.size(); ++i) contiguous = pages[i] == pages[0] + i * page;
    if (contiguous && r.mapped->bus() % alignment == 0) {
      out.a = r.mapped->bus();
    } else if (!pages.empty() && pages[0] % alignment == 0) {
      // Pages scattered on the bus (pinned physical pages): their addresses in a file of their own.
      page_file = cunvme::detail::file_descriptor(::memfd_create("cunvme-pages", MFD_CLOEXEC));
      const std::size_t list = pages.size() * sizeof(std::uint64_t);
      if (!page_file || ::pwrite(page_file.get(), pages.data(), list, 0) != static_cast<ssize_t>(list)) {
        page_file.reset();
        release(r);
        return reply::refusal(std::system_error(errno, std::generic_category(), "write the page list").what());
      }
      out.a = pages[0];
      out.b = pages.size();
      out.c = page;
    } else {
      release(r);
      return reply::refusal("the controller cannot reach this memory on a " + std::to_string(alignment) + "-byte boundary");
    }
    r.bus = pages[0];
    const std::scoped_lock lock(mutex_);
    p.regions.emplace(r.bus, std::move(r));
    return out;
  }

  reply map_gpu(attached_process& p, const request& q) {
    if (emu_ == nullptr) return reply::refusal("an attached process's GPU memory reaches an emulated controller only (" + ctrl_.name() + " is not one)");
    const emu::memory_hooks& hooks = emu_->config().memory;
    if (!hooks.open_exported_gpu) return reply::refusal("the owner's emulator has no GPU reach (open it for GPU threads) to open another process's GPU memory");
    void* base = hooks.open_exported_gpu(q.handle);
    if (base == nullptr) return reply::refusal("CUDA could not open the exported GPU memory in the owner's process");
    region r{0, q.a, nullptr, base, 0};
    try {
      r.mapped = std::make_shared<dma_buffer>(ctrl_.backend().memory().map_gpu_range(static_cast<std::byte*>(base) + q.b, static_cast<std::size_t>(q.a)));
      r.bus = r.mapped->bus();
    } catch (const std::exception& e) {
      hooks.close_exported_gpu(base);
      return reply::refusal(e.what());
    }
    const std::scoped_lock lock(mutex_);
    p.regions.emplace(r.bus, r);
    reply out;
    out.a = r.bus;
    return out;
  }

  /// Takes `r` off the bus (waiting for the controller's accesses to it to end), then lets go
  /// of the owner's mapping.
  void release(region& r) noexcept {
    r.mapped.reset();  // off the bus first (the emulator waits for its accesses to end)
    if (r.reserved != 0) {
      ::munmap(r.reservation, r.reserved);
    } else if (emu_ != nullptr && emu_->config().memory.close_exported_gpu) {
      emu_->config().memory.close_exported_gpu(r.reservation);
    }
  }

  reply take_queue_id(attached_process& p) {
    const std::scoped_lock lock(mutex_);
    try {
      const std::uint16_t qid = ctrl_.take_queue_id();
      p.qids.insert(qid);
      reply r;
      r.a = qid;
      return r;
    } catch (const error&) {
      std::size_t others = 0;
      for (const attached_process& o : processes_) others += &o == &p ? 0 : o.qids.size();
      return reply::refusal("no I/O queue pair left: 0 of " + std::to_string(ctrl_.io_queue_pairs_granted()) + " free (" + who(p) + " holds " +
                            std::to_string(p.qids.size()) + ", other processes " + std::to_string(others) + ", the owner the rest)");
    }
  }

  [[nodiscard]] bool holds(const attached_process& p, std::uint16_t qid) const {
    const std::scoped_lock lock(mutex_);
    return p.qids.count(qid) != 0;
  }
  /// Whether [bus, bus + bytes) lies in memory `p` placed on the bus (within one page where its
  /// pages are scattered).
  [[nodiscard]] bool owns_memory(const attached_process& p, std::uint64_t bus, std::uint64_t bytes) const {
    const std::scoped_lock lock(mutex_);
    for (const auto& [first, r] : p.regions) {
      const std::uint64_t page = r.mapped->page_size();
      const std::vector<std::uint64_t>& pages = r.mapped->pages();
      if (pages.size() * page == r.bytes && pages.back() == pages.front() + (pages.size() - 1) * page) {
        if (bus >= first && bytes <= r.bytes && bus - first <= r.bytes - bytes) return true;
        continue;
      }
      for (const std::uint64_t at : pages) {
        if (bus >= at && bytes <= page && bus - at <= page - bytes) return true;
      }
    }
    return false;
  }

  /// Runs the admin commands a process may send, on its own queues and memory; refuses the rest.
  reply admin(attached_process& p, const spec::submission_entry& sqe) {
    const auto opcode = static_cast<spec::admin_opcode>(sqe.opcode());
    const auto qid = static_cast<std::uint16_t>(sqe.cdw10 & 0xffff);
    const std::string name = "admin command " + std::to_string(static_cast<unsigned>(sqe.opcode()));
    const std::uint64_t page = std::uint64_t{1} << ctrl_.page_shift();
    switch (opcode) {
      case spec::admin_opcode::identify:
      case spec::admin_opcode::get_log_page:
      case spec::admin_opcode::get_features:
        // Their data lands in memory the process placed on the bus (a list page too).
        if (sqe.prp1 != 0 && !owns_memory(p, sqe.prp1, 1)) return reply::refusal(name + ": PRP1 is not memory of " + who(p));
        if (sqe.prp2 != 0 && !owns_memory(p, sqe.prp2, 1)) return reply::refusal(name + ": PRP2 is not memory of " + who(p));
        break;
      case spec::admin_opcode::create_io_completion_queue:
      case spec::admin_opcode::create_io_submission_queue: {
        const std::uint64_t entries = std::uint64_t{(sqe.cdw10 >> 16) & 0xffff} + 1;
        const std::uint64_t bytes = entries * (opcode == spec::admin_opcode::create_io_submission_queue ? 64 : 16);
        if (!holds(p, qid)) return reply::refusal(name + ": queue " + std::to_string(qid) + " is not " + who(p) + "'s (take one first)");
        if (opcode == spec::admin_opcode::create_io_submission_queue && !holds(p, static_cast<std::uint16_t>(sqe.cdw11 >> 16))) {
          return reply::refusal(name + ": its CQ is not " + who(p) + "'s");
        }
        if (!owns_memory(p, sqe.prp1, (bytes + page - 1) / page * page)) return reply::refusal(name + ": the queue is not in memory of " + who(p));
        break;
      }
      case spec::admin_opcode::delete_io_submission_queue:
      case spec::admin_opcode::delete_io_completion_queue:
      case spec::admin_opcode::abort:
        if (!holds(p, qid)) return reply::refusal(name + ": queue " + std::to_string(qid) + " is not " + who(p) + "'s");
        break;
      default:
        return reply::refusal(name + " is the owner's alone: an attached process identifies, reads features and log pages, and creates, "
                                     "deletes and aborts on its own queues");
    }
    reply r;
    r.cqe = ctrl_.admin_command(sqe, who(p) + "'s " + name);
    return r;
  }

  /// A process is gone: its queues deleted (SQ before CQ; the emulator finishes the commands
  /// it is executing first), then its memory off the bus. Where a queue could not be deleted
  /// and the controller did not stop either, its memory stays mapped for good: the controller
  /// may still write it.
  void reclaim(attached_process& p) noexcept {
    std::set<std::uint16_t> qids;
    std::map<std::uint64_t, region> regions;
    {
      const std::scoped_lock lock(mutex_);
      qids.swap(p.qids);
      regions.swap(p.regions);
      p.gone = true;
      p.socket.reset();
    }
    bool stopped_dma = true;
    for (const std::uint16_t qid : qids) {
      bool deleted = false;
      try {
        const std::string which = std::to_string(qid) + " of gone " + who(p);
        const auto sq = ctrl_.admin_command(spec::make_delete_io_sq(qid), "Delete I/O SQ " + which).status();
        const auto cq = ctrl_.admin_command(spec::make_delete_io_cq(qid), "Delete I/O CQ " + which).status();
        // A queue the process deleted itself before it went is Invalid Queue Identifier now.
        deleted = (sq == spec::status::successful_completion || sq == spec::status::invalid_queue_identifier) &&
                  (cq == spec::status::successful_completion || cq == spec::status::invalid_queue_identifier);
        if (sq == spec::status::successful_completion) queues_reclaimed_.fetch_add(1, std::memory_order_relaxed);
      } catch (...) {
      }
      stopped_dma = stopped_dma && (deleted || ctrl_.stopped());
      const std::scoped_lock lock(mutex_);
      ctrl_.release_queue_id(qid);
    }
    if (stopped_dma) {
      for (auto& [bus, r] : regions) release(r);
    } else {
      // The controller may still write them: the owner keeps them mapped for good.
      for (auto& [bus, r] : regions) new region(std::move(r));
    }
    reclaimed_.fetch_add(1, std::memory_order_release);
  }

  controller& ctrl_;
  emu::controller* emu_ = nullptr;  ///< where the backend is the emulator (GPU memory of attached processes)
  shareable_bar bar_;
  std::string path_;
  cunvme::detail::file_descriptor listener_;
  mutable std::mutex mutex_;
  std::list<attached_process> processes_;
  std::thread acceptor_;
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> reclaimed_{0}, queues_reclaimed_{0};
};

}  // namespace host::sharing
CUNVME_NAMESPACE_END
