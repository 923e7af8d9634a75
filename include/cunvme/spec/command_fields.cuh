// Command-specific dwords of the admin and NVM commands a driver sends, as named fields,
// and constexpr builders that fill a whole submission entry.
//
// The field types are shared by both sides: the host builds commands with them and the
// emulator decodes the same words with them, so the two cannot drift apart.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/spec/bit_field.cuh>
#include <cunvme/spec/identify.cuh>
#include <cunvme/spec/log_page.cuh>
#include <cunvme/spec/opcodes.cuh>
#include <cunvme/spec/queue_entry.cuh>

#include <cuda/std/cstddef>
#include <cuda/std/cstdint>

CUNVME_NAMESPACE_BEGIN
namespace spec {

/// Create I/O Completion Queue (5.4, Figures 473–474).
struct create_io_cq_fields {
  using qid   = bit_field<cuda::std::uint32_t, 0, 16, cuda::std::uint16_t>;   ///< CDW10 Queue Identifier
  using qsize = bit_field<cuda::std::uint32_t, 16, 16, cuda::std::uint16_t>;  ///< CDW10 Queue Size, 0-based
  using pc    = bit_field<cuda::std::uint32_t, 0, 1, bool>;                   ///< CDW11 Physically Contiguous
  using ien   = bit_field<cuda::std::uint32_t, 1, 1, bool>;                   ///< CDW11 Interrupts Enabled
  using iv    = bit_field<cuda::std::uint32_t, 16, 16, cuda::std::uint16_t>;  ///< CDW11 Interrupt Vector
};

/// Queue Priority of Create I/O Submission Queue (Figure 477), used under weighted round robin.
enum class queue_priority : cuda::std::uint8_t { urgent = 0b00, high = 0b01, medium = 0b10, low = 0b11 };

/// Create I/O Submission Queue (5.5, Figures 476–477).
struct create_io_sq_fields {
  using qid      = bit_field<cuda::std::uint32_t, 0, 16, cuda::std::uint16_t>;   ///< CDW10
  using qsize    = bit_field<cuda::std::uint32_t, 16, 16, cuda::std::uint16_t>;  ///< CDW10, 0-based
  using pc       = bit_field<cuda::std::uint32_t, 0, 1, bool>;                   ///< CDW11
  using qprio    = bit_field<cuda::std::uint32_t, 1, 2, queue_priority>;         ///< CDW11
  using cqid     = bit_field<cuda::std::uint32_t, 16, 16, cuda::std::uint16_t>;  ///< CDW11
  using nvmsetid = bit_field<cuda::std::uint32_t, 0, 16, cuda::std::uint16_t>;   ///< CDW12
};

/// Delete I/O Submission/Completion Queue (5.6, 5.7): CDW10 Queue Identifier.
struct delete_io_queue_fields {
  using qid = bit_field<cuda::std::uint32_t, 0, 16, cuda::std::uint16_t>;
};

/// Identify (5.17, Figure 273–274).
struct identify_fields {
  using cns   = bit_field<cuda::std::uint32_t, 0, 8, identify_cns>;           ///< CDW10
  using cntid = bit_field<cuda::std::uint32_t, 16, 16, cuda::std::uint16_t>;  ///< CDW10
  using cnssid = bit_field<cuda::std::uint32_t, 0, 16, cuda::std::uint16_t>;  ///< CDW11
  using csi   = bit_field<cuda::std::uint32_t, 24, 8, cuda::std::uint8_t>;    ///< CDW11
};

/// Abort (5.1, Figure 138): CDW10 SQID and CID of the command to abort. Completion DW0 bit 0
/// is 0 when the command was aborted and 1 when it was not.
struct abort_fields {
  using sqid = bit_field<cuda::std::uint32_t, 0, 16, cuda::std::uint16_t>;
  using cid  = bit_field<cuda::std::uint32_t, 16, 16, cuda::std::uint16_t>;
  using not_aborted = bit_field<cuda::std::uint32_t, 0, 1, bool>;  ///< completion DW0
};

/// Asynchronous Event Type, completion DW0 bits 2:0 of an Asynchronous Event Request (5.2).
enum class async_event_type : cuda::std::uint8_t {
  error_status = 0b000,
  smart_health_status = 0b001,
  notice = 0b010,
  io_command_specific_status = 0b110,
  vendor_specific = 0b111,
};

/// Asynchronous Event Request (5.2): the completion DW0 that reports an event.
struct async_event_fields {
  using aet = bit_field<cuda::std::uint32_t, 0, 3, async_event_type>;       ///< Asynchronous Event Type
  using aei = bit_field<cuda::std::uint32_t, 8, 8, cuda::std::uint8_t>;     ///< Asynchronous Event Information
  using lid = bit_field<cuda::std::uint32_t, 16, 8, log_page_id>;           ///< Log Page Identifier to read to clear it
};

/// Get Features / Set Features (5.15, 5.27; Figures 279 and 316).
struct features_fields {
  using fid = bit_field<cuda::std::uint32_t, 0, 8, feature_id>;       ///< CDW10 Feature Identifier
  using sel = bit_field<cuda::std::uint32_t, 8, 3, feature_select>;   ///< CDW10 Select (Get Features)
  using sv  = bit_field<cuda::std::uint32_t, 31, 1, bool>;            ///< CDW10 Save (Set Features)
};

/// Number of Queues feature (5.27.1.5, Figure 323): CDW11 requests, completion DW0 grants.
/// Both counts are 0-based and exclude the admin queue; 0xFFFF requested is Invalid Field.
struct number_of_queues_fields {
  using nsqr = bit_field<cuda::std::uint32_t, 0, 16, cuda::std::uint16_t>;   ///< requested SQs (CDW11), allocated (DW0)
  using ncqr = bit_field<cuda::std::uint32_t, 16, 16, cuda::std::uint16_t>;  ///< requested CQs (CDW11), allocated (DW0)
};

/// Volatile Write Cache feature (5.27.1.4, Figure 321): CDW11 bit 0 Volatile Write Cache Enable.
struct volatile_write_cache_fields {
  using wce = bit_field<cuda::std::uint32_t, 0, 1, bool>;
};

/// Read, Write, Write Zeroes, Compare (NVM Command Set 3.2.4/3.2.6/3.2.8): CDW10–11 SLBA,
/// CDW12 fields below.
struct rw_fields {
  using nlb    = bit_field<cuda::std::uint32_t, 0, 16, cuda::std::uint16_t>;  ///< Number of Logical Blocks, 0-based
  using deac   = bit_field<cuda::std::uint32_t, 25, 1, bool>;                 ///< Deallocate (Write Zeroes)
  using prinfo = bit_field<cuda::std::uint32_t, 26, 4, cuda::std::uint8_t>;   ///< Protection Information
  using fua    = bit_field<cuda::std::uint32_t, 30, 1, bool>;                 ///< Force Unit Access
  using lr     = bit_field<cuda::std::uint32_t, 31, 1, bool>;                 ///< Limited Retry
  /// The most blocks one command can name (NLB is a 16-bit 0-based count).
  static constexpr cuda::std::uint32_t max_blocks = 65536;
};

/// Dataset Management (NVM Command Set 3.2.3, Figures 38–40).
struct dataset_management_fields {
  using nr  = bit_field<cuda::std::uint32_t, 0, 8, cuda::std::uint8_t>;  ///< CDW10 Number of Ranges, 0-based
  using idr = bit_field<cuda::std::uint32_t, 0, 1, bool>;                ///< CDW11 Integral Dataset for Read
  using idw = bit_field<cuda::std::uint32_t, 1, 1, bool>;                ///< CDW11 Integral Dataset for Write
  using ad  = bit_field<cuda::std::uint32_t, 2, 1, bool>;                ///< CDW11 Attribute – Deallocate
  static constexpr cuda::std::uint32_t max_ranges = 256;
};

/// One Dataset Management range (Figure 40), 16 bytes, 256 of them in the 4 KiB data buffer.
struct dsm_range {
  cuda::std::uint32_t context_attributes;
  cuda::std::uint32_t length_in_logical_blocks;  ///< 1-based
  cuda::std::uint64_t starting_lba;
};
static_assert(sizeof(dsm_range) == 16);
static_assert(offsetof(dsm_range, context_attributes) == 0);
static_assert(offsetof(dsm_range, length_in_logical_blocks) == 4);
static_assert(offsetof(dsm_range, starting_lba) == 8);

/// The 64-bit starting LBA split over CDW10 (low) and CDW11 (high).
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t starting_lba(const submission_entry& sqe) noexcept {
  return (cuda::std::uint64_t{sqe.cdw11} << 32) | sqe.cdw10;
}
CUNVME_HOST_DEVICE constexpr void set_starting_lba(submission_entry& sqe, cuda::std::uint64_t slba) noexcept {
  sqe.cdw10 = static_cast<cuda::std::uint32_t>(slba);
  sqe.cdw11 = static_cast<cuda::std::uint32_t>(slba >> 32);
}

// ---- builders -----------------------------------------------------------------------------
// Each returns a complete entry with PSDT = PRP and CID 0; the caller (queue layer) sets the CID.

/// Create I/O Completion Queue of `entries` entries (1-based here; encoded 0-based).
[[nodiscard]] CUNVME_HOST_DEVICE constexpr submission_entry make_create_io_cq(cuda::std::uint16_t qid, cuda::std::uint32_t entries,
                                                                          cuda::std::uint64_t prp1, bool physically_contiguous = true,
                                                                          bool interrupts_enabled = false,
                                                                          cuda::std::uint16_t interrupt_vector = 0) noexcept {
  submission_entry e{};
  e.set_opcode(admin_opcode::create_io_completion_queue);
  e.prp1  = prp1;
  e.cdw10 = create_io_cq_fields::qsize::set(create_io_cq_fields::qid::set(0, qid), static_cast<cuda::std::uint16_t>(entries - 1));
  e.cdw11 = create_io_cq_fields::iv::set(
      create_io_cq_fields::ien::set(create_io_cq_fields::pc::set(0, physically_contiguous), interrupts_enabled), interrupt_vector);
  return e;
}

/// Create I/O Submission Queue of `entries` entries bound to completion queue `cqid`.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr submission_entry make_create_io_sq(cuda::std::uint16_t qid, cuda::std::uint32_t entries,
                                                                          cuda::std::uint64_t prp1, cuda::std::uint16_t cqid,
                                                                          bool physically_contiguous = true,
                                                                          queue_priority priority = queue_priority::urgent) noexcept {
  submission_entry e{};
  e.set_opcode(admin_opcode::create_io_submission_queue);
  e.prp1  = prp1;
  e.cdw10 = create_io_sq_fields::qsize::set(create_io_sq_fields::qid::set(0, qid), static_cast<cuda::std::uint16_t>(entries - 1));
  e.cdw11 = create_io_sq_fields::cqid::set(
      create_io_sq_fields::qprio::set(create_io_sq_fields::pc::set(0, physically_contiguous), priority), cqid);
  return e;
}

[[nodiscard]] CUNVME_HOST_DEVICE constexpr submission_entry make_delete_io_sq(cuda::std::uint16_t qid) noexcept {
  submission_entry e{};
  e.set_opcode(admin_opcode::delete_io_submission_queue);
  e.cdw10 = delete_io_queue_fields::qid::set(0, qid);
  return e;
}

[[nodiscard]] CUNVME_HOST_DEVICE constexpr submission_entry make_delete_io_cq(cuda::std::uint16_t qid) noexcept {
  submission_entry e{};
  e.set_opcode(admin_opcode::delete_io_completion_queue);
  e.cdw10 = delete_io_queue_fields::qid::set(0, qid);
  return e;
}

/// Identify into the 4 KiB buffer at `prp1` (which must not cross a page unless PRP2 is set).
[[nodiscard]] CUNVME_HOST_DEVICE constexpr submission_entry make_identify(identify_cns cns, cuda::std::uint32_t nsid,
                                                                      cuda::std::uint64_t prp1, cuda::std::uint64_t prp2 = 0) noexcept {
  submission_entry e{};
  e.set_opcode(admin_opcode::identify);
  e.nsid  = nsid;
  e.prp1  = prp1;
  e.prp2  = prp2;
  e.cdw10 = identify_fields::cns::set(0, cns);
  return e;
}

/// Get Log Page of `bytes` (a multiple of 4) of log `lid` from byte `offset`, into the
/// buffer at PRP1/PRP2; NSID FFFFFFFFh asks for the controller-wide log.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr submission_entry make_get_log_page(log_page_id lid, cuda::std::uint64_t bytes,
                                                                          cuda::std::uint64_t prp1, cuda::std::uint64_t prp2 = 0,
                                                                          cuda::std::uint64_t offset = 0,
                                                                          cuda::std::uint32_t nsid = 0xffffffffu) noexcept {
  submission_entry e{};
  e.set_opcode(admin_opcode::get_log_page);
  e.nsid = nsid;
  e.prp1 = prp1;
  e.prp2 = prp2;
  const auto dw = get_log_page_dwords::for_log(lid, bytes, offset);
  e.cdw10 = dw.cdw10;
  e.cdw11 = dw.cdw11;
  e.cdw12 = dw.cdw12;
  e.cdw13 = dw.cdw13;
  e.cdw14 = dw.cdw14;
  return e;
}

[[nodiscard]] CUNVME_HOST_DEVICE constexpr submission_entry make_get_features(feature_id fid,
                                                                          feature_select sel = feature_select::current) noexcept {
  submission_entry e{};
  e.set_opcode(admin_opcode::get_features);
  e.cdw10 = features_fields::sel::set(features_fields::fid::set(0, fid), sel);
  return e;
}

[[nodiscard]] CUNVME_HOST_DEVICE constexpr submission_entry make_set_features(feature_id fid, cuda::std::uint32_t cdw11,
                                                                          bool save = false) noexcept {
  submission_entry e{};
  e.set_opcode(admin_opcode::set_features);
  e.cdw10 = features_fields::sv::set(features_fields::fid::set(0, fid), save);
  e.cdw11 = cdw11;
  return e;
}

/// Set Features – Number of Queues asking for `io_sqs` and `io_cqs` queues (1-based here).
[[nodiscard]] CUNVME_HOST_DEVICE constexpr submission_entry make_set_number_of_queues(cuda::std::uint16_t io_sqs,
                                                                                  cuda::std::uint16_t io_cqs) noexcept {
  return make_set_features(feature_id::number_of_queues,
                           number_of_queues_fields::ncqr::set(number_of_queues_fields::nsqr::set(0, static_cast<cuda::std::uint16_t>(io_sqs - 1)),
                                                              static_cast<cuda::std::uint16_t>(io_cqs - 1)));
}

[[nodiscard]] CUNVME_HOST_DEVICE constexpr submission_entry make_abort(cuda::std::uint16_t sqid, cuda::std::uint16_t cid) noexcept {
  submission_entry e{};
  e.set_opcode(admin_opcode::abort);
  e.cdw10 = abort_fields::cid::set(abort_fields::sqid::set(0, sqid), cid);
  return e;
}

/// Doorbell Buffer Config (5.9): PRP1 the Shadow Doorbell buffer, PRP2 the EventIdx buffer,
/// each one memory page, page aligned.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr submission_entry make_doorbell_buffer_config(cuda::std::uint64_t shadow_doorbells,
                                                                                    cuda::std::uint64_t event_indexes) noexcept {
  submission_entry e{};
  e.set_opcode(admin_opcode::doorbell_buffer_config);
  e.prp1 = shadow_doorbells;
  e.prp2 = event_indexes;
  return e;
}

/// Read, Write or Write Zeroes of `blocks` logical blocks (1..65536) at `slba`.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr submission_entry make_rw(nvm_opcode opcode, cuda::std::uint32_t nsid, cuda::std::uint64_t slba,
                                                                cuda::std::uint32_t blocks, cuda::std::uint64_t prp1 = 0,
                                                                cuda::std::uint64_t prp2 = 0, bool fua = false) noexcept {
  submission_entry e{};
  e.set_opcode(opcode);
  e.nsid = nsid;
  e.prp1 = prp1;
  e.prp2 = prp2;
  set_starting_lba(e, slba);
  e.cdw12 = rw_fields::fua::set(rw_fields::nlb::set(0, static_cast<cuda::std::uint16_t>(blocks - 1)), fua);
  return e;
}

[[nodiscard]] CUNVME_HOST_DEVICE constexpr submission_entry make_flush(cuda::std::uint32_t nsid) noexcept {
  submission_entry e{};
  e.set_opcode(nvm_opcode::flush);
  e.nsid = nsid;
  return e;
}

/// Dataset Management over `ranges` (1..256) `dsm_range`s at `prp1`, deallocating when asked.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr submission_entry make_dataset_management(cuda::std::uint32_t nsid, cuda::std::uint32_t ranges,
                                                                                cuda::std::uint64_t prp1, cuda::std::uint64_t prp2 = 0,
                                                                                bool deallocate = true) noexcept {
  submission_entry e{};
  e.set_opcode(nvm_opcode::dataset_management);
  e.nsid  = nsid;
  e.prp1  = prp1;
  e.prp2  = prp2;
  e.cdw10 = dataset_management_fields::nr::set(0, static_cast<cuda::std::uint8_t>(ranges - 1));
  e.cdw11 = dataset_management_fields::ad::set(0, deallocate);
  return e;
}

}  // namespace spec
CUNVME_NAMESPACE_END
