// What the emulated controller owns and every part of it shares: configuration, namespaces,
// the DMA space, BAR memory, queue and thread state, the error log and event queues, counters.
// The parts (emu/register_file.cuh, doorbells.cuh, queues.cuh, nvm_commands.cuh,
// admin_commands.cuh) derive from it in that order, each using only what lies below it, and
// emu/controller.cuh wires them to threads; the chain has no virtual calls, so the per-command
// path compiles as one class did.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/file_lock.cuh>
#include <cunvme/emu/backing_store.cuh>
#include <cunvme/emu/controller_config.cuh>
#include <cunvme/emu/dma_space.cuh>
#include <cunvme/emu/events.cuh>
#include <cunvme/emu/fault_injection.cuh>
#include <cunvme/emu/namespace_pinning.cuh>
#include <cunvme/emu/prp_walker.cuh>
#include <cunvme/emu/timing_model.cuh>
#include <cunvme/spec/queue_entry.cuh>
#include <cunvme/spec/registers.cuh>
#include <cunvme/spec/status.cuh>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

CUNVME_NAMESPACE_BEGIN
namespace emu::detail {

class controller_state {
 protected:
  explicit controller_state(controller_config config) : config_(std::move(config)) {}
  controller_state(const controller_state&) = delete;
  controller_state& operator=(const controller_state&) = delete;
  ~controller_state() = default;

  // ---- per-queue and per-thread state --------------------------------------------------------
  struct sq_state {
    std::mutex mutex;  // held by the owning thread while serving, by the admin thread to create/delete
    // Written under `mutex`; read without it by a polling worker, which then locks only queues
    // that exist: a try_lock of every queue on every pass contends with the admin thread's
    // blocking lock of a queue it creates, and costs idle workers most of their time.
    std::atomic<bool> live{false};
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
    // CQEs posted into this CQ, for `io_totals` (bumped under `mutex`, never reset).
    std::atomic<std::uint64_t> posted{0};
  };
  struct pending_completion {
    std::uint64_t due_ns = 0;
    std::uint16_t sqid = 0;
    std::uint16_t cqid = 0;
    std::uint32_t cq_generation = 0;
    spec::completion_entry cqe{};  // SQHD and phase are filled when posted
    bool dnr = false;
  };
  /// What one engine's I/O commands did. Each engine counts its own, on a cache line of its own,
  /// and readers sum the engines (`io_totals`): counters shared by every worker, bumped several
  /// times per command, bounced one cache line between all the workers' cores.
  struct alignas(64) io_counts {  // a whole cache line: nothing else of the engine shares it
    std::atomic<std::uint64_t> commands{0}, read_commands{0}, write_commands{0}, bytes_read{0}, bytes_written{0};
  };
  struct engine {
    explicit engine(std::uint64_t seed) : rng(seed) {}
    io_counts counted;
    static_assert(sizeof(io_counts) == 64);
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
  /// The I/O counts of every engine and the CQEs of every CQ, summed (relaxed: a snapshot).
  struct io_totals {
    std::uint64_t commands = 0, read_commands = 0, write_commands = 0, bytes_read = 0, bytes_written = 0, completions_posted = 0;
  };
  [[nodiscard]] io_totals totals() const noexcept {
    io_totals t;
    constexpr auto relaxed = std::memory_order_relaxed;
    for (const auto& e : engines_) {
      t.commands += e->counted.commands.load(relaxed);
      t.read_commands += e->counted.read_commands.load(relaxed);
      t.write_commands += e->counted.write_commands.load(relaxed);
      t.bytes_read += e->counted.bytes_read.load(relaxed);
      t.bytes_written += e->counted.bytes_written.load(relaxed);
    }
    for (std::uint32_t q = 0; cqs_ && q <= config_.max_io_queues; ++q) t.completions_posted += cqs_[q].posted.load(relaxed);
    return t;
  }
  struct namespace_state {
    backing_store store;
    std::uint32_t lba_size;
    std::uint8_t lbads;
    std::uint64_t lba_count;
    bool read_only;
    std::uint16_t ms;  // metadata bytes per block (LBAF.MS)
    bool extended;     // metadata at the end of each block (FLBAS bit 4), else through MPTR
    // Declared after `store`, so destroyed (unpinned) before the store is unmapped. Null
    // where no `register_host` hook is installed: nothing is pinned.
    std::unique_ptr<pinned_granules> pinning;

    /// Store (and data buffer) bytes per block: extended LBAs carry their metadata inline.
    [[nodiscard]] std::uint64_t data_stride() const noexcept { return std::uint64_t{lba_size} + (extended ? ms : 0u); }
    [[nodiscard]] bool separate_metadata() const noexcept { return ms != 0 && !extended; }
    /// Separate metadata lives after all the data in the store (namespace_config says why).
    [[nodiscard]] std::uint64_t metadata_offset(std::uint64_t lba) const noexcept { return lba_count * lba_size + lba * ms; }
    /// Whether Write may store blocks [slba, slba + blocks): all their bytes, data and separate
    /// metadata, lie in the file (`backing_store::file_bytes`), not in the zeros padding a
    /// file's partial last block.
    [[nodiscard]] bool writable(std::uint64_t slba, std::uint64_t blocks) const noexcept {
      const std::uint64_t end = store.file_bytes();
      if ((slba + blocks) * data_stride() > end) return false;
      return !separate_metadata() || metadata_offset(slba + blocks) <= end;
    }
    /// Write Zeroes and deallocation: data and metadata of the blocks read back as zeros.
    void zero_blocks(std::uint64_t slba, std::uint64_t blocks) {
      zero(slba * data_stride(), blocks * data_stride());
      if (separate_metadata()) zero(metadata_offset(slba), blocks * ms);
    }
    /// Store bytes [offset, offset + len) as zeros, a granule at a time where pinning is on:
    /// a pinned granule's pages stay (zeros are written), any other's are handed back with
    /// its pinning held off meanwhile.
    void zero(std::uint64_t offset, std::uint64_t len) {
      if (!pinning) {
        store.zero(offset, len);
        return;
      }
      const std::uint64_t granule = pinning->granule_bytes();
      for (std::uint64_t at = offset; at < offset + len;) {
        const std::uint64_t piece = std::min(granule - at % granule, offset + len - at);
        const std::uint64_t g = pinning->granule_of(at);
        std::uint8_t before = 0;
        if (pinning->hold_unpinned(g, before)) {
          struct end_hold {
            pinned_granules& p;
            std::uint64_t g;
            std::uint8_t before;
            ~end_hold() { p.end_hold(g, before); }
          } held{*pinning, g, before};
          store.zero(at, piece);
        } else {
          store.zero(at, piece, true);
        }
        at += piece;
      }
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

  /// The largest BAR0 emulated: real controllers' are 16 KiB to a few MiB.
  static constexpr std::uint64_t max_bar_bytes = std::uint64_t{256} << 20;

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
    // In 64 bits: the doorbell offsets are 32-bit, and the BAR is host memory this emulator
    // allocates (and a CUDA build pins).
    if (const std::uint64_t bar = spec::bar_bytes_for_queues(config_.max_io_queues, config_.doorbell_stride); bar > max_bar_bytes) {
      bad("max_io_queues " + std::to_string(config_.max_io_queues) + " with doorbell_stride (CAP.DSTRD) " + std::to_string(config_.doorbell_stride) +
          " needs a BAR0 of " + std::to_string(bar) + " bytes; at most " + std::to_string(max_bar_bytes) + " are emulated");
    }
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

  /// One emulator per file: an flock on each namespace file for the emulator's lifetime —
  /// exclusive where a namespace writes it, shared where all only read — taken before the file
  /// is sized or mapped, so a refused emulator changes nothing. Namespaces of this emulator
  /// share a file (`namespaces=N`); a second emulator, in this process or another, is refused
  /// (std::runtime_error naming the file and the holder) until this one is gone.
  void claim_files() {
    struct claimed {
      dev_t device;
      ino_t inode;
      bool exclusive;
      int fd;
    };
    std::vector<claimed> held;
    for (const auto& n : config_.namespaces) {
      if (n.file.empty()) continue;
      // The store's own flags: a file it would create is created here (and then sized by it).
      const int flags = n.read_only ? O_RDONLY : (n.lba_count > 0 ? O_RDWR | O_CREAT : O_RDWR);
      const int fd = ::open(n.file.c_str(), flags | O_CLOEXEC, 0644);
      if (fd < 0) throw std::system_error(errno, std::generic_category(), "emulator: open '" + n.file + "'");
      struct stat st {};
      if (::fstat(fd, &st) != 0) {
        const int e = errno;
        ::close(fd);
        throw std::system_error(e, std::generic_category(), "emulator: stat '" + n.file + "'");
      }
      auto same = std::find_if(held.begin(), held.end(), [&](const claimed& c) { return c.device == st.st_dev && c.inode == st.st_ino; });
      int lock_fd = fd;
      if (same != held.end()) {
        ::close(fd);
        // Already this emulator's: a writer among readers turns the claim exclusive.
        if (same->exclusive || n.read_only) continue;
        lock_fd = same->fd;
        same->exclusive = true;
      } else {
        file_claims_.emplace_back(fd);
        held.push_back({st.st_dev, st.st_ino, !n.read_only, fd});
      }
      std::string holder;
      switch (cunvme::detail::try_lock_file(lock_fd, !n.read_only, holder)) {
        case cunvme::detail::lock_outcome::taken: break;
        case cunvme::detail::lock_outcome::failed: throw std::system_error(errno, std::generic_category(), "emulator: lock '" + n.file + "'");
        case cunvme::detail::lock_outcome::held_elsewhere:
          throw std::runtime_error("'" + n.file + "' is in use by another emulator (" + (holder.empty() ? std::string("its holder is not known") : holder + " holds it") +
                                   "): a file backs one emulator's namespaces at a time, or any number of readonly ones; close the other first");
      }
    }
  }

  void open_namespaces() {
    pinned_granules::check_granule(config_.pinning.granule_bytes);  // refused with or without a hook
    claim_files();
    for (const auto& n : config_.namespaces) {
      const std::uint64_t per_block = n.stored_block_bytes();
      // A file sized by itself (lba_count 0) holds every byte of it: its size is rounded up to
      // whole blocks, the last one's bytes past the file's end reading as zeros, and Writes
      // that reach them fail (nvm_commands::read_write), since they could not reach the file.
      backing_store store = n.file.empty()
                                ? backing_store::in_memory(n.lba_count * per_block)
                                : backing_store::from_file(n.file, n.lba_count * per_block, n.read_only, per_block);
      const std::uint64_t blocks = store.size() / per_block;
      const std::uint8_t lbads = n.lba_size == 512 ? 9 : 12;
      namespace_state& added = namespaces_.emplace_back(
          namespace_state{std::move(store), n.lba_size, lbads, blocks, n.read_only, n.metadata_size, n.extended_lba && n.metadata_size != 0, {}});
      if (config_.memory.register_host) {
        added.pinning = std::make_unique<pinned_granules>(added.store.mapping(), added.store.size(), added.store.read_only(), config_.pinning,
                                                          config_.memory.register_host, config_.memory.unregister_host);
      }
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

  [[nodiscard]] bool namespace_active(std::uint32_t nsid) const noexcept { return nsid >= 1 && nsid <= namespaces_.size(); }

  /// The last value seen in a missing queue's doorbell (`stray_doorbells_`, SQ then CQ per queue).
  [[nodiscard]] std::uint32_t& stray_doorbell(std::uint16_t qid, bool is_cq) noexcept {
    return stray_doorbells_[2u * qid + (is_cq ? 1u : 0u)];
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

  // ---- members ------------------------------------------------------------------------------------
  controller_config config_;
  std::vector<cunvme::detail::file_claim> file_claims_;  // released after the stores unmap (`claim_files`)
  std::vector<namespace_state> namespaces_;
  dma_space dma_;
  std::byte* bar_ = nullptr;
  int bar_file_ = -1;  ///< the memory file of a shared BAR0, else -1
  std::size_t bar_size_ = 0;
  std::byte* cmb_ = nullptr;
  std::unique_ptr<sq_state[]> sqs_;
  std::unique_ptr<cq_state[]> cqs_;
  std::vector<std::unique_ptr<engine>> engines_;  // workers 0..N-1, then the admin thread's
  std::unique_ptr<fault_injector> faults_;
  std::unique_ptr<timing_scheduler> timing_;
  // After `namespaces_`: its threads stop before the granules they pin are destroyed.
  pin_ahead_pool pin_ahead_{config_.pinning.threads};

  // Owned by the admin thread.
  std::uint64_t page_size_ = 4096;  // CC.MPS, set when the controller is enabled
  std::vector<std::uint32_t> stray_doorbells_;  // last value seen in each missing queue's doorbells
  std::uint32_t allocated_sqs_ = 0, allocated_cqs_ = 0;
  std::atomic<bool> volatile_write_cache_enabled_{true};

  // Bus addresses of the Doorbell Buffer Config pages, 0 while none is configured. Plain
  // atomics on the polling path: every access through them goes through a DMA view, which
  // checks the region, so a stale address can only fail, never touch unregistered memory.
  std::atomic<std::uint64_t> shadow_doorbells_{0};
  std::atomic<std::uint64_t> event_indexes_{0};

  error_log errors_{config_.error_log_entries};
  async_events events_;
  doorbell_fault_inbox doorbell_faults_;

  std::atomic<bool> stop_{false};
  std::atomic<bool> ready_{false};
  std::atomic<bool> fatal_{false};
  std::atomic<bool> setup_failed_{false};  // a thread's device-copy setup failed: every enable is fatal
  std::atomic<std::uint64_t> thread_failures_{0};
  std::atomic<std::uint64_t> admin_commands_{0};
  std::atomic<std::uint64_t> doorbell_errors_{0}, completions_dropped_{0};
  std::vector<std::thread> threads_;
};

}  // namespace emu::detail
CUNVME_NAMESPACE_END
