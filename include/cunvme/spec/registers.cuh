// NVMe controller registers (NVMe Base Specification 2.0, section 3.1.3, Figure 33).
//
// Registers are raw little-endian words wrapped in small types with one accessor per field
// (`cap.mqes()`) and a chainable setter (`cap.set_mqes(…)`) for the emulator and tests.
// Registers are reached through the offsets below by the access layer; the struct
// `controller_registers` exists to pin those offsets against the spec's table.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/spec/bit_field.cuh>

#include <cuda/std/cstddef>
#include <cuda/std/cstdint>

CUNVME_NAMESPACE_BEGIN
namespace spec {

/// Offsets of the controller registers in BAR0 (Figure 33).
enum class register_offset : cuda::std::uint32_t {
  cap     = 0x00,  ///< Controller Capabilities (64 bit)
  vs      = 0x08,  ///< Version
  intms   = 0x0c,  ///< Interrupt Mask Set
  intmc   = 0x10,  ///< Interrupt Mask Clear
  cc      = 0x14,  ///< Controller Configuration
  csts    = 0x1c,  ///< Controller Status
  nssr    = 0x20,  ///< NVM Subsystem Reset
  aqa     = 0x24,  ///< Admin Queue Attributes
  asq     = 0x28,  ///< Admin Submission Queue Base Address (64 bit)
  acq     = 0x30,  ///< Admin Completion Queue Base Address (64 bit)
  cmbloc  = 0x38,  ///< Controller Memory Buffer Location
  cmbsz   = 0x3c,  ///< Controller Memory Buffer Size
  bpinfo  = 0x40,  ///< Boot Partition Information
  bprsel  = 0x44,  ///< Boot Partition Read Select
  bpmbl   = 0x48,  ///< Boot Partition Memory Buffer Location (64 bit)
  cmbmsc  = 0x50,  ///< Controller Memory Buffer Memory Space Control (64 bit)
  cmbsts  = 0x58,  ///< Controller Memory Buffer Status
  cmbebs  = 0x5c,  ///< Controller Memory Buffer Elasticity Buffer Size
  cmbswtp = 0x60,  ///< Controller Memory Buffer Sustained Write Throughput
  nssd    = 0x64,  ///< NVM Subsystem Shutdown
  crto    = 0x68,  ///< Controller Ready Timeouts
  pmrcap  = 0xe00, ///< Persistent Memory Region Capabilities
  doorbells = 0x1000, ///< Submission Queue 0 Tail Doorbell; the doorbell region starts here
};

[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t to_underlying(register_offset r) noexcept {
  return static_cast<cuda::std::uint32_t>(r);
}

/// The register block from CAP to the doorbells, laid out as Figure 33 lays it out.
struct controller_registers {
  cuda::std::uint64_t cap;
  cuda::std::uint32_t vs;
  cuda::std::uint32_t intms;
  cuda::std::uint32_t intmc;
  cuda::std::uint32_t cc;
  cuda::std::uint32_t reserved_18;
  cuda::std::uint32_t csts;
  cuda::std::uint32_t nssr;
  cuda::std::uint32_t aqa;
  cuda::std::uint64_t asq;
  cuda::std::uint64_t acq;
  cuda::std::uint32_t cmbloc;
  cuda::std::uint32_t cmbsz;
  cuda::std::uint32_t bpinfo;
  cuda::std::uint32_t bprsel;
  cuda::std::uint64_t bpmbl;
  cuda::std::uint64_t cmbmsc;
  cuda::std::uint32_t cmbsts;
  cuda::std::uint32_t cmbebs;
  cuda::std::uint32_t cmbswtp;
  cuda::std::uint32_t nssd;
  cuda::std::uint32_t crto;
  cuda::std::uint8_t reserved_6c[0xe00 - 0x6c];
  cuda::std::uint8_t pmr_registers[0x1000 - 0xe00];
};
static_assert(sizeof(controller_registers) == 0x1000);
static_assert(offsetof(controller_registers, cap) == to_underlying(register_offset::cap));
static_assert(offsetof(controller_registers, vs) == to_underlying(register_offset::vs));
static_assert(offsetof(controller_registers, intms) == to_underlying(register_offset::intms));
static_assert(offsetof(controller_registers, intmc) == to_underlying(register_offset::intmc));
static_assert(offsetof(controller_registers, cc) == to_underlying(register_offset::cc));
static_assert(offsetof(controller_registers, reserved_18) == 0x18);
static_assert(offsetof(controller_registers, csts) == to_underlying(register_offset::csts));
static_assert(offsetof(controller_registers, nssr) == to_underlying(register_offset::nssr));
static_assert(offsetof(controller_registers, aqa) == to_underlying(register_offset::aqa));
static_assert(offsetof(controller_registers, asq) == to_underlying(register_offset::asq));
static_assert(offsetof(controller_registers, acq) == to_underlying(register_offset::acq));
static_assert(offsetof(controller_registers, cmbloc) == to_underlying(register_offset::cmbloc));
static_assert(offsetof(controller_registers, cmbsz) == to_underlying(register_offset::cmbsz));
static_assert(offsetof(controller_registers, bpinfo) == to_underlying(register_offset::bpinfo));
static_assert(offsetof(controller_registers, bprsel) == to_underlying(register_offset::bprsel));
static_assert(offsetof(controller_registers, bpmbl) == to_underlying(register_offset::bpmbl));
static_assert(offsetof(controller_registers, cmbmsc) == to_underlying(register_offset::cmbmsc));
static_assert(offsetof(controller_registers, cmbsts) == to_underlying(register_offset::cmbsts));
static_assert(offsetof(controller_registers, cmbebs) == to_underlying(register_offset::cmbebs));
static_assert(offsetof(controller_registers, cmbswtp) == to_underlying(register_offset::cmbswtp));
static_assert(offsetof(controller_registers, nssd) == to_underlying(register_offset::nssd));
static_assert(offsetof(controller_registers, crto) == to_underlying(register_offset::crto));
static_assert(offsetof(controller_registers, reserved_6c) == 0x6c);
static_assert(offsetof(controller_registers, pmr_registers) == to_underlying(register_offset::pmrcap));

/// Doorbell byte offsets (section 3.1.3.20/3.1.3.21): SQ y Tail at 0x1000 + (2y)·(4 << DSTRD),
/// CQ y Head at 0x1000 + (2y + 1)·(4 << DSTRD).
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t doorbell_stride_bytes(unsigned dstrd) noexcept {
  return 4u << dstrd;
}
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t sq_tail_doorbell_offset(cuda::std::uint16_t qid,
                                                                                   unsigned dstrd) noexcept {
  return to_underlying(register_offset::doorbells) + (2u * qid) * doorbell_stride_bytes(dstrd);
}
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t cq_head_doorbell_offset(cuda::std::uint16_t qid,
                                                                                   unsigned dstrd) noexcept {
  return to_underlying(register_offset::doorbells) + (2u * qid + 1u) * doorbell_stride_bytes(dstrd);
}
/// Bytes of BAR0 needed to reach the doorbells of queues 0..max_qid (the last CQ head doorbell's
/// end), in 64 bits: with a large CAP.DSTRD (up to 128 KiB apart) and many queues the offsets
/// pass 4 GiB.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t bar_bytes_for_queues(cuda::std::uint16_t max_qid,
                                                                                unsigned dstrd) noexcept {
  return to_underlying(register_offset::doorbells) + (2ull * max_qid + 1u) * doorbell_stride_bytes(dstrd) + 4u;
}
/// The highest queue identifier whose two doorbells lie inside a BAR0 of `bar_bytes`; -1 where
/// not even the admin queue's do.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr long long max_qid_in_bar(cuda::std::uint64_t bar_bytes, unsigned dstrd) noexcept {
  const cuda::std::uint64_t first = to_underlying(register_offset::doorbells);
  if (bar_bytes < first + 4u) return -1;
  // Doorbells 0..last fit whole; queue y's CQ head doorbell is number 2y + 1.
  const cuda::std::uint64_t last = (bar_bytes - first - 4u) / doorbell_stride_bytes(dstrd);
  return last < 1 ? -1 : static_cast<long long>((last - 1) / 2);
}

/// CAP.CSS bits (Figure 36): which command sets CC.CSS may select.
enum class cap_css : cuda::std::uint8_t {
  nvm_command_set       = 1u << 0,
  io_command_sets       = 1u << 6,  ///< one or more I/O command sets (CC.CSS = 110b)
  no_io_command_set     = 1u << 7,  ///< admin only
};

/// CAP — Controller Capabilities (3.1.3.1, Figure 36). Read-only for the host.
struct cap_register {
  cuda::std::uint64_t raw{};

  using mqes_field   = bit_field<cuda::std::uint64_t, 0, 16, cuda::std::uint16_t>;
  using cqr_field    = bit_field<cuda::std::uint64_t, 16, 1, bool>;
  using ams_field    = bit_field<cuda::std::uint64_t, 17, 2, cuda::std::uint8_t>;
  using to_field     = bit_field<cuda::std::uint64_t, 24, 8, cuda::std::uint8_t>;
  using dstrd_field  = bit_field<cuda::std::uint64_t, 32, 4, cuda::std::uint8_t>;
  using nssrs_field  = bit_field<cuda::std::uint64_t, 36, 1, bool>;
  using css_field    = bit_field<cuda::std::uint64_t, 37, 8, cuda::std::uint8_t>;
  using bps_field    = bit_field<cuda::std::uint64_t, 45, 1, bool>;
  using mpsmin_field = bit_field<cuda::std::uint64_t, 48, 4, cuda::std::uint8_t>;
  using mpsmax_field = bit_field<cuda::std::uint64_t, 52, 4, cuda::std::uint8_t>;
  using pmrs_field   = bit_field<cuda::std::uint64_t, 56, 1, bool>;
  using cmbs_field   = bit_field<cuda::std::uint64_t, 57, 1, bool>;

  /// Maximum Queue Entries Supported, 0-based (2047 means 2048 entries).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint16_t mqes() const noexcept { return mqes_field::get(raw); }
  /// Contiguous Queues Required.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool cqr() const noexcept { return cqr_field::get(raw); }
  /// Arbitration Mechanism Supported (bit 0: weighted round robin, bit 1: vendor specific).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t ams() const noexcept { return ams_field::get(raw); }
  /// Timeout, in 500 ms units: worst case for CSTS.RDY to follow CC.EN.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t to() const noexcept { return to_field::get(raw); }
  /// Doorbell Stride: doorbells are 4 << DSTRD bytes apart.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t dstrd() const noexcept { return dstrd_field::get(raw); }
  /// NVM Subsystem Reset Supported.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool nssrs() const noexcept { return nssrs_field::get(raw); }
  /// Command Sets Supported (bits of `cap_css`).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t css() const noexcept { return css_field::get(raw); }
  /// Boot Partition Support.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool bps() const noexcept { return bps_field::get(raw); }
  /// Memory Page Size Minimum: 2^(12 + MPSMIN) bytes.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t mpsmin() const noexcept { return mpsmin_field::get(raw); }
  /// Memory Page Size Maximum: 2^(12 + MPSMAX) bytes.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t mpsmax() const noexcept { return mpsmax_field::get(raw); }
  /// Persistent Memory Region Supported.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool pmrs() const noexcept { return pmrs_field::get(raw); }
  /// Controller Memory Buffer Supported (CMBLOC/CMBSZ/CMBMSC are implemented).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool cmbs() const noexcept { return cmbs_field::get(raw); }

  /// Entries in the largest queue the controller supports (MQES is 0-based).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t max_queue_entries() const noexcept {
    return cuda::std::uint32_t{mqes()} + 1u;
  }
  /// CAP.TO in milliseconds.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t timeout_ms() const noexcept { return to() * 500u; }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t doorbell_stride() const noexcept {
    return doorbell_stride_bytes(dstrd());
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t min_page_size() const noexcept {
    return cuda::std::uint64_t{1} << (12u + mpsmin());
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t max_page_size() const noexcept {
    return cuda::std::uint64_t{1} << (12u + mpsmax());
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool supports(cap_css set) const noexcept {
    return (css() & static_cast<cuda::std::uint8_t>(set)) != 0;
  }

  CUNVME_HOST_DEVICE constexpr cap_register& set_mqes(cuda::std::uint16_t v) noexcept { raw = mqes_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cap_register& set_cqr(bool v) noexcept { raw = cqr_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cap_register& set_ams(cuda::std::uint8_t v) noexcept { raw = ams_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cap_register& set_to(cuda::std::uint8_t v) noexcept { raw = to_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cap_register& set_dstrd(cuda::std::uint8_t v) noexcept { raw = dstrd_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cap_register& set_nssrs(bool v) noexcept { raw = nssrs_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cap_register& set_css(cuda::std::uint8_t v) noexcept { raw = css_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cap_register& set_bps(bool v) noexcept { raw = bps_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cap_register& set_mpsmin(cuda::std::uint8_t v) noexcept { raw = mpsmin_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cap_register& set_mpsmax(cuda::std::uint8_t v) noexcept { raw = mpsmax_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cap_register& set_pmrs(bool v) noexcept { raw = pmrs_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cap_register& set_cmbs(bool v) noexcept { raw = cmbs_field::set(raw, v); return *this; }
};
static_assert(sizeof(cap_register) == 8);

/// VS — Version (3.1.3.2, Figure 37): MJR 31:16, MNR 15:8, TER 7:0.
struct version_register {
  cuda::std::uint32_t raw{};

  using mjr_field = bit_field<cuda::std::uint32_t, 16, 16, cuda::std::uint16_t>;
  using mnr_field = bit_field<cuda::std::uint32_t, 8, 8, cuda::std::uint8_t>;
  using ter_field = bit_field<cuda::std::uint32_t, 0, 8, cuda::std::uint8_t>;

  [[nodiscard]] CUNVME_HOST_DEVICE static constexpr version_register make(cuda::std::uint16_t major, cuda::std::uint8_t minor,
                                                                     cuda::std::uint8_t tertiary = 0) noexcept {
    return version_register{ter_field::set(mnr_field::set(mjr_field::set(0, major), minor), tertiary)};
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint16_t mjr() const noexcept { return mjr_field::get(raw); }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t mnr() const noexcept { return mnr_field::get(raw); }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t ter() const noexcept { return ter_field::get(raw); }
  /// Versions compare in the order of their raw encoding (major, minor, tertiary).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool at_least(cuda::std::uint16_t major, cuda::std::uint8_t minor) const noexcept {
    return raw >= make(major, minor).raw;
  }
};
static_assert(sizeof(version_register) == 4);

/// CC.CSS values (Figure 41).
enum class cc_css : cuda::std::uint8_t {
  nvm_command_set = 0b000,
  all_supported_io_command_sets = 0b110,
  admin_command_set_only = 0b111,
};

/// CC.AMS values (Figure 41).
enum class cc_ams : cuda::std::uint8_t {
  round_robin = 0b000,
  weighted_round_robin_with_urgent = 0b001,
  vendor_specific = 0b111,
};

/// CC.SHN values (Figure 41).
enum class shutdown_notification : cuda::std::uint8_t {
  none = 0b00,
  normal = 0b01,
  abrupt = 0b10,
};

/// CC — Controller Configuration (3.1.3.5, Figure 41). Written by the host.
struct cc_register {
  cuda::std::uint32_t raw{};

  using en_field     = bit_field<cuda::std::uint32_t, 0, 1, bool>;
  using css_field    = bit_field<cuda::std::uint32_t, 4, 3, cc_css>;
  using mps_field    = bit_field<cuda::std::uint32_t, 7, 4, cuda::std::uint8_t>;
  using ams_field    = bit_field<cuda::std::uint32_t, 11, 3, cc_ams>;
  using shn_field    = bit_field<cuda::std::uint32_t, 14, 2, shutdown_notification>;
  using iosqes_field = bit_field<cuda::std::uint32_t, 16, 4, cuda::std::uint8_t>;
  using iocqes_field = bit_field<cuda::std::uint32_t, 20, 4, cuda::std::uint8_t>;
  using crime_field  = bit_field<cuda::std::uint32_t, 24, 1, bool>;

  /// Enable.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool en() const noexcept { return en_field::get(raw); }
  /// I/O Command Set Selected.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cc_css css() const noexcept { return css_field::get(raw); }
  /// Memory Page Size: 2^(12 + MPS) bytes.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t mps() const noexcept { return mps_field::get(raw); }
  /// Arbitration Mechanism Selected.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cc_ams ams() const noexcept { return ams_field::get(raw); }
  /// Shutdown Notification.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr shutdown_notification shn() const noexcept { return shn_field::get(raw); }
  /// I/O Submission Queue Entry Size: 2^IOSQES bytes (6 for the 64-byte SQE).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t iosqes() const noexcept { return iosqes_field::get(raw); }
  /// I/O Completion Queue Entry Size: 2^IOCQES bytes (4 for the 16-byte CQE).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t iocqes() const noexcept { return iocqes_field::get(raw); }
  /// Controller Ready Independent of Media Enable.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool crime() const noexcept { return crime_field::get(raw); }

  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t page_size() const noexcept {
    return cuda::std::uint64_t{1} << (12u + mps());
  }

  CUNVME_HOST_DEVICE constexpr cc_register& set_en(bool v) noexcept { raw = en_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cc_register& set_css(cc_css v) noexcept { raw = css_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cc_register& set_mps(cuda::std::uint8_t v) noexcept { raw = mps_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cc_register& set_ams(cc_ams v) noexcept { raw = ams_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cc_register& set_shn(shutdown_notification v) noexcept { raw = shn_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cc_register& set_iosqes(cuda::std::uint8_t v) noexcept { raw = iosqes_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cc_register& set_iocqes(cuda::std::uint8_t v) noexcept { raw = iocqes_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cc_register& set_crime(bool v) noexcept { raw = crime_field::set(raw, v); return *this; }
};
static_assert(sizeof(cc_register) == 4);

/// CSTS.SHST values (Figure 42).
enum class shutdown_status : cuda::std::uint8_t {
  normal_operation = 0b00,
  shutdown_processing = 0b01,
  shutdown_complete = 0b10,
};

/// CSTS — Controller Status (3.1.3.6, Figure 42). Read by the host.
struct csts_register {
  cuda::std::uint32_t raw{};

  using rdy_field   = bit_field<cuda::std::uint32_t, 0, 1, bool>;
  using cfs_field   = bit_field<cuda::std::uint32_t, 1, 1, bool>;
  using shst_field  = bit_field<cuda::std::uint32_t, 2, 2, shutdown_status>;
  using nssro_field = bit_field<cuda::std::uint32_t, 4, 1, bool>;
  using pp_field    = bit_field<cuda::std::uint32_t, 5, 1, bool>;
  using st_field    = bit_field<cuda::std::uint32_t, 6, 1, bool>;

  /// Ready.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool rdy() const noexcept { return rdy_field::get(raw); }
  /// Controller Fatal Status.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool cfs() const noexcept { return cfs_field::get(raw); }
  /// Shutdown Status.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr shutdown_status shst() const noexcept { return shst_field::get(raw); }
  /// NVM Subsystem Reset Occurred.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool nssro() const noexcept { return nssro_field::get(raw); }
  /// Processing Paused.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool pp() const noexcept { return pp_field::get(raw); }
  /// Shutdown Type (0: controller, 1: NVM subsystem).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool st() const noexcept { return st_field::get(raw); }

  CUNVME_HOST_DEVICE constexpr csts_register& set_rdy(bool v) noexcept { raw = rdy_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr csts_register& set_cfs(bool v) noexcept { raw = cfs_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr csts_register& set_shst(shutdown_status v) noexcept { raw = shst_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr csts_register& set_nssro(bool v) noexcept { raw = nssro_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr csts_register& set_pp(bool v) noexcept { raw = pp_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr csts_register& set_st(bool v) noexcept { raw = st_field::set(raw, v); return *this; }
};
static_assert(sizeof(csts_register) == 4);

/// NSSR.NSSRC: writing this value ("NVMe") initiates an NVM Subsystem Reset (3.1.3.7).
inline constexpr cuda::std::uint32_t nvm_subsystem_reset_value = 0x4e564d65u;

/// AQA — Admin Queue Attributes (3.1.3.8, Figure 44). Both sizes are 0-based.
struct aqa_register {
  cuda::std::uint32_t raw{};

  using asqs_field = bit_field<cuda::std::uint32_t, 0, 12, cuda::std::uint16_t>;
  using acqs_field = bit_field<cuda::std::uint32_t, 16, 12, cuda::std::uint16_t>;

  /// Admin Submission Queue Size, 0-based.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint16_t asqs() const noexcept { return asqs_field::get(raw); }
  /// Admin Completion Queue Size, 0-based.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint16_t acqs() const noexcept { return acqs_field::get(raw); }

  CUNVME_HOST_DEVICE constexpr aqa_register& set_asqs(cuda::std::uint16_t v) noexcept { raw = asqs_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr aqa_register& set_acqs(cuda::std::uint16_t v) noexcept { raw = acqs_field::set(raw, v); return *this; }
};
static_assert(sizeof(aqa_register) == 4);

/// Admin queues hold 2 to 4096 entries (AQA fields are 12-bit and 0-based; section 3.1.3.8).
inline constexpr cuda::std::uint32_t min_admin_queue_entries = 2;
inline constexpr cuda::std::uint32_t max_admin_queue_entries = 4096;

/// CMBLOC/CMBSZ Size Units (Figure 52).
enum class cmb_size_unit : cuda::std::uint8_t {
  kib_4 = 0, kib_64 = 1, mib_1 = 2, mib_16 = 3, mib_256 = 4, gib_4 = 5, gib_64 = 6,
};

/// CMBLOC — Controller Memory Buffer Location (3.1.3.11, Figure 51).
struct cmbloc_register {
  cuda::std::uint32_t raw{};

  using bir_field   = bit_field<cuda::std::uint32_t, 0, 3, cuda::std::uint8_t>;
  using cqmms_field = bit_field<cuda::std::uint32_t, 3, 1, bool>;
  using cqpds_field = bit_field<cuda::std::uint32_t, 4, 1, bool>;
  using cdpmls_field = bit_field<cuda::std::uint32_t, 5, 1, bool>;
  using cdpcils_field = bit_field<cuda::std::uint32_t, 6, 1, bool>;
  using cdmmms_field = bit_field<cuda::std::uint32_t, 7, 1, bool>;
  using cqda_field  = bit_field<cuda::std::uint32_t, 8, 1, bool>;
  using ofst_field  = bit_field<cuda::std::uint32_t, 12, 20, cuda::std::uint32_t>;

  /// Base Indicator Register: which BAR holds the CMB.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t bir() const noexcept { return bir_field::get(raw); }
  /// CMB Queue Mixed Memory Support.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool cqmms() const noexcept { return cqmms_field::get(raw); }
  /// CMB Queue Physically Discontiguous Support.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool cqpds() const noexcept { return cqpds_field::get(raw); }
  /// CMB Data Pointer Mixed Locations Support: PRPs may mix CMB and host addresses.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool cdpmls() const noexcept { return cdpmls_field::get(raw); }
  /// CMB Data Pointer and Command Independent Locations Support.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool cdpcils() const noexcept { return cdpcils_field::get(raw); }
  /// CMB Data Metadata Mixed Memory Support.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool cdmmms() const noexcept { return cdmmms_field::get(raw); }
  /// CMB Queue Dword Alignment.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool cqda() const noexcept { return cqda_field::get(raw); }
  /// Offset of the CMB in its BAR, in CMBSZ.SZU units.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t ofst() const noexcept { return ofst_field::get(raw); }

  CUNVME_HOST_DEVICE constexpr cmbloc_register& set_bir(cuda::std::uint8_t v) noexcept { raw = bir_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cmbloc_register& set_cqmms(bool v) noexcept { raw = cqmms_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cmbloc_register& set_cqpds(bool v) noexcept { raw = cqpds_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cmbloc_register& set_cdpmls(bool v) noexcept { raw = cdpmls_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cmbloc_register& set_cdpcils(bool v) noexcept { raw = cdpcils_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cmbloc_register& set_cdmmms(bool v) noexcept { raw = cdmmms_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cmbloc_register& set_cqda(bool v) noexcept { raw = cqda_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cmbloc_register& set_ofst(cuda::std::uint32_t v) noexcept { raw = ofst_field::set(raw, v); return *this; }
};
static_assert(sizeof(cmbloc_register) == 4);

/// CMBSZ — Controller Memory Buffer Size (3.1.3.12, Figure 52).
struct cmbsz_register {
  cuda::std::uint32_t raw{};

  using sqs_field  = bit_field<cuda::std::uint32_t, 0, 1, bool>;
  using cqs_field  = bit_field<cuda::std::uint32_t, 1, 1, bool>;
  using lists_field = bit_field<cuda::std::uint32_t, 2, 1, bool>;
  using rds_field  = bit_field<cuda::std::uint32_t, 3, 1, bool>;
  using wds_field  = bit_field<cuda::std::uint32_t, 4, 1, bool>;
  using szu_field  = bit_field<cuda::std::uint32_t, 8, 4, cmb_size_unit>;
  using sz_field   = bit_field<cuda::std::uint32_t, 12, 20, cuda::std::uint32_t>;

  /// Submission Queue Support: submission queues may be placed in the CMB.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool sqs() const noexcept { return sqs_field::get(raw); }
  /// Completion Queue Support.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool cqs() const noexcept { return cqs_field::get(raw); }
  /// PRP SGL List Support: PRP lists may be placed in the CMB.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool lists() const noexcept { return lists_field::get(raw); }
  /// Read Data Support.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool rds() const noexcept { return rds_field::get(raw); }
  /// Write Data Support.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool wds() const noexcept { return wds_field::get(raw); }
  /// Size Units.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cmb_size_unit szu() const noexcept { return szu_field::get(raw); }
  /// Size, in SZU units.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t sz() const noexcept { return sz_field::get(raw); }

  /// Bytes per SZU unit: 4 KiB · 16^SZU.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t unit_bytes() const noexcept {
    return cuda::std::uint64_t{4096} << (4u * static_cast<unsigned>(szu()));
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t size_bytes() const noexcept { return unit_bytes() * sz(); }

  CUNVME_HOST_DEVICE constexpr cmbsz_register& set_sqs(bool v) noexcept { raw = sqs_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cmbsz_register& set_cqs(bool v) noexcept { raw = cqs_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cmbsz_register& set_lists(bool v) noexcept { raw = lists_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cmbsz_register& set_rds(bool v) noexcept { raw = rds_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cmbsz_register& set_wds(bool v) noexcept { raw = wds_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cmbsz_register& set_szu(cmb_size_unit v) noexcept { raw = szu_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cmbsz_register& set_sz(cuda::std::uint32_t v) noexcept { raw = sz_field::set(raw, v); return *this; }
};
static_assert(sizeof(cmbsz_register) == 4);

/// CMBMSC — Controller Memory Buffer Memory Space Control (3.1.3.16, Figure 56).
struct cmbmsc_register {
  cuda::std::uint64_t raw{};

  using cre_field  = bit_field<cuda::std::uint64_t, 0, 1, bool>;
  using cmse_field = bit_field<cuda::std::uint64_t, 1, 1, bool>;
  using cba_field  = bit_field<cuda::std::uint64_t, 12, 52, cuda::std::uint64_t>;

  /// Capabilities Registers Enabled: CMBLOC and CMBSZ read their values (not zero).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool cre() const noexcept { return cre_field::get(raw); }
  /// Controller Memory Space Enable: the CMB answers at CBA.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool cmse() const noexcept { return cmse_field::get(raw); }
  /// Controller Base Address: the CMB's address in the controller's memory space (4 KiB aligned).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t controller_base_address() const noexcept {
    return cba_field::get(raw) << 12;
  }

  CUNVME_HOST_DEVICE constexpr cmbmsc_register& set_cre(bool v) noexcept { raw = cre_field::set(raw, v); return *this; }
  CUNVME_HOST_DEVICE constexpr cmbmsc_register& set_cmse(bool v) noexcept { raw = cmse_field::set(raw, v); return *this; }
  /// `address` must be 4 KiB aligned; its low 12 bits are dropped.
  CUNVME_HOST_DEVICE constexpr cmbmsc_register& set_controller_base_address(cuda::std::uint64_t address) noexcept {
    raw = cba_field::set(raw, address >> 12);
    return *this;
  }
};
static_assert(sizeof(cmbmsc_register) == 8);

/// CMBSTS — Controller Memory Buffer Status (3.1.3.17, Figure 57).
struct cmbsts_register {
  cuda::std::uint32_t raw{};

  using cbai_field = bit_field<cuda::std::uint32_t, 0, 1, bool>;

  /// Controller Base Address Invalid: the CBA last written to CMBMSC is unusable (it
  /// overlaps another address range, say), so the CMB does not answer there.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool cbai() const noexcept { return cbai_field::get(raw); }

  CUNVME_HOST_DEVICE constexpr cmbsts_register& set_cbai(bool v) noexcept { raw = cbai_field::set(raw, v); return *this; }
};
static_assert(sizeof(cmbsts_register) == 4);

}  // namespace spec
CUNVME_NAMESPACE_END
