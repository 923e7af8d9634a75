// Identify data structures: what the host learns about a controller and its namespaces before
// the first I/O (NVMe Base Specification 2.0, section 5.17; NVM Command Set Specification 1.0,
// section 4.1.5).
//
// Every structure is the exact wire layout the controller DMAs into host or GPU memory: raw
// little-endian fields named by their spec mnemonic, gaps filled with `reservedN` byte arrays
// named by their starting byte, and every offset pinned by a `static_assert`, so a structure
// can be read straight out of the 4 KiB Identify buffer.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/spec/bit_field.cuh>

#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/type_traits>

#include <cstddef>
#include <string>

CUNVME_NAMESPACE_BEGIN
namespace spec {

/// Controller or Namespace Structure (CNS) values of the Identify command, CDW10 bits 7:0
/// (NVMe 2.0 Figure 273). Only the values a driver needs for bring-up are listed.
///
/// Usage: examples/snippets/spec.cpp, `identify_controller_cdw10`.
enum class identify_cns : cuda::std::uint8_t {
  /// Identify Namespace data structure (`identify_namespace`) for the NSID in the command.
  namespace_data = 0x00,
  /// Identify Controller data structure (`identify_controller`).
  controller = 0x01,
  /// Active Namespace ID list (`active_namespace_list`): NSIDs greater than the command's NSID.
  active_namespace_list = 0x02,
  /// Namespace Identification Descriptor list for the NSID in the command.
  namespace_identification_descriptor_list = 0x03,
};

/// One LBA Format entry of Identify Namespace (NVM Command Set 1.0 Figure 98): a raw dword.
///
/// Usage: examples/snippets/spec.cpp, `lba_format_block`.
struct lba_format {
  /// Metadata Size (MS), bits 15:0: metadata bytes per LBA.
  using ms_field = bit_field<cuda::std::uint32_t, 0, 16, cuda::std::uint16_t>;
  /// LBA Data Size (LBADS), bits 23:16: log2 of the data bytes per LBA.
  using lbads_field = bit_field<cuda::std::uint32_t, 16, 8, cuda::std::uint8_t>;
  /// Relative Performance (RP), bits 25:24: 0 best ... 3 degraded.
  using rp_field = bit_field<cuda::std::uint32_t, 24, 2, cuda::std::uint8_t>;

  cuda::std::uint32_t raw;

  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint16_t ms() const noexcept {
    return ms_field::get(raw);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t lbads() const noexcept {
    return lbads_field::get(raw);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t rp() const noexcept {
    return rp_field::get(raw);
  }

  CUNVME_HOST_DEVICE constexpr lba_format& set_ms(cuda::std::uint16_t value) noexcept {
    raw = ms_field::set(raw, value);
    return *this;
  }
  CUNVME_HOST_DEVICE constexpr lba_format& set_lbads(cuda::std::uint8_t value) noexcept {
    raw = lbads_field::set(raw, value);
    return *this;
  }
  /// `value` above 3 is truncated to the field's two bits.
  CUNVME_HOST_DEVICE constexpr lba_format& set_rp(cuda::std::uint8_t value) noexcept {
    raw = rp_field::set(raw, value);
    return *this;
  }

  /// Data bytes per LBA, 2^LBADS; 0 when this format cannot be used. The spec forbids LBADS
  /// below 9 (512 bytes) and uses 0 for "not supported or not currently available", so both
  /// read as 0 here; LBADS of 64 or more (not representable in 64 bits) also reads as 0.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t lba_data_size_bytes() const noexcept {
    const unsigned n = lbads();
    return (n < 9 || n >= 64) ? 0 : cuda::std::uint64_t{1} << n;
  }
};
static_assert(sizeof(lba_format) == 4);
static_assert(offsetof(lba_format, raw) == 0);
static_assert(cuda::std::is_standard_layout_v<lba_format> && cuda::std::is_trivially_copyable_v<lba_format>);

/// Power State Descriptor (NVMe 2.0 Figure 276), one of 32 in Identify Controller bytes 3071:2048.
/// Fields keep their raw bytes; the accessors decode only what a driver acts on.
///
/// Usage: examples/snippets/spec.cpp, `power_budget`.
struct power_state_descriptor {
  /// MXPS, byte 3 bit 0: MP is in 0.0001 W units when set, 0.01 W units when clear.
  using mxps_field = bit_field<cuda::std::uint8_t, 0, 1, bool>;
  /// NOPS, byte 3 bit 1: the controller processes no I/O commands in this state.
  using nops_field = bit_field<cuda::std::uint8_t, 1, 1, bool>;

  cuda::std::uint16_t mp;         ///< Maximum Power, scaled by MXPS
  cuda::std::uint8_t reserved2;
  cuda::std::uint8_t mxps_nops;   ///< MXPS bit 0, NOPS bit 1
  cuda::std::uint32_t enlat;      ///< Entry Latency, microseconds
  cuda::std::uint32_t exlat;      ///< Exit Latency, microseconds
  cuda::std::uint8_t rrt;         ///< Relative Read Throughput, bits 4:0
  cuda::std::uint8_t rrl;         ///< Relative Read Latency, bits 4:0
  cuda::std::uint8_t rwt;         ///< Relative Write Throughput, bits 4:0
  cuda::std::uint8_t rwl;         ///< Relative Write Latency, bits 4:0
  cuda::std::uint16_t idlp;       ///< Idle Power, scaled by IPS
  cuda::std::uint8_t ips;         ///< Idle Power Scale, bits 7:6
  cuda::std::uint8_t reserved19;
  cuda::std::uint16_t actp;       ///< Active Power, scaled by APS
  cuda::std::uint8_t apw_aps;     ///< Active Power Workload bits 2:0, Active Power Scale bits 7:6
  cuda::std::uint8_t reserved23[9];

  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool non_operational() const noexcept {
    return nops_field::get(mxps_nops);
  }

  /// MP in microwatts: MXPS picks 0.0001 W (100 uW) or 0.01 W (10000 uW) units.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t max_power_microwatts() const noexcept {
    return static_cast<cuda::std::uint32_t>(mp) * (mxps_field::get(mxps_nops) ? 100u : 10000u);
  }
};
static_assert(sizeof(power_state_descriptor) == 32);
static_assert(offsetof(power_state_descriptor, mp) == 0);
static_assert(offsetof(power_state_descriptor, reserved2) == 2);
static_assert(offsetof(power_state_descriptor, mxps_nops) == 3);
static_assert(offsetof(power_state_descriptor, enlat) == 4);
static_assert(offsetof(power_state_descriptor, exlat) == 8);
static_assert(offsetof(power_state_descriptor, rrt) == 12);
static_assert(offsetof(power_state_descriptor, rrl) == 13);
static_assert(offsetof(power_state_descriptor, rwt) == 14);
static_assert(offsetof(power_state_descriptor, rwl) == 15);
static_assert(offsetof(power_state_descriptor, idlp) == 16);
static_assert(offsetof(power_state_descriptor, ips) == 18);
static_assert(offsetof(power_state_descriptor, reserved19) == 19);
static_assert(offsetof(power_state_descriptor, actp) == 20);
static_assert(offsetof(power_state_descriptor, apw_aps) == 22);
static_assert(offsetof(power_state_descriptor, reserved23) == 23);
static_assert(cuda::std::is_standard_layout_v<power_state_descriptor> &&
              cuda::std::is_trivially_copyable_v<power_state_descriptor>);

/// How a controller accepts SGLs for NVM commands, Identify Controller SGLS bits 1:0.
enum class sgl_support : cuda::std::uint8_t {
  not_supported = 0,
  /// SGLs supported, no alignment or granularity requirement for Data Blocks.
  no_alignment = 1,
  /// SGLs supported, Data Blocks dword aligned and a whole number of dwords long.
  dword_alignment = 2,
  // 3 is reserved.
};

/// Flush with NSID FFFFFFFFh, Identify Controller VWC bits 2:1.
enum class flush_broadcast : cuda::std::uint8_t {
  /// Pre-2.0 controllers: support is not reported.
  not_indicated = 0,
  // 1 is reserved.
  not_supported = 2,
  supported = 3,
};

/// Identify Controller data structure, CNS 01h (NVMe 2.0 Figure 275): 4096 bytes.
///
/// Fields from the spec revisions up to 2.0 are named; later additions sit in the reserved
/// arrays. Bytes 255:240 belong to the NVMe Management Interface Specification (NVMSR,
/// VWCI, MEC) and 1791:1024 are reserved, so both stay raw.
///
/// Usage: examples/snippets/spec.cpp, `controller_summary`.
struct identify_controller {
  // Controller Capabilities and Features
  cuda::std::uint16_t vid;            ///< PCI Vendor ID
  cuda::std::uint16_t ssvid;          ///< PCI Subsystem Vendor ID
  char sn[20];                        ///< Serial Number, ASCII, space padded
  char mn[40];                        ///< Model Number, ASCII, space padded
  char fr[8];                         ///< Firmware Revision, ASCII, space padded
  cuda::std::uint8_t rab;             ///< Recommended Arbitration Burst, log2 of commands
  cuda::std::uint8_t ieee[3];         ///< IEEE OUI Identifier
  cuda::std::uint8_t cmic;            ///< Controller Multi-Path I/O and Namespace Sharing Capabilities
  cuda::std::uint8_t mdts;            ///< Maximum Data Transfer Size, log2 of CAP.MPSMIN pages; 0: no limit
  cuda::std::uint16_t cntlid;         ///< Controller ID
  cuda::std::uint32_t ver;            ///< Version, as the VS register
  cuda::std::uint32_t rtd3r;          ///< RTD3 Resume Latency, microseconds
  cuda::std::uint32_t rtd3e;          ///< RTD3 Entry Latency, microseconds
  cuda::std::uint32_t oaes;           ///< Optional Asynchronous Events Supported
  cuda::std::uint32_t ctratt;         ///< Controller Attributes
  cuda::std::uint16_t rrls;           ///< Read Recovery Levels Supported
  cuda::std::uint8_t reserved102[9];
  cuda::std::uint8_t cntrltype;       ///< Controller Type: 1 I/O, 2 discovery, 3 administrative
  cuda::std::uint8_t fguid[16];       ///< FRU Globally Unique Identifier
  cuda::std::uint16_t crdt1;          ///< Command Retry Delay Time 1, 100 ms units
  cuda::std::uint16_t crdt2;          ///< Command Retry Delay Time 2
  cuda::std::uint16_t crdt3;          ///< Command Retry Delay Time 3
  cuda::std::uint8_t reserved134[106];
  cuda::std::uint8_t reserved240[16];  ///< defined by NVMe-MI

  // Admin Command Set Attributes & Optional Controller Capabilities
  cuda::std::uint16_t oacs;           ///< Optional Admin Command Support
  cuda::std::uint8_t acl;             ///< Abort Command Limit, 0-based
  cuda::std::uint8_t aerl;            ///< Asynchronous Event Request Limit, 0-based
  cuda::std::uint8_t frmw;            ///< Firmware Updates
  cuda::std::uint8_t lpa;             ///< Log Page Attributes
  cuda::std::uint8_t elpe;            ///< Error Log Page Entries, 0-based
  cuda::std::uint8_t npss;            ///< Number of Power States Support, 0-based
  cuda::std::uint8_t avscc;           ///< Admin Vendor Specific Command Configuration
  cuda::std::uint8_t apsta;           ///< Autonomous Power State Transition Attributes
  cuda::std::uint16_t wctemp;         ///< Warning Composite Temperature Threshold, kelvin
  cuda::std::uint16_t cctemp;         ///< Critical Composite Temperature Threshold, kelvin
  cuda::std::uint16_t mtfa;           ///< Maximum Time for Firmware Activation, 100 ms units
  cuda::std::uint32_t hmpre;          ///< Host Memory Buffer Preferred Size, 4 KiB units
  cuda::std::uint32_t hmmin;          ///< Host Memory Buffer Minimum Size, 4 KiB units
  cuda::std::uint8_t tnvmcap[16];     ///< Total NVM Capacity, bytes, 128-bit little-endian
  cuda::std::uint8_t unvmcap[16];     ///< Unallocated NVM Capacity, bytes, 128-bit little-endian
  cuda::std::uint32_t rpmbs;          ///< Replay Protected Memory Block Support
  cuda::std::uint16_t edstt;          ///< Extended Device Self-test Time, minutes
  cuda::std::uint8_t dsto;            ///< Device Self-test Options
  cuda::std::uint8_t fwug;            ///< Firmware Update Granularity, 4 KiB units
  cuda::std::uint16_t kas;            ///< Keep Alive Support, 100 ms units
  cuda::std::uint16_t hctma;          ///< Host Controlled Thermal Management Attributes
  cuda::std::uint16_t mntmt;          ///< Minimum Thermal Management Temperature, kelvin
  cuda::std::uint16_t mxtmt;          ///< Maximum Thermal Management Temperature, kelvin
  cuda::std::uint32_t sanicap;        ///< Sanitize Capabilities
  cuda::std::uint32_t hmminds;        ///< Host Memory Buffer Minimum Descriptor Entry Size, 4 KiB units
  cuda::std::uint16_t hmmaxd;         ///< Host Memory Maximum Descriptors Entries
  cuda::std::uint16_t nsetidmax;      ///< NVM Set Identifier Maximum
  cuda::std::uint16_t endgidmax;      ///< Endurance Group Identifier Maximum
  cuda::std::uint8_t anatt;           ///< ANA Transition Time, seconds
  cuda::std::uint8_t anacap;          ///< Asymmetric Namespace Access Capabilities
  cuda::std::uint32_t anagrpmax;      ///< ANA Group Identifier Maximum
  cuda::std::uint32_t nanagrpid;      ///< Number of ANA Group Identifiers
  cuda::std::uint32_t pels;           ///< Persistent Event Log Size, 64 KiB units
  cuda::std::uint16_t domainid;       ///< Domain Identifier
  cuda::std::uint8_t reserved358[10];
  cuda::std::uint8_t megcap[16];      ///< Max Endurance Group Capacity, bytes, 128-bit little-endian
  cuda::std::uint8_t reserved384[128];

  // NVM Command Set Attributes
  cuda::std::uint8_t sqes;            ///< Submission Queue Entry Size: log2 bytes, required 3:0, maximum 7:4
  cuda::std::uint8_t cqes;            ///< Completion Queue Entry Size: log2 bytes, required 3:0, maximum 7:4
  cuda::std::uint16_t maxcmd;         ///< Maximum Outstanding Commands (fabrics); 0 on PCIe
  cuda::std::uint32_t nn;             ///< Number of Namespaces: the largest valid NSID
  cuda::std::uint16_t oncs;           ///< Optional NVM Command Support
  cuda::std::uint16_t fuses;          ///< Fused Operation Support
  cuda::std::uint8_t fna;             ///< Format NVM Attributes
  cuda::std::uint8_t vwc;             ///< Volatile Write Cache
  cuda::std::uint16_t awun;           ///< Atomic Write Unit Normal, logical blocks, 0-based
  cuda::std::uint16_t awupf;          ///< Atomic Write Unit Power Fail, logical blocks, 0-based
  cuda::std::uint8_t icsvscc;         ///< I/O Command Set Vendor Specific Command Configuration
  cuda::std::uint8_t nwpc;            ///< Namespace Write Protection Capabilities
  cuda::std::uint16_t acwu;           ///< Atomic Compare & Write Unit, logical blocks, 0-based
  cuda::std::uint16_t ocfs;           ///< Optional Copy Formats Supported
  cuda::std::uint32_t sgls;           ///< SGL Support
  cuda::std::uint32_t mnan;           ///< Maximum Number of Allowed Namespaces
  cuda::std::uint8_t maxdna[16];      ///< Maximum Domain Namespace Attachments, 128-bit little-endian
  cuda::std::uint32_t maxcna;         ///< Maximum I/O Controller Namespace Attachments
  cuda::std::uint8_t reserved564[204];
  char subnqn[256];                   ///< NVM Subsystem NVMe Qualified Name, UTF-8, NUL terminated
  cuda::std::uint8_t reserved1024[768];

  // Fabrics (NVMe 2.0 merged the NVMe over Fabrics fields into the base layout)
  cuda::std::uint32_t ioccsz;         ///< I/O Queue Command Capsule Supported Size, 16-byte units
  cuda::std::uint32_t iorcsz;         ///< I/O Queue Response Capsule Supported Size, 16-byte units
  cuda::std::uint16_t icdoff;         ///< In Capsule Data Offset, 16-byte units
  cuda::std::uint8_t fcatt;           ///< Fabrics Controller Attributes
  cuda::std::uint8_t msdbd;           ///< Maximum SGL Data Block Descriptors
  cuda::std::uint16_t ofcs;           ///< Optional Fabric Commands Support
  cuda::std::uint8_t reserved1806[242];

  power_state_descriptor psd[32];     ///< Power State Descriptors 0..31; NPSS + 1 are valid
  cuda::std::uint8_t vs[1024];        ///< Vendor Specific

  /// SQES and CQES nibbles: log2 of the entry size in bytes (6 = 64-byte SQE, 4 = 16-byte CQE).
  using entry_size_required = bit_field<cuda::std::uint8_t, 0, 4>;
  using entry_size_maximum = bit_field<cuda::std::uint8_t, 4, 4>;
  template <unsigned Bit>
  using oacs_bit = bit_field<cuda::std::uint16_t, Bit, 1, bool>;
  template <unsigned Bit>
  using oncs_bit = bit_field<cuda::std::uint16_t, Bit, 1, bool>;
  using vwc_present = bit_field<cuda::std::uint8_t, 0, 1, bool>;
  using vwc_flush_broadcast = bit_field<cuda::std::uint8_t, 1, 2, flush_broadcast>;
  using sgls_support_field = bit_field<cuda::std::uint32_t, 0, 2, sgl_support>;
  using sgls_bit_bucket = bit_field<cuda::std::uint32_t, 16, 1, bool>;

  /// Smallest SQ entry the controller accepts (CC.IOSQES may not go below it), log2 bytes.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t sqes_min() const noexcept {
    return entry_size_required::get(sqes);
  }
  /// Largest SQ entry the controller accepts, log2 bytes.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t sqes_max() const noexcept {
    return entry_size_maximum::get(sqes);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t cqes_min() const noexcept {
    return entry_size_required::get(cqes);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t cqes_max() const noexcept {
    return entry_size_maximum::get(cqes);
  }

  /// Largest data transfer of one command, in bytes: 2^MDTS units of the minimum memory page
  /// size. `min_page_size` is that size in bytes, 2^(12 + CAP.MPSMIN) (MDTS is in CAP.MPSMIN
  /// units whatever CC.MPS is set to; it must not be 0). Returns 0 when MDTS is 0, which the
  /// spec defines as "no maximum data transfer size"; a limit past 2^64 - 1 bytes saturates.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t mdts_bytes(
      cuda::std::uint32_t min_page_size) const noexcept {
    constexpr auto saturated = ~cuda::std::uint64_t{0};
    if (mdts == 0) {
      return 0;
    }
    if (mdts >= 64) {
      return saturated;
    }
    const cuda::std::uint64_t pages = cuda::std::uint64_t{1} << mdts;
    return pages > saturated / (min_page_size == 0 ? 1u : min_page_size) ? saturated
                                                                        : pages * min_page_size;
  }

  // OACS (NVMe 2.0 Figure 275, bytes 257:256): one bit per optional admin command.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool supports_security() const noexcept {
    return oacs_bit<0>::get(oacs);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool supports_format_nvm() const noexcept {
    return oacs_bit<1>::get(oacs);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool supports_firmware_download_commit() const noexcept {
    return oacs_bit<2>::get(oacs);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool supports_namespace_management() const noexcept {
    return oacs_bit<3>::get(oacs);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool supports_device_self_test() const noexcept {
    return oacs_bit<4>::get(oacs);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool supports_directives() const noexcept {
    return oacs_bit<5>::get(oacs);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool supports_nvme_mi_send_receive() const noexcept {
    return oacs_bit<6>::get(oacs);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool supports_virtualization_management() const noexcept {
    return oacs_bit<7>::get(oacs);
  }
  /// Shadow doorbells and EventIdx buffers (Doorbell Buffer Config, admin opcode 7Ch).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool supports_doorbell_buffer_config() const noexcept {
    return oacs_bit<8>::get(oacs);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool supports_get_lba_status() const noexcept {
    return oacs_bit<9>::get(oacs);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool supports_command_and_feature_lockdown() const noexcept {
    return oacs_bit<10>::get(oacs);
  }

  // ONCS (NVMe 2.0 Figure 275, bytes 521:520): one bit per optional NVM command or feature.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool supports_compare() const noexcept {
    return oncs_bit<0>::get(oncs);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool supports_write_uncorrectable() const noexcept {
    return oncs_bit<1>::get(oncs);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool supports_dataset_management() const noexcept {
    return oncs_bit<2>::get(oncs);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool supports_write_zeroes() const noexcept {
    return oncs_bit<3>::get(oncs);
  }
  /// The Save field of Set Features and the Select field of Get Features.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool supports_save_and_select_features() const noexcept {
    return oncs_bit<4>::get(oncs);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool supports_reservations() const noexcept {
    return oncs_bit<5>::get(oncs);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool supports_timestamp() const noexcept {
    return oncs_bit<6>::get(oncs);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool supports_verify() const noexcept {
    return oncs_bit<7>::get(oncs);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool supports_copy() const noexcept {
    return oncs_bit<8>::get(oncs);
  }

  /// A volatile write cache exists, so written data is durable only after Flush (or FUA).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool volatile_write_cache_present() const noexcept {
    return vwc_present::get(vwc);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr flush_broadcast flush_broadcast_support() const noexcept {
    return vwc_flush_broadcast::get(vwc);
  }

  /// SGLS bits 1:0; `sgl_support::not_supported` means commands must use PRPs.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr sgl_support sgls_support() const noexcept {
    return sgls_support_field::get(sgls);
  }
  /// SGLS bit 16: SGL Bit Bucket descriptors (discard part of a read) are accepted.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool supports_sgl_bit_bucket() const noexcept {
    return sgls_bit_bucket::get(sgls);
  }

  /// Entries the Error Information log page holds (ELPE is 0-based).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t error_log_page_entries() const noexcept {
    return cuda::std::uint32_t{elpe} + 1u;
  }
  /// Power states 0..NPSS are supported (NPSS is 0-based), so `psd` holds this many valid entries.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t number_of_power_states() const noexcept {
    return cuda::std::uint32_t{npss} + 1u;
  }
};
static_assert(sizeof(identify_controller) == 4096);
static_assert(offsetof(identify_controller, vid) == 0);
static_assert(offsetof(identify_controller, ssvid) == 2);
static_assert(offsetof(identify_controller, sn) == 4);
static_assert(offsetof(identify_controller, mn) == 24);
static_assert(offsetof(identify_controller, fr) == 64);
static_assert(offsetof(identify_controller, rab) == 72);
static_assert(offsetof(identify_controller, ieee) == 73);
static_assert(offsetof(identify_controller, cmic) == 76);
static_assert(offsetof(identify_controller, mdts) == 77);
static_assert(offsetof(identify_controller, cntlid) == 78);
static_assert(offsetof(identify_controller, ver) == 80);
static_assert(offsetof(identify_controller, rtd3r) == 84);
static_assert(offsetof(identify_controller, rtd3e) == 88);
static_assert(offsetof(identify_controller, oaes) == 92);
static_assert(offsetof(identify_controller, ctratt) == 96);
static_assert(offsetof(identify_controller, rrls) == 100);
static_assert(offsetof(identify_controller, reserved102) == 102);
static_assert(offsetof(identify_controller, cntrltype) == 111);
static_assert(offsetof(identify_controller, fguid) == 112);
static_assert(offsetof(identify_controller, crdt1) == 128);
static_assert(offsetof(identify_controller, crdt2) == 130);
static_assert(offsetof(identify_controller, crdt3) == 132);
static_assert(offsetof(identify_controller, reserved134) == 134);
static_assert(offsetof(identify_controller, reserved240) == 240);
static_assert(offsetof(identify_controller, oacs) == 256);
static_assert(offsetof(identify_controller, acl) == 258);
static_assert(offsetof(identify_controller, aerl) == 259);
static_assert(offsetof(identify_controller, frmw) == 260);
static_assert(offsetof(identify_controller, lpa) == 261);
static_assert(offsetof(identify_controller, elpe) == 262);
static_assert(offsetof(identify_controller, npss) == 263);
static_assert(offsetof(identify_controller, avscc) == 264);
static_assert(offsetof(identify_controller, apsta) == 265);
static_assert(offsetof(identify_controller, wctemp) == 266);
static_assert(offsetof(identify_controller, cctemp) == 268);
static_assert(offsetof(identify_controller, mtfa) == 270);
static_assert(offsetof(identify_controller, hmpre) == 272);
static_assert(offsetof(identify_controller, hmmin) == 276);
static_assert(offsetof(identify_controller, tnvmcap) == 280);
static_assert(offsetof(identify_controller, unvmcap) == 296);
static_assert(offsetof(identify_controller, rpmbs) == 312);
static_assert(offsetof(identify_controller, edstt) == 316);
static_assert(offsetof(identify_controller, dsto) == 318);
static_assert(offsetof(identify_controller, fwug) == 319);
static_assert(offsetof(identify_controller, kas) == 320);
static_assert(offsetof(identify_controller, hctma) == 322);
static_assert(offsetof(identify_controller, mntmt) == 324);
static_assert(offsetof(identify_controller, mxtmt) == 326);
static_assert(offsetof(identify_controller, sanicap) == 328);
static_assert(offsetof(identify_controller, hmminds) == 332);
static_assert(offsetof(identify_controller, hmmaxd) == 336);
static_assert(offsetof(identify_controller, nsetidmax) == 338);
static_assert(offsetof(identify_controller, endgidmax) == 340);
static_assert(offsetof(identify_controller, anatt) == 342);
static_assert(offsetof(identify_controller, anacap) == 343);
static_assert(offsetof(identify_controller, anagrpmax) == 344);
static_assert(offsetof(identify_controller, nanagrpid) == 348);
static_assert(offsetof(identify_controller, pels) == 352);
static_assert(offsetof(identify_controller, domainid) == 356);
static_assert(offsetof(identify_controller, reserved358) == 358);
static_assert(offsetof(identify_controller, megcap) == 368);
static_assert(offsetof(identify_controller, reserved384) == 384);
static_assert(offsetof(identify_controller, sqes) == 512);
static_assert(offsetof(identify_controller, cqes) == 513);
static_assert(offsetof(identify_controller, maxcmd) == 514);
static_assert(offsetof(identify_controller, nn) == 516);
static_assert(offsetof(identify_controller, oncs) == 520);
static_assert(offsetof(identify_controller, fuses) == 522);
static_assert(offsetof(identify_controller, fna) == 524);
static_assert(offsetof(identify_controller, vwc) == 525);
static_assert(offsetof(identify_controller, awun) == 526);
static_assert(offsetof(identify_controller, awupf) == 528);
static_assert(offsetof(identify_controller, icsvscc) == 530);
static_assert(offsetof(identify_controller, nwpc) == 531);
static_assert(offsetof(identify_controller, acwu) == 532);
static_assert(offsetof(identify_controller, ocfs) == 534);
static_assert(offsetof(identify_controller, sgls) == 536);
static_assert(offsetof(identify_controller, mnan) == 540);
static_assert(offsetof(identify_controller, maxdna) == 544);
static_assert(offsetof(identify_controller, maxcna) == 560);
static_assert(offsetof(identify_controller, reserved564) == 564);
static_assert(offsetof(identify_controller, subnqn) == 768);
static_assert(offsetof(identify_controller, reserved1024) == 1024);
static_assert(offsetof(identify_controller, ioccsz) == 1792);
static_assert(offsetof(identify_controller, iorcsz) == 1796);
static_assert(offsetof(identify_controller, icdoff) == 1800);
static_assert(offsetof(identify_controller, fcatt) == 1802);
static_assert(offsetof(identify_controller, msdbd) == 1803);
static_assert(offsetof(identify_controller, ofcs) == 1804);
static_assert(offsetof(identify_controller, reserved1806) == 1806);
static_assert(offsetof(identify_controller, psd) == 2048);
static_assert(offsetof(identify_controller, vs) == 3072);
static_assert(cuda::std::is_standard_layout_v<identify_controller> &&
              cuda::std::is_trivially_copyable_v<identify_controller>);

/// Identify Namespace data structure for the NVM Command Set, CNS 00h (NVM Command Set 1.0
/// Figure 97): 4096 bytes. Sizes and capacities are in logical blocks of the current format.
///
/// Usage: examples/snippets/spec.cpp, `namespace_bytes`.
struct identify_namespace {
  cuda::std::uint64_t nsze;           ///< Namespace Size, logical blocks
  cuda::std::uint64_t ncap;           ///< Namespace Capacity, logical blocks
  cuda::std::uint64_t nuse;           ///< Namespace Utilization, logical blocks
  cuda::std::uint8_t nsfeat;          ///< Namespace Features
  cuda::std::uint8_t nlbaf;           ///< Number of LBA Formats, 0-based
  cuda::std::uint8_t flbas;           ///< Formatted LBA Size: index bits 3:0 and 6:5, extended LBA bit 4
  cuda::std::uint8_t mc;              ///< Metadata Capabilities
  cuda::std::uint8_t dpc;             ///< End-to-end Data Protection Capabilities
  cuda::std::uint8_t dps;             ///< End-to-end Data Protection Type Settings
  cuda::std::uint8_t nmic;            ///< Namespace Multi-path I/O and Namespace Sharing Capabilities
  cuda::std::uint8_t rescap;          ///< Reservation Capabilities
  cuda::std::uint8_t fpi;             ///< Format Progress Indicator
  cuda::std::uint8_t dlfeat;          ///< Deallocate Logical Block Features
  cuda::std::uint16_t nawun;          ///< Namespace Atomic Write Unit Normal, 0-based
  cuda::std::uint16_t nawupf;         ///< Namespace Atomic Write Unit Power Fail, 0-based
  cuda::std::uint16_t nacwu;          ///< Namespace Atomic Compare & Write Unit, 0-based
  cuda::std::uint16_t nabsn;          ///< Namespace Atomic Boundary Size Normal, 0-based
  cuda::std::uint16_t nabo;           ///< Namespace Atomic Boundary Offset
  cuda::std::uint16_t nabspf;         ///< Namespace Atomic Boundary Size Power Fail, 0-based
  cuda::std::uint16_t noiob;          ///< Namespace Optimal I/O Boundary, logical blocks
  cuda::std::uint8_t nvmcap[16];      ///< NVM Capacity, bytes, 128-bit little-endian
  cuda::std::uint16_t npwg;           ///< Namespace Preferred Write Granularity, 0-based
  cuda::std::uint16_t npwa;           ///< Namespace Preferred Write Alignment, 0-based
  cuda::std::uint16_t npdg;           ///< Namespace Preferred Deallocate Granularity, 0-based
  cuda::std::uint16_t npda;           ///< Namespace Preferred Deallocate Alignment, 0-based
  cuda::std::uint16_t nows;           ///< Namespace Optimal Write Size, 0-based
  cuda::std::uint16_t mssrl;          ///< Maximum Single Source Range Length (Copy)
  cuda::std::uint32_t mcl;            ///< Maximum Copy Length
  cuda::std::uint8_t msrc;            ///< Maximum Source Range Count, 0-based
  cuda::std::uint8_t reserved81[11];
  cuda::std::uint32_t anagrpid;       ///< ANA Group Identifier
  cuda::std::uint8_t reserved96[3];
  cuda::std::uint8_t nsattr;          ///< Namespace Attributes: bit 0 write protected
  cuda::std::uint16_t nvmsetid;       ///< NVM Set Identifier
  cuda::std::uint16_t endgid;         ///< Endurance Group Identifier
  cuda::std::uint8_t nguid[16];       ///< Namespace Globally Unique Identifier
  cuda::std::uint8_t eui64[8];        ///< IEEE Extended Unique Identifier
  lba_format lbaf[64];                ///< LBA Formats 0..NLBAF; entries past NLBAF are invalid
  cuda::std::uint8_t reserved384[3456];
  cuda::std::uint8_t vs[256];         ///< Vendor Specific

  using flbas_index_low = bit_field<cuda::std::uint8_t, 0, 4>;
  using flbas_extended_lba = bit_field<cuda::std::uint8_t, 4, 1, bool>;
  using flbas_index_high = bit_field<cuda::std::uint8_t, 5, 2>;
  /// DPS bits 2:0, Protection Information Type: 0 none, 1..3 Type 1..3.
  using dps_pit = bit_field<cuda::std::uint8_t, 0, 3>;

  /// How many entries of `lbaf` are valid (NLBAF is 0-based; at most 64).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t number_of_lba_formats() const noexcept {
    return cuda::std::uint32_t{nlbaf} + 1u;
  }

  /// Index into `lbaf` of the format the namespace is formatted with: FLBAS bits 3:0, with
  /// bits 6:5 as index bits 5:4. Bits 6:5 were reserved before NVM Command Set 1.0 and the
  /// spec tells hosts to ignore them unless the namespace has more than 16 formats, so they
  /// are used only when `number_of_lba_formats() > 16` (the only case where an index of 16 or
  /// more can be valid).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t formatted_lba_index() const noexcept {
    const auto low = flbas_index_low::get(flbas);
    if (number_of_lba_formats() <= 16) {
      return low;
    }
    return static_cast<cuda::std::uint8_t>(low | (flbas_index_high::get(flbas) << 4));
  }

  /// Stores `index` (0..63) into FLBAS bits 3:0 and 6:5; bit 4 is untouched.
  CUNVME_HOST_DEVICE constexpr identify_namespace& set_formatted_lba_index(cuda::std::uint8_t index) noexcept {
    flbas = flbas_index_low::set(flbas, static_cast<cuda::std::uint8_t>(index & 0x0fu));
    flbas = flbas_index_high::set(flbas, static_cast<cuda::std::uint8_t>(index >> 4));
    return *this;
  }

  /// FLBAS bit 4: metadata travels at the end of each logical block (an extended LBA) rather
  /// than in the separate buffer MPTR points to. Meaningful only when the format has metadata.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool metadata_at_end_of_lba() const noexcept {
    return flbas_extended_lba::get(flbas);
  }

  CUNVME_HOST_DEVICE constexpr identify_namespace& set_metadata_at_end_of_lba(bool value) noexcept {
    flbas = flbas_extended_lba::set(flbas, value);
    return *this;
  }

  /// The end-to-end protection type the namespace is formatted with (DPS bits 2:0): 0 when
  /// protection is off, 1, 2 or 3 for Type 1, 2 or 3. DPS bit 3 (where the protection
  /// information sits in the metadata) does not enable protection on its own.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t protection_type() const noexcept {
    return dps_pit::get(dps);
  }

  CUNVME_HOST_DEVICE constexpr identify_namespace& set_protection_type(cuda::std::uint8_t type) noexcept {
    dps = dps_pit::set(dps, type);
    return *this;
  }

  [[nodiscard]] CUNVME_HOST_DEVICE constexpr lba_format current_lba_format() const noexcept {
    return lbaf[formatted_lba_index()];
  }

  /// Data bytes per logical block of the current format; 0 when that format is not usable.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t lba_size_bytes() const noexcept {
    return current_lba_format().lba_data_size_bytes();
  }

  /// Metadata bytes per logical block of the current format.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint16_t metadata_size_bytes() const noexcept {
    return current_lba_format().ms();
  }
};
static_assert(sizeof(identify_namespace) == 4096);
static_assert(offsetof(identify_namespace, nsze) == 0);
static_assert(offsetof(identify_namespace, ncap) == 8);
static_assert(offsetof(identify_namespace, nuse) == 16);
static_assert(offsetof(identify_namespace, nsfeat) == 24);
static_assert(offsetof(identify_namespace, nlbaf) == 25);
static_assert(offsetof(identify_namespace, flbas) == 26);
static_assert(offsetof(identify_namespace, mc) == 27);
static_assert(offsetof(identify_namespace, dpc) == 28);
static_assert(offsetof(identify_namespace, dps) == 29);
static_assert(offsetof(identify_namespace, nmic) == 30);
static_assert(offsetof(identify_namespace, rescap) == 31);
static_assert(offsetof(identify_namespace, fpi) == 32);
static_assert(offsetof(identify_namespace, dlfeat) == 33);
static_assert(offsetof(identify_namespace, nawun) == 34);
static_assert(offsetof(identify_namespace, nawupf) == 36);
static_assert(offsetof(identify_namespace, nacwu) == 38);
static_assert(offsetof(identify_namespace, nabsn) == 40);
static_assert(offsetof(identify_namespace, nabo) == 42);
static_assert(offsetof(identify_namespace, nabspf) == 44);
static_assert(offsetof(identify_namespace, noiob) == 46);
static_assert(offsetof(identify_namespace, nvmcap) == 48);
static_assert(offsetof(identify_namespace, npwg) == 64);
static_assert(offsetof(identify_namespace, npwa) == 66);
static_assert(offsetof(identify_namespace, npdg) == 68);
static_assert(offsetof(identify_namespace, npda) == 70);
static_assert(offsetof(identify_namespace, nows) == 72);
static_assert(offsetof(identify_namespace, mssrl) == 74);
static_assert(offsetof(identify_namespace, mcl) == 76);
static_assert(offsetof(identify_namespace, msrc) == 80);
static_assert(offsetof(identify_namespace, reserved81) == 81);
static_assert(offsetof(identify_namespace, anagrpid) == 92);
static_assert(offsetof(identify_namespace, reserved96) == 96);
static_assert(offsetof(identify_namespace, nsattr) == 99);
static_assert(offsetof(identify_namespace, nvmsetid) == 100);
static_assert(offsetof(identify_namespace, endgid) == 102);
static_assert(offsetof(identify_namespace, nguid) == 104);
static_assert(offsetof(identify_namespace, eui64) == 120);
static_assert(offsetof(identify_namespace, lbaf) == 128);
static_assert(offsetof(identify_namespace, reserved384) == 384);
static_assert(offsetof(identify_namespace, vs) == 3840);
static_assert(cuda::std::is_standard_layout_v<identify_namespace> &&
              cuda::std::is_trivially_copyable_v<identify_namespace>);

/// Active Namespace ID list, CNS 02h (NVMe 2.0 section 5.17.2.2): up to 1024 active NSIDs
/// greater than the NSID in the command, in increasing order, the unused tail zero-filled.
/// A controller with more namespaces is walked by issuing the command again with the last
/// NSID returned.
///
/// Usage: examples/snippets/spec.cpp, `active_namespaces`.
struct active_namespace_list {
  cuda::std::uint32_t nsid[1024];

  /// Entries before the first zero.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t count() const noexcept {
    cuda::std::uint32_t n = 0;
    while (n < 1024 && nsid[n] != 0) {
      ++n;
    }
    return n;
  }
};
static_assert(sizeof(active_namespace_list) == 4096);
static_assert(offsetof(active_namespace_list, nsid) == 0);
static_assert(cuda::std::is_standard_layout_v<active_namespace_list> &&
              cuda::std::is_trivially_copyable_v<active_namespace_list>);

/// An ASCII field of Identify Controller (SN, MN, FR) as text: the spec pads them with spaces
/// (20h) on the right, and some controllers also pad on the left or with NULs, so the result
/// ends at the first NUL and has leading and trailing spaces removed. Also reads SUBNQN, which
/// is NUL terminated. Host only.
///
/// Usage: examples/snippets/spec.cpp, `controller_summary`.
template <std::size_t N>
[[nodiscard]] inline std::string trimmed(const char (&field)[N]) {
  std::size_t end = 0;
  while (end < N && field[end] != '\0') {
    ++end;
  }
  std::size_t begin = 0;
  while (begin < end && field[begin] == ' ') {
    ++begin;
  }
  while (end > begin && field[end - 1] == ' ') {
    --end;
  }
  return std::string(field + begin, end - begin);
}

}  // namespace spec
CUNVME_NAMESPACE_END
