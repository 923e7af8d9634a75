// The emulated NVMe controller: a strict, spec-following NVMe controller run by host threads.
//
// The host (or a GPU) talks to it exactly as to a PCIe controller: it writes registers and
// doorbells in `bar()`, places queues and data in memory it registered with `dma()`, and
// reads completions. One admin thread watches CC, serves the admin queue and scans for stray
// doorbell writes; `workers` threads serve the I/O queues, each owning a fixed subset of
// them. Everything a real controller would reject gets the real NVMe status.
#pragma once

#include <cunvme/config.cuh>
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
};

/// A strict software NVMe controller.
///
/// ```
/// cunvme::emu::controller ctrl;                 // one 1 GiB RAM namespace, 512-byte LBAs
/// std::byte* bar = ctrl.bar();                  // registers and doorbells (BAR0)
/// auto bus = ctrl.dma().map(buffer, bytes);     // memory the controller may DMA to
/// // … write AQA/ASQ/ACQ/CC, submit SQEs, ring doorbells, poll CQEs …
/// ```
class controller {
 public:
  explicit controller(controller_config config = {}) : config_(std::move(config)) {
    validate_config();
    open_namespaces();
    if (config_.memory.device_copy) dma_.set_device_copier(config_.memory.device_copy);
    bar_size_ = round_up(spec::bar_size_for_queues(config_.max_io_queues, config_.doorbell_stride), 4096);
    bar_ = allocate(bar_size_);
    try {
      if (config_.cmb_bytes != 0) cmb_ = allocate(config_.cmb_bytes);
      start();
    } catch (...) {
      // The destructor does not run for a constructor that throws: undo here.
      stop_.store(true, std::memory_order_release);
      for (auto& t : threads_) t.join();
      if (cmb_ != nullptr) release(cmb_, config_.cmb_bytes);
      release(bar_, bar_size_);
      throw;
    }
  }

  controller(const controller&) = delete;
  controller& operator=(const controller&) = delete;

  ~controller() {
    stop_.store(true, std::memory_order_release);
    for (auto& t : threads_) t.join();
    for (auto& n : namespaces_) {
      try {
        n.store.flush();
      } catch (...) {
        // A destructor must not throw; flush() errors are reported by Flush and shutdown.
      }
    }
    release(bar_, bar_size_);
    if (cmb_ != nullptr) release(cmb_, config_.cmb_bytes);
  }

 private:
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
  [[nodiscard]] std::size_t bar_size() const noexcept { return bar_size_; }

  /// A 32-bit MMIO read of BAR0 at `offset` (4-byte aligned, inside `bar_size()`): registers
  /// from the controller's register file, doorbells from the BAR memory. Reserved and
  /// unimplemented registers read as 0. Throws std::out_of_range for any other offset.
  [[nodiscard]] std::uint32_t read_register(std::uint32_t offset) const {
    check_register_offset(offset, "read_register");
    if (offset >= spec::to_underlying(spec::register_offset::doorbells)) return load32(offset);
    if (offset != spec::to_underlying(spec::register_offset::csts)) return register_word(offset).load(std::memory_order_acquire);
    // A reset the host asked for (CC.EN 1 → 0) clears CSTS.CFS (3.7.2). Until the admin thread
    // has done it, CFS reads 0 already, so a host that writes EN = 1 right after never sees the
    // fatal status its reset cleared. The counts are read before CSTS: the admin thread stores
    // the done count after the reset's CSTS, so a done count that matches means CSTS is read
    // from after that reset. Read after CSTS, a reset finishing in between passed a CFS read
    // from before it (emu_fuzz: the host took it for the new enable's, then read CSTS 0).
    const bool reset_pending =
        cc_disables_.load(std::memory_order_acquire) != cc_disables_done_.load(std::memory_order_acquire);
    std::uint32_t value = register_word(offset).load(std::memory_order_acquire);
    if (reset_pending) value &= ~spec::csts_register{}.set_cfs(true).raw;
    return value;
  }

  /// A 32-bit MMIO write of BAR0 at `offset` (as `read_register`). Writes to read-only and
  /// reserved registers are ignored; every write to CC is seen, however soon the next one
  /// follows. A doorbell write here is the same as a store into `bar()`.
  void write_register(std::uint32_t offset, std::uint32_t value) {
    check_register_offset(offset, "write_register");
    if (offset >= spec::to_underlying(spec::register_offset::doorbells)) {
      store32(offset, value);
      return;
    }
    write_register_file(offset, value);
  }
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

  /// Whether namespace `nsid`'s memory was registered through `memory_hooks::register_host`
  /// (with `cuda_memory()`: pinned, so copies into GPU memory run at pinned-copy speed).
  /// false where no hook is installed or registration failed; the namespace works either way.
  [[nodiscard]] bool namespace_memory_pinned(std::uint32_t nsid) const {
    if (nsid == 0 || nsid > namespaces_.size()) {
      throw std::out_of_range("emu::controller::namespace_memory_pinned: no namespace " + std::to_string(nsid) +
                              " (the controller has " + std::to_string(namespaces_.size()) + ")");
    }
    return namespaces_[nsid - 1].registration.active();
  }

  /// false when Read and Write move no data (`controller_config::move_data`): a benchmark
  /// that measures command rates says so next to its figures.
  [[nodiscard]] bool moves_data() const noexcept { return config_.move_data; }

  [[nodiscard]] controller_stats stats() const noexcept {
    controller_stats s;
    s.admin_commands = admin_commands_.load(std::memory_order_relaxed);
    s.io_commands = io_commands_.load(std::memory_order_relaxed);
    s.completions_posted = completions_posted_.load(std::memory_order_relaxed);
    s.bytes_read = bytes_read_.load(std::memory_order_relaxed);
    s.bytes_written = bytes_written_.load(std::memory_order_relaxed);
    s.doorbell_errors = doorbell_errors_.load(std::memory_order_relaxed);
    s.dma_faults = dma_.faults();
    s.errors_logged = error_count_.load(std::memory_order_relaxed);
    s.completions_dropped = completions_dropped_.load(std::memory_order_relaxed);
    s.thread_failures = thread_failures_.load(std::memory_order_relaxed);
    return s;
  }
  [[nodiscard]] fault_counters injected_faults() const { return faults_->counters(); }

 private:
  // ---- per-queue and per-thread state --------------------------------------------------------
  struct sq_state {
    std::mutex mutex;  // held by the owning thread while serving, by the admin thread to create/delete
    bool live = false;
    std::uint16_t cqid = 0;
    std::uint32_t size = 0;
    std::uint64_t base = 0;  // bus address; looked up again on every access, never cached
    std::atomic<std::uint32_t> head{0};  // read by whoever posts this queue's completions (SQHD)
    std::uint32_t tail = 0;
    std::uint64_t sequence = 0;
    std::uint32_t rejected_tail = ~0u;  // last invalid doorbell value, reported once
  };
  struct cq_state {
    std::mutex mutex;  // completions for one CQ may come from several threads
    bool live = false;
    std::uint32_t size = 0;
    std::uint64_t base = 0;
    std::uint32_t tail = 0;
    std::uint32_t head = 0;
    bool phase = true;  // the first pass through a new queue posts phase 1 (4.6.2)
    std::uint32_t sq_refs = 0;
    std::uint32_t rejected_head = ~0u;
    // Completions for this CQ waiting in the threads' pending lists (not yet due, or the CQ
    // was full). The SQs feeding it stop being fetched once this reaches the CQ's size, so a
    // host that never consumes its CQ cannot make the controller queue without bound.
    std::atomic<std::uint32_t> parked{0};
    // Bumped whenever the queue is created: a completion made for an earlier incarnation
    // (before a reset or a delete and re-create) is dropped, never posted into the new one.
    std::atomic<std::uint32_t> generation{0};
  };
  struct pending_completion {
    std::uint64_t due_ns = 0;
    std::uint16_t sqid = 0;
    std::uint16_t cqid = 0;
    std::uint32_t cq_generation = 0;
    spec::completion_entry cqe{};  // SQHD and phase are filled when posted
    bool dnr = false;
  };
  struct engine {
    explicit engine(std::uint64_t seed) : rng(seed) {}
    std::mutex pending_mutex;
    std::vector<pending_completion> pending;  // min-heap on due_ns
    std::vector<pending_completion> batch;
    std::vector<pending_completion> due;
    /// Reads of the burst in `batch` whose copies into device memory may still be in flight:
    /// one wait for all of them before the burst's completions go out (`settle_copies`).
    struct awaiting_copy {
      std::size_t index;  // into `batch`
      std::uint64_t lba;
      std::uint32_t nsid;
    };
    std::vector<awaiting_copy> awaiting;
    /// The store ranges those reads copy from, held until the copies are done (`read_from_store`).
    std::vector<backing_store::read_hold> holds;
    std::size_t held_locks = 0;
    /// The command being executed has copies in flight that are not in `awaiting` yet, and
    /// whether a settle in its middle (read_from_store) found copies failed: it then fails too.
    bool command_copies = false;
    bool command_copies_lost = false;
    prp_walker walker;
    std::vector<std::byte> scratch;
    std::mt19937_64 rng;
  };
  /// A namespace's mapping registered through `memory_hooks::register_host`, unregistered
  /// when this is destroyed. Keeps the pointer, not the store: namespaces move while the
  /// vector holding them grows, their mappings do not.
  class host_registration {
   public:
    host_registration() = default;
    /// Registers `store`'s mapping; an inactive registration when the hook declines.
    host_registration(backing_store& store, const memory_hooks& hooks) {
      if (!hooks.register_host || !hooks.register_host(store.mapping(), store.size(), store.read_only())) return;
      // Write Zeroes and Deallocate must now write zeros rather than drop the pinned pages.
      store.set_pages_pinned(true);
      pointer_ = store.mapping();
      bytes_ = store.size();
      unregister_ = hooks.unregister_host;
      active_ = true;
    }
    host_registration(host_registration&& other) noexcept
        : pointer_(std::exchange(other.pointer_, nullptr)),
          bytes_(std::exchange(other.bytes_, 0)),
          unregister_(std::move(other.unregister_)),
          active_(std::exchange(other.active_, false)) {}
    host_registration& operator=(host_registration&& other) noexcept {
      if (this != &other) {
        release();
        pointer_ = std::exchange(other.pointer_, nullptr);
        bytes_ = std::exchange(other.bytes_, 0);
        unregister_ = std::move(other.unregister_);
        active_ = std::exchange(other.active_, false);
      }
      return *this;
    }
    host_registration(const host_registration&) = delete;
    host_registration& operator=(const host_registration&) = delete;
    ~host_registration() { release(); }

    [[nodiscard]] bool active() const noexcept { return active_; }

   private:
    void release() noexcept {
      if (active_ && unregister_) unregister_(pointer_, bytes_);
      active_ = false;
    }

    void* pointer_ = nullptr;
    std::size_t bytes_ = 0;
    std::function<void(void*, std::size_t)> unregister_;
    bool active_ = false;
  };

  struct namespace_state {
    backing_store store;
    std::uint32_t lba_size;
    std::uint8_t lbads;
    std::uint64_t lba_count;
    bool read_only;
    std::uint16_t ms;  // metadata bytes per block (LBAF.MS)
    bool extended;     // metadata at the end of each block (FLBAS bit 4), else through MPTR
    // Declared after `store`, so destroyed (unregistered) before the store is unmapped.
    host_registration registration;

    /// Store (and data buffer) bytes per block: extended LBAs carry their metadata inline.
    [[nodiscard]] std::uint64_t data_stride() const noexcept { return std::uint64_t{lba_size} + (extended ? ms : 0u); }
    [[nodiscard]] bool separate_metadata() const noexcept { return ms != 0 && !extended; }
    /// Separate metadata lives after all the data in the store (namespace_config says why).
    [[nodiscard]] std::uint64_t metadata_offset(std::uint64_t lba) const noexcept { return lba_count * lba_size + lba * ms; }
    /// Write Zeroes and deallocation: data and metadata of the blocks read back as zeros.
    void zero_blocks(std::uint64_t slba, std::uint64_t blocks) {
      store.zero(slba * data_stride(), blocks * data_stride());
      if (separate_metadata()) store.zero(metadata_offset(slba), blocks * ms);
    }
  };
  /// What executing a command produced.
  struct outcome {
    spec::status status = spec::status::successful_completion;
    std::uint32_t dw0 = 0;
    bool deferred = false;  // completes later (Asynchronous Event Request)
    std::uint64_t bytes = 0;
    bool is_write = false;
    std::uint64_t lba = 0;
    std::uint32_t nsid = 0;
    bool copies_in_flight = false;  // a read whose copies into device memory `settle_copies` waits for
  };
  static constexpr outcome fail(spec::status s) { return outcome{s}; }

  // ---- configuration ---------------------------------------------------------------------------
  void validate_config() const {
    auto bad = [](const std::string& what) { throw std::invalid_argument("emu::controller: " + what); };
    if (config_.max_queue_entries < 2 || config_.max_queue_entries > 65536) bad("max_queue_entries must be 2..65536");
    if (!config_.contiguous_queues_required) bad("only physically contiguous queues are emulated: keep contiguous_queues_required");
    if (config_.doorbell_stride > 15) bad("doorbell_stride (CAP.DSTRD) must be 0..15");
    if (config_.mpsmin > config_.mpsmax || config_.mpsmax > 15) bad("need mpsmin <= mpsmax <= 15");
    // MDTS counts pages of 2^(12 + MPSMIN) bytes: the limit in bytes must fit in 64 bits.
    if (config_.mdts != 0 && config_.mdts + 12u + config_.mpsmin >= 64) {
      bad("mdts " + std::to_string(config_.mdts) + " with mpsmin " + std::to_string(config_.mpsmin) +
          " gives a transfer limit of 2^" + std::to_string(config_.mdts + 12u + config_.mpsmin) +
          " bytes; need mdts + 12 + mpsmin <= 63 (or mdts 0, no limit)");
    }
    if (config_.timeout == 0) bad("timeout (CAP.TO) must be at least 1 (500 ms)");
    if (config_.ready_delay > std::chrono::milliseconds(500ull * config_.timeout)) bad("ready_delay exceeds CAP.TO");
    if (config_.max_io_queues == 0) bad("max_io_queues must be at least 1");
    if (config_.workers == 0) bad("workers must be at least 1");
    if (config_.error_log_entries == 0 || config_.error_log_entries > 256) bad("error_log_entries must be 1..256");
    if (config_.cmb_bytes % 4096 != 0 || config_.cmb_bytes / 4096 > spec::cmbsz_register::sz_field::max) {
      bad("cmb_bytes must be a multiple of 4 KiB below 4 GiB");
    }
    if (config_.namespaces.empty()) bad("at least one namespace is needed");
    for (std::size_t i = 0; i < config_.namespaces.size(); ++i) {
      const auto& n = config_.namespaces[i];
      if (n.lba_size != 512 && n.lba_size != 4096) bad("namespace " + std::to_string(i + 1) + ": lba_size must be 512 or 4096");
      if (n.file.empty() && n.lba_count == 0) bad("namespace " + std::to_string(i + 1) + ": lba_count must not be 0");
      if (n.metadata_size > 4096) bad("namespace " + std::to_string(i + 1) + ": metadata_size must be 0..4096");
      if (n.lba_count > ~std::uint64_t{0} / n.stored_block_bytes()) {
        bad("namespace " + std::to_string(i + 1) + ": lba_count blocks of " + std::to_string(n.stored_block_bytes()) + " bytes exceed 2^64 bytes");
      }
    }
  }

  void open_namespaces() {
    for (const auto& n : config_.namespaces) {
      const std::uint64_t per_block = n.stored_block_bytes();
      backing_store store = n.file.empty()
                                ? backing_store::in_memory(n.lba_count * per_block)
                                : backing_store::from_file(n.file, n.lba_count * per_block, n.read_only);
      const std::uint64_t blocks = store.size() / per_block;
      if (blocks == 0) {
        throw std::invalid_argument("emu::controller: namespace file '" + n.file + "' is smaller than one " +
                                    std::to_string(per_block) + "-byte block");
      }
      const std::uint8_t lbads = n.lba_size == 512 ? 9 : 12;
      namespace_state& added = namespaces_.emplace_back(
          namespace_state{std::move(store), n.lba_size, lbads, blocks, n.read_only, n.metadata_size, n.extended_lba && n.metadata_size != 0, {}});
      // Before any worker thread starts: the store's pinned flag is then fixed while they run.
      added.registration = host_registration(added.store, config_.memory);
    }
  }

  [[nodiscard]] std::byte* allocate(std::size_t bytes) {
    void* p = nullptr;
    if (config_.memory.allocate) {
      p = config_.memory.allocate(bytes);
    } else {
      p = std::aligned_alloc(4096, bytes);
    }
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    return static_cast<std::byte*>(p);
  }
  void release(void* p, std::size_t bytes) noexcept {
    if (config_.memory.release) {
      config_.memory.release(p, bytes);
    } else {
      std::free(p);
    }
  }
  static constexpr std::uint64_t round_up(std::uint64_t v, std::uint64_t to) { return (v + to - 1) / to * to; }
  static std::uint64_t now_ns() {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
  }

  // ---- register file ------------------------------------------------------------------------
  void check_register_offset(std::uint32_t offset, const char* operation) const {
    if (offset % 4 != 0 || offset >= bar_size_ || bar_size_ - offset < 4) {
      throw std::out_of_range(std::string("emu::controller::") + operation + ": offset " + std::to_string(offset) +
                              " is not a 4-byte aligned offset inside BAR0's " + std::to_string(bar_size_) + " bytes");
    }
  }
  // Registers and doorbells are shared with the host (and GPU): accessed atomically so that
  // the doorbell's release/acquire pairs order the SQE and data accesses around them.
  [[nodiscard]] std::uint32_t load32(std::uint32_t offset) const noexcept {
    return std::atomic_ref<std::uint32_t>(*reinterpret_cast<std::uint32_t*>(bar_ + offset)).load(std::memory_order_acquire);
  }
  void store32(std::uint32_t offset, std::uint32_t value) const noexcept {
    std::atomic_ref<std::uint32_t>(*reinterpret_cast<std::uint32_t*>(bar_ + offset)).store(value, std::memory_order_release);
  }
  // The registers below the doorbells live in `registers_`, the controller's copy, never in
  // the BAR memory the host can store into: a read-only register must never show a host's
  // write, not even until the admin thread would notice it (read_register/write_register).
  [[nodiscard]] std::uint64_t load64(spec::register_offset r) const noexcept {
    const auto off = spec::to_underlying(r);
    return std::uint64_t{register_word(off).load(std::memory_order_acquire)} |
           (std::uint64_t{register_word(off + 4).load(std::memory_order_acquire)} << 32);
  }
  void store64(spec::register_offset r, std::uint64_t value) noexcept {
    const auto off = spec::to_underlying(r);
    register_word(off).store(static_cast<std::uint32_t>(value), std::memory_order_release);
    register_word(off + 4).store(static_cast<std::uint32_t>(value >> 32), std::memory_order_release);
  }
  [[nodiscard]] std::uint32_t load(spec::register_offset r) const noexcept {
    return register_word(spec::to_underlying(r)).load(std::memory_order_acquire);
  }
  void store(spec::register_offset r, std::uint32_t v) noexcept {
    register_word(spec::to_underlying(r)).store(v, std::memory_order_release);
  }
  [[nodiscard]] std::atomic<std::uint32_t>& register_word(std::uint32_t offset) const noexcept { return registers_[offset / 4]; }

  void write_capability_registers() {
    cap_ = spec::cap_register{}
               .set_mqes(static_cast<std::uint16_t>(config_.max_queue_entries - 1))
               .set_cqr(config_.contiguous_queues_required)
               .set_to(config_.timeout)
               .set_dstrd(config_.doorbell_stride)
               .set_css(static_cast<std::uint8_t>(spec::cap_css::nvm_command_set))
               .set_mpsmin(config_.mpsmin)
               .set_mpsmax(config_.mpsmax)
               .set_cmbs(config_.cmb_bytes != 0);
    vs_ = spec::version_register::make(config_.version_major, static_cast<std::uint8_t>(config_.version_minor));
    store64(spec::register_offset::cap, cap_.raw);
    store(spec::register_offset::vs, vs_.raw);
    update_csts([](spec::csts_register& c) { c = {}; });
  }

  /// CSTS is changed by the admin thread and, on a fatal error, by any worker.
  template <class Change>
  void update_csts(Change change) {
    std::scoped_lock lock(csts_mutex_);
    change(csts_);
    store(spec::register_offset::csts, csts_.raw);
  }

  /// The host's MMIO write to the register file (below the doorbells): only the read/write
  /// fields take the value; read-only and reserved registers ignore it, as on hardware.
  void write_register_file(std::uint32_t offset, std::uint32_t value) {
    using spec::register_offset;
    std::scoped_lock lock(register_write_mutex_);
    const auto is = [offset](register_offset r, std::uint32_t words = 1) {
      return offset >= spec::to_underlying(r) && offset < spec::to_underlying(r) + 4 * words;
    };
    if (is(register_offset::cc)) {
      const spec::cc_register before{load(register_offset::cc)};
      // Every 1 → 0 write of EN is a reset (3.7.2), even if EN is set again before the admin
      // thread looks: it counts them, it does not sample EN.
      if (before.en() && !spec::cc_register{value}.en()) cc_disables_.fetch_add(1, std::memory_order_acq_rel);
      register_word(offset).store(value, std::memory_order_release);
    } else if (is(register_offset::aqa) || is(register_offset::asq, 2) || is(register_offset::acq, 2)) {
      register_word(offset).store(value, std::memory_order_release);
    } else if (is(register_offset::cmbmsc, 2) && cmb_ != nullptr) {
      register_word(offset).store(value, std::memory_order_release);
      // CRE makes CMBLOC/CMBSZ readable at once (NVMe 1.4 CMBMSC); the mapping at CBA is the
      // admin thread's (handle_cmb).
      const bool cre = spec::cmbmsc_register{load64(register_offset::cmbmsc)}.cre();
      const auto loc = spec::cmbloc_register{}.set_bir(2).set_cdpmls(config_.cmb_mixed_data_locations).set_cdpcils(true);
      const auto sz = spec::cmbsz_register{}
                          .set_sqs(true)
                          .set_lists(true)
                          .set_rds(true)
                          .set_wds(true)
                          .set_szu(spec::cmb_size_unit::kib_4)
                          .set_sz(static_cast<std::uint32_t>(config_.cmb_bytes / 4096));
      store(register_offset::cmbloc, cre ? loc.raw : 0);
      store(register_offset::cmbsz, cre ? sz.raw : 0);
    }
    // Everything else (CAP, VS, CSTS, CMBLOC, CMBSZ, CMBSTS, CRTO, INTMS/INTMC under MSI-X,
    // NSSR without CAP.NSSRS, boot partitions, reserved space) is read-only here.
  }

  [[nodiscard]] std::uint32_t sq_doorbell(std::uint16_t qid) const noexcept {
    return spec::sq_tail_doorbell_offset(qid, config_.doorbell_stride);
  }
  [[nodiscard]] std::uint32_t cq_doorbell(std::uint16_t qid) const noexcept {
    return spec::cq_head_doorbell_offset(qid, config_.doorbell_stride);
  }

  // ---- admin thread: CC, CMB, admin queue, stray doorbells -----------------------------------
  void run_admin() {
    engine& e = *engines_[config_.workers];
    std::uint32_t idle = 0;
    std::uint32_t scan = 0;
    while (!stop_.load(std::memory_order_acquire)) {
      bool busy = false;
      spec::cc_register cc{};
      {
        // CC, the count of EN 1 -> 0 writes and AQA/ASQ/ACQ are read and acted on (reset,
        // enable, RDY) with host register writes held off. Acting on a snapshot, a host's
        // EN = 0 landing after it was lost for this pass: the controller went on to finish the
        // enable it had seen and raised RDY, and the host, which had read RDY = 0 (the enable
        // not yet acted on) and gone on with 3.7.2 (new admin queues, EN = 1), took that RDY
        // for its own; the counted reset then dropped it (CSTS 0) and re-attached the admin SQ
        // over a doorbell already rung (emu_fuzz). Before that, the count and CC were read
        // apart and the same happened with the old admin queues.
        std::scoped_lock lock(register_write_mutex_);
        const std::uint64_t disables = cc_disables_.load(std::memory_order_relaxed);
        cc = spec::cc_register{load(spec::register_offset::cc)};
        if (disables != cc_disables_seen_) {
          reset();
          cc_disables_seen_ = disables;
          cc_disables_done_.store(disables, std::memory_order_release);
          busy = true;
        }
        if (cc.en() && !enabled_) {
          begin_enable(cc);
          busy = true;
        } else if (!cc.en() && enabled_) {
          reset();
          busy = true;
        }
        if (enabled_ && !ready_.load(std::memory_order_relaxed) && !fatal_.load() && now_ns() >= ready_at_ns_) {
          ready_.store(true, std::memory_order_release);
          update_csts([](spec::csts_register& c) { c.set_rdy(true); });
        }
      }
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

  void begin_enable(spec::cc_register cc) {
    enabled_ = true;
    const spec::aqa_register aqa{load(spec::register_offset::aqa)};
    const std::uint64_t asq = load64(spec::register_offset::asq);
    const std::uint64_t acq = load64(spec::register_offset::acq);
    page_size_ = cc.page_size();
    // A configuration the controller cannot run is a fatal condition: CSTS.CFS, never ready.
    const bool valid = cc.mps() >= cap_.mpsmin() && cc.mps() <= cap_.mpsmax() && cc.css() == spec::cc_css::nvm_command_set &&
                       cc.ams() == spec::cc_ams::round_robin && aqa.asqs() >= 1 && aqa.acqs() >= 1 &&
                       (asq & (page_size_ - 1)) == 0 && (acq & (page_size_ - 1)) == 0 &&
                       attach_admin_queues(aqa.asqs() + 1u, asq, aqa.acqs() + 1u, acq);
    if (!valid || setup_failed_.load(std::memory_order_acquire)) {
      go_fatal();
      return;
    }
    ready_at_ns_ = now_ns() + static_cast<std::uint64_t>(std::chrono::nanoseconds(config_.ready_delay).count());
  }

  [[nodiscard]] bool attach_admin_queues(std::uint32_t sq_entries, std::uint64_t asq, std::uint32_t cq_entries, std::uint64_t acq) {
    const auto sq_region = dma_.find(asq, std::uint64_t{sq_entries} * sizeof(spec::submission_entry));
    const auto cq_region = dma_.find(acq, std::uint64_t{cq_entries} * sizeof(spec::completion_entry));
    if (!sq_region || !cq_region || cq_region->kind == memory_kind::cmb) return false;
    {
      std::scoped_lock lock(cqs_[0].mutex);
      init_cq(cqs_[0], cq_entries, acq);
    }
    std::scoped_lock lock(sqs_[0].mutex);
    init_sq(sqs_[0], 0, sq_entries, asq);
    store32(sq_doorbell(0), 0);
    store32(cq_doorbell(0), 0);
    return true;
  }

  static void init_cq(cq_state& cq, std::uint32_t entries, std::uint64_t bus) {
    cq.live = true;
    cq.size = entries;
    cq.base = bus;
    cq.tail = cq.head = 0;
    cq.phase = true;
    cq.sq_refs = 0;
    cq.rejected_head = ~0u;
    cq.generation.fetch_add(1, std::memory_order_relaxed);
  }
  static void init_sq(sq_state& sq, std::uint16_t cqid, std::uint32_t entries, std::uint64_t bus) {
    sq.live = true;
    sq.cqid = cqid;
    sq.size = entries;
    sq.base = bus;
    sq.head.store(0, std::memory_order_relaxed);
    sq.tail = 0;
    sq.sequence = 0;
    sq.rejected_tail = ~0u;
  }

  /// CC.EN 1 → 0 (3.7.2 Controller Reset): every queue is deleted, outstanding commands and
  /// their completions are dropped, features return to defaults, CSTS.RDY falls.
  void reset() {
    ready_.store(false, std::memory_order_release);
    for (std::uint32_t q = 0; q <= config_.max_io_queues; ++q) {
      std::scoped_lock lock(sqs_[q].mutex, cqs_[q].mutex);
      sqs_[q].live = false;
      cqs_[q].live = false;
      cqs_[q].sq_refs = 0;
    }
    for (auto& e : engines_) {
      std::scoped_lock lock(e->pending_mutex);
      e->pending.clear();
    }
    for (std::uint32_t q = 0; q <= config_.max_io_queues; ++q) {
      cqs_[q].parked.store(0, std::memory_order_relaxed);
    }
    {
      std::scoped_lock lock(event_mutex_);
      outstanding_aers_.clear();
      pending_events_.clear();
      error_event_masked_ = false;
    }
    shadow_doorbells_.store(0, std::memory_order_release);
    event_indexes_.store(0, std::memory_order_release);
    allocated_sqs_ = allocated_cqs_ = config_.max_io_queues;
    volatile_write_cache_enabled_.store(config_.volatile_write_cache);
    for (std::uint32_t q = 1; q <= config_.max_io_queues; ++q) forget_doorbells(static_cast<std::uint16_t>(q));
    enabled_ = false;
    fatal_.store(false);
    update_csts([](spec::csts_register& c) { c = {}; });
  }

  void handle_shutdown(spec::cc_register cc) {
    const auto shn = cc.shn();
    if (shn == last_shn_) return;
    last_shn_ = shn;
    if (shn == spec::shutdown_notification::none) {
      update_csts([](spec::csts_register& c) { c.set_shst(spec::shutdown_status::normal_operation); });
      return;
    }
    update_csts([](spec::csts_register& c) { c.set_shst(spec::shutdown_status::shutdown_processing); });
    bool flushed = true;
    for (auto& n : namespaces_) {
      try {
        n.store.flush();
      } catch (const std::exception&) {
        flushed = false;
      }
    }
    update_csts([&](spec::csts_register& c) {
      c.set_shst(spec::shutdown_status::shutdown_complete);
      if (!flushed) c.set_cfs(true);  // data could not be made durable: report, don't pretend
    });
  }

  /// CMBMSC (NVMe 1.4+): CRE makes CMBLOC/CMBSZ readable, CMSE maps the CMB at CBA.
  void handle_cmb() {
    if (cmb_ == nullptr) return;
    const spec::cmbmsc_register msc{load64(spec::register_offset::cmbmsc)};
    const bool want = msc.cre() && msc.cmse();
    const std::uint64_t base = msc.controller_base_address();
    if (want == cmb_mapped_ && (!want || base == cmb_bus_)) return;
    if (cmb_mapped_) {
      // Only this thread maps and unmaps the CMB, and dma_space::map never places a buffer on
      // it, so the region is there; if it were not, there is nothing left to remove.
      (void)dma_.try_unmap(cmb_bus_);
      cmb_mapped_ = false;
    }
    std::uint32_t cmbsts = 0;
    if (want) {
      cmb_mapped_ = dma_.map_at(base, cmb_, config_.cmb_bytes, memory_kind::cmb);
      cmb_bus_ = base;
      if (!cmb_mapped_) cmbsts = 1;  // CMBSTS.CBAI: Controller Base Address Invalid
    }
    store(spec::register_offset::cmbsts, cmbsts);
  }

  /// Doorbells of queues that do not exist are not backed by anything on a real controller;
  /// a write to one is an error the host learns about through the error log and an
  /// asynchronous event (Write to Invalid Doorbell Register, 5.2).
  void scan_stray_doorbells() {
    for (std::uint32_t q = 1; q <= config_.max_io_queues; ++q) {
      const auto qid = static_cast<std::uint16_t>(q);
      for (int is_cq = 0; is_cq < 2; ++is_cq) {
        bool live = false;
        {
          auto& m = is_cq ? cqs_[q].mutex : sqs_[q].mutex;
          std::scoped_lock lock(m);
          live = is_cq ? cqs_[q].live : sqs_[q].live;
        }
        if (live) continue;
        const std::uint32_t offset = is_cq ? cq_doorbell(qid) : sq_doorbell(qid);
        const std::uint32_t value = load32(offset);
        std::uint32_t& seen = stray_doorbells_[2u * q + static_cast<unsigned>(is_cq)];
        if (value != seen) {
          seen = value;
          doorbell_error(qid, value, async_error_info::invalid_doorbell_register);
        }
      }
    }
  }

  /// A deleted queue's doorbells keep the last values written; only later writes are stray.
  void forget_doorbells(std::uint16_t qid) {
    stray_doorbells_[2u * qid] = load32(sq_doorbell(qid));
    stray_doorbells_[2u * qid + 1u] = load32(cq_doorbell(qid));
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
    std::unique_lock lock(sq.mutex, std::try_to_lock);
    if (!lock.owns_lock() || !sq.live) return false;
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

  /// Waits once for the burst's copies into device memory, before any of its completions is
  /// posted: a CUDA synchronize per command capped the emulator at about 110 k commands/s
  /// (bench/RESULTS.md, P3). Reads whose copies failed complete with Data Transfer Error.
  /// Deferring the wait past later commands of the burst is allowed: commands in flight
  /// together have no order (NVMe 2.0 base specification, "Command Ordering Requirements"),
  /// so a later write may overlap an earlier read.
  void settle_copies(engine& e, const dma_space::view& mem) {
    if (e.awaiting.empty() && e.holds.empty()) return;
    const bool copied = mem.finish_device_writes();
    // The data has left the store: writers may have its ranges again.
    e.holds.clear();
    e.held_locks = 0;
    if (!copied && e.command_copies) e.command_copies_lost = true;
    e.command_copies = false;
    if (!copied) {
      for (const auto& a : e.awaiting) {
        pending_completion& pc = e.batch[a.index];
        if (spec::cqe_status::status_of(pc.cqe.status_field) != spec::status::successful_completion) continue;
        pc.cqe.status_field = spec::cqe_status::make_status_field(spec::status::data_transfer_error, false, true);
        pc.dnr = true;
        log_error(pc.sqid, pc.cqe.cid, spec::status::data_transfer_error, a.lba, a.nsid);
      }
    }
    e.awaiting.clear();
  }

  /// Releases the store ranges a burst still holds when serve_sq leaves early, after waiting
  /// for the copies out of them.
  struct release_holds_on_exit {
    release_holds_on_exit(engine& engine_, const dma_space::view& view) : e(engine_), mem(view) {}
    release_holds_on_exit(const release_holds_on_exit&) = delete;
    release_holds_on_exit& operator=(const release_holds_on_exit&) = delete;
    ~release_holds_on_exit() {
      if (e.holds.empty()) return;
      try {
        (void)mem.finish_device_writes();
      } catch (...) {
        // The copies' fate is unknown either way; the ranges must not stay locked.
      }
      e.holds.clear();
      e.held_locks = 0;
    }
    engine& e;
    const dma_space::view& mem;
  };

  /// Locks a thread may hold for reads whose copies are in flight: ThreadSanitizer, which CI
  /// runs, aborts a thread holding more than 64, and the controller holds a few of its own.
  static constexpr std::size_t max_held_locks = 32;

  /// Runs `copy(p, p2)`, `p` and `p2` the store's bytes at `offset` and `offset2`, under one
  /// shared lock of [offset, offset + len) and [offset2, offset2 + len2) (a command's data and
  /// separate metadata: a write lands before both or after both). When `in_flight` (copies into device memory complete later, in
  /// settle_copies), the lock is kept until they have: a write overlapping the read waits for
  /// the read's data to have left the store, so no read returns a mix of old and new data.
  /// A thread that keeps such locks never waits for another lock while it does (that could
  /// deadlock with a writer waiting for one it keeps): it takes the range only if it is free
  /// now, and otherwise settles the burst's copies, letting its locks go, before it waits.
  template <class Copy>
  [[nodiscard]] bool read_from_store(engine& e, const dma_space::view& mem, const backing_store& store, std::uint64_t offset,
                                     std::uint64_t len, std::uint64_t offset2, std::uint64_t len2, bool in_flight, Copy copy) {
    if (!in_flight) {
      // Done before returning, so held only for the copy; but with earlier reads' holds kept,
      // waiting for this range could deadlock as below: try it, else let them go first.
      if (!e.holds.empty()) {
        if (auto hold = store.try_hold_for_read(offset, len, offset2, len2); hold && e.held_locks + hold->locks_held() <= max_held_locks) {
          return copy(hold->data(), hold->data2());
        }
        settle_copies(e, mem);
      }
      bool ok = false;
      store.with_read_access(offset, len, offset2, len2, [&](const std::byte* p, const std::byte* p2) { ok = copy(p, p2); });
      return ok;
    }
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (auto hold = store.try_hold_for_read(offset, len, offset2, len2); hold && e.held_locks + hold->locks_held() <= max_held_locks) {
        const bool ok = copy(hold->data(), hold->data2());
        e.command_copies = true;
        e.held_locks += hold->locks_held();
        e.holds.push_back(std::move(*hold));
        return ok;
      }
      if (e.holds.empty()) break;
      settle_copies(e, mem);
    }
    // Contended, or too long to hold: wait for the range holding nothing else, and for the
    // copies before letting it go.
    bool ok = false;
    store.with_read_access(offset, len, offset2, len2, [&](const std::byte* p, const std::byte* p2) { ok = copy(p, p2) && mem.finish_device_writes(); });
    return ok;
  }

  [[nodiscard]] static bool lands_on_device(const std::vector<data_segment>& segments) noexcept {
    return std::any_of(segments.begin(), segments.end(), [](const data_segment& s) { return s.region.kind == memory_kind::device; });
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

  /// Reads the SQE at `head` and advances the head. A queue whose own memory is gone is
  /// a controller fatal condition: nothing sensible can continue.
  [[nodiscard]] bool fetch(const dma_space::view& mem, sq_state& sq, std::uint32_t head, spec::submission_entry& sqe) {
    if (!mem.read(sq.base + std::uint64_t{head} * sizeof sqe, &sqe, sizeof sqe)) {
      go_fatal();
      return false;
    }
    sq.head.store(head + 1 == sq.size ? 0 : head + 1, std::memory_order_release);
    return true;
  }

  /// Builds the completion, applies injected faults and the timing model, and queues it.
  void complete(engine& e, std::uint16_t sqid, std::uint16_t cqid, const spec::submission_entry& sqe, const outcome& o,
                std::uint64_t sequence) {
    const bool admin = sqid == 0;
    const bool has_lba = !admin && o.nsid != 0 && (sqe.opcode() == static_cast<std::uint8_t>(spec::nvm_opcode::read) ||
                                                   sqe.opcode() == static_cast<std::uint8_t>(spec::nvm_opcode::write) ||
                                                   sqe.opcode() == static_cast<std::uint8_t>(spec::nvm_opcode::write_zeroes));
    const auto nlb = static_cast<std::uint32_t>(spec::rw_fields::nlb::get(sqe.cdw12)) + 1u;
    const fault_decision f = faults_->decide(command_view{admin, sqid, sqe.cid(), sqe.opcode(), sequence, has_lba,
                                                          has_lba ? spec::starting_lba(sqe) : 0, has_lba ? nlb : 0});
    if (f.controller_fatal) {
      go_fatal();
      return;
    }
    spec::status status = o.status;
    bool dnr = status != spec::status::successful_completion;
    if (f.status) {
      status = *f.status;
      dnr = f.dnr;
    }
    if (status != spec::status::successful_completion) {
      log_error(sqid, sqe.cid(), status, o.lba, o.nsid ? o.nsid : sqe.nsid);
    }
    if (f.lose_completion) {
      completions_dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    pending_completion pc;
    pc.sqid = sqid;
    pc.cqid = cqid;
    pc.cq_generation = cqs_[cqid].generation.load(std::memory_order_relaxed);
    pc.cqe.dw0 = o.dw0;
    pc.cqe.sqid = sqid;
    pc.cqe.cid = sqe.cid();
    pc.cqe.status_field = spec::cqe_status::make_status_field(status, false, dnr);
    pc.dnr = dnr;
    const std::uint64_t now = now_ns();
    pc.due_ns = now;
    if (!admin && config_.timing.enabled()) pc.due_ns = timing_->due_ns(now, o.bytes, o.is_write);
    pc.due_ns += f.extra_delay_ns;
    e.batch.push_back(pc);
  }

  /// Posts a batch's completions that are due (in a shuffled order when asked) and parks the rest.
  void dispatch_batch(engine& e, const dma_space::view& mem) {
    if (e.batch.empty()) return;
    if (config_.out_of_order_completions) std::shuffle(e.batch.begin(), e.batch.end(), e.rng);
    const std::uint64_t now = now_ns();
    for (const auto& pc : e.batch) {
      if (pc.due_ns <= now && post(mem, pc)) continue;
      park(e, pc);
    }
    e.batch.clear();
  }

  static bool later(const pending_completion& a, const pending_completion& b) { return a.due_ns > b.due_ns; }

  void park(engine& e, const pending_completion& pc) {
    cqs_[pc.cqid].parked.fetch_add(1, std::memory_order_relaxed);
    std::scoped_lock lock(e.pending_mutex);
    e.pending.push_back(pc);
    std::push_heap(e.pending.begin(), e.pending.end(), later);
  }

  /// Posts parked completions whose time has come; those whose CQ is full wait.
  bool post_due(engine& e) {
    std::vector<pending_completion>& due = e.due;
    due.clear();
    {
      std::scoped_lock lock(e.pending_mutex);
      const std::uint64_t now = now_ns();
      while (!e.pending.empty() && e.pending.front().due_ns <= now) {
        std::pop_heap(e.pending.begin(), e.pending.end(), later);
        due.push_back(e.pending.back());
        e.pending.pop_back();
        cqs_[due.back().cqid].parked.fetch_sub(1, std::memory_order_relaxed);
      }
    }
    if (due.empty()) return false;
    bool posted = false;
    const dma_space::view mem = dma_.pin();
    for (const auto& pc : due) {
      if (post(mem, pc)) {
        posted = true;
      } else {
        park(e, pc);
      }
    }
    return posted;
  }

  /// Writes one CQE: DW0–DW2 first, then DW3 (CID, status and the phase tag) with release
  /// semantics, so a consumer that sees the new phase also sees the rest (DESIGN rule 2).
  /// Returns false when the CQ is full; the caller keeps the completion for later.
  bool post(const dma_space::view& mem, const pending_completion& pc) {
    cq_state& cq = cqs_[pc.cqid];
    std::scoped_lock lock(cq.mutex);
    if (!cq.live || cq.generation.load(std::memory_order_relaxed) != pc.cq_generation) {
      completions_dropped_.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    refresh_cq_head(&mem, pc.cqid, cq);
    const std::uint32_t next = cq.tail + 1 == cq.size ? 0 : cq.tail + 1;
    if (next == cq.head) return false;  // full: a controller never overwrites an unconsumed entry
    spec::completion_entry cqe = pc.cqe;
    cqe.sqhd = static_cast<std::uint16_t>(sqs_[pc.sqid].head.load(std::memory_order_acquire));
    cqe.status_field = static_cast<std::uint16_t>((cqe.status_field & ~1u) | (cq.phase ? 1u : 0u));
    const std::uint64_t at = cq.base + std::uint64_t{cq.tail} * sizeof cqe;
    std::uint32_t dwords[4];
    std::memcpy(dwords, &cqe, sizeof dwords);
    // DW3 goes last: store32 completes the earlier device copies before its own.
    if (!mem.write(at, dwords, 12) || !mem.store32(at + 12, dwords[3])) {
      go_fatal();  // the CQ's memory is gone
      return true;
    }
    cq.tail = next;
    if (next == 0) cq.phase = !cq.phase;
    completions_posted_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  void go_fatal() {
    fatal_.store(true, std::memory_order_release);
    update_csts([](spec::csts_register& c) { c.set_cfs(true); });
  }

  // ---- doorbells (MMIO and shadow) ----------------------------------------------------------
  [[nodiscard]] std::uint32_t doorbell_slot(std::uint16_t qid, bool is_cq) const noexcept {
    return (2u * qid + (is_cq ? 1u : 0u)) * spec::doorbell_stride_bytes(config_.doorbell_stride);
  }

  /// Whether a doorbell's shadow and EventIdx slots lie inside the buffers' one memory page
  /// (5.8): with a large CAP.DSTRD or many queues they do not, and such a queue keeps its MMIO
  /// doorbell; the bytes past the page are not the controller's to read or write.
  [[nodiscard]] bool has_shadow_slot(std::uint16_t qid, bool is_cq) const noexcept {
    // In 64 bits: 2 × 65535 queues × a 128 KiB stride wraps doorbell_slot's 32.
    const std::uint64_t slot = (2ull * qid + (is_cq ? 1u : 0u)) * spec::doorbell_stride_bytes(config_.doorbell_stride);
    return slot + 4 <= page_size_;
  }

  /// The value the host last rang for an I/O queue: the shadow doorbell once Doorbell Buffer
  /// Config is in effect (5.8), the MMIO doorbell otherwise. The admin queue always uses MMIO.
  [[nodiscard]] std::uint32_t read_doorbell(const dma_space::view* mem, std::uint16_t qid, bool is_cq) {
    if (qid != 0 && mem != nullptr && has_shadow_slot(qid, is_cq)) {
      // A shadow page the host has unmapped leaves only the MMIO doorbell to go by.
      if (const std::uint64_t shadow = shadow_doorbells_.load(std::memory_order_acquire); shadow != 0) {
        if (const auto v = mem->load32(shadow + doorbell_slot(qid, is_cq))) return *v;
      }
    }
    return load32(is_cq ? cq_doorbell(qid) : sq_doorbell(qid));
  }

  /// EventIdx tells a shadow-doorbell host how far the controller has looked, so it rings the
  /// MMIO doorbell only when it moves past that point.
  void publish_event_index(const dma_space::view& mem, std::uint16_t qid, bool is_cq, std::uint32_t value) {
    if (!has_shadow_slot(qid, is_cq)) return;
    if (const std::uint64_t events = event_indexes_.load(std::memory_order_acquire); events != 0) {
      (void)mem.store32(events + doorbell_slot(qid, is_cq), value);
    }
  }

  /// A queue created while shadow doorbells are in effect starts from 0 on both sides: its
  /// shadow slot and EventIdx are set to the queue's initial value before the queue goes live
  /// (DESIGN.md rule 5). A value left in the slot for an earlier queue with this identifier was
  /// never rung for this one: read as a tail it runs zeroed SQEs nobody submitted, read as a
  /// head it is an invalid doorbell value. The NVMe 2.0 base specification (5.8, Doorbell
  /// Buffer Config) has the controller keep its doorbell state in the host's buffer and does
  /// not carry a deleted queue's state over to a new one; QEMU likewise writes its own state
  /// into the buffer (hw/nvme nvme_dbbuf_config), and Linux zeroes both buffers on every reset.
  void start_shadow_doorbell(const dma_space::view& mem, std::uint16_t qid, bool is_cq) {
    if (!has_shadow_slot(qid, is_cq)) return;
    if (const std::uint64_t shadow = shadow_doorbells_.load(std::memory_order_acquire); shadow != 0) {
      (void)mem.store32(shadow + doorbell_slot(qid, is_cq), 0);
    }
    publish_event_index(mem, qid, is_cq, 0);
  }

  [[nodiscard]] std::uint32_t read_sq_tail(const dma_space::view* mem, std::uint16_t qid, sq_state& sq) {
    const std::uint32_t value = read_doorbell(mem, qid, false);
    if (value < sq.size) return value;
    if (value != sq.rejected_tail) {
      sq.rejected_tail = value;
      doorbell_error(qid, value, async_error_info::invalid_doorbell_write_value);
    }
    return sq.tail;
  }

  /// A CQ head may only move over entries the controller has posted (Invalid Doorbell Write
  /// Value otherwise, 5.2); such a write is ignored.
  void refresh_cq_head(const dma_space::view* mem, std::uint16_t qid, cq_state& cq) {
    const std::uint32_t value = read_doorbell(mem, qid, true);
    if (value == cq.head) return;
    const std::uint32_t posted = (cq.tail + cq.size - cq.head) % cq.size;
    const std::uint32_t advance = (value + cq.size - cq.head) % cq.size;
    if (value < cq.size && advance <= posted) {
      cq.head = value;
      if (qid != 0 && mem != nullptr) publish_event_index(*mem, qid, true, value);
      return;
    }
    if (value != cq.rejected_head) {
      cq.rejected_head = value;
      doorbell_error(qid, value, async_error_info::invalid_doorbell_write_value);
    }
  }

  // ---- errors, events, logs --------------------------------------------------------------------
  /// Asynchronous Event Information for the Error status type (Figure 146).
  enum class async_error_info : std::uint8_t {
    invalid_doorbell_register = 0x00,
    invalid_doorbell_write_value = 0x01,
  };

  struct doorbell_fault {
    std::uint16_t qid;
    std::uint32_t value;
    async_error_info info;
  };

  /// Doorbell errors are found while queue and CQ locks are held (even CQ 0's, whose AER
  /// completion they may cause), so they are only noted here; the admin thread logs and
  /// reports them with no lock held.
  void doorbell_error(std::uint16_t qid, std::uint32_t value, async_error_info info) {
    doorbell_errors_.fetch_add(1, std::memory_order_relaxed);
    std::scoped_lock lock(inbox_mutex_);
    if (inbox_.size() < 1024) inbox_.push_back(doorbell_fault{qid, value, info});
  }

  void report_doorbell_errors() {
    std::vector<doorbell_fault> faults;
    {
      std::scoped_lock lock(inbox_mutex_);
      faults.swap(inbox_);
    }
    for (const auto& f : faults) {
      spec::error_information_log_entry entry{};
      entry.sqid = f.qid;
      entry.cid = 0xffff;
      entry.parameter_error_location = 0xffff;
      entry.command_specific_information = f.value;
      append_error(entry);
      raise_error_event(f.info);
    }
  }

  void log_error(std::uint16_t sqid, std::uint16_t cid, spec::status status, std::uint64_t lba, std::uint32_t nsid) {
    spec::error_information_log_entry entry{};
    entry.sqid = sqid;
    entry.cid = cid;
    entry.status_field = spec::cqe_status::make_status_field(status, false, true);
    entry.parameter_error_location = 0xffff;
    entry.lba = lba;
    entry.nsid = nsid;
    append_error(entry);
  }

  void append_error(spec::error_information_log_entry entry) {
    std::scoped_lock lock(error_mutex_);
    entry.error_count = error_count_.fetch_add(1, std::memory_order_relaxed) + 1;
    error_log_.push_front(entry);
    if (error_log_.size() > config_.error_log_entries) error_log_.pop_back();
  }

  void raise_error_event(async_error_info info) {
    // DW0 of the AER completion: event type 000b (error status), information, log page 01h.
    const std::uint32_t dw0 = 0u | (std::uint32_t{static_cast<std::uint8_t>(info)} << 8) |
                              (std::uint32_t{static_cast<std::uint8_t>(spec::log_page_id::error_information)} << 16);
    std::unique_lock lock(event_mutex_);
    // An error event stays masked until the host reads the Error Information log (5.2).
    if (error_event_masked_) return;
    if (outstanding_aers_.empty()) {
      if (pending_events_.size() < 16) pending_events_.push_back(dw0);
      return;
    }
    const std::uint16_t cid = outstanding_aers_.front();
    outstanding_aers_.pop_front();
    error_event_masked_ = true;
    lock.unlock();
    post_admin_now(cid, spec::status::successful_completion, dw0);
  }

  void post_admin_now(std::uint16_t cid, spec::status status, std::uint32_t dw0) {
    pending_completion pc;
    pc.sqid = 0;
    pc.cqid = 0;
    pc.cq_generation = cqs_[0].generation.load(std::memory_order_relaxed);
    pc.cqe.dw0 = dw0;
    pc.cqe.cid = cid;
    pc.cqe.status_field = spec::cqe_status::make_status_field(status, false, false);
    bool posted = false;
    {
      const dma_space::view mem = dma_.pin();
      posted = post(mem, pc);
    }
    if (!posted) park(*engines_[config_.workers], pc);
  }

  // ---- admin commands ---------------------------------------------------------------------------
  outcome execute_admin(engine& e, const spec::submission_entry& sqe) {
    admin_commands_.fetch_add(1, std::memory_order_relaxed);
    if (sqe.fuse() != spec::fused_operation::normal || sqe.psdt() != spec::data_transfer_kind::prp) {
      return fail(spec::status::invalid_field_in_command);  // FUSES = 0, SGLS = 0
    }
    switch (static_cast<spec::admin_opcode>(sqe.opcode())) {
      case spec::admin_opcode::identify: return identify(e, sqe);
      case spec::admin_opcode::get_features: return get_features(sqe);
      case spec::admin_opcode::set_features: return set_features(sqe);
      case spec::admin_opcode::create_io_completion_queue: return create_io_cq(sqe);
      case spec::admin_opcode::create_io_submission_queue: return create_io_sq(sqe);
      case spec::admin_opcode::delete_io_submission_queue: return delete_io_sq(sqe);
      case spec::admin_opcode::delete_io_completion_queue: return delete_io_cq(sqe);
      case spec::admin_opcode::get_log_page: return get_log_page(e, sqe);
      case spec::admin_opcode::doorbell_buffer_config: return doorbell_buffer_config(sqe);
      case spec::admin_opcode::abort: return abort(sqe);
      case spec::admin_opcode::asynchronous_event_request: return asynchronous_event_request(sqe);
      default: return fail(spec::status::invalid_command_opcode);
    }
  }

  /// Copies `bytes` of controller data to the command's PRPs.
  [[nodiscard]] spec::status to_host(engine& e, const dma_space::view& mem, const spec::submission_entry& sqe, const void* data,
                                     std::uint64_t bytes) {
    const auto s = e.walker.walk(mem, sqe.prp1, sqe.prp2, bytes, page_size_, config_.cmb_mixed_data_locations);
    if (s != spec::status::successful_completion) return s;
    const auto* src = static_cast<const std::byte*>(data);
    for (const auto& seg : e.walker.segments()) {
      if (!mem.copy_in(seg.region, seg.offset, src, seg.length)) return spec::status::data_transfer_error;
      src += seg.length;
    }
    return mem.finish_device_writes() ? spec::status::successful_completion : spec::status::data_transfer_error;
  }

  /// Copies `data_bytes` of controller data to the command's PRPs, then zeros up to `bytes`
  /// (a log page read past its end), the zeros from one static page.
  [[nodiscard]] spec::status to_host_padded(engine& e, const dma_space::view& mem, const spec::submission_entry& sqe,
                                            const std::byte* data, std::uint64_t data_bytes, std::uint64_t bytes) {
    static constexpr std::byte zeros[4096] = {};
    const auto s = e.walker.walk(mem, sqe.prp1, sqe.prp2, bytes, page_size_, config_.cmb_mixed_data_locations);
    if (s != spec::status::successful_completion) return s;
    std::uint64_t done = 0;
    for (const auto& seg : e.walker.segments()) {
      for (std::uint64_t at = 0; at < seg.length;) {
        const std::uint64_t n = done < data_bytes ? std::min(seg.length - at, data_bytes - done)
                                                  : std::min<std::uint64_t>(seg.length - at, sizeof zeros);
        if (!mem.copy_in(seg.region, seg.offset + at, done < data_bytes ? data + done : zeros, n)) {
          return spec::status::data_transfer_error;
        }
        at += n;
        done += n;
      }
    }
    return mem.finish_device_writes() ? spec::status::successful_completion : spec::status::data_transfer_error;
  }

  /// Copies `bytes` of host data from the command's PRPs.
  [[nodiscard]] spec::status from_host(engine& e, const dma_space::view& mem, const spec::submission_entry& sqe, void* data,
                                       std::uint64_t bytes) {
    const auto s = e.walker.walk(mem, sqe.prp1, sqe.prp2, bytes, page_size_, config_.cmb_mixed_data_locations);
    if (s != spec::status::successful_completion) return s;
    auto* dst = static_cast<std::byte*>(data);
    for (const auto& seg : e.walker.segments()) {
      if (!mem.copy_out(seg.region, seg.offset, dst, seg.length)) return spec::status::data_transfer_error;
      dst += seg.length;
    }
    return spec::status::successful_completion;
  }

  [[nodiscard]] bool namespace_active(std::uint32_t nsid) const noexcept { return nsid >= 1 && nsid <= namespaces_.size(); }

  outcome identify(engine& e, const spec::submission_entry& sqe) {
    const auto cns = spec::identify_fields::cns::get(sqe.cdw10);
    auto page = std::make_unique<std::byte[]>(4096);
    std::memset(page.get(), 0, 4096);
    switch (cns) {
      case spec::identify_cns::controller: fill_identify_controller(*reinterpret_cast<spec::identify_controller*>(page.get())); break;
      case spec::identify_cns::namespace_data:
        // Every NSID in 1..NN is active here; NSID FFFFFFFFh (common capabilities) is not supported.
        if (!namespace_active(sqe.nsid)) return fail(spec::status::invalid_namespace_or_format);
        fill_identify_namespace(*reinterpret_cast<spec::identify_namespace*>(page.get()), sqe.nsid);
        break;
      case spec::identify_cns::active_namespace_list: {
        if (sqe.nsid >= 0xfffffffeu) return fail(spec::status::invalid_namespace_or_format);
        auto& list = *reinterpret_cast<spec::active_namespace_list*>(page.get());
        std::size_t n = 0;
        for (std::uint32_t id = sqe.nsid + 1; id <= namespaces_.size() && n < 1024; ++id) list.nsid[n++] = id;
        break;
      }
      default: return fail(spec::status::invalid_field_in_command);
    }
    return outcome{to_host(e, dma_.pin(), sqe, page.get(), 4096)};
  }

  static void copy_padded(char* field, std::size_t size, const std::string& text) {
    std::memset(field, ' ', size);
    std::memcpy(field, text.data(), std::min(size, text.size()));
  }

  void fill_identify_controller(spec::identify_controller& id) const {
    id.vid = config_.vendor_id;
    id.ssvid = config_.vendor_id;
    copy_padded(id.sn, sizeof id.sn, config_.serial);
    copy_padded(id.mn, sizeof id.mn, config_.model);
    copy_padded(id.fr, sizeof id.fr, config_.firmware);
    id.rab = 6;
    id.mdts = config_.mdts;
    id.cntlid = 1;
    id.ver = vs_.raw;
    id.cntrltype = 1;  // I/O controller
    id.oacs = 1u << 8;  // Doorbell Buffer Config
    id.acl = config_.abort_command_limit;
    id.aerl = config_.async_event_request_limit;
    id.lpa = 0;
    id.elpe = static_cast<std::uint8_t>(config_.error_log_entries - 1);
    id.sqes = 0x66;
    id.cqes = 0x44;
    id.nn = static_cast<std::uint32_t>(namespaces_.size());
    id.oncs = (1u << 2) | (1u << 3);  // Dataset Management, Write Zeroes
    // VWC bit 0: present; bits 2:1 = 11b: Flush with NSID FFFFFFFFh applies to all namespaces.
    id.vwc = config_.volatile_write_cache ? 0x07 : 0x00;
    id.sgls = 0;
    const std::string nqn = "nqn.2026-11.io.cunvme:emu:" + config_.serial;
    std::memcpy(id.subnqn, nqn.data(), std::min(nqn.size(), sizeof id.subnqn - 1));
  }

  void fill_identify_namespace(spec::identify_namespace& id, std::uint32_t nsid) const {
    if (!namespace_active(nsid)) return;  // allocated-but-inactive reads as zeros
    const namespace_state& n = namespaces_[nsid - 1];
    id.nsze = id.ncap = id.nuse = n.lba_count;
    // Formats 0 (512 B) and 1 (4 KiB); a namespace with metadata adds 2 and 3, the same with
    // MS bytes of metadata, and MC names the one way (extended or separate) it was made with.
    id.nlbaf = n.ms == 0 ? 1 : 3;
    id.set_formatted_lba_index(static_cast<std::uint8_t>((n.lba_size == 512 ? 0 : 1) + (n.ms == 0 ? 0 : 2)));
    id.set_metadata_at_end_of_lba(n.extended);
    id.mc = n.ms == 0 ? 0 : n.extended ? 0x01 : 0x02;
    id.dlfeat = 0x01;  // deallocated blocks read as zeros
    id.lbaf[0] = spec::lba_format{}.set_lbads(9);
    id.lbaf[1] = spec::lba_format{}.set_lbads(12);
    if (n.ms != 0) {
      id.lbaf[2] = spec::lba_format{}.set_lbads(9).set_ms(n.ms);
      id.lbaf[3] = spec::lba_format{}.set_lbads(12).set_ms(n.ms);
    }
    if (n.read_only) id.nsattr = 1;  // write protected
  }

  outcome get_features(const spec::submission_entry& sqe) {
    const auto fid = spec::features_fields::fid::get(sqe.cdw10);
    switch (fid) {
      case spec::feature_id::number_of_queues:
        return outcome{spec::status::successful_completion,
                       spec::number_of_queues_fields::ncqr::set(
                           spec::number_of_queues_fields::nsqr::set(0, static_cast<std::uint16_t>(allocated_sqs_ - 1)),
                           static_cast<std::uint16_t>(allocated_cqs_ - 1))};
      case spec::feature_id::volatile_write_cache:
        if (!config_.volatile_write_cache) return fail(spec::status::invalid_field_in_command);
        return outcome{spec::status::successful_completion, volatile_write_cache_enabled_ ? 1u : 0u};
      default:
        if (!stored_feature(fid)) return fail(spec::status::invalid_field_in_command);
        return outcome{spec::status::successful_completion, plain_features_[static_cast<std::uint8_t>(fid)]};
    }
  }

  /// Features the emulator accepts and reports back without acting on them (it has no
  /// interrupts, power states or thermal sensors whose behaviour they would change).
  [[nodiscard]] static constexpr bool stored_feature(spec::feature_id fid) noexcept {
    switch (fid) {
      case spec::feature_id::arbitration:
      case spec::feature_id::power_management:
      case spec::feature_id::temperature_threshold:
      case spec::feature_id::error_recovery:
      case spec::feature_id::interrupt_coalescing:
      case spec::feature_id::interrupt_vector_configuration:
      case spec::feature_id::asynchronous_event_configuration: return true;
      default: return false;
    }
  }

  [[nodiscard]] bool any_io_queue_exists() {
    for (std::uint32_t q = 1; q <= config_.max_io_queues; ++q) {
      std::scoped_lock lock(sqs_[q].mutex, cqs_[q].mutex);
      if (sqs_[q].live || cqs_[q].live) return true;
    }
    return false;
  }

  outcome set_features(const spec::submission_entry& sqe) {
    const auto fid = spec::features_fields::fid::get(sqe.cdw10);
    if (spec::features_fields::sv::get(sqe.cdw10)) return fail(spec::status::feature_identifier_not_saveable);
    switch (fid) {
      case spec::feature_id::number_of_queues: {
        const auto nsqr = spec::number_of_queues_fields::nsqr::get(sqe.cdw11);
        const auto ncqr = spec::number_of_queues_fields::ncqr::get(sqe.cdw11);
        if (nsqr == 0xffff || ncqr == 0xffff) return fail(spec::status::invalid_field_in_command);
        // Only during initialisation, before any I/O queue exists (5.27.1.5).
        if (any_io_queue_exists()) return fail(spec::status::command_sequence_error);
        allocated_sqs_ = std::min<std::uint32_t>(nsqr + 1u, config_.max_io_queues);
        allocated_cqs_ = std::min<std::uint32_t>(ncqr + 1u, config_.max_io_queues);
        return get_features(sqe);
      }
      case spec::feature_id::volatile_write_cache:
        if (!config_.volatile_write_cache) return fail(spec::status::invalid_field_in_command);
        volatile_write_cache_enabled_.store(spec::volatile_write_cache_fields::wce::get(sqe.cdw11));
        return outcome{};
      default:
        if (!stored_feature(fid)) return fail(spec::status::invalid_field_in_command);
        plain_features_[static_cast<std::uint8_t>(fid)] = sqe.cdw11;
        return outcome{};
    }
  }

  /// Where a new I/O queue's memory is, checked as Create I/O CQ/SQ require (5.4, 5.5).
  [[nodiscard]] std::optional<dma_region> queue_memory(std::uint64_t prp1, std::uint32_t entries, std::size_t entry_size,
                                                       spec::status& error) const {
    if ((prp1 & (page_size_ - 1)) != 0) {
      error = spec::status::prp_offset_invalid;
      return std::nullopt;
    }
    auto region = dma_.find(prp1, std::uint64_t{entries} * entry_size);
    if (!region) error = spec::status::data_transfer_error;
    return region;
  }

  outcome create_io_cq(const spec::submission_entry& sqe) {
    using f = spec::create_io_cq_fields;
    const std::uint16_t qid = f::qid::get(sqe.cdw10);
    const std::uint32_t entries = f::qsize::get(sqe.cdw10) + 1u;
    if (qid == 0 || qid > allocated_cqs_) return fail(spec::status::invalid_queue_identifier);
    {
      std::scoped_lock lock(cqs_[qid].mutex);
      if (cqs_[qid].live) return fail(spec::status::invalid_queue_identifier);
    }
    if (entries < 2 || entries > config_.max_queue_entries) return fail(spec::status::invalid_queue_size);
    if (!f::pc::get(sqe.cdw11) && cap_.cqr()) return fail(spec::status::invalid_field_in_command);
    if (f::ien::get(sqe.cdw11) && f::iv::get(sqe.cdw11) >= config_.interrupt_vectors) {
      return fail(spec::status::invalid_interrupt_vector);
    }
    if (spec::cc_register{load(spec::register_offset::cc)}.iocqes() != spec::completion_entry_size_log2) {
      return fail(spec::status::invalid_field_in_command);
    }
    spec::status error{};
    const auto region = queue_memory(sqe.prp1, entries, sizeof(spec::completion_entry), error);
    if (!region) return fail(error);
    // The CMB holds submission queues only (CMBSZ.CQS = 0): a GPU should never read a BAR.
    if (region->kind == memory_kind::cmb) return fail(spec::status::invalid_use_of_controller_memory_buffer);
    const dma_space::view mem = dma_.pin();  // before the CQ mutex: the lock order is view → CQ mutex
    std::scoped_lock lock(cqs_[qid].mutex);
    start_shadow_doorbell(mem, qid, true);
    init_cq(cqs_[qid], entries, sqe.prp1);
    store32(cq_doorbell(qid), 0);
    stray_doorbells_[2u * qid + 1u] = 0;
    return outcome{};
  }

  outcome create_io_sq(const spec::submission_entry& sqe) {
    using f = spec::create_io_sq_fields;
    const std::uint16_t qid = f::qid::get(sqe.cdw10);
    const std::uint32_t entries = f::qsize::get(sqe.cdw10) + 1u;
    const std::uint16_t cqid = f::cqid::get(sqe.cdw11);
    if (qid == 0 || qid > allocated_sqs_) return fail(spec::status::invalid_queue_identifier);
    {
      std::scoped_lock lock(sqs_[qid].mutex);
      if (sqs_[qid].live) return fail(spec::status::invalid_queue_identifier);
    }
    if (cqid == 0 || cqid > config_.max_io_queues) return fail(spec::status::completion_queue_invalid);
    {
      std::scoped_lock lock(cqs_[cqid].mutex);
      if (!cqs_[cqid].live) return fail(spec::status::completion_queue_invalid);
    }
    if (entries < 2 || entries > config_.max_queue_entries) return fail(spec::status::invalid_queue_size);
    if (!f::pc::get(sqe.cdw11) && cap_.cqr()) return fail(spec::status::invalid_field_in_command);
    if (spec::cc_register{load(spec::register_offset::cc)}.iosqes() != spec::submission_entry_size_log2) {
      return fail(spec::status::invalid_field_in_command);
    }
    spec::status error{};
    const auto region = queue_memory(sqe.prp1, entries, sizeof(spec::submission_entry), error);
    if (!region) return fail(error);
    {
      std::scoped_lock lock(cqs_[cqid].mutex);
      ++cqs_[cqid].sq_refs;
    }
    std::scoped_lock lock(sqs_[qid].mutex);
    const dma_space::view mem = dma_.pin();
    start_shadow_doorbell(mem, qid, false);
    init_sq(sqs_[qid], cqid, entries, sqe.prp1);
    store32(sq_doorbell(qid), 0);
    stray_doorbells_[2u * qid] = 0;
    return outcome{};
  }

  outcome delete_io_sq(const spec::submission_entry& sqe) {
    const std::uint16_t qid = spec::delete_io_queue_fields::qid::get(sqe.cdw10);
    if (qid == 0 || qid > config_.max_io_queues) return fail(spec::status::invalid_queue_identifier);
    std::uint16_t cqid = 0;
    {
      std::scoped_lock lock(sqs_[qid].mutex);  // waits for a burst in progress on this queue
      if (!sqs_[qid].live) return fail(spec::status::invalid_queue_identifier);
      sqs_[qid].live = false;
      cqid = sqs_[qid].cqid;
    }
    // Commands still in flight complete as aborted before the deletion does (5.6).
    for (auto& e : engines_) {
      std::vector<pending_completion> victims;
      {
        std::scoped_lock lock(e->pending_mutex);
        auto split = std::partition(e->pending.begin(), e->pending.end(), [&](const auto& pc) { return pc.sqid != qid; });
        victims.assign(split, e->pending.end());
        e->pending.erase(split, e->pending.end());
        for (const auto& v : victims) cqs_[v.cqid].parked.fetch_sub(1, std::memory_order_relaxed);
        std::make_heap(e->pending.begin(), e->pending.end(), later);
      }
      const dma_space::view mem = dma_.pin();
      for (auto& pc : victims) {
        pc.cqe.status_field = spec::cqe_status::make_status_field(spec::status::command_aborted_due_to_sq_deletion, false, true);
        if (!post(mem, pc)) completions_dropped_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    stray_doorbells_[2u * qid] = load32(sq_doorbell(qid));
    std::scoped_lock lock(cqs_[cqid].mutex);
    --cqs_[cqid].sq_refs;
    return outcome{};
  }

  outcome delete_io_cq(const spec::submission_entry& sqe) {
    const std::uint16_t qid = spec::delete_io_queue_fields::qid::get(sqe.cdw10);
    if (qid == 0 || qid > config_.max_io_queues) return fail(spec::status::invalid_queue_identifier);
    std::scoped_lock lock(cqs_[qid].mutex);
    if (!cqs_[qid].live) return fail(spec::status::invalid_queue_identifier);
    if (cqs_[qid].sq_refs != 0) return fail(spec::status::invalid_queue_deletion);
    cqs_[qid].live = false;
    stray_doorbells_[2u * qid + 1u] = load32(cq_doorbell(qid));
    return outcome{};
  }

  outcome get_log_page(engine& e, const spec::submission_entry& sqe) {
    const spec::get_log_page_dwords dw{sqe.cdw10, sqe.cdw11, sqe.cdw12, sqe.cdw13, sqe.cdw14};
    const std::uint64_t bytes = dw.number_of_bytes();
    const std::uint64_t offset = dw.offset();
    if ((offset & 3u) != 0 || dw.offset_is_index()) return fail(spec::status::invalid_field_in_command);
    std::vector<std::byte> log;
    switch (dw.lid()) {
      case spec::log_page_id::error_information: {
        std::scoped_lock lock(error_mutex_);
        log.resize(std::size_t{config_.error_log_entries} * sizeof(spec::error_information_log_entry));
        std::size_t i = 0;
        for (const auto& entry : error_log_) std::memcpy(log.data() + sizeof entry * i++, &entry, sizeof entry);
        break;
      }
      case spec::log_page_id::smart_health_information: {
        // Per-namespace SMART data is not supported (LPA bit 0 = 0).
        if (sqe.nsid != 0 && sqe.nsid != 0xffffffffu) return fail(spec::status::invalid_field_in_command);
        spec::smart_health_information_log smart{};
        fill_smart(smart);
        log.resize(sizeof smart);
        std::memcpy(log.data(), &smart, sizeof smart);
        break;
      }
      default: return fail(spec::status::invalid_log_page);
    }
    if (offset >= log.size()) return fail(spec::status::invalid_field_in_command);
    // NUMD asks for up to 16 GiB: bounded by MDTS like every transfer, and never staged in
    // memory; without an MDTS limit, a transfer past the log page's end is refused instead.
    const std::uint64_t available = log.size() - offset;
    if (bytes > max_transfer_bytes() || (config_.mdts == 0 && bytes > available)) {
      return fail(spec::status::invalid_field_in_command);
    }
    const auto s = to_host_padded(e, dma_.pin(), sqe, log.data() + offset, std::min(bytes, available), bytes);
    if (s == spec::status::successful_completion && dw.lid() == spec::log_page_id::error_information && !dw.rae()) {
      std::scoped_lock lock(event_mutex_);
      error_event_masked_ = false;  // reading the log re-arms error events (5.2)
    }
    return outcome{s};
  }

  void fill_smart(spec::smart_health_information_log& smart) const {
    smart.set_composite_temperature_kelvin(300);
    smart.available_spare = 100;
    smart.available_spare_threshold = 10;
    const auto units = [](std::uint64_t bytes) { return spec::data_units((bytes + 511) / 512); };
    smart.data_units_read.add(units(bytes_read_.load(std::memory_order_relaxed)));
    smart.data_units_written.add(units(bytes_written_.load(std::memory_order_relaxed)));
    smart.host_read_commands.add(host_read_commands_.load(std::memory_order_relaxed));
    smart.host_write_commands.add(host_write_commands_.load(std::memory_order_relaxed));
    smart.power_cycles.add(1);
    smart.number_of_error_information_log_entries.add(error_count_.load(std::memory_order_relaxed));
  }

  outcome doorbell_buffer_config(const spec::submission_entry& sqe) {
    // Both buffers are one memory page, page aligned (5.8).
    if ((sqe.prp1 & (page_size_ - 1)) != 0 || (sqe.prp2 & (page_size_ - 1)) != 0) {
      return fail(spec::status::invalid_field_in_command);
    }
    const auto shadow = dma_.find(sqe.prp1, page_size_);
    const auto events = dma_.find(sqe.prp2, page_size_);
    if (!shadow || !events || shadow->kind == memory_kind::device || events->kind == memory_kind::device) {
      return fail(spec::status::invalid_field_in_command);
    }
    const dma_space::view mem = dma_.pin();
    // Existing queues get EventIdx equal to the state the controller already has, so a host
    // applying the EventIdx rule rings MMIO on its next update (QEMU 7.2 leaves them at 0),
    // and their shadow slots get the values last rung (as QEMU's nvme_dbbuf_config does): from
    // now on the controller reads the slots, and a tail read back as the buffer's 0 would send
    // it around the ring again.
    for (std::uint32_t q = 1; q <= config_.max_io_queues; ++q) {
      const auto qid = static_cast<std::uint16_t>(q);
      for (const bool is_cq : {false, true}) {
        if (!has_shadow_slot(qid, is_cq)) continue;
        const std::uint32_t rung = load32(is_cq ? cq_doorbell(qid) : sq_doorbell(qid));
        (void)mem.store32(sqe.prp1 + doorbell_slot(qid, is_cq), rung);
        (void)mem.store32(sqe.prp2 + doorbell_slot(qid, is_cq), rung);
      }
    }
    event_indexes_.store(sqe.prp2, std::memory_order_release);
    shadow_doorbells_.store(sqe.prp1, std::memory_order_release);
    return outcome{};
  }

  outcome abort(const spec::submission_entry& sqe) {
    const std::uint16_t sqid = spec::abort_fields::sqid::get(sqe.cdw10);
    const std::uint16_t cid = spec::abort_fields::cid::get(sqe.cdw10);
    for (auto& e : engines_) {
      std::optional<pending_completion> victim;
      {
        std::scoped_lock lock(e->pending_mutex);
        auto it = std::find_if(e->pending.begin(), e->pending.end(),
                               [&](const auto& pc) { return pc.sqid == sqid && pc.cqe.cid == cid; });
        if (it != e->pending.end()) {
          victim = *it;
          e->pending.erase(it);
          cqs_[victim->cqid].parked.fetch_sub(1, std::memory_order_relaxed);
          std::make_heap(e->pending.begin(), e->pending.end(), later);
        }
      }
      if (victim) {
        victim->cqe.status_field = spec::cqe_status::make_status_field(spec::status::command_abort_requested, false, true);
        victim->cqe.dw0 = 0;
        victim->due_ns = 0;
        bool posted = false;
        {
          const dma_space::view mem = dma_.pin();
          posted = post(mem, *victim);
        }
        if (!posted) park(*e, *victim);
        return outcome{spec::status::successful_completion, 0};  // DW0 bit 0 = 0: aborted
      }
    }
    return outcome{spec::status::successful_completion, spec::abort_fields::not_aborted::set(0, true)};
  }

  outcome asynchronous_event_request(const spec::submission_entry& sqe) {
    std::unique_lock lock(event_mutex_);
    if (outstanding_aers_.size() > config_.async_event_request_limit) {
      return fail(spec::status::asynchronous_event_request_limit_exceeded);
    }
    if (!pending_events_.empty() && !error_event_masked_) {
      const std::uint32_t dw0 = pending_events_.front();
      pending_events_.pop_front();
      error_event_masked_ = true;
      return outcome{spec::status::successful_completion, dw0};
    }
    outstanding_aers_.push_back(sqe.cid());
    outcome o;
    o.deferred = true;
    return o;
  }

  // ---- NVM commands -----------------------------------------------------------------------------
  outcome execute_io(engine& e, const dma_space::view& mem, const spec::submission_entry& sqe) {
    io_commands_.fetch_add(1, std::memory_order_relaxed);
    if (sqe.fuse() != spec::fused_operation::normal || sqe.psdt() != spec::data_transfer_kind::prp) {
      return fail(spec::status::invalid_field_in_command);
    }
    switch (static_cast<spec::nvm_opcode>(sqe.opcode())) {
      case spec::nvm_opcode::read: return read_write(e, mem, sqe, false);
      case spec::nvm_opcode::write: return read_write(e, mem, sqe, true);
      case spec::nvm_opcode::flush: return flush(sqe);
      case spec::nvm_opcode::write_zeroes: return write_zeroes(sqe);
      case spec::nvm_opcode::dataset_management: return dataset_management(e, mem, sqe);
      default: return fail(spec::status::invalid_command_opcode);
    }
  }

  /// Checks NSID and the LBA range of a command; nullptr with `error` set if they are bad.
  [[nodiscard]] namespace_state* checked_range(std::uint32_t nsid, std::uint64_t slba, std::uint64_t blocks, spec::status& error) {
    if (!namespace_active(nsid)) {
      error = spec::status::invalid_namespace_or_format;
      return nullptr;
    }
    namespace_state& n = namespaces_[nsid - 1];
    if (slba > n.lba_count || blocks > n.lba_count - slba) {
      error = spec::status::lba_out_of_range;
      return nullptr;
    }
    return &n;
  }

  [[nodiscard]] std::uint64_t max_transfer_bytes() const noexcept {
    return config_.mdts == 0 ? ~std::uint64_t{0} : (std::uint64_t{1} << config_.mdts) * cap_.min_page_size();
  }

  outcome read_write(engine& e, const dma_space::view& mem, const spec::submission_entry& sqe, bool is_write) {
    const std::uint64_t slba = spec::starting_lba(sqe);
    const std::uint64_t blocks = spec::rw_fields::nlb::get(sqe.cdw12) + 1u;
    outcome o;
    o.lba = slba;
    o.nsid = sqe.nsid;
    o.is_write = is_write;
    const auto failed = [&o](spec::status s) {
      o.status = s;
      return o;
    };
    namespace_state* n = checked_range(sqe.nsid, slba, blocks, o.status);
    if (n == nullptr) return o;
    // MDTS counts metadata that is interleaved with the data (extended LBAs), not a separate
    // metadata buffer (Identify Controller, MDTS). blocks <= 65536 and the stride <= 8192: no wrap.
    const std::uint64_t bytes = blocks * n->data_stride();
    if (bytes > max_transfer_bytes()) return failed(spec::status::invalid_field_in_command);
    if (is_write && n->read_only) return failed(spec::status::namespace_is_write_protected);
    // Separate metadata: MPTR is the address of one contiguous, dword-aligned buffer of MS
    // bytes per block (NVMe 2.0 4.1.1, PSDT 00b).
    const std::uint64_t metadata_bytes = n->separate_metadata() ? blocks * n->ms : 0;
    std::optional<dma_region> metadata;
    if (metadata_bytes != 0) {
      if ((sqe.mptr & 3u) != 0) return failed(spec::status::invalid_field_in_command);
      metadata = mem.find(sqe.mptr, metadata_bytes);
      if (!metadata) return failed(spec::status::data_transfer_error);
    }
    o.status = e.walker.walk(mem, sqe.prp1, sqe.prp2, bytes, page_size_, config_.cmb_mixed_data_locations);
    if (o.status != spec::status::successful_completion) return o;
    // Without data movement every check above has run and the command completes as it
    // would have; only the copies (which, not attempted, cannot fail) are left out.
    if (config_.move_data) {
      // One lock over the command's whole range, not one per segment, and over its separate
      // metadata too, held (for reads into device memory) until the copies are done: an
      // overlapping write sees all of it or none, data and metadata alike.
      const std::uint64_t at = slba * n->data_stride();
      const std::uint64_t metadata_at = metadata ? n->metadata_offset(slba) : 0;
      const std::uint64_t from = metadata ? sqe.mptr - metadata->bus : 0;
      bool ok = true;
      e.command_copies = e.command_copies_lost = false;
      if (is_write) {
        n->store.with_write_access(at, bytes, metadata_at, metadata_bytes, [&](std::byte* p, std::byte* mp) {
          for (const auto& seg : e.walker.segments()) {
            if (ok) ok = mem.copy_out(seg.region, seg.offset, p, seg.length);
            p += seg.length;
          }
          if (ok && metadata) ok = mem.copy_out(*metadata, from, mp, metadata_bytes);
        });
      } else {
        const bool in_flight = lands_on_device(e.walker.segments()) || (metadata && metadata->kind == memory_kind::device);
        ok = read_from_store(e, mem, n->store, at, bytes, metadata_at, metadata_bytes, in_flight, [&](const std::byte* p, const std::byte* mp) {
          for (const auto& seg : e.walker.segments()) {
            if (!mem.copy_in(seg.region, seg.offset, p, seg.length)) return false;
            p += seg.length;
          }
          return !metadata || mem.copy_in(*metadata, from, mp, metadata_bytes);
        });
      }
      if (!ok) return failed(spec::status::data_transfer_error);
      // A settle of the burst's copies after this command's own had started (read_from_store
      // settles before copying, so only a later path could) that reported a failure may have
      // been this command's (one wait covers them all).
      if (e.command_copies_lost) return failed(spec::status::data_transfer_error);
      // Copies into GPU memory may still be in flight: serve_sq waits for the whole burst's
      // before any completion is posted (settle_copies).
      o.copies_in_flight = !is_write;
    }
    o.bytes = bytes;
    if (is_write) {
      bytes_written_.fetch_add(bytes, std::memory_order_relaxed);
      host_write_commands_.fetch_add(1, std::memory_order_relaxed);
      // Force Unit Access, or no volatile cache: the data is durable before completion.
      if ((spec::rw_fields::fua::get(sqe.cdw12) || !volatile_write_cache_enabled_) && !durable(*n)) {
        o.status = spec::status::write_fault;
      }
    } else {
      bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
      host_read_commands_.fetch_add(1, std::memory_order_relaxed);
    }
    return o;
  }

  [[nodiscard]] static bool durable(namespace_state& n) {
    if (!n.store.file_backed()) return true;
    try {
      n.store.flush();
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }

  outcome flush(const spec::submission_entry& sqe) {
    if (sqe.nsid == 0xffffffffu && config_.volatile_write_cache) {
      for (auto& n : namespaces_) {
        if (!durable(n)) return fail(spec::status::write_fault);
      }
      return outcome{};
    }
    if (!namespace_active(sqe.nsid)) return fail(spec::status::invalid_namespace_or_format);
    return durable(namespaces_[sqe.nsid - 1]) ? outcome{} : fail(spec::status::write_fault);
  }

  outcome write_zeroes(const spec::submission_entry& sqe) {
    const std::uint64_t slba = spec::starting_lba(sqe);
    const std::uint64_t blocks = spec::rw_fields::nlb::get(sqe.cdw12) + 1u;
    outcome o;
    o.lba = slba;
    o.nsid = sqe.nsid;
    namespace_state* n = checked_range(sqe.nsid, slba, blocks, o.status);
    if (n == nullptr) return o;
    if (n->read_only) {
      o.status = spec::status::namespace_is_write_protected;
      return o;
    }
    n->zero_blocks(slba, blocks);
    return o;
  }

  outcome dataset_management(engine& e, const dma_space::view& mem, const spec::submission_entry& sqe) {
    if (!namespace_active(sqe.nsid)) return fail(spec::status::invalid_namespace_or_format);
    const std::uint32_t count = spec::dataset_management_fields::nr::get(sqe.cdw10) + 1u;
    std::vector<spec::dsm_range> ranges(count);
    const auto s = from_host(e, mem, sqe, ranges.data(), ranges.size() * sizeof(spec::dsm_range));
    if (s != spec::status::successful_completion) return fail(s);
    if (!spec::dataset_management_fields::ad::get(sqe.cdw11)) return outcome{};  // attributes are hints
    namespace_state& n = namespaces_[sqe.nsid - 1];
    if (n.read_only) return fail(spec::status::namespace_is_write_protected);
    // Check every range before touching any: a command fails as a whole.
    for (const auto& r : ranges) {
      spec::status error{};
      if (checked_range(sqe.nsid, r.starting_lba, r.length_in_logical_blocks, error) == nullptr) {
        outcome o = fail(error);
        o.lba = r.starting_lba;
        o.nsid = sqe.nsid;
        return o;
      }
    }
    for (const auto& r : ranges) {
      if (r.length_in_logical_blocks != 0) n.zero_blocks(r.starting_lba, r.length_in_logical_blocks);
    }
    return outcome{};
  }

  // ---- members ------------------------------------------------------------------------------------
  controller_config config_;
  std::vector<namespace_state> namespaces_;
  dma_space dma_;
  std::byte* bar_ = nullptr;
  std::size_t bar_size_ = 0;
  std::byte* cmb_ = nullptr;
  std::unique_ptr<sq_state[]> sqs_;
  std::unique_ptr<cq_state[]> cqs_;
  std::vector<std::unique_ptr<engine>> engines_;  // workers 0..N-1, then the admin thread's
  std::unique_ptr<fault_injector> faults_;
  std::unique_ptr<timing_scheduler> timing_;

  // The registers below the doorbells (load/store, read_register/write_register).
  std::unique_ptr<std::atomic<std::uint32_t>[]> registers_ =
      std::make_unique<std::atomic<std::uint32_t>[]>(spec::to_underlying(spec::register_offset::doorbells) / 4);
  std::mutex register_write_mutex_;  // host register writes; the admin thread's CC handling
  std::atomic<std::uint64_t> cc_disables_{0};       // CC.EN 1 → 0 writes by the host
  std::atomic<std::uint64_t> cc_disables_done_{0};  // of those, the resets the admin thread finished
  std::uint64_t cc_disables_seen_ = 0;              // admin thread only

  // Owned by the admin thread.
  spec::cap_register cap_{};
  spec::version_register vs_{};
  spec::csts_register csts_{};
  std::mutex csts_mutex_;
  bool enabled_ = false;
  std::uint64_t page_size_ = 4096;
  std::uint64_t ready_at_ns_ = 0;
  spec::shutdown_notification last_shn_ = spec::shutdown_notification::none;
  bool cmb_mapped_ = false;
  std::uint64_t cmb_bus_ = 0;
  std::vector<std::uint32_t> stray_doorbells_;
  std::uint32_t allocated_sqs_ = 0, allocated_cqs_ = 0;
  std::atomic<bool> volatile_write_cache_enabled_{true};
  std::uint32_t plain_features_[256] = {};

  // Bus addresses of the Doorbell Buffer Config pages, 0 while none is configured. Plain
  // atomics on the polling path: every access through them goes through a DMA view, which
  // checks the region, so a stale address can only fail, never touch unregistered memory.
  std::atomic<std::uint64_t> shadow_doorbells_{0};
  std::atomic<std::uint64_t> event_indexes_{0};

  std::mutex event_mutex_;
  std::deque<std::uint16_t> outstanding_aers_;
  std::deque<std::uint32_t> pending_events_;
  bool error_event_masked_ = false;

  std::mutex inbox_mutex_;
  std::vector<doorbell_fault> inbox_;

  mutable std::mutex error_mutex_;
  std::deque<spec::error_information_log_entry> error_log_;

  std::atomic<bool> stop_{false};
  std::atomic<bool> ready_{false};
  std::atomic<bool> fatal_{false};
  std::atomic<bool> setup_failed_{false};  // a thread's device-copy setup failed: every enable is fatal
  std::atomic<std::uint64_t> thread_failures_{0};
  std::atomic<std::uint64_t> admin_commands_{0}, io_commands_{0}, completions_posted_{0};
  std::atomic<std::uint64_t> bytes_read_{0}, bytes_written_{0}, host_read_commands_{0}, host_write_commands_{0};
  std::atomic<std::uint64_t> doorbell_errors_{0}, error_count_{0}, completions_dropped_{0};
  std::vector<std::thread> threads_;
};

}  // namespace emu
CUNVME_NAMESPACE_END
