// Log pages and the Get Log Page command (NVMe Base Specification 2.0, sections 5.16 and
// 5.16.1): log identifiers, the command's dwords 10-14, and the layouts of the logs a driver
// reads to report health and errors.
//
// Structures keep raw little-endian fields named after the spec, with every offset pinned by
// a `static_assert`, so a log can be read straight out of the Get Log Page buffer.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/spec/bit_field.cuh>

#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/type_traits>

CUNVME_NAMESPACE_BEGIN
namespace spec {

/// Log Page Identifiers, Get Log Page CDW10 bits 7:0 (NVMe 2.0 Figure 202). C0h-FFh are
/// vendor specific; any byte converts with `static_cast<log_page_id>(byte)`.
///
/// Usage: examples/snippets/spec.cpp, `error_log_command`.
enum class log_page_id : cuda::std::uint8_t {
  supported_log_pages = 0x00,
  error_information = 0x01,
  smart_health_information = 0x02,
  firmware_slot_information = 0x03,
  changed_namespace_list = 0x04,
  commands_supported_and_effects = 0x05,
  device_self_test = 0x06,
  telemetry_host_initiated = 0x07,
  telemetry_controller_initiated = 0x08,
  endurance_group_information = 0x09,
  predictable_latency_per_nvm_set = 0x0a,
  predictable_latency_event_aggregate = 0x0b,
  asymmetric_namespace_access = 0x0c,
  persistent_event_log = 0x0d,
  endurance_group_event_aggregate = 0x0f,
  media_unit_status = 0x10,
  supported_capacity_configuration_list = 0x11,
  feature_identifiers_supported_and_effects = 0x12,
  nvme_mi_commands_supported_and_effects = 0x13,
  command_and_feature_lockdown = 0x14,
  boot_partition = 0x15,
  rotational_media_information = 0x16,
  discovery = 0x70,
  reservation_notification = 0x80,
  sanitize_status = 0x81,
};

/// Command dwords 10-14 of Get Log Page (NVMe 2.0 Figures 197-200), raw, with field accessors.
/// The transfer length NUMD is a 0-based dword count split across CDW10.NUMDL (low 16 bits)
/// and CDW11.NUMDU (high 16 bits); the offset LPOL/LPOU is in bytes unless OT is set.
///
/// Usage: examples/snippets/spec.cpp, `error_log_command`.
struct get_log_page_dwords {
  using lid_field = bit_field<cuda::std::uint32_t, 0, 8, log_page_id>;
  /// Log Specific Parameter, 7 bits since NVMe 2.0 (4 bits, 11:8, before).
  using lsp_field = bit_field<cuda::std::uint32_t, 8, 7, cuda::std::uint8_t>;
  using rae_field = bit_field<cuda::std::uint32_t, 15, 1, bool>;
  using numdl_field = bit_field<cuda::std::uint32_t, 16, 16, cuda::std::uint16_t>;
  using numdu_field = bit_field<cuda::std::uint32_t, 0, 16, cuda::std::uint16_t>;
  using lsi_field = bit_field<cuda::std::uint32_t, 16, 16, cuda::std::uint16_t>;
  using uuid_index_field = bit_field<cuda::std::uint32_t, 0, 7, cuda::std::uint8_t>;
  using ot_field = bit_field<cuda::std::uint32_t, 23, 1, bool>;
  using csi_field = bit_field<cuda::std::uint32_t, 24, 8, cuda::std::uint8_t>;

  /// NUMD is 32 bits and 0-based, so one command moves at most 2^32 dwords.
  static constexpr cuda::std::uint64_t max_dwords = cuda::std::uint64_t{1} << 32;

  cuda::std::uint32_t cdw10;  ///< LID 7:0, LSP 14:8, RAE 15, NUMDL 31:16
  cuda::std::uint32_t cdw11;  ///< NUMDU 15:0, LSI 31:16
  cuda::std::uint32_t cdw12;  ///< LPOL: offset bits 31:0
  cuda::std::uint32_t cdw13;  ///< LPOU: offset bits 63:32
  cuda::std::uint32_t cdw14;  ///< UUID Index 6:0, OT 23, CSI 31:24

  /// Whether `bytes` is a length Get Log Page can express exactly: whole dwords, 1..2^32 of them.
  [[nodiscard]] CUNVME_HOST_DEVICE static constexpr bool valid_length(cuda::std::uint64_t bytes) noexcept {
    return bytes >= 4 && bytes % 4 == 0 && bytes / 4 <= max_dwords;
  }

  /// Dwords to read `bytes` of log `lid` starting at byte `offset` (which the spec requires to
  /// be dword aligned). Every log page is a whole number of dwords; a length that is not is
  /// rounded down so the controller never writes past `bytes`, and lengths outside
  /// `valid_length` are clamped to 1..2^32 dwords. LSP, RAE, LSI, UUID index and CSI are 0.
  [[nodiscard]] CUNVME_HOST_DEVICE static constexpr get_log_page_dwords for_log(
      log_page_id lid, cuda::std::uint64_t bytes, cuda::std::uint64_t offset = 0) noexcept {
    get_log_page_dwords dw{};
    dw.set_lid(lid).set_number_of_dwords(bytes / 4).set_offset(offset);
    return dw;
  }

  [[nodiscard]] CUNVME_HOST_DEVICE constexpr log_page_id lid() const noexcept {
    return lid_field::get(cdw10);
  }
  CUNVME_HOST_DEVICE constexpr get_log_page_dwords& set_lid(log_page_id value) noexcept {
    cdw10 = lid_field::set(cdw10, value);
    return *this;
  }

  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t lsp() const noexcept {
    return lsp_field::get(cdw10);
  }
  CUNVME_HOST_DEVICE constexpr get_log_page_dwords& set_lsp(cuda::std::uint8_t value) noexcept {
    cdw10 = lsp_field::set(cdw10, value);
    return *this;
  }

  /// Retain Asynchronous Event: reading the log does not clear the event that announced it,
  /// so a monitoring read does not swallow an event another agent is waiting for.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool rae() const noexcept {
    return rae_field::get(cdw10);
  }
  CUNVME_HOST_DEVICE constexpr get_log_page_dwords& set_rae(bool value) noexcept {
    cdw10 = rae_field::set(cdw10, value);
    return *this;
  }

  /// Dwords to transfer, 1..2^32 (NUMDU:NUMDL + 1).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t number_of_dwords() const noexcept {
    const cuda::std::uint64_t numd =
        (cuda::std::uint64_t{numdu_field::get(cdw11)} << 16) | numdl_field::get(cdw10);
    return numd + 1;
  }
  /// `dwords` is clamped to 1..2^32, the range the 0-based NUMD can hold.
  CUNVME_HOST_DEVICE constexpr get_log_page_dwords& set_number_of_dwords(cuda::std::uint64_t dwords) noexcept {
    const cuda::std::uint64_t clamped = dwords == 0 ? 1 : (dwords > max_dwords ? max_dwords : dwords);
    const auto numd = static_cast<cuda::std::uint32_t>(clamped - 1);
    cdw10 = numdl_field::set(cdw10, static_cast<cuda::std::uint16_t>(numd & 0xffffu));
    cdw11 = numdu_field::set(cdw11, static_cast<cuda::std::uint16_t>(numd >> 16));
    return *this;
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t number_of_bytes() const noexcept {
    return number_of_dwords() * 4;
  }

  /// Log Specific Identifier (e.g. the Endurance Group for log 09h).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint16_t lsi() const noexcept {
    return lsi_field::get(cdw11);
  }
  CUNVME_HOST_DEVICE constexpr get_log_page_dwords& set_lsi(cuda::std::uint16_t value) noexcept {
    cdw11 = lsi_field::set(cdw11, value);
    return *this;
  }

  /// LPOU:LPOL, a byte offset into the log (or an entry index when OT is set).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t offset() const noexcept {
    return (cuda::std::uint64_t{cdw13} << 32) | cdw12;
  }
  CUNVME_HOST_DEVICE constexpr get_log_page_dwords& set_offset(cuda::std::uint64_t value) noexcept {
    cdw12 = static_cast<cuda::std::uint32_t>(value);
    cdw13 = static_cast<cuda::std::uint32_t>(value >> 32);
    return *this;
  }

  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t uuid_index() const noexcept {
    return uuid_index_field::get(cdw14);
  }
  CUNVME_HOST_DEVICE constexpr get_log_page_dwords& set_uuid_index(cuda::std::uint8_t value) noexcept {
    cdw14 = uuid_index_field::set(cdw14, value);
    return *this;
  }

  /// Offset Type: LPOL/LPOU index a list of entries instead of bytes (only for logs whose
  /// support is reported in the Supported Log Pages log).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool offset_is_index() const noexcept {
    return ot_field::get(cdw14);
  }
  CUNVME_HOST_DEVICE constexpr get_log_page_dwords& set_offset_is_index(bool value) noexcept {
    cdw14 = ot_field::set(cdw14, value);
    return *this;
  }

  /// Command Set Identifier for command-set-specific logs (0 = NVM Command Set).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t csi() const noexcept {
    return csi_field::get(cdw14);
  }
  CUNVME_HOST_DEVICE constexpr get_log_page_dwords& set_csi(cuda::std::uint8_t value) noexcept {
    cdw14 = csi_field::set(cdw14, value);
    return *this;
  }
};
static_assert(sizeof(get_log_page_dwords) == 20);
static_assert(offsetof(get_log_page_dwords, cdw10) == 0);
static_assert(offsetof(get_log_page_dwords, cdw11) == 4);
static_assert(offsetof(get_log_page_dwords, cdw12) == 8);
static_assert(offsetof(get_log_page_dwords, cdw13) == 12);
static_assert(offsetof(get_log_page_dwords, cdw14) == 16);
static_assert(cuda::std::is_standard_layout_v<get_log_page_dwords> &&
              cuda::std::is_trivially_copyable_v<get_log_page_dwords>);

/// Error Information Log Entry, log 01h (NVMe 2.0 Figure 206): 64 bytes; the log is ELPE + 1
/// of these, newest first.
///
/// Usage: examples/snippets/spec.cpp, `report_errors`.
struct error_information_log_entry {
  /// Status Field word: bit 0 is the phase tag, bits 15:1 the Status Field as in CQE DW3 31:17.
  using phase_tag_field = bit_field<cuda::std::uint16_t, 0, 1, bool>;
  using status_field_bits = bit_field<cuda::std::uint16_t, 1, 15>;
  using status_code_field = bit_field<cuda::std::uint16_t, 1, 8, cuda::std::uint8_t>;
  using status_code_type_field = bit_field<cuda::std::uint16_t, 9, 3, cuda::std::uint8_t>;
  using do_not_retry_field = bit_field<cuda::std::uint16_t, 15, 1, bool>;
  /// Parameter Error Location: byte of the command in bits 7:0, bit within it in bits 10:8.
  using error_byte_field = bit_field<cuda::std::uint16_t, 0, 8, cuda::std::uint8_t>;
  using error_bit_field = bit_field<cuda::std::uint16_t, 8, 3, cuda::std::uint8_t>;

  cuda::std::uint64_t error_count;  ///< unique, incrementing; 0 marks an unused entry
  cuda::std::uint16_t sqid;         ///< Submission Queue ID; FFFFh when not command specific
  cuda::std::uint16_t cid;          ///< Command ID; FFFFh when not command specific
  cuda::std::uint16_t status_field;
  cuda::std::uint16_t parameter_error_location;  ///< FFFFh when not command specific
  cuda::std::uint64_t lba;          ///< first LBA that saw the error
  cuda::std::uint32_t nsid;         ///< Namespace
  cuda::std::uint8_t vendor_specific_information_available;  ///< log page ID holding more; 0: none
  cuda::std::uint8_t transport_type;
  cuda::std::uint8_t reserved30[2];
  cuda::std::uint64_t command_specific_information;
  cuda::std::uint16_t transport_type_specific_information;
  cuda::std::uint8_t reserved42[22];

  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool valid() const noexcept {
    return error_count != 0;
  }

  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool phase_tag() const noexcept {
    return phase_tag_field::get(status_field);
  }
  /// The 15-bit Status Field, laid out as CQE DW3 bits 31:17 (SC 7:0, SCT 10:8, CRD 12:11,
  /// M 13, DNR 14).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint16_t status() const noexcept {
    return status_field_bits::get(status_field);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t status_code() const noexcept {
    return status_code_field::get(status_field);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t status_code_type() const noexcept {
    return status_code_type_field::get(status_field);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool do_not_retry() const noexcept {
    return do_not_retry_field::get(status_field);
  }

  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool has_parameter_error_location() const noexcept {
    return parameter_error_location != 0xffffu;
  }
  /// Byte of the submission queue entry holding the parameter in error (0..63).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t parameter_error_byte() const noexcept {
    return error_byte_field::get(parameter_error_location);
  }
  /// Bit (0..7) within `parameter_error_byte()`.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t parameter_error_bit() const noexcept {
    return error_bit_field::get(parameter_error_location);
  }
  /// Points at bit `bit` of byte `byte` of the command; reserved bits 15:11 are cleared.
  CUNVME_HOST_DEVICE constexpr error_information_log_entry& set_parameter_error_location(
      cuda::std::uint8_t byte, cuda::std::uint8_t bit) noexcept {
    parameter_error_location = error_bit_field::set(error_byte_field::set(0, byte), bit);
    return *this;
  }
};
static_assert(sizeof(error_information_log_entry) == 64);
static_assert(offsetof(error_information_log_entry, error_count) == 0);
static_assert(offsetof(error_information_log_entry, sqid) == 8);
static_assert(offsetof(error_information_log_entry, cid) == 10);
static_assert(offsetof(error_information_log_entry, status_field) == 12);
static_assert(offsetof(error_information_log_entry, parameter_error_location) == 14);
static_assert(offsetof(error_information_log_entry, lba) == 16);
static_assert(offsetof(error_information_log_entry, nsid) == 24);
static_assert(offsetof(error_information_log_entry, vendor_specific_information_available) == 28);
static_assert(offsetof(error_information_log_entry, transport_type) == 29);
static_assert(offsetof(error_information_log_entry, reserved30) == 30);
static_assert(offsetof(error_information_log_entry, command_specific_information) == 32);
static_assert(offsetof(error_information_log_entry, transport_type_specific_information) == 40);
static_assert(offsetof(error_information_log_entry, reserved42) == 42);
static_assert(cuda::std::is_standard_layout_v<error_information_log_entry> &&
              cuda::std::is_trivially_copyable_v<error_information_log_entry>);

/// A 128-bit little-endian counter of the SMART / Health log. The two halves are the low and
/// high 8 bytes in memory, which is the value's own layout on the little-endian hosts and GPUs
/// this library targets.
///
/// Usage: examples/snippets/spec.cpp, `data_units_read`.
struct u128_le {
  cuda::std::uint64_t lo;
  cuda::std::uint64_t hi;

  /// Adds `value`, carrying into the high half; wraps modulo 2^128.
  CUNVME_HOST_DEVICE constexpr u128_le& add(cuda::std::uint64_t value) noexcept {
    const cuda::std::uint64_t before = lo;
    lo += value;
    if (lo < before) {
      ++hi;
    }
    return *this;
  }

  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t low64() const noexcept {
    return lo;
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool fits_in_64_bits() const noexcept {
    return hi == 0;
  }
};
static_assert(sizeof(u128_le) == 16);
static_assert(offsetof(u128_le, lo) == 0);
static_assert(offsetof(u128_le, hi) == 8);
static_assert(cuda::std::is_standard_layout_v<u128_le> && cuda::std::is_trivially_copyable_v<u128_le>);

/// Data Units Read/Written for `count_512b_blocks` 512-byte units: the SMART / Health log
/// reports them in thousands, rounded up (NVMe 2.0 Figure 207: 1 means 1 to 1,000 units,
/// 3 means 2,001 to 3,000). Metadata is not counted.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t data_units(
    cuda::std::uint64_t count_512b_blocks) noexcept {
  return count_512b_blocks / 1000 + (count_512b_blocks % 1000 != 0 ? 1 : 0);
}

/// SMART / Health Information log, log 02h (NVMe 2.0 Figure 207): 512 bytes. Temperatures are
/// in kelvin; 128-bit counters are `u128_le`.
///
/// Usage: examples/snippets/spec.cpp, `written_bytes_upper_bound`.
struct smart_health_information_log {
  template <unsigned Bit>
  using critical_warning_bit = bit_field<cuda::std::uint8_t, Bit, 1, bool>;

  cuda::std::uint8_t critical_warning;
  /// Composite Temperature, kelvin: a 16-bit field at byte 1, so it is kept as bytes to keep
  /// the structure free of padding; use `composite_temperature_kelvin()`.
  cuda::std::uint8_t composite_temperature[2];
  cuda::std::uint8_t available_spare;            ///< percent of spare capacity left
  cuda::std::uint8_t available_spare_threshold;  ///< percent
  cuda::std::uint8_t percentage_used;            ///< may exceed 100
  cuda::std::uint8_t endurance_group_critical_warning_summary;
  cuda::std::uint8_t reserved7[25];
  u128_le data_units_read;     ///< thousands of 512-byte units, rounded up; see `data_units`
  u128_le data_units_written;  ///< thousands of 512-byte units, rounded up
  u128_le host_read_commands;
  u128_le host_write_commands;
  u128_le controller_busy_time;  ///< minutes
  u128_le power_cycles;
  u128_le power_on_hours;
  u128_le unsafe_shutdowns;
  u128_le media_and_data_integrity_errors;
  u128_le number_of_error_information_log_entries;
  cuda::std::uint32_t warning_composite_temperature_time;   ///< minutes at or above WCTEMP
  cuda::std::uint32_t critical_composite_temperature_time;  ///< minutes at or above CCTEMP
  cuda::std::uint16_t temperature_sensor[8];                ///< kelvin; 0: sensor not implemented
  cuda::std::uint32_t thermal_management_temperature_1_transition_count;
  cuda::std::uint32_t thermal_management_temperature_2_transition_count;
  cuda::std::uint32_t total_time_for_thermal_management_temperature_1;  ///< seconds
  cuda::std::uint32_t total_time_for_thermal_management_temperature_2;  ///< seconds
  cuda::std::uint8_t reserved232[280];

  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint16_t composite_temperature_kelvin() const noexcept {
    return static_cast<cuda::std::uint16_t>(composite_temperature[0] |
                                            (composite_temperature[1] << 8));
  }
  CUNVME_HOST_DEVICE constexpr smart_health_information_log& set_composite_temperature_kelvin(
      cuda::std::uint16_t kelvin) noexcept {
    composite_temperature[0] = static_cast<cuda::std::uint8_t>(kelvin & 0xffu);
    composite_temperature[1] = static_cast<cuda::std::uint8_t>(kelvin >> 8);
    return *this;
  }

  // Critical Warning bits (Figure 207, byte 0); each also raises a SMART / Health async event.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool available_spare_below_threshold() const noexcept {
    return critical_warning_bit<0>::get(critical_warning);
  }
  /// Composite or another temperature is above an over-temperature or below an
  /// under-temperature threshold.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool temperature_out_of_range() const noexcept {
    return critical_warning_bit<1>::get(critical_warning);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool reliability_degraded() const noexcept {
    return critical_warning_bit<2>::get(critical_warning);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool read_only() const noexcept {
    return critical_warning_bit<3>::get(critical_warning);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool volatile_memory_backup_failed() const noexcept {
    return critical_warning_bit<4>::get(critical_warning);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool persistent_memory_region_read_only() const noexcept {
    return critical_warning_bit<5>::get(critical_warning);
  }
};
static_assert(sizeof(smart_health_information_log) == 512);
static_assert(offsetof(smart_health_information_log, critical_warning) == 0);
static_assert(offsetof(smart_health_information_log, composite_temperature) == 1);
static_assert(offsetof(smart_health_information_log, available_spare) == 3);
static_assert(offsetof(smart_health_information_log, available_spare_threshold) == 4);
static_assert(offsetof(smart_health_information_log, percentage_used) == 5);
static_assert(offsetof(smart_health_information_log, endurance_group_critical_warning_summary) == 6);
static_assert(offsetof(smart_health_information_log, reserved7) == 7);
static_assert(offsetof(smart_health_information_log, data_units_read) == 32);
static_assert(offsetof(smart_health_information_log, data_units_written) == 48);
static_assert(offsetof(smart_health_information_log, host_read_commands) == 64);
static_assert(offsetof(smart_health_information_log, host_write_commands) == 80);
static_assert(offsetof(smart_health_information_log, controller_busy_time) == 96);
static_assert(offsetof(smart_health_information_log, power_cycles) == 112);
static_assert(offsetof(smart_health_information_log, power_on_hours) == 128);
static_assert(offsetof(smart_health_information_log, unsafe_shutdowns) == 144);
static_assert(offsetof(smart_health_information_log, media_and_data_integrity_errors) == 160);
static_assert(offsetof(smart_health_information_log, number_of_error_information_log_entries) == 176);
static_assert(offsetof(smart_health_information_log, warning_composite_temperature_time) == 192);
static_assert(offsetof(smart_health_information_log, critical_composite_temperature_time) == 196);
static_assert(offsetof(smart_health_information_log, temperature_sensor) == 200);
static_assert(offsetof(smart_health_information_log, thermal_management_temperature_1_transition_count) == 216);
static_assert(offsetof(smart_health_information_log, thermal_management_temperature_2_transition_count) == 220);
static_assert(offsetof(smart_health_information_log, total_time_for_thermal_management_temperature_1) == 224);
static_assert(offsetof(smart_health_information_log, total_time_for_thermal_management_temperature_2) == 228);
static_assert(offsetof(smart_health_information_log, reserved232) == 232);
static_assert(cuda::std::is_standard_layout_v<smart_health_information_log> &&
              cuda::std::is_trivially_copyable_v<smart_health_information_log>);

}  // namespace spec
CUNVME_NAMESPACE_END
