// Host bring-up: takes a controller from reset to ready I/O queue pairs over any register
// backend, and shuts it down cleanly. Every wait is bounded by a timeout derived from CAP.TO
// (or given), and every failure is a `host::error` naming the operation, the device and the
// NVMe status, errno or reason.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/dma_memory.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/register_backend.cuh>
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
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace host {

using namespace std::chrono_literals;

/// Bring-up options; `controller` checks each against its range (`check`) before it touches
/// the device.
struct controller_options {
  std::uint32_t admin_queue_entries = 32;   ///< 2..4096 (and at most CAP.MQES + 1)
  std::uint16_t io_queue_pairs = 16;        ///< 1..65535, asked for with Set Features – Number of Queues
  bool shadow_doorbells = false;            ///< send Doorbell Buffer Config when OACS bit 8 says it is supported
  bool use_cmb = false;                     ///< map the controller memory buffer when CAP.CMBS says there is one
  std::chrono::milliseconds ready_timeout{0};     ///< 0: CAP.TO; else 1 ms..max_timeout
  std::chrono::milliseconds command_timeout{10'000};  ///< 1 ms..max_timeout

  /// The longest timeout taken: a deadline `now() + timeout` must not overflow the clock.
  static constexpr std::chrono::milliseconds max_timeout = std::chrono::hours(24);

  /// Throws `host::error` naming the first option outside its range and its value.
  void check(const std::string& device) const {
    const auto bad = [&](const std::string& what, const std::string& range) {
      throw error("Check controller options", device, what + " is outside " + range);
    };
    if (admin_queue_entries < spec::min_admin_queue_entries || admin_queue_entries > spec::max_admin_queue_entries) {
      bad("admin_queue_entries = " + std::to_string(admin_queue_entries),
          std::to_string(spec::min_admin_queue_entries) + ".." + std::to_string(spec::max_admin_queue_entries));
    }
    // NSQR/NCQR are 0's based and FFFFh is reserved (Set Features – Number of Queues): 0 pairs
    // would be sent as FFFFh.
    if (io_queue_pairs == 0) bad("io_queue_pairs = 0", "1..65535");
    const auto max = std::to_string(max_timeout.count());
    if (ready_timeout.count() < 0 || ready_timeout > max_timeout) {
      bad("ready_timeout = " + std::to_string(ready_timeout.count()) + " ms", "0 (CAP.TO) or 1.." + max + " ms");
    }
    if (command_timeout.count() <= 0 || command_timeout > max_timeout) {
      bad("command_timeout = " + std::to_string(command_timeout.count()) + " ms", "1.." + max + " ms");
    }
  }
};

/// A namespace as Identify Namespace describes it (`describe_namespace`).
///
/// Metadata (LBAF.MS > 0) travels one of two ways, fixed when the namespace was formatted
/// (FLBAS bit 4): with extended LBAs each block's metadata follows its data in the data
/// buffer (`block_bytes()` = lba_size + metadata_size per block); otherwise it lives in a
/// separate buffer the command's MPTR points to, which `queue_pair::read`/`write` take in
/// their metadata overloads.
struct namespace_info {
  std::uint32_t nsid = 0;
  std::uint32_t lba_size = 0;         ///< data bytes per block (2^LBADS)
  std::uint64_t lba_count = 0;        ///< NSZE
  std::uint16_t metadata_size = 0;    ///< LBAF.MS: metadata bytes per block; 0: none
  bool extended_lba = false;          ///< with metadata: it is at the end of each block in the data buffer (FLBAS bit 4)
  std::uint8_t protection_type = 0;   ///< DPS bits 2:0: end-to-end protection information type; 0: none

  /// Data bytes of the namespace (metadata not counted). `describe_namespace` refuses
  /// namespaces whose data and metadata do not fit 64 bits, so this cannot wrap for them.
  [[nodiscard]] std::uint64_t bytes() const noexcept { return std::uint64_t{lba_size} * lba_count; }
  /// Bytes one block occupies in the data buffer: its data, and its metadata with extended LBAs.
  [[nodiscard]] std::uint64_t block_bytes() const noexcept { return std::uint64_t{lba_size} + (extended_lba ? metadata_size : 0u); }
  /// Whether I/O needs a separate metadata buffer (MPTR).
  [[nodiscard]] bool separate_metadata() const noexcept { return metadata_size != 0 && !extended_lba; }
};

/// The namespace `nsid`'s Identify Namespace data as a `namespace_info`. Throws `host::error`
/// (naming `device`) for data no I/O can be built on: FLBAS selecting a format past NLBAF,
/// an LBADS below 9 (the spec's minimum, 512 bytes) or above 31, or a capacity whose bytes
/// (data and metadata) do not fit 64 bits.
[[nodiscard]] inline namespace_info describe_namespace(std::uint32_t nsid, const spec::identify_namespace& id, const std::string& device) {
  const std::string operation = "Identify Namespace " + std::to_string(nsid);
  const unsigned index = id.formatted_lba_index();
  if (index >= id.number_of_lba_formats()) {
    throw error(operation, device, "FLBAS selects LBA format " + std::to_string(index) + " but NLBAF lists only " +
                                       std::to_string(id.number_of_lba_formats()));
  }
  const spec::lba_format format = id.current_lba_format();
  if (format.lbads() < 9 || format.lbads() > 31) {
    throw error(operation, device, "LBA format " + std::to_string(index) + " has LBADS " + std::to_string(format.lbads()) +
                                       " (data size 2^LBADS must be 512 bytes to 2 GiB)");
  }
  namespace_info info;
  info.nsid = nsid;
  info.lba_size = std::uint32_t{1} << format.lbads();
  info.lba_count = id.nsze;
  info.metadata_size = format.ms();
  info.extended_lba = info.metadata_size != 0 && id.metadata_at_end_of_lba();
  info.protection_type = static_cast<std::uint8_t>(id.dps & 0x7u);
  const std::uint64_t stored = std::uint64_t{info.lba_size} + info.metadata_size;
  if (info.lba_count > ~std::uint64_t{0} / stored) {
    throw error(operation, device, std::to_string(info.lba_count) + " blocks of " + std::to_string(stored) + " bytes exceed 2^64 bytes");
  }
  return info;
}

/// Throws `host::error` unless `operation` (Read, Write) can be done right on namespace `ns`
/// by this library, before anything is sent: end-to-end protection information is not
/// handled (PRACT and PRCHK are never set, so the controller would check or return PI the
/// caller did not ask for); separate metadata needs a metadata buffer, and a metadata buffer
/// needs a namespace with separate metadata.
inline void require_transferable(const namespace_info& ns, bool with_metadata_buffer, const std::string& operation, const std::string& device) {
  const std::string what = "namespace " + std::to_string(ns.nsid);
  if (ns.protection_type != 0) {
    throw error(operation, device, what + " has end-to-end protection information enabled (DPS type " + std::to_string(ns.protection_type) +
                                       "), which cunvme does not handle: format it without protection information");
  }
  if (ns.separate_metadata() && !with_metadata_buffer) {
    throw error(operation, device, what + " keeps " + std::to_string(ns.metadata_size) +
                                       " bytes of metadata per block in a separate buffer (MPTR): pass a metadata buffer");
  }
  if (!ns.separate_metadata() && with_metadata_buffer) {
    throw error(operation, device, what + (ns.metadata_size == 0 ? " has no metadata" : " carries its metadata in the data buffer (extended LBAs)") +
                                       ": a separate metadata buffer does not apply");
  }
}

/// Blocks per command when a transfer is split into commands of at most `per_command`: the
/// largest count whose data (`block_bytes` each, metadata included for extended LBAs) and
/// separate metadata (`metadata_bytes` each) are whole dwords, so that every command after
/// the first starts dword aligned as PRP1 and MPTR must (bits 1:0 zero). 0 where none of
/// 1..per_command is (then only a transfer of one command can be done).
[[nodiscard]] inline std::uint64_t dword_aligned_split(std::uint64_t per_command, std::uint64_t block_bytes, std::uint64_t metadata_bytes) noexcept {
  // A multiple of 4 always qualifies: at most three steps down. per_command <= 65536 (NLB).
  while (per_command > 0 && ((per_command * block_bytes) % 4 != 0 || (per_command * metadata_bytes) % 4 != 0)) --per_command;
  return per_command;
}

/// Where a queue pair's queues live.
enum class queue_placement : std::uint8_t {
  host,            ///< both in pinned host memory
  cmb_submission,  ///< the SQ in the controller memory buffer (a GPU then only writes across PCIe), the CQ in host memory
  provided,        ///< memory the caller provides, e.g. GPU memory from `dma_allocator::map_gpu`
};

/// Everything the device side needs to drive one queue pair: a trivially copyable value
/// passed to kernels. Pointers are the GPU-usable ones where the memory has them (pinned
/// mapped host memory, GPU memory, a BAR registered for the GPU) and the host's otherwise.
struct queue_pair_view {
  spec::submission_entry* sq = nullptr;
  spec::completion_entry* cq = nullptr;
  std::uint32_t* sq_doorbell = nullptr;  ///< in BAR0
  std::uint32_t* cq_doorbell = nullptr;
  std::uint32_t* sq_shadow = nullptr;    ///< shadow doorbell and EventIdx slots; nullptr without
  std::uint32_t* cq_shadow = nullptr;
  std::uint32_t* sq_event_index = nullptr;
  std::uint32_t* cq_event_index = nullptr;
  std::uint32_t entries = 0;
  std::uint16_t qid = 0;
};
static_assert(std::is_trivially_copyable_v<queue_pair_view>);

class controller;

/// Polls a condition until it holds or `timeout` passes.
template <class Condition>
[[nodiscard]] bool wait_until(Condition done, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (unsigned spins = 0; !done(); ++spins) {
    if (std::chrono::steady_clock::now() >= until) return done();
    if (spins > 1000) std::this_thread::sleep_for(20us);
  }
  return true;
}

/// One I/O submission/completion queue pair. Host threads use it one at a time (it has no
/// lock); the device side gets its own view of the same queues.
///
/// ```
/// auto qp = ctrl.create_queue_pair(256);
/// host::dma_buffer buf = ctrl.memory().allocate(1 << 20);
/// if (qp->read(1, 0, 2048, buf) != spec::status::successful_completion) …
/// ```
class queue_pair {
 public:
  queue_pair(const queue_pair&) = delete;
  queue_pair& operator=(const queue_pair&) = delete;
  ~queue_pair();

  [[nodiscard]] std::uint16_t id() const noexcept { return qid_; }
  [[nodiscard]] std::uint32_t entries() const noexcept { return entries_; }
  [[nodiscard]] queue_placement placement() const noexcept { return placement_; }
  /// Bus address of the SQ (in the CMB for `cmb_submission`) and of the CQ.
  [[nodiscard]] std::uint64_t sq_bus() const noexcept { return sq_bus_; }
  [[nodiscard]] std::uint64_t cq_bus() const noexcept { return cq_.bus(); }
  [[nodiscard]] spec::submission_entry* sq() const noexcept { return sq_; }
  [[nodiscard]] spec::completion_entry* cq() const noexcept { return reinterpret_cast<spec::completion_entry*>(cq_.data()); }
  /// The queues, doorbells and shadow slots, for the device side.
  [[nodiscard]] queue_pair_view view() const;

  /// Submits one command and waits (bounded) for its completion. The CID is chosen here.
  /// Throws `host::error` on a timeout; returns the completion, whatever its status.
  /// Throws `host::error` on a timeout, or when the queues are in memory the host cannot
  /// address (GPU memory: drive them from the device side); returns the completion,
  /// whatever its status.
  spec::completion_entry execute(spec::submission_entry sqe, const std::string& operation);

  /// Reads `blocks` logical blocks at `lba` of namespace `nsid` into `buffer` at `offset`,
  /// split into commands of at most MDTS. Returns the first failing status, or success.
  /// Each block takes `namespace_info::block_bytes()` of the buffer: its data, and with
  /// extended LBAs its metadata after it. A namespace with separate metadata needs the
  /// overload with a metadata buffer, and one with protection information is refused
  /// (`require_transferable`); both throw `host::error` before anything is sent.
  [[nodiscard]] spec::status read(std::uint32_t nsid, std::uint64_t lba, std::uint64_t blocks, const dma_buffer& buffer,
                                  std::size_t offset = 0) {
    return transfer(spec::nvm_opcode::read, nsid, lba, blocks, buffer, offset, nullptr, 0);
  }
  [[nodiscard]] spec::status write(std::uint32_t nsid, std::uint64_t lba, std::uint64_t blocks, const dma_buffer& buffer,
                                   std::size_t offset = 0) {
    return transfer(spec::nvm_opcode::write, nsid, lba, blocks, buffer, offset, nullptr, 0);
  }
  /// The same on a namespace with separate metadata: `metadata` at `metadata_offset` holds
  /// `metadata_size` bytes per block, dword aligned and contiguous in bus address space (one
  /// MPTR per command).
  [[nodiscard]] spec::status read(std::uint32_t nsid, std::uint64_t lba, std::uint64_t blocks, const dma_buffer& buffer, std::size_t offset,
                                  const dma_buffer& metadata, std::size_t metadata_offset = 0) {
    return transfer(spec::nvm_opcode::read, nsid, lba, blocks, buffer, offset, &metadata, metadata_offset);
  }
  [[nodiscard]] spec::status write(std::uint32_t nsid, std::uint64_t lba, std::uint64_t blocks, const dma_buffer& buffer, std::size_t offset,
                                   const dma_buffer& metadata, std::size_t metadata_offset = 0) {
    return transfer(spec::nvm_opcode::write, nsid, lba, blocks, buffer, offset, &metadata, metadata_offset);
  }
  [[nodiscard]] spec::status flush(std::uint32_t nsid) { return execute(spec::make_flush(nsid), "Flush").status(); }

 private:
  friend class controller;
  queue_pair(controller& c, std::uint16_t qid, std::uint32_t entries, queue_placement placement, dma_buffer cq, dma_buffer sq_memory,
             spec::submission_entry* sq, std::uint64_t sq_bus, dma_buffer lists);

  spec::status transfer(spec::nvm_opcode opcode, std::uint32_t nsid, std::uint64_t lba, std::uint64_t blocks, const dma_buffer& buffer,
                        std::size_t offset, const dma_buffer* metadata, std::size_t metadata_offset);

  controller& ctrl_;
  std::uint16_t qid_;
  std::uint32_t entries_;
  queue_placement placement_;
  dma_buffer cq_;
  dma_buffer sq_memory_;  // empty when the SQ is in the CMB
  spec::submission_entry* sq_;
  std::uint64_t sq_bus_;
  dma_buffer lists_;      // one PRP list for the command in flight
  std::uint32_t sq_tail_ = 0;
  std::uint32_t cq_head_ = 0;
  bool phase_ = true;
  std::uint16_t next_cid_ = 0;
  bool sq_doorbell_rung_ = false;  // DESIGN.md rule 5: a new queue's first doorbell write is MMIO
  bool cq_doorbell_rung_ = false;
};

/// A controller brought up over a register backend.
///
/// ```
/// host::controller ctrl(std::make_unique<host::emu_backend>());
/// for (const auto& ns : ctrl.namespaces()) std::printf("ns %u: %llu blocks\n", ns.nsid, ns.lba_count);
/// auto qp = ctrl.create_queue_pair(1024);
/// ```
class controller {
 public:
  explicit controller(std::unique_ptr<register_backend> backend, controller_options options = {})
      : backend_(std::move(backend)), options_(options) {
    if (!backend_) throw error("Bring up", "(none)", "no register backend");
    name_ = backend_->name();
    options_.check(name_);
    cap_ = spec::cap_register{backend_->read64(spec::to_underlying(spec::register_offset::cap))};
    vs_ = spec::version_register{backend_->read32(spec::to_underlying(spec::register_offset::vs))};
    if (cap_.raw == ~std::uint64_t{0}) throw error("Read CAP", name_, "the BAR reads all ones: the device is gone or not enabled");
    if (!cap_.supports(spec::cap_css::nvm_command_set)) throw error("Bring up", name_, "CAP.CSS lacks the NVM command set");
    ready_timeout_ = options_.ready_timeout.count() != 0 ? options_.ready_timeout : std::chrono::milliseconds(cap_.timeout_ms());
    page_shift_ = 12u + cap_.mpsmin();
    reset();
    setup_admin_queues();
    enable();
    identify_all();
    negotiate_queues();
    if (options_.shadow_doorbells && identify_.supports_doorbell_buffer_config()) configure_shadow_doorbells();
    if (options_.use_cmb && cap_.cmbs()) configure_cmb();
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
  [[nodiscard]] dma_allocator& memory() noexcept { return backend_->memory(); }
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
  [[nodiscard]] std::uint16_t io_queue_pairs_granted() const noexcept { return granted_; }
  [[nodiscard]] bool shadow_doorbells() const noexcept { return static_cast<bool>(shadow_); }
  [[nodiscard]] const controller_options& options() const noexcept { return options_; }

  /// Sends an admin command and waits (bounded) for its completion, whatever its status.
  /// Throws when the controller is not ready, is fatal, or does not answer in time.
  spec::completion_entry admin_command(spec::submission_entry sqe, const std::string& operation) {
    std::scoped_lock lock(admin_mutex_);
    require_ready(operation);
    const std::uint16_t cid = admin_cid_++;
    sqe.set_cid(cid);
    admin_sq()[admin_tail_] = sqe;
    admin_tail_ = (admin_tail_ + 1) % options_.admin_queue_entries;
    // Rule 1 of DESIGN.md: the SQE is complete before the doorbell (release store).
    backend_->write32(spec::sq_tail_doorbell_offset(0, cap_.dstrd()), admin_tail_);
    bool cq_rung = true;  // the admin queue has no shadow doorbell: every write is MMIO
    return await(admin_cq_.data(), admin_head_, admin_phase_, options_.admin_queue_entries, 0, cid, cq_rung, operation);
  }

  /// `admin_command`, throwing `host::error` with the NVMe status when it is not success.
  spec::completion_entry admin(spec::submission_entry sqe, const std::string& operation) {
    const auto cqe = admin_command(sqe, operation);
    if (cqe.status() != spec::status::successful_completion) throw error(operation, name_, cqe.status());
    return cqe;
  }

  /// Creates an I/O queue pair of `entries` entries (2..MQES+1) with its queues placed as asked.
  [[nodiscard]] std::unique_ptr<queue_pair> create_queue_pair(std::uint32_t entries, queue_placement placement = queue_placement::host) {
    if (placement == queue_placement::provided) {
      throw error("Create I/O queue pair", name_, "provided placement takes the queues' memory: use the overload with two buffers");
    }
    return make_queue_pair(entries, placement, dma_buffer{}, dma_buffer{});
  }

  /// Creates an I/O queue pair in memory the caller provides (GPU memory from
  /// `memory().map_gpu(...)`, say): `sq` holds `entries` × 64 bytes, `cq` `entries` × 16,
  /// each contiguous in bus address space.
  [[nodiscard]] std::unique_ptr<queue_pair> create_queue_pair(std::uint32_t entries, dma_buffer sq, dma_buffer cq) {
    if (sq.size() < std::size_t{entries} * sizeof(spec::submission_entry) || cq.size() < std::size_t{entries} * sizeof(spec::completion_entry)) {
      throw error("Create I/O queue pair", name_, "the provided memory is smaller than " + std::to_string(entries) + " entries");
    }
    return make_queue_pair(entries, queue_placement::provided, std::move(sq), std::move(cq));
  }

 private:
  [[nodiscard]] std::unique_ptr<queue_pair> make_queue_pair(std::uint32_t entries, queue_placement placement, dma_buffer provided_sq,
                                                           dma_buffer provided_cq) {
    if (entries < 2 || entries > 65536) {
      throw error("Create I/O queue pair", name_, "a queue holds 2 to 65536 entries, not " + std::to_string(entries));
    }
    const std::uint16_t qid = take_queue_id();
    try {
      dma_buffer cq = placement == queue_placement::provided ? std::move(provided_cq)
                                                             : memory().allocate(std::size_t{entries} * sizeof(spec::completion_entry), page_bytes());
      dma_buffer sq_memory;
      spec::submission_entry* sq = nullptr;
      std::uint64_t sq_bus = 0;
      if (placement == queue_placement::provided) {
        sq_memory = std::move(provided_sq);
        sq = reinterpret_cast<spec::submission_entry*>(sq_memory.data() != nullptr ? sq_memory.data()
                                                                                    : static_cast<std::byte*>(sq_memory.device_data()));
        sq_bus = sq_memory.bus();
      } else if (placement == queue_placement::cmb_submission) {
        const auto [pointer, bus] = take_cmb(std::size_t{entries} * sizeof(spec::submission_entry));
        sq = reinterpret_cast<spec::submission_entry*>(pointer);
        sq_bus = bus;
      } else {
        sq_memory = memory().allocate(std::size_t{entries} * sizeof(spec::submission_entry), page_bytes());
        sq = reinterpret_cast<spec::submission_entry*>(sq_memory.data());
        sq_bus = sq_memory.bus();
      }
      require_contiguous(cq, "Create I/O CQ " + std::to_string(qid));
      if (sq_memory) require_contiguous(sq_memory, "Create I/O SQ " + std::to_string(qid));
      require_page_aligned(cq.bus(), "Create I/O CQ " + std::to_string(qid));
      require_page_aligned(sq_bus, "Create I/O SQ " + std::to_string(qid));
      // The worst-case start needs one page more than MDTS; an unlimited MDTS saturates
      // instead of wrapping to a tiny list.
      const std::uint64_t page = std::uint64_t{1} << page_shift_;
      const std::uint64_t span = max_transfer_bytes() > ~std::uint64_t{0} - page ? ~std::uint64_t{0} : max_transfer_bytes() + page;
      const std::uint64_t list_entries = std::max<std::uint64_t>(1, prp::list_entries_needed(0, span, page_shift_));
      dma_buffer lists = memory().allocate(static_cast<std::size_t>(list_entries * 8), page_bytes());
      start_shadow_doorbells(qid);
      admin(spec::make_create_io_cq(qid, entries, cq.bus()), "Create I/O CQ " + std::to_string(qid));
      try {
        admin(spec::make_create_io_sq(qid, entries, sq_bus, qid), "Create I/O SQ " + std::to_string(qid));
      } catch (const error&) {
        (void)admin_command(spec::make_delete_io_cq(qid), "Delete I/O CQ " + std::to_string(qid));
        throw;
      }
      return std::unique_ptr<queue_pair>(
          new queue_pair(*this, qid, entries, placement, std::move(cq), std::move(sq_memory), sq, sq_bus, std::move(lists)));
    } catch (...) {
      release_queue_id(qid);
      throw;
    }
  }

 public:

  /// Deletes every queue, announces a normal shutdown (CC.SHN), waits for CSTS.SHST, and
  /// disables the controller. Queue pairs must be destroyed first.
  void shutdown() {
    if (shut_down_) return;
    shut_down_ = true;
    const auto cc_off = spec::to_underlying(spec::register_offset::cc);
    if (csts().rdy() && !csts().cfs()) {
      backend_->write32(cc_off, spec::cc_register{backend_->read32(cc_off)}.set_shn(spec::shutdown_notification::normal).raw);
      if (!wait_until([&] { return csts().shst() == spec::shutdown_status::shutdown_complete; }, ready_timeout_)) {
        disable();
        throw error("Shutdown", name_, "CSTS.SHST did not report shutdown complete within " + std::to_string(ready_timeout_.count()) + " ms");
      }
    }
    disable();
  }

  /// Reads `bytes` of log page `lid` (Get Log Page) into host memory.
  [[nodiscard]] std::vector<std::byte> log_page(spec::log_page_id lid, std::size_t bytes, std::uint32_t nsid = 0xffffffffu) {
    // NUMD (NUMDU:NUMDL) is a 0's based count of dwords in 32 bits.
    if (bytes == 0 || bytes % 4 != 0 || bytes / 4 > (std::uint64_t{1} << 32)) {
      throw error("Get Log Page " + std::to_string(static_cast<unsigned>(lid)), name_,
                  std::to_string(bytes) + " bytes: a log page read is a whole number of dwords, 4 bytes to 16 GiB");
    }
    dma_buffer buf = memory().allocate(bytes, page_bytes());
    const std::uint64_t entries = prp::list_entries_needed(buf.bus(), bytes, page_shift_);  // ≤ 2^53 for any valid page
    dma_buffer list = memory().allocate(static_cast<std::size_t>(std::max<std::uint64_t>(entries, 1) * 8), page_bytes());
    auto sqe = spec::make_get_log_page(lid, bytes, 0, 0, 0, nsid);
    fill_prps(sqe, buf, 0, bytes, list);
    admin(sqe, "Get Log Page " + std::to_string(static_cast<unsigned>(lid)));
    return std::vector<std::byte>(buf.data(), buf.data() + bytes);
  }

  // ---- used by queue_pair ------------------------------------------------------------------
  /// Writes a doorbell: through the shadow buffer and only then, if EventIdx asks, MMIO (5.8).
  /// `first`: the queue's first write, which goes to MMIO whatever EventIdx says (DESIGN.md
  /// rule 5): a controller may not look at a new queue's shadow slot before it is rung once
  /// (QEMU does not), and an EventIdx it has not written yet for this queue proves nothing.
  void ring(std::uint16_t qid, bool is_cq, std::uint32_t new_value, std::uint32_t old_value, bool first = false) {
    const std::uint32_t mmio = is_cq ? spec::cq_head_doorbell_offset(qid, cap_.dstrd()) : spec::sq_tail_doorbell_offset(qid, cap_.dstrd());
    const auto [shadow, event] = qid == 0 ? std::pair<std::uint32_t*, std::uint32_t*>{} : shadow_slots(qid, is_cq);
    if (shadow == nullptr) {
      backend_->write32(mmio, new_value);
      return;
    }
    // The shadow store must be visible before EventIdx is read, or both sides can miss each
    // other's update (SPDK and Linux put a full barrier here): two sequentially consistent
    // operations are never reordered store-before-load.
    std::atomic_ref<std::uint32_t>(*shadow).store(new_value, std::memory_order_seq_cst);
    const std::uint32_t ev = std::atomic_ref<std::uint32_t>(*event).load(std::memory_order_seq_cst);
    if (first || spec::shadow_doorbell_needs_mmio(static_cast<std::uint16_t>(ev), static_cast<std::uint16_t>(new_value),
                                                  static_cast<std::uint16_t>(old_value))) {
      backend_->write32(mmio, new_value);
      mmio_doorbell_writes_.fetch_add(1, std::memory_order_relaxed);
    } else {
      skipped_doorbell_writes_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  /// I/O doorbell updates that went to MMIO, and those the shadow buffer's EventIdx let the
  /// host skip (queue pairs on several threads update these at once).
  [[nodiscard]] std::uint64_t mmio_doorbell_writes() const noexcept { return mmio_doorbell_writes_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t skipped_doorbell_writes() const noexcept { return skipped_doorbell_writes_.load(std::memory_order_relaxed); }
  /// CQEs the host's own waits (admin commands, `queue_pair::execute`) consumed and dropped
  /// because their CID (or SQ identifier) was not the command in flight (DESIGN.md rule 4).
  [[nodiscard]] std::uint64_t unexpected_completions() const noexcept { return unexpected_completions_.load(std::memory_order_relaxed); }

  /// The shadow doorbell and EventIdx slots of a queue's doorbell; nullptrs without them, and
  /// for a doorbell whose slot lies past the buffers' one memory page (5.8; a large CAP.DSTRD or
  /// many queues): that queue rings by MMIO only.
  [[nodiscard]] std::pair<std::uint32_t*, std::uint32_t*> shadow_slots(std::uint16_t qid, bool is_cq) const {
    if (!shadow_) return {nullptr, nullptr};
    const std::size_t slot = (2u * qid + (is_cq ? 1u : 0u)) * (spec::doorbell_stride_bytes(cap_.dstrd()) / 4);
    if ((slot + 1) * 4 > shadow_->size() || (slot + 1) * 4 > event_index_->size()) return {nullptr, nullptr};
    return {reinterpret_cast<std::uint32_t*>(shadow_->data()) + slot, reinterpret_cast<std::uint32_t*>(event_index_->data()) + slot};
  }

  /// Waits for the completion of command `cid` (the only one in flight) on the CQ of queue
  /// `qid`, consuming CQEs from `head` and ringing the CQ head doorbell after each. A CQE for
  /// any other CID or SQ is counted and dropped, never returned (DESIGN.md rule 4), and the
  /// wait goes on; the whole wait is bounded by the command timeout. `cq_rung`: whether the
  /// CQ head doorbell was written before (the first write is MMIO, rule 5).
  spec::completion_entry await(std::byte* cq_memory, std::uint32_t& head, bool& phase, std::uint32_t entries, std::uint16_t qid,
                               std::uint16_t cid, bool& cq_rung, const std::string& operation) {
    const auto until = std::chrono::steady_clock::now() + options_.command_timeout;
    for (;;) {
      auto* slot = cq_memory + std::size_t{head} * sizeof(spec::completion_entry);
      auto& dw3 = *reinterpret_cast<std::uint32_t*>(slot + 12);
      // Rule 2: the phase tag (in DW3) is read with acquire before any other field.
      const auto arrived = [&] { return ((std::atomic_ref<std::uint32_t>(dw3).load(std::memory_order_acquire) >> 16) & 1u) == (phase ? 1u : 0u); };
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (!wait_until(arrived, std::max(left, std::chrono::milliseconds(0)))) {
        const auto status = csts();
        throw error(operation, name_,
                    status.cfs() ? std::string("controller fatal status (CSTS.CFS) while waiting for the completion")
                                 : "no completion within " + std::to_string(options_.command_timeout.count()) + " ms");
      }
      spec::completion_entry cqe;
      std::memcpy(&cqe, slot, sizeof cqe);
      const std::uint32_t old = head;
      head = head + 1 == entries ? 0 : head + 1;
      if (head == 0) phase = !phase;
      ring(qid, true, head, old, !cq_rung);
      cq_rung = true;
      if (cqe.cid == cid && cqe.sqid == qid) return cqe;
      unexpected_completions_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  /// PRP1/PRP2 for `bytes` of `buffer` at `offset`, with a list in `lists` (page-aligned
  /// DMA memory that must outlive the command) when the transfer spans more than two pages.
  void fill_prps(spec::submission_entry& sqe, const dma_buffer& buffer, std::size_t offset, std::uint64_t bytes, const dma_buffer& lists) {
    // page_list reads the page of every byte it maps: the range must lie inside the buffer.
    if (offset > buffer.size() || bytes > buffer.size() - offset) {
      throw error("Build PRPs", name_, std::to_string(bytes) + " bytes at offset " + std::to_string(offset) + " do not fit the " +
                                           std::to_string(buffer.size()) + "-byte buffer");
    }
    if (buffer.page_size() == 0 || (buffer.page_size() & (buffer.page_size() - 1)) != 0) {
      throw error("Build PRPs", name_, "the buffer's page size " + std::to_string(buffer.page_size()) + " is not a power of two");
    }
    const std::uint64_t list_capacity = std::min<std::uint64_t>(lists.size() / 8, ~std::uint32_t{0});
    prp::list_memory list{reinterpret_cast<std::uint64_t*>(lists.data()), lists.bus(), static_cast<std::uint32_t>(list_capacity)};
    // List memory needs each controller page contiguous, not the whole of it (4.1.1): chain
    // pointers then take each page's own bus address.
    std::vector<std::uint64_t> list_pages;
    if (!lists.contiguous(0, lists.size())) {
      list_pages = lists.bus_pages(page_bytes());
      if (list_pages.empty()) {
        throw error("Build PRPs", name_, "a " + std::to_string(page_bytes()) + "-byte page of the PRP list memory is not one aligned bus range");
      }
      list.pages = list_pages.data();
    }
    unsigned buffer_shift = 0;
    while ((std::size_t{1} << buffer_shift) < buffer.page_size()) ++buffer_shift;
    prp::prp_entries e;
    // A buffer that is one bus range (the emulator's, VFIO's, a huge page) serves any
    // controller page size; one listed page by page only pages at least as large.
    const auto r = bytes != 0 && buffer.contiguous(offset, bytes)
                       ? prp::build(prp::contiguous{buffer.bus(offset) - offset}, offset, bytes, page_shift_, list, e)
                       : prp::build(prp::page_list{buffer.pages().data(), buffer_shift}, offset, bytes, page_shift_, list, e);
    if (r != prp::build_result::ok) throw error("Build PRPs", name_, build_failure(r, buffer.page_size(), lists.size()));
    sqe.prp1 = e.prp1;
    sqe.prp2 = e.prp2;
  }

  /// Why `prp::build` refused, for a `host::error` (every result named: a new one must be added here).
  [[nodiscard]] std::string build_failure(prp::build_result r, std::size_t buffer_page, std::size_t list_bytes) const {
    const std::string controller_page = std::to_string(std::uint64_t{1} << page_shift_);
    switch (r) {
      case prp::build_result::ok: return "no error";
      case prp::build_result::unaligned_start: return "the buffer offset is not dword aligned (PRP1 bits 1:0 must be zero)";
      case prp::build_result::pages_misaligned:
        return "the buffer's " + std::to_string(buffer_page) + "-byte pages do not line up with the controller's " + controller_page +
               "-byte pages (smaller, or not aligned to them)";
      case prp::build_result::list_too_small:
        return "the transfer needs more PRP list entries than the " + std::to_string(list_bytes) + "-byte PRP list memory holds";
      case prp::build_result::list_misaligned: return "the PRP list memory is not aligned to the controller's " + controller_page + "-byte page";
      case prp::build_result::invalid_page_size:
        return "page sizes out of range (controller page " + controller_page + " bytes, buffer page " + std::to_string(buffer_page) +
               " bytes; 4 KiB..128 MiB and 4 KiB..2^63 allowed)";
      case prp::build_result::range_overflow: return "the buffer range or the PRP list's bus range does not fit 64 bits";
    }
    return "unknown PRP build result " + std::to_string(static_cast<unsigned>(r));
  }

  void release_queue_id(std::uint16_t qid) {
    std::scoped_lock lock(admin_mutex_);
    used_qids_.at(qid) = false;
  }

 private:
  /// A queue's base must be on a controller page (CC.MPS; Create I/O SQ/CQ, 5.4/5.5): the
  /// controller answers Invalid PRP Offset otherwise.
  void require_page_aligned(std::uint64_t bus, const std::string& operation) const {
    if (bus % page_bytes() != 0) {
      throw error(operation, name_, "the queue's bus address " + std::to_string(bus) + " is not on a " + std::to_string(page_bytes()) + "-byte controller page (CC.MPS)");
    }
  }

  /// Queues are created physically contiguous (PC = 1; CAP.CQR): one bus range.
  void require_contiguous(const dma_buffer& queue, const std::string& operation) const {
    if (!queue.contiguous(0, queue.size())) {
      // A 2 MiB huge page is the most physically contiguous memory pinned pages give: a hint
      // to reserve them helps only queues that fit one.
      constexpr std::size_t huge_page = std::size_t{2} << 20;
      throw error(operation, name_, "the queue's " + std::to_string(queue.size()) + " bytes are not contiguous in bus address space: " +
                                        (queue.size() <= huge_page ? "reserve huge pages (/proc/sys/vm/nr_hugepages) or use a smaller queue"
                                                                   : "a queue over 2 MiB needs an IOMMU (vfio:, or kmod: with the IOMMU on); use a smaller queue"));
    }
  }

  [[nodiscard]] spec::submission_entry* admin_sq() const { return reinterpret_cast<spec::submission_entry*>(admin_sq_.data()); }

  /// A new queue's shadow doorbell and EventIdx slots start from the host's values (DESIGN.md
  /// rule 5), written before the queue exists: a deleted queue with the same identifier left
  /// its own there, and a stale EventIdx makes the EventIdx rule skip MMIO writes the
  /// controller is waiting for (QEMU then never runs the first command).
  void start_shadow_doorbells(std::uint16_t qid) {
    if (!shadow_) return;
    for (const bool is_cq : {false, true}) {
      const auto [shadow, event] = shadow_slots(qid, is_cq);
      if (shadow == nullptr) continue;
      std::atomic_ref<std::uint32_t>(*shadow).store(0, std::memory_order_seq_cst);
      std::atomic_ref<std::uint32_t>(*event).store(0, std::memory_order_seq_cst);
    }
  }

  void require_ready(const std::string& operation) const {
    const auto status = csts();
    if (status.cfs()) throw error(operation, name_, "controller fatal status (CSTS.CFS = 1): reset the controller");
    if (!status.rdy()) throw error(operation, name_, "controller not ready (CSTS.RDY = 0)");
  }

  void disable() {
    const auto cc_off = spec::to_underlying(spec::register_offset::cc);
    backend_->write32(cc_off, spec::cc_register{backend_->read32(cc_off)}.set_en(false).raw);
    if (!wait_until([&] { return !csts().rdy(); }, ready_timeout_)) {
      throw error("Disable", name_, "CSTS.RDY still 1 " + std::to_string(ready_timeout_.count()) + " ms after CC.EN was cleared");
    }
  }

  /// CC.EN → 0 and wait for CSTS.RDY → 0 (3.5.2); a controller left enabled by someone else
  /// is reset before it is configured.
  void reset() {
    if (spec::cc_register{backend_->read32(spec::to_underlying(spec::register_offset::cc))}.en() || csts().rdy()) disable();
  }

  void setup_admin_queues() {
    const std::uint32_t n = options_.admin_queue_entries;
    if (n < spec::min_admin_queue_entries || n > spec::max_admin_queue_entries || n > cap_.max_queue_entries()) {
      throw error("Set up admin queues", name_, std::to_string(n) + " entries is outside 2.." + std::to_string(std::min<std::uint32_t>(4096, cap_.max_queue_entries())));
    }
    // ASQ and ACQ must be on a CC.MPS page, not only the 4 KiB their registers can express:
    // a controller with CAP.MPSMIN > 0 fails CC.EN = 1 otherwise (QEMU sets CSTS.CFS).
    admin_sq_ = memory().allocate(std::size_t{n} * sizeof(spec::submission_entry), page_bytes());
    admin_cq_ = memory().allocate(std::size_t{n} * sizeof(spec::completion_entry), page_bytes());
    require_contiguous(admin_sq_, "Set up the admin SQ");
    require_contiguous(admin_cq_, "Set up the admin CQ");
    const auto size = static_cast<std::uint16_t>(n - 1);
    backend_->write32(spec::to_underlying(spec::register_offset::aqa), spec::aqa_register{}.set_asqs(size).set_acqs(size).raw);
    backend_->write64(spec::to_underlying(spec::register_offset::asq), admin_sq_.bus());
    backend_->write64(spec::to_underlying(spec::register_offset::acq), admin_cq_.bus());
  }

  void enable() {
    const auto cc = spec::cc_register{}
                        .set_iosqes(spec::submission_entry_size_log2)
                        .set_iocqes(spec::completion_entry_size_log2)
                        .set_mps(static_cast<std::uint8_t>(page_shift_ - 12))
                        .set_css(spec::cc_css::nvm_command_set)
                        .set_ams(spec::cc_ams::round_robin)
                        .set_en(true);
    backend_->write32(spec::to_underlying(spec::register_offset::cc), cc.raw);
    // CSTS.CFS during bring-up is reported at once, not waited on (3.5.1).
    if (!wait_until([&] { return csts().rdy() || csts().cfs(); }, ready_timeout_)) {
      throw error("Enable", name_, "controller not ready: CSTS.RDY not set within " + std::to_string(ready_timeout_.count()) + " ms (CAP.TO " +
                                       std::to_string(cap_.timeout_ms()) + " ms)");
    }
    if (csts().cfs()) throw error("Enable", name_, "controller fatal status (CSTS.CFS = 1) while enabling");
  }

  void identify_all() {
    dma_buffer page = memory().allocate(4096, page_bytes());
    admin(spec::make_identify(spec::identify_cns::controller, 0, page.bus()), "Identify Controller");
    std::memcpy(&identify_, page.data(), sizeof identify_);
    admin(spec::make_identify(spec::identify_cns::active_namespace_list, 0, page.bus()), "Identify Active Namespace List");
    spec::active_namespace_list list;
    std::memcpy(&list, page.data(), sizeof list);
    for (std::uint32_t nsid : list.nsid) {
      if (nsid == 0) break;
      admin(spec::make_identify(spec::identify_cns::namespace_data, nsid, page.bus()), "Identify Namespace " + std::to_string(nsid));
      spec::identify_namespace ns;
      std::memcpy(&ns, page.data(), sizeof ns);
      namespaces_.push_back(describe_namespace(nsid, ns, name_));
    }
  }

  void negotiate_queues() {
    const auto cqe = admin(spec::make_set_number_of_queues(options_.io_queue_pairs, options_.io_queue_pairs), "Set Features Number of Queues");
    const auto sqs = spec::number_of_queues_fields::nsqr::get(cqe.dw0) + 1u;
    const auto cqs = spec::number_of_queues_fields::ncqr::get(cqe.dw0) + 1u;
    granted_ = static_cast<std::uint16_t>(std::min<std::uint32_t>({sqs, cqs, options_.io_queue_pairs}));
    used_qids_.assign(granted_ + 1u, false);
    used_qids_[0] = true;
  }

  /// Doorbell Buffer Config goes before any I/O queue exists, as Linux does: QEMU 7.2 leaves
  /// EventIdx at 0 for queues that already existed (QEMU.md).
  void configure_shadow_doorbells() {
    const std::size_t page = std::size_t{1} << page_shift_;
    shadow_ = std::make_unique<dma_buffer>(memory().allocate(page, page));
    event_index_ = std::make_unique<dma_buffer>(memory().allocate(page, page));
    admin(spec::make_doorbell_buffer_config(shadow_->bus(), event_index_->bus()), "Doorbell Buffer Config");
  }

  /// NVMe 1.4+: CMBMSC.CRE makes CMBLOC/CMBSZ readable; CMSE with CBA enables the CMB at
  /// the bus address the backend mapped it at.
  void configure_cmb() {
    const auto msc = spec::to_underlying(spec::register_offset::cmbmsc);
    backend_->write64(msc, spec::cmbmsc_register{}.set_cre(true).raw);
    // A controller that updates registers asynchronously (the emulator polls) shows CMBSZ a
    // moment after CRE; a bounded wait costs nothing where it is immediate.
    const auto cmbsz = [&] { return spec::cmbsz_register{backend_->read32(spec::to_underlying(spec::register_offset::cmbsz))}; };
    if (!wait_until([&] { return cmbsz().raw != 0; }, 1000ms)) throw error("Map CMB", name_, "CAP.CMBS is set but CMBSZ reads 0 after CMBMSC.CRE");
    const spec::cmbloc_register loc{backend_->read32(spec::to_underlying(spec::register_offset::cmbloc))};
    const spec::cmbsz_register sz = cmbsz();
    if (!sz.sqs()) throw error("Map CMB", name_, "the CMB cannot hold submission queues (CMBSZ.SQS = 0)");
    backend_->map_cmb(loc.bir(), std::uint64_t{loc.ofst()} * sz.unit_bytes(), sz.size_bytes());
    backend_->write64(msc, spec::cmbmsc_register{}.set_cre(true).set_cmse(true).set_controller_base_address(backend_->cmb_bus_address()).raw);
    // Any admin command completes after the controller has taken CMBMSC in.
    (void)admin(spec::make_get_features(spec::feature_id::number_of_queues), "Get Features Number of Queues");
    if (backend_->read32(spec::to_underlying(spec::register_offset::cmbsts)) & 1u) {
      throw error("Map CMB", name_, "the controller refused the CMB base address (CMBSTS.CBAI)");
    }
    cmb_used_ = 0;
  }

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

  [[nodiscard]] std::uint16_t take_queue_id() {
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
  controller_options options_;
  std::string name_;
  spec::cap_register cap_{};
  spec::version_register vs_{};
  std::chrono::milliseconds ready_timeout_{};
  unsigned page_shift_ = 12;
  dma_buffer admin_sq_, admin_cq_;
  std::mutex admin_mutex_;
  std::uint32_t admin_tail_ = 0, admin_head_ = 0;
  bool admin_phase_ = true;
  std::uint16_t admin_cid_ = 0;
  spec::identify_controller identify_{};
  std::vector<namespace_info> namespaces_;
  std::uint16_t granted_ = 0;
  std::vector<bool> used_qids_;
  std::unique_ptr<dma_buffer> shadow_, event_index_;
  std::atomic<std::uint64_t> mmio_doorbell_writes_{0}, skipped_doorbell_writes_{0}, unexpected_completions_{0};
  std::size_t cmb_used_ = 0;
  bool shut_down_ = false;
};

// ---- queue_pair ------------------------------------------------------------------------------

inline queue_pair::queue_pair(controller& c, std::uint16_t qid, std::uint32_t entries, queue_placement placement, dma_buffer cq,
                              dma_buffer sq_memory, spec::submission_entry* sq, std::uint64_t sq_bus, dma_buffer lists)
    : ctrl_(c), qid_(qid), entries_(entries), placement_(placement), cq_(std::move(cq)), sq_memory_(std::move(sq_memory)), sq_(sq),
      sq_bus_(sq_bus), lists_(std::move(lists)) {}

inline queue_pair::~queue_pair() {
  // SQ before CQ: a CQ still in use cannot be deleted (Invalid Queue Deletion, 5.7).
  try {
    (void)ctrl_.admin_command(spec::make_delete_io_sq(qid_), "Delete I/O SQ " + std::to_string(qid_));
    (void)ctrl_.admin_command(spec::make_delete_io_cq(qid_), "Delete I/O CQ " + std::to_string(qid_));
  } catch (const error&) {
    // The controller is gone or fatal; its reset deletes the queues anyway.
  }
  ctrl_.release_queue_id(qid_);
}

inline queue_pair_view queue_pair::view() const {
  queue_pair_view v;
  // The GPU-usable address where the memory has one, the host's otherwise.
  v.cq = static_cast<spec::completion_entry*>(cq_.device_data() != nullptr ? cq_.device_data() : static_cast<void*>(cq_.data()));
  v.sq = sq_memory_ && sq_memory_.device_data() != nullptr ? static_cast<spec::submission_entry*>(sq_memory_.device_data()) : sq_;
  auto& backend = ctrl_.backend();
  const unsigned dstrd = ctrl_.cap().dstrd();
  v.sq_doorbell = reinterpret_cast<std::uint32_t*>(backend.bar() + spec::sq_tail_doorbell_offset(qid_, dstrd));
  v.cq_doorbell = reinterpret_cast<std::uint32_t*>(backend.bar() + spec::cq_head_doorbell_offset(qid_, dstrd));
  std::tie(v.sq_shadow, v.sq_event_index) = ctrl_.shadow_slots(qid_, false);
  std::tie(v.cq_shadow, v.cq_event_index) = ctrl_.shadow_slots(qid_, true);
  v.entries = entries_;
  v.qid = qid_;
  return v;
}

inline spec::completion_entry queue_pair::execute(spec::submission_entry sqe, const std::string& operation) {
  if (cq_.data() == nullptr || sq_memory_.location() == memory_location::gpu) {
    throw error(operation, ctrl_.name(), "I/O queue " + std::to_string(qid_) + " is in GPU memory: drive it from the device side");
  }
  // One command at a time here, so the slot's index is a unique CID.
  sqe.set_cid(next_cid_++);
  sq_[sq_tail_] = sqe;
  const std::uint32_t old = sq_tail_;
  sq_tail_ = sq_tail_ + 1 == entries_ ? 0 : sq_tail_ + 1;
  ctrl_.ring(qid_, false, sq_tail_, old, !sq_doorbell_rung_);
  sq_doorbell_rung_ = true;
  return ctrl_.await(cq_.data(), cq_head_, phase_, entries_, qid_, sqe.cid(), cq_doorbell_rung_,
                     operation + " on I/O queue " + std::to_string(qid_));
}

inline spec::status queue_pair::transfer(spec::nvm_opcode opcode, std::uint32_t nsid, std::uint64_t lba, std::uint64_t blocks,
                                         const dma_buffer& buffer, std::size_t offset, const dma_buffer* metadata, std::size_t metadata_offset) {
  const std::string operation = opcode == spec::nvm_opcode::read ? "Read" : "Write";
  const namespace_info& ns = ctrl_.namespace_by_id(nsid);
  require_transferable(ns, metadata != nullptr, operation, ctrl_.name());
  // Extended LBAs: the controller moves data and metadata, block_bytes() per block, through
  // the PRPs. The comparisons divide, so no product can wrap.
  const std::uint64_t block = ns.block_bytes();
  if (offset > buffer.size() || blocks > (buffer.size() - offset) / block) {
    throw error(operation, ctrl_.name(),
                std::to_string(blocks) + " blocks of " + std::to_string(block) + " bytes" +
                    (ns.extended_lba ? " (" + std::to_string(ns.lba_size) + " data + " + std::to_string(ns.metadata_size) + " metadata)" : "") +
                    " do not fit the buffer of " + std::to_string(buffer.size()) + " bytes at offset " + std::to_string(offset));
  }
  // The last LBA, lba + blocks - 1, must not wrap: the controller would see a range that starts
  // near 2^64 and, split into commands, continues at LBA 0.
  if (blocks != 0 && lba > ~std::uint64_t{0} - (blocks - 1)) {
    throw error(operation, ctrl_.name(), std::to_string(blocks) + " blocks at LBA " + std::to_string(lba) + " run past LBA 2^64 - 1");
  }
  const std::uint64_t metadata_block = metadata != nullptr ? ns.metadata_size : 0u;
  if (metadata != nullptr && blocks > 0) {
    if (metadata_offset % 4 != 0) throw error(operation, ctrl_.name(), "the metadata buffer offset is not dword aligned (MPTR)");
    if (metadata_offset > metadata->size() || blocks > (metadata->size() - metadata_offset) / metadata_block) {
      throw error(operation, ctrl_.name(), std::to_string(blocks) + " blocks of " + std::to_string(metadata_block) +
                                               " metadata bytes do not fit the metadata buffer of " + std::to_string(metadata->size()) +
                                               " bytes at offset " + std::to_string(metadata_offset));
    }
    // One MPTR per command addresses one bus range (PSDT 00b).
    if (!metadata->contiguous(metadata_offset, blocks * metadata_block)) {
      throw error(operation, ctrl_.name(), "the metadata buffer's " + std::to_string(blocks * metadata_block) +
                                               " bytes are not contiguous in bus address space (MPTR addresses one range)");
    }
  }
  // MDTS counts metadata interleaved with the data, not a separate metadata buffer.
  std::uint64_t per_command = std::min<std::uint64_t>(ctrl_.max_transfer_bytes() / block, spec::rw_fields::max_blocks);
  if (per_command == 0) {
    throw error(operation, ctrl_.name(), "MDTS (" + std::to_string(ctrl_.max_transfer_bytes()) + " bytes) is smaller than one " +
                                             std::to_string(block) + "-byte block");
  }
  // Split so that no later command starts unaligned: refused there, it would leave the
  // transfer partly done.
  if (blocks > per_command) {
    per_command = dword_aligned_split(per_command, block, metadata_block);
    if (per_command == 0) {
      throw error(operation, ctrl_.name(), std::to_string(blocks) + " blocks of " + std::to_string(block) +
                                               " bytes need several commands under MDTS (" + std::to_string(ctrl_.max_transfer_bytes()) +
                                               " bytes), and no split starts every command dword aligned");
    }
  }
  while (blocks > 0) {
    const std::uint64_t n = std::min(blocks, per_command);
    auto sqe = spec::make_rw(opcode, nsid, lba, static_cast<std::uint32_t>(n));
    ctrl_.fill_prps(sqe, buffer, offset, n * block, lists_);
    if (metadata != nullptr) sqe.mptr = metadata->bus(metadata_offset);
    const auto cqe = execute(sqe, operation);
    if (cqe.status() != spec::status::successful_completion) return cqe.status();
    lba += n;
    blocks -= n;
    offset += n * block;
    metadata_offset += n * metadata_block;
  }
  return spec::status::successful_completion;
}

}  // namespace host
CUNVME_NAMESPACE_END
