// Host bring-up: takes a controller from reset to ready I/O queue pairs over any register
// backend, and shuts it down cleanly. Every wait is bounded by a timeout derived from CAP.TO
// (or given), and every failure is a `host::error` naming the operation, the device and the
// NVMe status, errno or reason.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/controller/admin_link.cuh>
#include <cunvme/host/controller/admin_queue.cuh>
#include <cunvme/host/controller/controller_options.cuh>
#include <cunvme/host/memory/dma_memory.cuh>
#include <cunvme/host/memory/dma_prps.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/memory/host_registration.cuh>
#include <cunvme/host/controller/namespace_info.cuh>
#include <cunvme/host/memory/queue_memory.cuh>
#include <cunvme/host/backend/register_backend.cuh>
#include <cunvme/policy/prp.cuh>
#include <cunvme/spec/command_fields.cuh>
#include <cunvme/spec/identify.cuh>
#include <cunvme/spec/log_page.cuh>
#include <cunvme/spec/queue_entry.cuh>
#include <cunvme/spec/registers.cuh>
#include <cunvme/spec/shadow_doorbell.cuh>
#include <cunvme/spec/status.cuh>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace host {

class queue_pair;
class io_queue;
namespace sharing {
class controller_owner;
}
struct timeout_outcome;  // recovery.cuh

/// A controller brought up over a register backend.
///
/// Usage: examples/snippets/host.cpp, `list_namespaces`.
class controller {
 public:
  /// Brings the controller up. `gpu`, where given, registers for GPU threads what the backend
  /// maps and they cannot use yet (`register_backend::needs_gpu_registration`): the BAR (as
  /// I/O memory for a real device) and every DMA buffer, before anything is allocated.
  explicit controller(std::unique_ptr<register_backend> backend, controller_options options = {}, const host_registrar& gpu = {})
      : backend_(std::move(backend)), options_(options) {
    if (!backend_) throw error("Bring up", "(none)", "no register backend");
    name_ = backend_->name();
    options_.check(name_);
    register_for_gpu(gpu);
    read_identity_registers();
    if (cap_.raw == ~std::uint64_t{0}) throw error("Read CAP", name_, "the BAR reads all ones: the device is gone or not enabled");
    if (!cap_.supports(spec::cap_css::nvm_command_set)) throw error("Bring up", name_, "CAP.CSS lacks the NVM command set");
    ready_timeout_ = options_.ready_timeout.count() != 0 ? options_.ready_timeout : std::chrono::milliseconds(cap_.timeout_ms());
    page_shift_ = 12u + cap_.mpsmin();
    disable_if_enabled();
    setup_admin_queues();
    try {
      enable();
      identify_all();
      negotiate_queues();
      if (options_.shadow_doorbells && identify_.supports_doorbell_buffer_config()) configure_shadow_doorbells();
      if (options_.use_cmb && cap_.cmbs()) configure_cmb();
    } catch (...) {
      // The admin queues and the shadow buffers go with this object: the controller must
      // not be enabled while they do, and where it does not stop they are kept for good.
      if (!halt()) keep_forever();
      throw;
    }
  }

  /// Attaches to a controller whose admin queue another process owns (`owner`): nothing is
  /// configured; the identity and namespaces are read through the owner; queue pairs are made
  /// as for an owned controller, their identifiers and their Create/Delete commands going
  /// through the owner. `reset()` is the owner's alone; `shutdown()` only lets go.
  controller(std::unique_ptr<register_backend> backend, std::unique_ptr<admin_link> owner, controller_options options = {}, const host_registrar& gpu = {})
      : backend_(std::move(backend)), options_(options), owner_(std::move(owner)) {
    if (!backend_) throw error("Attach", "(none)", "no register backend");
    name_ = backend_->name();
    if (!owner_) throw error("Attach", name_, "no owner of the admin queue");
    options_.check(name_);
    register_for_gpu(gpu);
    read_identity_registers();
    ready_timeout_ = options_.ready_timeout.count() != 0 ? options_.ready_timeout : std::chrono::milliseconds(cap_.timeout_ms());
    page_shift_ = owner_->page_shift();
    require_ready("Attach to " + owner_->owner());
    identify_all();
    granted_ = owner_->queue_pairs_granted();
  }

  controller(const controller&) = delete;
  controller& operator=(const controller&) = delete;

  ~controller() {
    try {
      shutdown();
    } catch (const error&) {
      // A destructor cannot report; call shutdown() first to see its errors.
    }
  }

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] register_backend& backend() noexcept { return *backend_; }
  /// DMA memory for this controller (registered for GPU threads where the controller was
  /// brought up for them).
  [[nodiscard]] dma_allocator& memory() noexcept { return gpu_memory_ ? *gpu_memory_ : backend_->memory(); }
  /// Where GPU threads store to `bar()` + `offset`: the registered BAR where the backend
  /// needed registering, else the backend's mapping itself.
  [[nodiscard]] std::byte* device_bar() const noexcept { return gpu_bar_ ? static_cast<std::byte*>(gpu_bar_.device()) : backend_->bar(); }
  [[nodiscard]] spec::cap_register cap() const noexcept { return cap_; }
  [[nodiscard]] spec::version_register version() const noexcept { return vs_; }
  [[nodiscard]] spec::csts_register csts() const {
    return spec::csts_register{backend_->read32(spec::to_underlying(spec::register_offset::csts))};
  }
  [[nodiscard]] const spec::identify_controller& identify() const noexcept { return identify_; }
  [[nodiscard]] const std::vector<namespace_info>& namespaces() const noexcept { return namespaces_; }
  [[nodiscard]] const namespace_info& namespace_by_id(std::uint32_t nsid) const {
    for (const auto& n : namespaces_) {
      if (n.nsid == nsid) return n;
    }
    throw error("Find namespace " + std::to_string(nsid), name_, "no such active namespace");
  }
  /// Bytes one command may move (MDTS; 2 MiB where the controller sets no limit).
  [[nodiscard]] std::uint64_t max_transfer_bytes() const noexcept {
    const std::uint64_t mdts = identify_.mdts_bytes(cap_.min_page_size());
    return mdts == 0 ? std::uint64_t{2} << 20 : mdts;
  }
  [[nodiscard]] unsigned page_shift() const noexcept { return page_shift_; }
  /// The controller page (CC.MPS) in bytes: what queues, PRP lists and admin buffers are aligned to.
  [[nodiscard]] std::size_t page_bytes() const noexcept { return std::size_t{1} << page_shift_; }
  /// I/O queue pairs granted (Set Features – Number of Queues) with their doorbells in BAR0.
  [[nodiscard]] std::uint16_t io_queue_pairs_granted() const noexcept { return granted_; }
  [[nodiscard]] bool shadow_doorbells() const noexcept { return static_cast<bool>(shadow_); }
  [[nodiscard]] const controller_options& options() const noexcept { return options_; }
  /// Whether another process owns the admin queue (the attaching constructor).
  [[nodiscard]] bool attached() const noexcept { return owner_ != nullptr; }

  /// Whether cunvme stopped the controller (CC.EN = 0) after a command that would not end and
  /// no `reset()` ran since. `require_running` then throws for `operation` before anything is
  /// submitted (it would only wait out its timeout); every host I/O entry point calls it.
  [[nodiscard]] bool stopped() const noexcept { return stopped_.load(std::memory_order_acquire); }
  void require_running(const std::string& operation) const;

  /// Sends an admin command and waits (bounded) for its completion, whatever its status.
  /// Throws when the controller is not ready, is fatal, or does not answer in time.
  ///
  /// An admin command without a completion may still move data into the buffers it names,
  /// which its caller is about to release: the controller is stopped (CC.EN = 0) first, as a
  /// driver resets a controller whose admin queue stopped answering; `reset()` brings it back.
  spec::completion_entry admin_command(spec::submission_entry sqe, const std::string& operation) {
    if (owner_) {
      require_running(operation);
      return owner_->admin(sqe, operation);
    }
    std::scoped_lock lock(admin_mutex_);
    require_ready(operation);
    const auto cqe = admin_.execute(sqe, options_.admin_command_timeout(), unexpected_completions_);
    if (!cqe) {
      const std::string why = no_completion_reason(options_.admin_command_timeout());  // before CC.EN = 0 clears CSTS.CFS
      throw error(operation, name_, why + (halt() ? "; the controller was stopped (CC.EN = 0): reset() brings it back"
                                                  : "; the controller does not stop (CSTS.RDY stays 1): memory given to it may still be written"));
    }
    return *cqe;
  }

  /// `admin_command`, throwing `host::error` with the NVMe status when it is not success.
  spec::completion_entry admin(spec::submission_entry sqe, const std::string& operation) {
    const auto cqe = admin_command(sqe, operation);
    if (cqe.status() != spec::status::successful_completion) throw error(operation, name_, cqe.status());
    return cqe;
  }

  /// Asks the controller to abort command `cid` of SQ `sqid` (Abort, 5.1). True when it says
  /// it did: the command then completes on its CQ with Command Abort Requested and moves no
  /// data after that completion. False when it did not (the command completed already, its
  /// completion was lost, or the Abort Command Limit was reached): the command may still run
  /// and move data until the controller is reset. Throws `host::error` when the admin command
  /// itself fails (no completion, controller not ready).
  [[nodiscard]] bool abort(std::uint16_t sqid, std::uint16_t cid);

  /// The one timeout policy for commands `cids` of SQ `sqid` whose waiters timed out (recovery.cuh).
  timeout_outcome end_timed_out(std::uint16_t sqid, const std::vector<std::uint16_t>& cids, std::chrono::nanoseconds wait, const std::function<bool(std::uint16_t)>& completed);

  /// Recovers the controller as a driver does (3.7.2): CC.EN → 0, which stops its command
  /// processing and DMA and deletes every I/O queue, then bring-up again (admin queues,
  /// enable, Number of Queues, Doorbell Buffer Config, the CMB at its address) and every live
  /// queue pair re-created on its identifier over its own memory, so the views kernels and
  /// CPU readers hold stay valid. Of the commands outstanding on those queues, one whose
  /// waiter timed out gives its CID back; one still marked submitted completes with Command
  /// Aborted By Host, which its waiter gets. For a controller in fatal status (CSTS.CFS), one
  /// that stopped answering, or commands that would not abort.
  ///
  /// Call it while no thread submits to or waits on this controller's queues (kernels that
  /// use them finished, host I/O not running). Throws `host::error` when the controller does
  /// not stop (CSTS.RDY stays 1: its DMA may still run, so release none of the memory it was
  /// given) or does not come back (then reset again, or destroy the controller).
  void reset();

  /// How many times `reset` brought the controller back.
  [[nodiscard]] std::uint64_t resets() const noexcept { return resets_; }

  /// Creates an I/O queue pair of `entries` entries (2..MQES+1) with its queues placed as asked.
  [[nodiscard]] std::unique_ptr<queue_pair> create_queue_pair(std::uint32_t entries, queue_placement placement = queue_placement::host);

  /// Creates an I/O queue pair in memory the caller provides (GPU memory from
  /// `memory().map_gpu(...)`, say): `sq` holds `entries` × 64 bytes, `cq` `entries` × 16,
  /// each contiguous in bus address space.
  [[nodiscard]] std::unique_ptr<queue_pair> create_queue_pair(std::uint32_t entries, dma_buffer sq, dma_buffer cq);

 private:
  friend class io_queue;
  friend class sharing::controller_owner;  // lends queue identifiers to attached processes
  /// Both `create_queue_pair`s, with the bookkeeping and PRP lists where `hooks` put them
  /// and every wait of the queue's I/O bounded by `timeout`.
  [[nodiscard]] std::unique_ptr<queue_pair> make_queue_pair(std::uint32_t entries, queue_placement placement, dma_buffer provided_sq,
                                                           dma_buffer provided_cq, const io_queue_memory& hooks, std::chrono::nanoseconds timeout);

 public:
  /// Deletes every queue, announces a normal shutdown (CC.SHN), waits for CSTS.SHST, and
  /// disables the controller. Queue pairs must be destroyed first.
  void shutdown();

  /// Reads `bytes` of log page `lid` (Get Log Page) into host memory.
  [[nodiscard]] std::vector<std::byte> log_page(spec::log_page_id lid, std::size_t bytes, std::uint32_t nsid = spec::broadcast_nsid) {
    // NUMD (NUMDU:NUMDL) is a 0's based count of dwords in 32 bits.
    if (bytes == 0 || bytes % 4 != 0 || bytes / 4 > (std::uint64_t{1} << 32)) {
      throw error("Get Log Page " + std::to_string(static_cast<unsigned>(lid)), name_,
                  std::to_string(bytes) + " bytes: a log page read is a whole number of dwords, 4 bytes to 16 GiB");
    }
    dma_buffer buf = host_memory().allocate(bytes, page_bytes());
    const std::uint64_t entries = prp::list_entries_needed(buf.bus(), bytes, page_shift_);  // ≤ 2^53 for any valid page
    dma_buffer list = host_memory().allocate(static_cast<std::size_t>(std::max<std::uint64_t>(entries, 1) * 8), page_bytes());
    auto sqe = spec::make_get_log_page(lid, bytes, 0, 0, 0, nsid);
    fill_prps(sqe, buf, 0, bytes, list);
    admin(sqe, "Get Log Page " + std::to_string(static_cast<unsigned>(lid)));
    return std::vector<std::byte>(buf.data(), buf.data() + bytes);
  }

  /// I/O doorbell updates that went to MMIO, and those the shadow buffer's EventIdx let the
  /// host skip, on the host's own I/O (queue pairs on several threads add to these at once).
  [[nodiscard]] std::uint64_t mmio_doorbell_writes() const noexcept { return mmio_doorbell_writes_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t skipped_doorbell_writes() const noexcept { return skipped_doorbell_writes_.load(std::memory_order_relaxed); }
  /// CQEs the host's own waits (admin commands, `queue_pair` I/O) consumed and dropped because
  /// their CID (or SQ identifier) named no command in flight, late completions of commands
  /// that timed out included (DESIGN.md rule 4).
  [[nodiscard]] std::uint64_t unexpected_completions() const noexcept { return unexpected_completions_.load(std::memory_order_relaxed); }

  /// The shadow doorbell and EventIdx slots of a queue's doorbell; nullptrs without them, and
  /// for a doorbell whose slot lies past the buffers' one memory page (5.8; a large CAP.DSTRD or
  /// many queues): that queue rings by MMIO only.
  /// `device`: through the addresses GPU threads use, where the buffers have them.
  [[nodiscard]] std::pair<std::uint32_t*, std::uint32_t*> shadow_slots(std::uint16_t qid, bool is_cq, bool device = false) const {
    if (!shadow_) return {nullptr, nullptr};
    const std::size_t slot = spec::shadow_doorbell_slot(qid, is_cq, cap_.dstrd());
    if ((slot + 1) * 4 > shadow_->size() || (slot + 1) * 4 > event_index_->size()) return {nullptr, nullptr};
    const auto base = [device](const dma_buffer& b) {
      return static_cast<std::uint32_t*>(device && b.device_data() != nullptr ? b.device_data() : static_cast<void*>(b.data()));
    };
    return {base(*shadow_) + slot, base(*event_index_) + slot};
  }

  /// Where GPU threads write a byte of the CMB the host maps at `host` (an SQ placed there).
  [[nodiscard]] std::byte* device_cmb(std::byte* host) const noexcept {
    return gpu_cmb_ ? static_cast<std::byte*>(gpu_cmb_.device()) + (host - backend_->cmb()) : host;
  }

  /// PRP1/PRP2 for `bytes` of `buffer` at `offset`, with a list in `lists` (page-aligned
  /// DMA memory that must outlive the command) when the transfer spans more than two pages
  /// (`host::fill_prps` with this controller's page).
  void fill_prps(spec::submission_entry& sqe, const dma_buffer& buffer, std::size_t offset, std::uint64_t bytes, const dma_buffer& lists) const {
    host::fill_prps(sqe, buffer, offset, bytes, lists, page_shift_, name_);
  }

 private:
  friend class queue_pair;

  /// Registers for GPU threads what the backend maps and they cannot use yet: the BAR (as I/O
  /// memory for a real device) and every DMA buffer, before anything is allocated.
  void register_for_gpu(const host_registrar& gpu) {
    if (!gpu || !backend_->needs_gpu_registration()) return;
    gpu_ = gpu;
    gpu_bar_ = gpu(backend_->bar(), backend_->bar_size(), backend_->bar_is_io_memory(), "the BAR (doorbells)", name_);
    gpu_memory_ = std::make_unique<registering_allocator>(backend_->memory(), gpu, name_);
  }
  void read_identity_registers() {
    cap_ = spec::cap_register{backend_->read64(spec::to_underlying(spec::register_offset::cap))};
    vs_ = spec::version_register{backend_->read32(spec::to_underlying(spec::register_offset::vs))};
  }

  /// DMA memory only the host uses (admin queues, identify and log pages): never registered for
  /// GPU threads, which would cost a cudaHostRegister per buffer for nothing.
  [[nodiscard]] dma_allocator& host_memory() noexcept { return backend_->memory(); }

  /// Why a command had no completion: CSTS.CFS (read before a stop clears it) or the timeout.
  [[nodiscard]] std::string no_completion_reason(std::chrono::milliseconds timeout) const {
    return csts().cfs() ? std::string("controller fatal status (CSTS.CFS) while waiting for the completion")
                        : "no completion within " + std::to_string(timeout.count()) + " ms";
  }

  /// Adds what a queue pair's own I/O counted (doorbell writes, dropped completions).
  void count_io(std::uint64_t mmio, std::uint64_t skipped, std::uint64_t unexpected) noexcept {
    mmio_doorbell_writes_.fetch_add(mmio, std::memory_order_relaxed);
    skipped_doorbell_writes_.fetch_add(skipped, std::memory_order_relaxed);
    unexpected_completions_.fetch_add(unexpected, std::memory_order_relaxed);
  }

  /// No-throw: a reset that found fewer queues granted may have shrunk the table.
  void release_queue_id(std::uint16_t qid) noexcept {
    if (owner_) {
      owner_->release_queue_id(qid);
      return;
    }
    std::scoped_lock lock(admin_mutex_);
    if (qid < used_qids_.size()) used_qids_[qid] = false;
  }


  /// The queue pairs `reset` re-creates: each adds itself once its queues exist and leaves as
  /// it is destroyed.
  void attach(queue_pair* q) {
    std::scoped_lock lock(live_mutex_);
    live_.push_back(q);
  }
  /// Waits for a `reset` in progress, which may be re-creating `q`.
  void detach(queue_pair* q) {
    std::scoped_lock lock(live_mutex_);
    std::erase(live_, q);
  }

  /// CC.EN → 0 for a queue pair whose queues could not be deleted (the controller is fatal or
  /// gone) before its memory is released. False when CSTS.RDY stays 1: the controller may
  /// still DMA to that memory, which must then never be released.
  [[nodiscard]] bool halt() noexcept;

  /// The admin queues and shadow buffers of a controller that did not stop, kept allocated
  /// for good (the process's lifetime): it may still write them.
  void keep_forever() noexcept;

  /// A new queue's shadow doorbell and EventIdx slots start from the host's values (DESIGN.md
  /// rule 5), written before the queue exists: a deleted queue with the same identifier left
  /// its own there, and a stale EventIdx makes the EventIdx rule skip MMIO writes the
  /// controller is waiting for (QEMU then never runs the first command).
  void start_shadow_doorbells(std::uint16_t qid);

  void require_ready(const std::string& operation) const {
    require_running(operation);
    const auto status = csts();
    if (status.cfs()) throw error(operation, name_, "controller fatal status (CSTS.CFS = 1): reset the controller");
    if (!status.rdy()) throw error(operation, name_, "controller not ready (CSTS.RDY = 0)");
  }

  void disable();

  /// CC.EN → 0 and wait for CSTS.RDY → 0 (3.5.2); a controller left enabled by someone else
  /// is reset before it is configured.
  void disable_if_enabled();

  void setup_admin_queues();
  void enable();
  void identify_all();
  void negotiate_queues();
  /// Doorbell Buffer Config goes before any I/O queue exists, as Linux does: QEMU 7.2 leaves
  /// EventIdx at 0 for queues that already existed (QEMU.md).
  void configure_shadow_doorbells();
  /// NVMe 1.4+: CMBMSC.CRE makes CMBLOC/CMBSZ readable; CMSE with CBA enables the CMB at
  /// the bus address the backend mapped it at.
  void configure_cmb();
  /// CMBMSC.CMSE with the address the backend mapped the CMB at; again after a reset, where
  /// SQs in the CMB keep their place.
  void enable_cmb_at_mapping();

  struct cmb_block {
    std::byte* pointer;
    std::uint64_t bus;
  };
  /// Page-aligned space in the CMB; it is not given back (CMBs are small and queues few).
  [[nodiscard]] cmb_block take_cmb(std::size_t bytes) {
    if (backend_->cmb() == nullptr) throw error("Place SQ in CMB", name_, "no CMB mapped (open with use_cmb on a controller with CAP.CMBS)");
    const std::size_t page = std::size_t{1} << page_shift_;
    const std::size_t at = (cmb_used_ + page - 1) / page * page;
    if (at + bytes > backend_->cmb_size()) {
      throw error("Place SQ in CMB", name_, std::to_string(bytes) + " bytes do not fit in the CMB's " + std::to_string(backend_->cmb_size()));
    }
    cmb_used_ = at + bytes;
    std::memset(backend_->cmb() + at, 0, bytes);
    return cmb_block{backend_->cmb() + at, backend_->cmb_bus_address() + at};
  }

  /// A queue identifier lent to another process (sharing::controller_owner), and its return:
  /// while any is out, `reset()` is refused (CC.EN = 0 would delete that process's queues).
  [[nodiscard]] std::uint16_t lend_queue_id() {
    const std::uint16_t qid = take_queue_id();
    std::scoped_lock lock(admin_mutex_);
    ++lent_;
    return qid;
  }
  void return_lent_queue_id(std::uint16_t qid) noexcept {
    release_queue_id(qid);
    std::scoped_lock lock(admin_mutex_);
    if (lent_ != 0) --lent_;
  }

  [[nodiscard]] std::uint16_t take_queue_id() {
    if (owner_) return owner_->take_queue_id("Create I/O queue pair");
    std::scoped_lock lock(admin_mutex_);
    for (std::size_t q = 1; q < used_qids_.size(); ++q) {
      if (!used_qids_[q]) {
        used_qids_[q] = true;
        return static_cast<std::uint16_t>(q);
      }
    }
    throw error("Create I/O queue pair", name_, "all " + std::to_string(granted_) + " granted queue pairs are in use");
  }

  std::unique_ptr<register_backend> backend_;
  // Unregistered before the backend unmaps and unpins (members go in reverse order).
  host_registrar gpu_;
  host_registration gpu_bar_, gpu_cmb_;
  std::unique_ptr<registering_allocator> gpu_memory_;
  controller_options options_;
  std::string name_;
  spec::cap_register cap_{};
  spec::version_register vs_{};
  std::chrono::milliseconds ready_timeout_{};
  unsigned page_shift_ = 12;
  admin_queue admin_;
  std::mutex admin_mutex_;
  spec::identify_controller identify_{};
  std::vector<namespace_info> namespaces_;
  std::uint16_t granted_ = 0;
  std::vector<bool> used_qids_;
  std::unique_ptr<dma_buffer> shadow_, event_index_;
  std::unique_ptr<admin_link> owner_;  ///< the admin queue's owner where this process attached
  std::size_t lent_ = 0;               ///< queue identifiers lent to attached processes (under admin_mutex_)
  std::atomic<std::uint64_t> mmio_doorbell_writes_{0}, skipped_doorbell_writes_{0}, unexpected_completions_{0};
  std::size_t cmb_used_ = 0;
  bool shut_down_ = false;
  // Held by reset() throughout, so a queue pair is never destroyed while it is re-created;
  // taken before admin_mutex_ where both are held.
  std::mutex live_mutex_;
  // reset() holds it exclusively; creating and destroying a queue pair hold it shared, so a
  // queue pair is never created or destroyed (its Delete, halt and memory release) while the
  // controller is reset. Taken before every other lock.
  std::shared_mutex state_mutex_;
  std::vector<queue_pair*> live_;
  std::uint64_t resets_ = 0;
  std::atomic<bool> stopped_{false};  // halt() sets it, reset() clears it
};

}  // namespace host
CUNVME_NAMESPACE_END

// queue_pair and the definitions of create_queue_pair, which need the whole controller, then
// the bring-up steps, and the members that stop and restart it (a reset re-creates queue pairs).
#include <cunvme/host/queue/queue_pair.cuh>
#include <cunvme/host/controller/bring_up.cuh>
#include <cunvme/host/controller/recovery.cuh>
