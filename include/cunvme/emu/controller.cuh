// The emulated NVMe controller: a strict, spec-following NVMe controller run by host threads.
//
// The host (or a GPU) talks to it exactly as to a PCIe controller: it writes registers and
// doorbells in `bar()`, places queues and data in memory it registered with `dma()`, and
// reads completions. One admin thread watches CC, serves the admin queue and scans for stray
// doorbell writes; `workers` threads serve the I/O queues, each owning a fixed subset of
// them. Everything a real controller would reject gets the real NVMe status.
//
// This file starts and stops the threads and runs their loops (arbitration over the SQs);
// what they do is in the parts below it, each one responsibility (controller_state.cuh
// says how they fit together): register_file.cuh (registers, CC/CSTS state machine),
// doorbells.cuh (MMIO and shadow doorbells), queues.cuh (fetching SQEs, posting CQEs, event
// completions), nvm_commands.cuh, admin_commands.cuh, events.cuh (error log, AER state).
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/emu/admin_commands.cuh>
#include <cunvme/emu/backing_store.cuh>
#include <cunvme/emu/controller_config.cuh>
#include <cunvme/emu/dma_space.cuh>
#include <cunvme/emu/fault_injection.cuh>
#include <cunvme/emu/prp_walker.cuh>
#include <cunvme/emu/timing_model.cuh>
#include <cunvme/spec/command_fields.cuh>
#include <cunvme/spec/identify.cuh>
#include <cunvme/spec/log_page.cuh>
#include <cunvme/spec/opcodes.cuh>
#include <cunvme/spec/queue_entry.cuh>
#include <cunvme/spec/registers.cuh>
#include <cunvme/spec/status.cuh>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

CUNVME_NAMESPACE_BEGIN
namespace emu {

/// Counters of what the controller did, for tests and benchmarks.
struct controller_stats {
  std::uint64_t admin_commands = 0;
  std::uint64_t io_commands = 0;
  std::uint64_t completions_posted = 0;
  std::uint64_t bytes_read = 0;       ///< moved from namespaces to host/GPU memory
  std::uint64_t bytes_written = 0;    ///< moved from host/GPU memory to namespaces
  std::uint64_t doorbell_errors = 0;  ///< writes to missing queues' doorbells or out-of-range values
  std::uint64_t dma_faults = 0;       ///< accesses outside every registered region
  std::uint64_t errors_logged = 0;    ///< Error Information log entries created
  std::uint64_t completions_dropped = 0;  ///< lost by fault injection or by a deleted queue
  std::uint64_t thread_failures = 0;  ///< exceptions caught on controller threads (each made it fatal)
  copier_delays copies;               ///< the device copier's calls held up in the CUDA driver
};

namespace detail {
[[nodiscard]] inline std::string seconds_text(std::uint64_t ns) {
  const std::uint64_t tenths = ns / 100'000'000;
  return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " s";
}
}  // namespace detail

/// What `d` says of the device copier's calls held up in the CUDA driver during the last
/// `recent_ns` (a call running now, or one that ended within it), for an error about commands
/// that timed out in that time; empty where there was none.
[[nodiscard]] inline std::string copy_stall_note(const copier_delays& d, std::uint64_t recent_ns) {
  std::string what;
  if (d.running_stall_ns != 0) {
    what = "a call has been waiting " + detail::seconds_text(d.running_stall_ns);
  } else if (d.last_stall_ns != 0 && d.last_stall_ended_ns <= recent_ns) {
    what = "a call waited " + detail::seconds_text(d.last_stall_ns) + ", until " + detail::seconds_text(d.last_stall_ended_ns) + " ago";
  } else {
    return {};
  }
  return "the emulator's data copies were held up in the CUDA driver (" + what +
         "), most likely by a CUDA call on another thread that waits for a kernel which waits for the emulator: cudaFree, "
         "cudaFreeHost, or a synchronous copy on the legacy default stream (emu::cuda_memory, \"Threads\"; too few hardware "
         "queues, emu::prepare_cuda_environment, hold copies up too)";
}

/// A strict software NVMe controller.
///
/// Usage: examples/snippets/emu.cpp, `controller_version`.
class controller : private detail::admin_commands {
 public:
  explicit controller(controller_config config = {}) : admin_commands(std::move(config)) {
    validate_config();
    open_namespaces();
    if (config_.memory.device_copy) dma_.set_device_copier(config_.memory.device_copy);
    bar_size_ = round_up(spec::bar_bytes_for_queues(config_.max_io_queues, config_.doorbell_stride), 4096);
    bar_ = config_.shared_bar ? map_shared_bar() : allocate(bar_size_);
    try {
      if (config_.cmb_bytes != 0) cmb_ = allocate(config_.cmb_bytes);
      start();
    } catch (...) {
      // The destructor does not run for a constructor that throws: undo here.
      stop_.store(true, std::memory_order_release);
      for (auto& t : threads_) t.join();
      if (cmb_ != nullptr) release(cmb_, config_.cmb_bytes);
      release_bar();
      throw;
    }
  }

  controller(const controller&) = delete;
  controller& operator=(const controller&) = delete;

  ~controller() {
    stop_.store(true, std::memory_order_release);
    for (auto& t : threads_) t.join();
    pin_ahead_.stop();
    for (auto& n : namespaces_) {
      try {
        n.store.flush();
      } catch (...) {
        // A destructor must not throw; flush() errors are reported by Flush and shutdown.
      }
    }
    release_bar();
    if (cmb_ != nullptr) release(cmb_, config_.cmb_bytes);
  }

 private:
  /// BAR0 in a memory file other processes map: zeroed, page-aligned, shared.
  [[nodiscard]] std::byte* map_shared_bar() {
    bar_file_ = ::memfd_create("cunvme-emu-bar", MFD_CLOEXEC);
    if (bar_file_ < 0) throw std::system_error(errno, std::generic_category(), "emu: memfd_create for a shared BAR0");
    void* p = MAP_FAILED;
    if (::ftruncate(bar_file_, static_cast<off_t>(bar_size_)) == 0) p = ::mmap(nullptr, bar_size_, PROT_READ | PROT_WRITE, MAP_SHARED, bar_file_, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(bar_file_);
      bar_file_ = -1;
      throw std::system_error(e, std::generic_category(), "emu: map a shared BAR0 of " + std::to_string(bar_size_) + " bytes");
    }
    // This process's GPU threads ring doorbells too (the owner's own devices), as they do in a
    // BAR from `allocate` with GPU hooks.
    if (config_.memory.register_bar && !config_.memory.register_bar(p, bar_size_)) {
      ::munmap(p, bar_size_);
      ::close(bar_file_);
      bar_file_ = -1;
      throw std::runtime_error("emu: the shared BAR0 could not be registered for GPU threads");
    }
    return static_cast<std::byte*>(p);
  }
  void release_bar() noexcept {
    if (bar_file_ < 0) {
      release(bar_, bar_size_);
      return;
    }
    if (config_.memory.register_bar && config_.memory.unregister_bar) config_.memory.unregister_bar(bar_);
    ::munmap(bar_, bar_size_);
    ::close(bar_file_);
    bar_file_ = -1;
  }

  void start() {
    sqs_ = std::make_unique<sq_state[]>(config_.max_io_queues + 1u);
    cqs_ = std::make_unique<cq_state[]>(config_.max_io_queues + 1u);
    stray_doorbells_.assign(2u * (config_.max_io_queues + 1u), 0);
    faults_ = std::make_unique<fault_injector>(config_.faults, config_.fault_seed);
    timing_ = std::make_unique<timing_scheduler>(config_.timing);
    allocated_sqs_ = allocated_cqs_ = config_.max_io_queues;
    volatile_write_cache_enabled_.store(config_.volatile_write_cache);
    write_capability_registers();
    engines_.reserve(config_.workers + 1);
    for (unsigned i = 0; i <= config_.workers; ++i) engines_.push_back(std::make_unique<engine>(config_.seed + i));
    threads_.reserve(config_.workers + 1);
    for (unsigned t = 0; t <= config_.workers; ++t) {
      try {
        threads_.emplace_back([this, t] { thread_main(t); });
      } catch (const std::system_error& e) {
        throw std::system_error(e.code(), "emu::controller: could not start thread " + std::to_string(t + 1) + " of " +
                                              std::to_string(config_.workers + 1) + " (admin thread and " +
                                              std::to_string(config_.workers) + " I/O workers)");
      }
    }
  }

 public:

  /// BAR0's memory: the doorbells, from offset 1000h, are plain memory the host and GPU
  /// threads store into (`spec::sq_tail_doorbell_offset`). The registers below them are not
  /// here: they are reached through `read_register`/`write_register` only (the controller
  /// keeps them, so a write to a read-only register is never visible); this memory's first
  /// 4 KiB are never read by the controller.
  [[nodiscard]] std::byte* bar() const noexcept { return bar_; }
  /// The memory file holding BAR0 (`controller_config::shared_bar`), for other processes to
  /// map; -1 without one. Owned by the controller: duplicate it to keep it.
  [[nodiscard]] int bar_file() const noexcept { return bar_file_; }
  [[nodiscard]] std::size_t bar_size() const noexcept { return bar_size_; }

  /// A 32-bit MMIO read of BAR0 at `offset` (4-byte aligned, inside `bar_size()`): registers
  /// from the controller's register file, doorbells from the BAR memory. Reserved and
  /// unimplemented registers read as 0. Throws std::out_of_range for any other offset.
  [[nodiscard]] std::uint32_t read_register(std::uint32_t offset) const { return mmio_read(offset); }

  /// A 32-bit MMIO write of BAR0 at `offset` (as `read_register`). Writes to read-only and
  /// reserved registers are ignored; every write to CC is seen, however soon the next one
  /// follows. A doorbell write here is the same as a store into `bar()`.
  void write_register(std::uint32_t offset, std::uint32_t value) { mmio_write(offset, value); }
  /// The Controller Memory Buffer (BAR2 in CMBLOC), or nullptr when the config has none.
  [[nodiscard]] std::byte* cmb() const noexcept { return cmb_; }
  [[nodiscard]] std::size_t cmb_size() const noexcept { return config_.cmb_bytes; }
  /// Every status the controller completes a command with on its own; fault injection adds
  /// the statuses its rules name. The emulator fuzzer (test/fuzz/emu_fuzz.cpp) holds it to this.
  static constexpr std::array documented_statuses{
      spec::status::successful_completion,
      spec::status::invalid_command_opcode,
      spec::status::invalid_field_in_command,
      spec::status::data_transfer_error,
      spec::status::command_abort_requested,
      spec::status::command_aborted_due_to_sq_deletion,
      spec::status::invalid_namespace_or_format,
      spec::status::command_sequence_error,
      spec::status::prp_offset_invalid,
      spec::status::invalid_use_of_controller_memory_buffer,
      spec::status::lba_out_of_range,
      spec::status::namespace_is_write_protected,
      spec::status::completion_queue_invalid,
      spec::status::invalid_queue_identifier,
      spec::status::invalid_queue_size,
      spec::status::asynchronous_event_request_limit_exceeded,
      spec::status::invalid_interrupt_vector,
      spec::status::invalid_log_page,
      spec::status::invalid_queue_deletion,
      spec::status::feature_identifier_not_saveable,
      spec::status::write_fault,
  };
  [[nodiscard]] static constexpr bool documented(spec::status s) noexcept {
    return std::find(documented_statuses.begin(), documented_statuses.end(), s) != documented_statuses.end();
  }

  /// A bus address no registered region uses, for CMBMSC.CBA.
  static constexpr std::uint64_t suggested_cmb_address = 0x8'0000'0000ull;

  /// The emulated IOMMU: register memory here to get bus addresses for queues and PRPs.
  [[nodiscard]] dma_space& dma() noexcept { return dma_; }
  [[nodiscard]] const controller_config& config() const noexcept { return config_; }

  /// The bytes behind namespace `nsid` (1-based), for filling and checking from the host.
  [[nodiscard]] backing_store& store(std::uint32_t nsid) {
    if (nsid == 0 || nsid > namespaces_.size()) {
      throw std::out_of_range("emu::controller::store: no namespace " + std::to_string(nsid) + " (the controller has " +
                              std::to_string(namespaces_.size()) + ")");
    }
    return namespaces_[nsid - 1].store;
  }

  /// Bytes of namespace `nsid`'s memory registered through `memory_hooks::register_host` now
  /// (with `cuda_memory()`: pinned, so copies between them and GPU memory run at pinned-copy
  /// speed). Granules are pinned as commands move their data to or from device memory, and
  /// ahead of them (`controller_config::pinning`); 0 where no hook is installed, nothing was
  /// used yet, or every registration was declined. The namespace works either way.
  [[nodiscard]] std::uint64_t namespace_pinned_bytes(std::uint32_t nsid) const {
    if (nsid == 0 || nsid > namespaces_.size()) {
      throw std::out_of_range("emu::controller::namespace_pinned_bytes: no namespace " + std::to_string(nsid) +
                              " (the controller has " + std::to_string(namespaces_.size()) + ")");
    }
    const auto& pinning = namespaces_[nsid - 1].pinning;
    return pinning ? pinning->pinned_bytes() : 0;
  }

  /// false when Read and Write move no data (`controller_config::move_data`): a benchmark
  /// that measures command rates says so next to its figures.
  [[nodiscard]] bool moves_data() const noexcept { return config_.move_data; }

  [[nodiscard]] controller_stats stats() const noexcept {
    controller_stats s;
    s.admin_commands = admin_commands_.load(std::memory_order_relaxed);
    const io_totals t = totals();
    s.io_commands = t.commands;
    s.completions_posted = t.completions_posted;
    s.bytes_read = t.bytes_read;
    s.bytes_written = t.bytes_written;
    s.doorbell_errors = doorbell_errors_.load(std::memory_order_relaxed);
    s.dma_faults = dma_.faults();
    s.errors_logged = errors_.count();
    s.completions_dropped = completions_dropped_.load(std::memory_order_relaxed);
    s.thread_failures = thread_failures_.load(std::memory_order_relaxed);
    s.copies = dma_.copier_delays_seen();
    return s;
  }
  [[nodiscard]] fault_counters injected_faults() const { return faults_->counters(); }

 private:
  // ---- admin thread: CC, CMB, admin queue, stray doorbells -----------------------------------
  void run_admin() {
    engine& e = *engines_[config_.workers];
    std::uint32_t idle = 0;
    std::uint32_t scan = 0;
    while (!stop_.load(std::memory_order_acquire)) {
      spec::cc_register cc{};
      bool busy = handle_cc(cc);
      handle_shutdown(cc);
      handle_cmb();
      if (ready_.load(std::memory_order_acquire) && !fatal_.load(std::memory_order_acquire)) {
        busy |= serve_sq(e, 0);
        if (++scan % 64 == 0) scan_stray_doorbells();
      }
      report_doorbell_errors();
      busy |= post_due(e);
      idle_wait(busy, idle, e);
    }
  }

  // ---- thread entry -----------------------------------------------------------------------------
  /// Every controller thread runs here: thread 0 is the admin thread, 1..N the I/O workers.
  /// Nothing escapes it (an exception leaving a thread ends the process): a failure makes the
  /// controller fatal (CSTS.CFS), which a host sees and can reset, and the loop goes on.
  void thread_main(unsigned t) noexcept {
    if (!guarded([this] { start_thread(); })) setup_failed_.store(true, std::memory_order_release);
    while (!stop_.load(std::memory_order_acquire)) {
      const bool ok = guarded([this, t] {
        if (t == 0) {
          run_admin();
        } else {
          run_io_worker(t - 1);
        }
      });
      // The same failure would come back at once: don't spin on it.
      if (!ok) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    (void)guarded([this] {
      if (config_.memory.device_copy.thread_end) config_.memory.device_copy.thread_end();
    });
  }

  /// Runs `f`; on an exception, counts it, goes fatal and returns false.
  template <class F>
  bool guarded(F&& f) noexcept {
    try {
      f();
      return true;
    } catch (...) {
      thread_failures_.fetch_add(1, std::memory_order_relaxed);
      try {
        go_fatal();
      } catch (...) {
        fatal_.store(true, std::memory_order_release);  // CSTS could not be updated; RDY never rises
      }
      return false;
    }
  }

  // ---- I/O workers ------------------------------------------------------------------------------
  void start_thread() const {
    if (config_.memory.device_copy.thread_start) config_.memory.device_copy.thread_start();
  }

  void run_io_worker(unsigned w) {
    engine& e = *engines_[w];
    std::uint32_t idle = 0;
    while (!stop_.load(std::memory_order_acquire)) {
      bool busy = false;
      if (ready_.load(std::memory_order_acquire) && !fatal_.load(std::memory_order_acquire)) {
        // Round robin over the owned queues, at most one arbitration burst from each per pass.
        for (std::uint32_t q = 1 + w; q <= config_.max_io_queues; q += config_.workers) {
          busy |= serve_sq(e, static_cast<std::uint16_t>(q));
        }
      }
      busy |= post_due(e);
      idle_wait(busy, idle, e);
    }
  }

  /// Spins, then sleeps — but never past the next parked completion's due time, so the
  /// timing model's latencies hold however long the idle sleep is.
  void idle_wait(bool busy, std::uint32_t& idle, engine& e) const {
    if (busy) {
      idle = 0;
      return;
    }
    if (++idle < config_.idle.spins) return;
    auto sleep = std::chrono::nanoseconds(config_.idle.sleep);
    {
      std::scoped_lock lock(e.pending_mutex);
      if (!e.pending.empty()) {
        const std::uint64_t now = now_ns();
        const std::uint64_t due = e.pending.front().due_ns;
        sleep = std::min(sleep, std::chrono::nanoseconds(due > now ? due - now : 0));
      }
    }
    if (sleep.count() > 0) std::this_thread::sleep_for(sleep);
  }

  static constexpr std::uint32_t arbitration_burst = 64;  // Identify RAB = 6

  /// Fetches and executes up to one burst of commands from SQ `qid`.
  /// Lock order, everywhere: SQ mutex → DMA view → {pending list, CQ mutex}; pending lists
  /// and CQ mutexes are never held together.
  bool serve_sq(engine& e, std::uint16_t qid) {
    sq_state& sq = sqs_[qid];
    if (!sq.live.load(std::memory_order_relaxed)) return false;
    std::unique_lock lock(sq.mutex, std::try_to_lock);
    if (!lock.owns_lock() || !sq.live.load(std::memory_order_relaxed)) return false;
    if (qid == 0) return serve_admin_sq(e, sq);
    // One view for the burst: no region the commands use can be unmapped under them.
    const dma_space::view mem = dma_.pin();
    // However the burst ends (an exception, a fatal fetch), no store range stays held.
    const release_holds_on_exit holds_guard{e, mem};
    sq.tail = read_sq_tail(&mem, qid, sq);
    std::uint32_t head = sq.head.load(std::memory_order_relaxed);
    if (head == sq.tail) return false;
    const cq_state& cq = cqs_[sq.cqid];
    e.batch.clear();
    e.awaiting.clear();
    const auto room = [&] { return cq.parked.load(std::memory_order_relaxed) + e.batch.size() < cq.size; };
    if (!room()) return false;
    for (std::uint32_t n = 0; n < arbitration_burst && head != sq.tail && room(); ++n) {
      spec::submission_entry sqe;
      if (!fetch(mem, sq, head, sqe)) return true;
      head = sq.head.load(std::memory_order_relaxed);
      const std::uint64_t sequence = ++sq.sequence;
      const std::size_t before = e.batch.size();
      // Only reads take store locks without waiting while this thread holds some; anything
      // else may wait for a range, so the held ones go first (read_from_store).
      if (!e.holds.empty() && sqe.opcode() != static_cast<std::uint8_t>(spec::nvm_opcode::read)) settle_copies(e, mem);
      const outcome o = execute_io(e, mem, sqe);
      complete(e, qid, sq.cqid, sqe, o, sequence);
      if (o.copies_in_flight && e.batch.size() > before) e.awaiting.push_back({before, o.lba, o.nsid});
      if (fatal_.load(std::memory_order_acquire)) return true;
    }
    publish_event_index(mem, qid, false, sq.tail);
    settle_copies(e, mem);
    dispatch_batch(e, mem);
    return true;
  }

  /// The admin queue runs without a view held across commands: queue creation and deletion
  /// look regions up and take other queues' locks themselves.
  bool serve_admin_sq(engine& e, sq_state& sq) {
    sq.tail = read_sq_tail(nullptr, 0, sq);
    if (sq.head.load(std::memory_order_relaxed) == sq.tail) return false;
    // A CMBMSC write that came before this doorbell takes effect before these commands run.
    handle_cmb();
    e.batch.clear();
    // As for I/O queues: no command is fetched without room for its completion, counting
    // those already waiting, so a host that never consumes the admin CQ cannot make the
    // controller hold more than the CQ's size in completions.
    const cq_state& cq = cqs_[0];
    const auto room = [&] { return cq.parked.load(std::memory_order_relaxed) + e.batch.size() < cq.size; };
    if (!room()) return false;
    for (std::uint32_t n = 0; n < arbitration_burst && sq.head.load(std::memory_order_relaxed) != sq.tail && room(); ++n) {
      spec::submission_entry sqe;
      if (!fetch(dma_.pin(), sq, sq.head.load(std::memory_order_relaxed), sqe)) return true;
      const std::uint64_t sequence = ++sq.sequence;
      const outcome o = execute_admin(e, sqe);
      if (!o.deferred) complete(e, 0, 0, sqe, o, sequence);
      if (fatal_.load(std::memory_order_acquire)) return true;
    }
    dispatch_batch(e, dma_.pin());
    return true;
  }
};

}  // namespace emu
CUNVME_NAMESPACE_END
