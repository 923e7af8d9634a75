// The emulated controller's admin command set (NVMe 2.0 base specification 5): Identify,
// Get/Set Features, Create/Delete I/O Completion and Submission Queue, Get Log Page, Doorbell
// Buffer Config, Abort and Asynchronous Event Request.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/emu/dma_space.cuh>
#include <cunvme/emu/events.cuh>
#include <cunvme/emu/nvm_commands.cuh>
#include <cunvme/spec/command_fields.cuh>
#include <cunvme/spec/identify.cuh>
#include <cunvme/spec/log_page.cuh>
#include <cunvme/spec/opcodes.cuh>
#include <cunvme/spec/queue_entry.cuh>
#include <cunvme/spec/registers.cuh>
#include <cunvme/spec/status.cuh>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace emu::detail {

class admin_commands : public nvm_commands {
 protected:
  using nvm_commands::nvm_commands;

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
        // NSIDs FFFFFFFEh and FFFFFFFFh cannot start an active namespace list.
        if (sqe.nsid >= spec::broadcast_nsid - 1u) return fail(spec::status::invalid_namespace_or_format);
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
    id.oacs = spec::identify_controller::oacs_bit<8>::set(0, true);  // Doorbell Buffer Config, and nothing else
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
    stray_doorbell(qid, true) = 0;
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
    stray_doorbell(qid, false) = 0;
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
    stray_doorbell(qid, false) = load32(sq_doorbell(qid));
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
    stray_doorbell(qid, true) = load32(cq_doorbell(qid));
    return outcome{};
  }

  outcome get_log_page(engine& e, const spec::submission_entry& sqe) {
    const spec::get_log_page_dwords dw{sqe.cdw10, sqe.cdw11, sqe.cdw12, sqe.cdw13, sqe.cdw14};
    const std::uint64_t bytes = dw.number_of_bytes();
    const std::uint64_t offset = dw.offset();
    if (!spec::dword_aligned(offset) || dw.offset_is_index()) return fail(spec::status::invalid_field_in_command);
    std::vector<std::byte> log;
    switch (dw.lid()) {
      case spec::log_page_id::error_information: {
        errors_.copy_page(log);
        break;
      }
      case spec::log_page_id::smart_health_information: {
        // Per-namespace SMART data is not supported (LPA bit 0 = 0).
        if (sqe.nsid != 0 && sqe.nsid != spec::broadcast_nsid) return fail(spec::status::invalid_field_in_command);
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
      events_.rearm();  // reading the log re-arms error events (5.2)
    }
    return outcome{s};
  }

  void fill_smart(spec::smart_health_information_log& smart) const {
    smart.set_composite_temperature_kelvin(300);
    smart.available_spare = 100;
    smart.available_spare_threshold = 10;
    const auto units = [](std::uint64_t bytes) { return spec::data_units((bytes + 511) / 512); };
    const io_totals t = totals();
    smart.data_units_read.add(units(t.bytes_read));
    smart.data_units_written.add(units(t.bytes_written));
    smart.host_read_commands.add(t.read_commands);
    smart.host_write_commands.add(t.write_commands);
    smart.power_cycles.add(1);
    smart.number_of_error_information_log_entries.add(errors_.count());
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
    // A burst in progress on the I/O SQ first finishes (its worker holds the SQ's mutex from
    // fetch to parking its completions, as for Delete I/O SQ): a command already fetched is then
    // parked or posted, never between, so it is found while still in flight. Not the admin SQ:
    // this thread is serving it.
    std::unique_lock<std::mutex> burst;
    if (sqid != 0 && sqid <= config_.max_io_queues) burst = std::unique_lock<std::mutex>(sqs_[sqid].mutex);
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
    std::uint32_t dw0 = 0;
    switch (events_.request(sqe.cid(), config_.async_event_request_limit, dw0)) {
      case async_events::request_result::limit_exceeded: return fail(spec::status::asynchronous_event_request_limit_exceeded);
      case async_events::request_result::completed: return outcome{spec::status::successful_completion, dw0};
      case async_events::request_result::deferred: break;
    }
    outcome o;
    o.deferred = true;
    return o;
  }

  std::uint32_t plain_features_[256] = {};  // admin thread only
};

}  // namespace emu::detail
CUNVME_NAMESPACE_END
