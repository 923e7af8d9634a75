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
// Isolation: the owner keeps processes to their own queue identifiers, queues, memory and admin
// commands, and no message of theirs can crash it or make it wait without bound. It cannot keep
// them from the device itself: a command a process submits on its own queue may name any bus
// address the controller reaches (no NVMe controller checks that; SPDK's multi-process mode is
// the same), and the BAR0 file it gets (a VFIO device, resource0) reaches the whole device.
// Processes sharing a controller trust one another; the socket is the owner's user's alone
// (mode 0600).
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/file_descriptor.cuh>
#include <cunvme/detail/system_memory.cuh>
#include <cunvme/host/backend/emu_backend.cuh>
#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/sharing/wire.cuh>
#include <cunvme/spec/command_fields.cuh>
#include <cunvme/spec/opcodes.cuh>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <system_error>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

CUNVME_NAMESPACE_BEGIN
namespace host::sharing {

/// Serves `ctrl` (brought up by this process) to other processes at socket `path` until
/// destroyed, which must happen before `ctrl` goes. While processes hold queue identifiers,
/// `ctrl.reset()` is refused (it would delete their queues).
///
/// Usage: examples/snippets/host.cpp, `share_controller`; a serving process: examples/cunvme_share.cpp.
class controller_owner {
 public:
  /// Attached at once, at most.
  static constexpr std::size_t max_processes = 1024;

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
    const std::uint64_t machine = cunvme::detail::physical_memory_bytes();
    max_bytes_per_process_ = machine != 0 ? machine / 2 : std::uint64_t{1} << 34;
    listener_ = cunvme::detail::file_descriptor(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (!listener_) throw error("Share", path_, std::system_error(errno, std::generic_category(), "socket").what());
    const sockaddr_un address = socket_address(path_, "Share");
    if (::bind(listener_.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
      const int e = errno;
      throw error("Share", path_, std::string(std::system_error(e, std::generic_category(), "bind").what()) +
                                      (e == EADDRINUSE ? ": the path exists (another owner, or one that died: remove the file if none runs)" : ""));
    }
    try {
      if (::chmod(path_.c_str(), 0600) != 0 || ::listen(listener_.get(), 64) != 0) {
        throw error("Share", path_, std::system_error(errno, std::generic_category(), "chmod/listen").what());
      }
      acceptor_ = std::thread([this] { accept_processes(); });
    } catch (...) {
      ::unlink(path_.c_str());
      throw;
    }
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
      for (attached_process& p : processes_) {
        if (p.socket) ::shutdown(p.socket.get(), SHUT_RDWR);
      }
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
  /// Queues (SQs and CQs) of gone processes the owner deleted for them.
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
  /// Where a live queue of a process lies on the bus (PC = 1: one range).
  struct queue_memory {
    std::uint64_t bus = 0, bytes = 0;
  };
  struct attached_process {
    cunvme::detail::file_descriptor socket;
    int pid = 0;
    std::thread thread;
    std::set<std::uint16_t> qids;                          ///< identifiers it holds (lent by the controller)
    std::map<std::uint16_t, queue_memory> sqs, cqs;        ///< its queues the controller has now
    std::map<std::uint64_t, region> regions;               ///< by bus address of the first page
    std::uint64_t mapped_bytes = 0;
    bool gone = false;      ///< its socket closed; reclaimed
    bool finished = false;  ///< its thread is done: the entry may be erased
  };

  void accept_processes() noexcept {
    for (;;) {
      const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));  // out of descriptors: serve on, accept later
          continue;
        }
        return;  // shut down (EINVAL), or the listener failed
      }
      cunvme::detail::file_descriptor socket(fd);
      if (stopping_.load(std::memory_order_acquire)) return;
      const std::scoped_lock lock(mutex_);
      // Entries whose threads are done go first (their threads end right after marking them).
      for (auto it = processes_.begin(); it != processes_.end();) {
        if (!it->finished) {
          ++it;
          continue;
        }
        if (it->thread.joinable()) it->thread.join();
        it = processes_.erase(it);
      }
      if (processes_.size() >= max_processes) {
        (void)send_message(socket.get(), reply::refusal(std::to_string(max_processes) + " processes are attached already"));
        continue;
      }
      try {
        attached_process& p = processes_.emplace_back();
        p.socket = std::move(socket);
        ucred peer{};
        socklen_t len = sizeof peer;
        if (::getsockopt(p.socket.get(), SOL_SOCKET, SO_PEERCRED, &peer, &len) == 0) p.pid = peer.pid;
        try {
          p.thread = std::thread([this, &p] { serve(p); });
        } catch (...) {
          processes_.pop_back();  // its socket closes: the process is told by its next call
        }
      } catch (...) {
        // Out of memory for the entry: this process is not served; the others are.
      }
    }
  }

  void serve(attached_process& p) noexcept {
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
    const std::scoped_lock lock(mutex_);
    p.finished = true;
  }

  [[nodiscard]] std::string who(const attached_process& p) const { return "process " + std::to_string(p.pid); }

  reply answer(attached_process& p, const request& q, cunvme::detail::file_descriptor& file, cunvme::detail::file_descriptor& reply_file) noexcept {
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
        case request_kind::unmap_memory: return unmap_memory(p, q.a);
        case request_kind::take_queue_id: return take_queue_id(p);
        case request_kind::release_queue_id: return release_queue_id(p, q.a);
        case request_kind::admin: return admin(p, q.sqe);
      }
      return reply::refusal("unknown request " + std::to_string(static_cast<std::uint32_t>(q.kind)));
    } catch (const std::exception& e) {
      return reply::refusal(e.what());
    }
  }

  reply map_memory(attached_process& p, const request& q, const cunvme::detail::file_descriptor& file, cunvme::detail::file_descriptor& page_file);

  reply map_gpu(attached_process& p, const request& q);

  /// A region leaves the bus, unless a live queue of the process lies in it.
  reply unmap_memory(attached_process& p, std::uint64_t bus);

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
    std::uint16_t qid = 0;
    try {
      qid = ctrl_.lend_queue_id();  // the controller's own lock only: no wait under mutex_
    } catch (const error&) {
      const std::scoped_lock lock(mutex_);
      std::size_t others = 0;
      for (const attached_process& o : processes_) others += &o == &p ? 0 : o.qids.size();
      return reply::refusal("no I/O queue pair left: 0 of " + std::to_string(ctrl_.io_queue_pairs_granted()) + " free (" + who(p) + " holds " +
                            std::to_string(p.qids.size()) + ", other processes " + std::to_string(others) + ", the owner the rest)");
    }
    const std::scoped_lock lock(mutex_);
    p.qids.insert(qid);
    reply r;
    r.a = qid;
    return r;
  }

  /// Gives an identifier back once its queues are gone: the owner deletes those the controller
  /// still has (a process that failed to, or did not try), and keeps the identifier where it
  /// cannot.
  reply release_queue_id(attached_process& p, std::uint64_t id) {
    const auto qid = static_cast<std::uint16_t>(id);
    {
      const std::scoped_lock lock(mutex_);
      if (id > 0xffff || p.qids.count(qid) == 0) return reply::refusal("queue " + std::to_string(id) + " is not " + who(p) + "'s");
    }
    if (!delete_queues(p, {qid})) return reply::refusal("queue " + std::to_string(qid) + " could not be deleted: its identifier stays taken");
    {
      const std::scoped_lock lock(mutex_);
      p.qids.erase(qid);
    }
    ctrl_.return_lent_queue_id(qid);  // outside mutex_: it waits for the controller's admin lock
    return reply{};
  }

  /// Deletes the live queues of identifiers `qids` (every SQ first: a CQ with an SQ on it cannot
  /// go). True when none of them is left on the controller.
  bool delete_queues(attached_process& p, const std::set<std::uint16_t>& qids) noexcept {
    bool all = true;
    for (const bool sq : {true, false}) {
      for (const std::uint16_t qid : qids) {
        {
          const std::scoped_lock lock(mutex_);
          if ((sq ? p.sqs : p.cqs).count(qid) == 0) continue;
        }
        bool deleted = false;
        try {
          const std::string which = std::string(sq ? "SQ " : "CQ ") + std::to_string(qid) + " of " + who(p);
          const auto status = ctrl_.admin_command(sq ? spec::make_delete_io_sq(qid) : spec::make_delete_io_cq(qid), "Delete I/O " + which).status();
          deleted = status == spec::status::successful_completion || status == spec::status::invalid_queue_identifier;
        } catch (...) {
        }
        if (deleted || ctrl_.stopped()) {  // CC.EN = 0 deleted it too
          const std::scoped_lock lock(mutex_);
          (sq ? p.sqs : p.cqs).erase(qid);
          if (p.gone) queues_reclaimed_.fetch_add(1, std::memory_order_relaxed);
        } else {
          all = false;
        }
      }
    }
    return all;
  }

  [[nodiscard]] bool holds(const attached_process& p, std::uint16_t qid) const {
    const std::scoped_lock lock(mutex_);
    return p.qids.count(qid) != 0;
  }
  /// Whether [bus, bus + bytes) lies in `r` (within one page where its pages are scattered).
  [[nodiscard]] static bool in_region(const region& r, std::uint64_t bus, std::uint64_t bytes) noexcept {
    if (bytes == 0) return false;
    const std::uint64_t page = r.mapped->page_size();
    if (r.mapped->contiguous(0, r.mapped->size())) {
      const std::uint64_t first = r.mapped->pages().front(), span = r.mapped->pages().size() * page;
      return bus >= first && bytes <= span && bus - first <= span - bytes;
    }
    for (const std::uint64_t at : r.mapped->pages()) {
      if (bus >= at && bytes <= page && bus - at <= page - bytes) return true;
    }
    return false;
  }
  [[nodiscard]] bool owns_memory(const attached_process& p, std::uint64_t bus, std::uint64_t bytes) const {
    const std::scoped_lock lock(mutex_);
    return std::any_of(p.regions.begin(), p.regions.end(), [&](const auto& entry) { return in_region(entry.second, bus, bytes); });
  }
  /// Whether a transfer of `bytes` through PRP1/PRP2 lands in memory of `p` (at most two pages:
  /// longer ones, whose PRP2 is a list, are refused).
  [[nodiscard]] bool data_in_own_memory(const attached_process& p, std::uint64_t prp1, std::uint64_t prp2, std::uint64_t bytes) const {
    const std::uint64_t page = std::uint64_t{1} << ctrl_.page_shift();
    if (prp1 == 0 || bytes == 0) return false;
    const std::uint64_t first = std::min(bytes, page - prp1 % page);
    if (!owns_memory(p, prp1, first)) return false;
    const std::uint64_t rest = bytes - first;
    return rest == 0 || (rest <= page && prp2 % page == 0 && owns_memory(p, prp2, rest));
  }

  /// Runs the admin commands a process may send, on its own queues and memory; refuses the rest.
  reply admin(attached_process& p, const spec::submission_entry& sqe);

  /// A process is gone: its queues deleted (SQs before CQs; the controller ends the commands it
  /// is executing for them first), then its memory off the bus. Where a queue could not be
  /// deleted and the controller did not stop either, its identifier stays taken and its memory
  /// mapped for good: the controller may still use them.
  void reclaim(attached_process& p) noexcept {
    std::set<std::uint16_t> qids;
    std::vector<std::uint16_t> returned;
    try {
      const std::scoped_lock lock(mutex_);
      p.gone = true;
      qids = p.qids;
      returned.reserve(qids.size());
    } catch (...) {
      // Out of memory: nothing is given back; the identifiers stay taken, the memory mapped.
      return;
    }
    const bool stopped_dma = delete_queues(p, qids);
    std::map<std::uint64_t, region> regions;
    {
      const std::scoped_lock lock(mutex_);
      for (const std::uint16_t qid : qids) {
        if (stopped_dma || (p.sqs.count(qid) == 0 && p.cqs.count(qid) == 0)) {
          p.qids.erase(qid);
          returned.push_back(qid);  // (reserved above: qids holds as many)
        }
      }
      if (stopped_dma) {
        regions.swap(p.regions);
        p.mapped_bytes = 0;
      }
      p.socket.reset();
    }
    for (const std::uint16_t qid : returned) ctrl_.return_lent_queue_id(qid);
    for (auto& [bus, r] : regions) release(r);
    reclaimed_.fetch_add(1, std::memory_order_release);
  }

  controller& ctrl_;
  emu::controller* emu_ = nullptr;  ///< where the backend is the emulator (GPU memory of attached processes)
  shareable_bar bar_;
  std::string path_;
  std::uint64_t max_bytes_per_process_ = 0;
  cunvme::detail::file_descriptor listener_;
  mutable std::mutex mutex_;
  std::list<attached_process> processes_;
  std::thread acceptor_;
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> reclaimed_{0}, queues_reclaimed_{0};
};

}  // namespace host::sharing
CUNVME_NAMESPACE_END

// The requests that change what a process may reach: its memory on the bus, its admin commands.
#include <cunvme/host/sharing/owner_requests.cuh>
