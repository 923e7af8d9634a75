// Submission and completion queue entries (NVMe Base Specification 2.0, sections 4.2 and 4.6).
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/spec/bit_field.cuh>
#include <cunvme/spec/status.cuh>

#include <cuda/std/cstddef>
#include <cuda/std/cstdint>

CUNVME_NAMESPACE_BEGIN
namespace spec {

/// CDW0.FUSE (Figure 88): fused operation.
enum class fused_operation : cuda::std::uint8_t {
  normal = 0b00,
  first_command = 0b01,
  second_command = 0b10,
};

/// CDW0.PSDT (Figure 88): how the data pointer is to be read.
enum class data_transfer_kind : cuda::std::uint8_t {
  prp = 0b00,
  sgl_metadata_buffer = 0b01,
  sgl_metadata_segment = 0b10,
};

/// Submission Queue Entry — 64 bytes (4.2, Figure 88 and 89).
///
/// Plain data the host (or a GPU thread) fills and copies into a submission-queue slot.
/// Usage: examples/snippets/spec.cpp, `read_command`.
struct submission_entry {
  cuda::std::uint32_t cdw0;   ///< OPC 7:0, FUSE 9:8, PSDT 15:14, CID 31:16
  cuda::std::uint32_t nsid;   ///< Namespace Identifier
  cuda::std::uint32_t cdw2;
  cuda::std::uint32_t cdw3;
  cuda::std::uint64_t mptr;   ///< Metadata Pointer
  cuda::std::uint64_t prp1;   ///< Data Pointer, PRP Entry 1
  cuda::std::uint64_t prp2;   ///< Data Pointer, PRP Entry 2 (or PRP List pointer)
  cuda::std::uint32_t cdw10;
  cuda::std::uint32_t cdw11;
  cuda::std::uint32_t cdw12;
  cuda::std::uint32_t cdw13;
  cuda::std::uint32_t cdw14;
  cuda::std::uint32_t cdw15;

  using opc_field  = bit_field<cuda::std::uint32_t, 0, 8, cuda::std::uint8_t>;
  using fuse_field = bit_field<cuda::std::uint32_t, 8, 2, fused_operation>;
  using psdt_field = bit_field<cuda::std::uint32_t, 14, 2, data_transfer_kind>;
  using cid_field  = bit_field<cuda::std::uint32_t, 16, 16, cuda::std::uint16_t>;

  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t opcode() const noexcept { return opc_field::get(cdw0); }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr fused_operation fuse() const noexcept { return fuse_field::get(cdw0); }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr data_transfer_kind psdt() const noexcept { return psdt_field::get(cdw0); }
  /// Command Identifier: with the SQ identifier, unique among the commands outstanding.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint16_t cid() const noexcept { return cid_field::get(cdw0); }

  /// Accepts any opcode enum (admin or NVM) or a raw byte.
  template <class Opcode>
  CUNVME_HOST_DEVICE constexpr submission_entry& set_opcode(Opcode v) noexcept {
    cdw0 = opc_field::set(cdw0, static_cast<cuda::std::uint8_t>(v));
    return *this;
  }
  CUNVME_HOST_DEVICE constexpr submission_entry& set_fuse(fused_operation v) noexcept { cdw0 = fuse_field::set(cdw0, v); return *this; }
  CUNVME_HOST_DEVICE constexpr submission_entry& set_psdt(data_transfer_kind v) noexcept { cdw0 = psdt_field::set(cdw0, v); return *this; }
  CUNVME_HOST_DEVICE constexpr submission_entry& set_cid(cuda::std::uint16_t v) noexcept { cdw0 = cid_field::set(cdw0, v); return *this; }
};
static_assert(sizeof(submission_entry) == 64);
static_assert(offsetof(submission_entry, cdw0) == 0);
static_assert(offsetof(submission_entry, nsid) == 4);
static_assert(offsetof(submission_entry, cdw2) == 8);
static_assert(offsetof(submission_entry, cdw3) == 12);
static_assert(offsetof(submission_entry, mptr) == 16);
static_assert(offsetof(submission_entry, prp1) == 24);
static_assert(offsetof(submission_entry, prp2) == 32);
static_assert(offsetof(submission_entry, cdw10) == 40);
static_assert(offsetof(submission_entry, cdw11) == 44);
static_assert(offsetof(submission_entry, cdw12) == 48);
static_assert(offsetof(submission_entry, cdw13) == 52);
static_assert(offsetof(submission_entry, cdw14) == 56);
static_assert(offsetof(submission_entry, cdw15) == 60);

/// Whether an address or byte offset is dword aligned (bits 1:0 zero), as MPTR (4.1.2, no SGL)
/// and the Get Log Page offset (5.16: LPOL bits 1:0) must be.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr bool dword_aligned(cuda::std::uint64_t value) noexcept { return (value & 0x3u) == 0; }
/// Whether a PRP entry's offset is dword aligned (4.1.1, Figure 87: bits 1:0 are zero). PRP1
/// and a PRP list pointer need only this; later entries are page aligned.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr bool prp_dword_aligned(cuda::std::uint64_t entry) noexcept { return dword_aligned(entry); }
static_assert(prp_dword_aligned(0x1004) && !prp_dword_aligned(0x1002));

/// NSID FFFFFFFFh: every attached namespace (3.2.1.1, broadcast value).
inline constexpr cuda::std::uint32_t broadcast_nsid = 0xffffffffu;

/// log2 of the entry sizes, as CC.IOSQES/IOCQES and Identify SQES/CQES express them.
inline constexpr cuda::std::uint8_t submission_entry_size_log2 = 6;
inline constexpr cuda::std::uint8_t completion_entry_size_log2 = 4;

/// Completion Queue Entry — 16 bytes (4.6, Figure 90–93).
///
/// Valid only once `phase()` equals the phase the consumer expects; the payload is read
/// after that test, behind an acquire fence (ordering rule 2 in DESIGN.md).
/// Usage: examples/snippets/spec.cpp, `completion_for`.
struct completion_entry {
  cuda::std::uint32_t dw0;           ///< command specific
  cuda::std::uint32_t dw1;           ///< command specific
  cuda::std::uint16_t sqhd;          ///< SQ Head Pointer
  cuda::std::uint16_t sqid;          ///< SQ Identifier
  cuda::std::uint16_t cid;           ///< Command Identifier
  cuda::std::uint16_t status_field;  ///< Phase Tag (bit 0) and Status (bits 15:1)

  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool phase() const noexcept { return cqe_status::phase(status_field); }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr spec::status status() const noexcept { return cqe_status::status_of(status_field); }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool more() const noexcept { return cqe_status::more(status_field); }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool dnr() const noexcept { return cqe_status::dnr(status_field); }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t crd() const noexcept { return cqe_status::crd(status_field); }
};
static_assert(sizeof(completion_entry) == 16);
static_assert(offsetof(completion_entry, dw0) == 0);
static_assert(offsetof(completion_entry, dw1) == 4);
static_assert(offsetof(completion_entry, sqhd) == 8);
static_assert(offsetof(completion_entry, sqid) == 10);
static_assert(offsetof(completion_entry, cid) == 12);
static_assert(offsetof(completion_entry, status_field) == 14);

/// A CQE's Dword 2 and Dword 3 as the 32-bit words a poller loads (4.6): a consumer tests the
/// phase with one 32-bit acquire load of DW3 and decodes the rest from the words it loaded,
/// rather than from a second read of memory the controller may be overwriting.
namespace cqe_dword {
/// DW2 bits 15:0 — SQ Head Pointer.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint16_t sq_head(cuda::std::uint32_t dw2) noexcept {
  return static_cast<cuda::std::uint16_t>(dw2 & 0xffffu);
}
/// DW2 bits 31:16 — SQ Identifier.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint16_t sq_id(cuda::std::uint32_t dw2) noexcept {
  return static_cast<cuda::std::uint16_t>(dw2 >> 16);
}
/// DW3 bits 15:0 — Command Identifier.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint16_t cid(cuda::std::uint32_t dw3) noexcept {
  return static_cast<cuda::std::uint16_t>(dw3 & 0xffffu);
}
/// DW3 bits 31:16 — the Phase Tag and Status field.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint16_t status_field(cuda::std::uint32_t dw3) noexcept {
  return static_cast<cuda::std::uint16_t>(dw3 >> 16);
}
/// DW3 bit 16 — Phase Tag.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr bool phase(cuda::std::uint32_t dw3) noexcept { return cqe_status::phase(status_field(dw3)); }
/// DW3 bits 31:17 — Status (type << 8 | code, with CRD, More and DNR dropped).
[[nodiscard]] CUNVME_HOST_DEVICE constexpr status status_of(cuda::std::uint32_t dw3) noexcept {
  return cqe_status::status_of(status_field(dw3));
}
/// DW2 as a controller posts it: SQ Head Pointer in bits 15:0, SQ Identifier in bits 31:16.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t make_dw2(cuda::std::uint16_t sq_head, cuda::std::uint16_t sq_id) noexcept {
  return cuda::std::uint32_t{sq_head} | cuda::std::uint32_t{sq_id} << 16;
}
/// DW3 as a controller posts it: the CID in bits 15:0, the Phase Tag and Status field
/// (`cqe_status::make_status_field`) in bits 31:16. A controller stores it last, with
/// release: the phase tag makes the entry valid (4.6).
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t make_dw3(cuda::std::uint16_t cid, cuda::std::uint16_t status_field) noexcept {
  return cuda::std::uint32_t{cid} | cuda::std::uint32_t{status_field} << 16;
}
/// Byte offsets of DW2 and DW3 in the entry, for pollers that load them as words.
inline constexpr cuda::std::uint32_t dw2_offset = offsetof(completion_entry, sqhd);
inline constexpr cuda::std::uint32_t dw3_offset = offsetof(completion_entry, cid);
}  // namespace cqe_dword

static_assert(cqe_dword::cid(0x8001'1234u) == 0x1234u && cqe_dword::phase(0x8001'1234u));
static_assert(!cqe_dword::phase(0x8000'1234u));
static_assert(cqe_dword::sq_head(0x0003'0007u) == 7u && cqe_dword::sq_id(0x0003'0007u) == 3u);
static_assert(cqe_dword::make_dw2(7, 3) == 0x0003'0007u && cqe_dword::make_dw3(0x1234, 0x8001) == 0x8001'1234u);

}  // namespace spec
CUNVME_NAMESPACE_END
