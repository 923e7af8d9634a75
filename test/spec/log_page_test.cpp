// Log pages and Get Log Page dwords: layouts decode from raw little-endian bytes at the spec's
// offsets, command dwords round-trip, and counters follow NVMe 2.0's rules.
#include <cunvme/spec/log_page.cuh>

#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace {

using cunvme::spec::data_units;
using cunvme::spec::error_information_log_entry;
using cunvme::spec::get_log_page_dwords;
using cunvme::spec::log_page_id;
using cunvme::spec::smart_health_information_log;
using cunvme::spec::u128_le;

template <std::size_t N>
void put_le(std::array<std::uint8_t, N>& image, std::size_t offset, std::uint64_t value, std::size_t width) {
  for (std::size_t i = 0; i < width; ++i) {
    image[offset + i] = static_cast<std::uint8_t>(value >> (8 * i));
  }
}

template <class T>
T decode(const std::array<std::uint8_t, sizeof(T)>& image) {
  T value;
  std::memcpy(&value, image.data(), sizeof value);
  return value;
}

constexpr std::uint8_t id(log_page_id lid) {
  return static_cast<std::uint8_t>(lid);
}

}  // namespace

TEST_CASE("log page identifiers are those of NVMe 2.0 Figure 202") {
  static_assert(id(log_page_id::supported_log_pages) == 0x00);
  static_assert(id(log_page_id::error_information) == 0x01);
  static_assert(id(log_page_id::smart_health_information) == 0x02);
  static_assert(id(log_page_id::firmware_slot_information) == 0x03);
  static_assert(id(log_page_id::changed_namespace_list) == 0x04);
  static_assert(id(log_page_id::commands_supported_and_effects) == 0x05);
  static_assert(id(log_page_id::device_self_test) == 0x06);
  static_assert(id(log_page_id::telemetry_host_initiated) == 0x07);
  static_assert(id(log_page_id::telemetry_controller_initiated) == 0x08);
  static_assert(id(log_page_id::endurance_group_information) == 0x09);
  static_assert(id(log_page_id::predictable_latency_per_nvm_set) == 0x0a);
  static_assert(id(log_page_id::predictable_latency_event_aggregate) == 0x0b);
  static_assert(id(log_page_id::asymmetric_namespace_access) == 0x0c);
  static_assert(id(log_page_id::persistent_event_log) == 0x0d);
  static_assert(id(log_page_id::endurance_group_event_aggregate) == 0x0f);
  static_assert(id(log_page_id::media_unit_status) == 0x10);
  static_assert(id(log_page_id::supported_capacity_configuration_list) == 0x11);
  static_assert(id(log_page_id::feature_identifiers_supported_and_effects) == 0x12);
  static_assert(id(log_page_id::nvme_mi_commands_supported_and_effects) == 0x13);
  static_assert(id(log_page_id::command_and_feature_lockdown) == 0x14);
  static_assert(id(log_page_id::boot_partition) == 0x15);
  static_assert(id(log_page_id::rotational_media_information) == 0x16);
  static_assert(id(log_page_id::discovery) == 0x70);
  static_assert(id(log_page_id::reservation_notification) == 0x80);
  static_assert(id(log_page_id::sanitize_status) == 0x81);
  CHECK(sizeof(log_page_id) == 1);
}

TEST_CASE("get log page dwords for the 512-byte SMART log carry LID 02h and NUMD 127") {
  constexpr auto dw = get_log_page_dwords::for_log(log_page_id::smart_health_information, 512);
  static_assert(dw.cdw10 == 0x007f0002u);
  static_assert(dw.cdw11 == 0 && dw.cdw12 == 0 && dw.cdw13 == 0 && dw.cdw14 == 0);
  static_assert(dw.lid() == log_page_id::smart_health_information);
  static_assert(dw.number_of_dwords() == 128);
  static_assert(dw.number_of_bytes() == 512);
  CHECK(dw.cdw10 == 0x007f0002u);
}

TEST_CASE("a 0-based dword count above 16 bits continues from NUMDL into NUMDU") {
  // 0x23456 dwords: NUMD = 0x23455, NUMDL = 3455h, NUMDU = 0002h.
  constexpr auto dw = get_log_page_dwords::for_log(log_page_id::telemetry_host_initiated, 0x23456ull * 4);
  static_assert(dw.cdw10 == 0x34550007u);
  static_assert(dw.cdw11 == 0x00000002u);
  static_assert(dw.number_of_dwords() == 0x23456);
  CHECK(dw.number_of_bytes() == 0x23456ull * 4);
}

TEST_CASE("number_of_dwords round-trips from 1 to 2^32") {
  const std::uint64_t counts[] = {1, 2, 16, 0xffff, 0x10000, 0x10001, 0x12345678, 0xffffffffull, 1ull << 32};
  for (const auto count : counts) {
    CAPTURE(count);
    get_log_page_dwords dw{};
    dw.set_number_of_dwords(count);
    CHECK(dw.number_of_dwords() == count);
    CHECK(dw.number_of_bytes() == count * 4);
  }
  constexpr auto max = get_log_page_dwords::for_log(log_page_id::persistent_event_log, 16ull << 30);
  static_assert(max.cdw10 == 0xffff000du && max.cdw11 == 0x0000ffffu);
  static_assert(max.number_of_dwords() == get_log_page_dwords::max_dwords);
}

TEST_CASE("lengths Get Log Page cannot express are rounded down and clamped to 1..2^32 dwords") {
  static_assert(get_log_page_dwords::for_log(log_page_id::error_information, 10).number_of_bytes() == 8);
  static_assert(get_log_page_dwords::for_log(log_page_id::error_information, 3).number_of_dwords() == 1);
  static_assert(get_log_page_dwords::for_log(log_page_id::error_information, 0).number_of_dwords() == 1);
  get_log_page_dwords dw{};
  dw.set_number_of_dwords((1ull << 32) + 1);
  CHECK(dw.number_of_dwords() == 1ull << 32);
  dw.set_number_of_dwords(~std::uint64_t{0});
  CHECK(dw.number_of_dwords() == 1ull << 32);
  dw.set_number_of_dwords(0);
  CHECK(dw.number_of_dwords() == 1);
}

TEST_CASE("valid_length accepts whole dwords from 4 bytes to 16 GiB") {
  static_assert(get_log_page_dwords::valid_length(4));
  static_assert(get_log_page_dwords::valid_length(512));
  static_assert(get_log_page_dwords::valid_length(16ull << 30));
  static_assert(!get_log_page_dwords::valid_length(0));
  static_assert(!get_log_page_dwords::valid_length(2));
  static_assert(!get_log_page_dwords::valid_length(514));
  static_assert(!get_log_page_dwords::valid_length((16ull << 30) + 4));
  CHECK(get_log_page_dwords::valid_length(64));
}

TEST_CASE("the log page offset spans LPOL and LPOU") {
  constexpr auto dw =
      get_log_page_dwords::for_log(log_page_id::telemetry_host_initiated, 4096, 0x0000000123456780ull);
  static_assert(dw.cdw12 == 0x23456780u);
  static_assert(dw.cdw13 == 0x00000001u);
  static_assert(dw.offset() == 0x0000000123456780ull);
  get_log_page_dwords rt{};
  rt.set_offset(0xfedcba9876543210ull);
  CHECK(rt.cdw12 == 0x76543210u);
  CHECK(rt.cdw13 == 0xfedcba98u);
  CHECK(rt.offset() == 0xfedcba9876543210ull);
}

TEST_CASE("each Get Log Page field setter writes only its own bits") {
  get_log_page_dwords dw{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
  dw.set_lid(static_cast<log_page_id>(0));
  CHECK(dw.cdw10 == 0xffffff00u);
  dw.set_lsp(0);
  CHECK(dw.cdw10 == 0xffff8000u);
  dw.set_rae(false);
  CHECK(dw.cdw10 == 0xffff0000u);
  dw.set_number_of_dwords(1);
  CHECK(dw.cdw10 == 0x00000000u);
  CHECK(dw.cdw11 == 0xffff0000u);
  dw.set_lsi(0);
  CHECK(dw.cdw11 == 0x00000000u);
  dw.set_uuid_index(0);
  CHECK(dw.cdw14 == 0xffffff80u);
  dw.set_offset_is_index(false);
  CHECK(dw.cdw14 == 0xff7fff80u);
  dw.set_csi(0);
  CHECK(dw.cdw14 == 0x007fff80u);  // reserved bits 22:7 untouched
  CHECK(dw.cdw12 == 0xffffffffu);
  CHECK(dw.cdw13 == 0xffffffffu);
}

TEST_CASE("Get Log Page fields round-trip through their accessors") {
  constexpr auto dw = [] {
    auto v = get_log_page_dwords::for_log(log_page_id::endurance_group_information, 512);
    v.set_lsp(0x7f).set_rae(true).set_lsi(0xbeef).set_uuid_index(0x7f).set_offset_is_index(true).set_csi(0x02);
    return v;
  }();
  static_assert(dw.lid() == log_page_id::endurance_group_information);
  static_assert(dw.lsp() == 0x7f);
  static_assert(dw.rae());
  static_assert(dw.lsi() == 0xbeef);
  static_assert(dw.uuid_index() == 0x7f);
  static_assert(dw.offset_is_index());
  static_assert(dw.csi() == 0x02);
  static_assert(dw.number_of_dwords() == 128);
  static_assert(dw.cdw10 == 0x007fff09u);
  static_assert(dw.cdw11 == 0xbeef0000u);
  static_assert(dw.cdw14 == 0x0280007fu);
  get_log_page_dwords narrow{};
  narrow.set_lsp(0xff).set_uuid_index(0xff);  // 7-bit fields drop bit 7
  CHECK(narrow.lsp() == 0x7f);
  CHECK(narrow.uuid_index() == 0x7f);
  CHECK(narrow.cdw10 == 0x00007f00u);
  CHECK(narrow.cdw14 == 0x0000007fu);
}

TEST_CASE("a vendor-specific log identifier decodes unchanged") {
  get_log_page_dwords dw{};
  dw.set_lid(static_cast<log_page_id>(0xc0));
  CHECK(id(dw.lid()) == 0xc0);
  CHECK(dw.cdw10 == 0x000000c0u);
}

TEST_CASE("an error information log entry decodes from its NVMe 2.0 byte offsets") {
  // LBA Out of Range (SCT 0, SC 80h) with DNR, phase 1, on SQ 1 command 0Ch; the parameter in
  // error is bit 3 of byte 40 (CDW10).
  std::array<std::uint8_t, 64> image{};
  put_le(image, 0, 5, 8);
  put_le(image, 8, 0x0001, 2);
  put_le(image, 10, 0x000c, 2);
  put_le(image, 12, ((0x4000u | 0x80u) << 1) | 1u, 2);
  put_le(image, 14, 0x0328, 2);
  put_le(image, 16, 0x0000000100000000ull, 8);
  put_le(image, 24, 1, 4);
  put_le(image, 28, 0xc1, 1);
  put_le(image, 29, 3, 1);
  put_le(image, 32, 0xdeadbeefcafef00dull, 8);
  put_le(image, 40, 0x1234, 2);
  const auto e = decode<error_information_log_entry>(image);
  CHECK(e.error_count == 5);
  CHECK(e.valid());
  CHECK(e.sqid == 1);
  CHECK(e.cid == 0x0c);
  CHECK(e.status_field == 0x8101);
  CHECK(e.phase_tag());
  CHECK(e.status() == 0x4080);
  CHECK(e.status_code_type() == 0);
  CHECK(e.status_code() == 0x80);
  CHECK(e.do_not_retry());
  CHECK(e.has_parameter_error_location());
  CHECK(e.parameter_error_byte() == 40);
  CHECK(e.parameter_error_bit() == 3);
  CHECK(e.lba == 0x0000000100000000ull);
  CHECK(e.nsid == 1);
  CHECK(e.vendor_specific_information_available == 0xc1);
  CHECK(e.transport_type == 3);
  CHECK(e.command_specific_information == 0xdeadbeefcafef00dull);
  CHECK(e.transport_type_specific_information == 0x1234);
}

TEST_CASE("the error entry status field decodes SCT and SC after the phase bit") {
  // Unrecovered Read Error: SCT 2h (Media and Data Integrity), SC 81h, retry allowed, phase 0.
  constexpr auto e = [] {
    error_information_log_entry v{};
    v.error_count = 1;
    v.status_field = static_cast<std::uint16_t>(((2u << 8) | 0x81u) << 1);
    return v;
  }();
  static_assert(e.status_field == 0x0502);
  static_assert(!e.phase_tag());
  static_assert(e.status() == 0x0281);
  static_assert(e.status_code_type() == 2);
  static_assert(e.status_code() == 0x81);
  static_assert(!e.do_not_retry());
  CHECK(e.status_code() == 0x81);
}

TEST_CASE("an error entry with error count 0 is unused") {
  error_information_log_entry e{};
  CHECK_FALSE(e.valid());
  e.error_count = 1;
  CHECK(e.valid());
}

TEST_CASE("a parameter error location of FFFFh means none applies") {
  error_information_log_entry e{};
  e.parameter_error_location = 0xffff;
  CHECK_FALSE(e.has_parameter_error_location());
  e.set_parameter_error_location(0, 0);
  CHECK(e.has_parameter_error_location());
  CHECK(e.parameter_error_location == 0);
}

TEST_CASE("set_parameter_error_location round-trips every byte and bit of a command") {
  error_information_log_entry e{};
  for (unsigned byte = 0; byte < 64; ++byte) {
    for (unsigned bit = 0; bit < 8; ++bit) {
      CAPTURE(byte);
      CAPTURE(bit);
      e.parameter_error_location = 0xffff;  // reserved bits 15:11 are cleared by the setter
      e.set_parameter_error_location(static_cast<std::uint8_t>(byte), static_cast<std::uint8_t>(bit));
      CHECK(e.parameter_error_location == ((bit << 8) | byte));
      CHECK(e.parameter_error_byte() == byte);
      CHECK(e.parameter_error_bit() == bit);
    }
  }
  static_assert(error_information_log_entry{}.set_parameter_error_location(44, 7).parameter_error_location == 0x072c);
}

TEST_CASE("u128_le add carries from the low half into the high half") {
  constexpr auto c = [] {
    u128_le v{~std::uint64_t{0} - 1, 0};
    v.add(3);
    return v;
  }();
  static_assert(c.lo == 1 && c.hi == 1);
  static_assert(!c.fits_in_64_bits());
  static_assert(c.low64() == 1);

  u128_le v{0, 0};
  v.add(~std::uint64_t{0});
  CHECK(v.lo == ~std::uint64_t{0});
  CHECK(v.hi == 0);
  CHECK(v.fits_in_64_bits());
  v.add(1);
  CHECK(v.lo == 0);
  CHECK(v.hi == 1);
  v.add(0);
  CHECK(v.lo == 0);
  CHECK(v.hi == 1);
}

TEST_CASE("u128_le wraps modulo 2^128") {
  u128_le v{~std::uint64_t{0}, ~std::uint64_t{0}};
  v.add(2).add(5);
  CHECK(v.lo == 6);
  CHECK(v.hi == 0);
  CHECK(v.low64() == 6);
  CHECK(v.fits_in_64_bits());
}

TEST_CASE("data units count thousands of 512-byte units, rounded up") {
  static_assert(data_units(0) == 0);
  static_assert(data_units(1) == 1);
  static_assert(data_units(1000) == 1);
  static_assert(data_units(1001) == 2);
  static_assert(data_units(2001) == 3);
  static_assert(data_units(3000) == 3);
  static_assert(data_units(~std::uint64_t{0}) == 18446744073709552ull);
  CHECK(data_units(1'000'000) == 1000);
}

TEST_CASE("the SMART / Health log decodes from its NVMe 2.0 byte offsets") {
  std::array<std::uint8_t, 512> image{};
  put_le(image, 0, 0x0a, 1);       // temperature and read-only warnings
  put_le(image, 1, 0x0143, 2);     // 323 K
  put_le(image, 3, 100, 1);
  put_le(image, 4, 10, 1);
  put_le(image, 5, 3, 1);
  put_le(image, 6, 0x04, 1);
  put_le(image, 32, 0x0102030405060708ull, 8);
  put_le(image, 40, 0x1, 8);       // Data Units Read high half
  put_le(image, 48, 2000, 8);
  put_le(image, 64, 3, 8);
  put_le(image, 80, 4, 8);
  put_le(image, 96, 5, 8);
  put_le(image, 112, 6, 8);
  put_le(image, 128, 7, 8);
  put_le(image, 144, 8, 8);
  put_le(image, 160, 9, 8);
  put_le(image, 176, 10, 8);
  put_le(image, 184, 0xff, 8);     // Error Information Log Entries high half
  put_le(image, 192, 11, 4);
  put_le(image, 196, 12, 4);
  for (std::size_t i = 0; i < 8; ++i) {
    put_le(image, 200 + 2 * i, 300 + i, 2);
  }
  put_le(image, 216, 13, 4);
  put_le(image, 220, 14, 4);
  put_le(image, 224, 15, 4);
  put_le(image, 228, 16, 4);
  put_le(image, 511, 0xee, 1);
  const auto log = decode<smart_health_information_log>(image);
  CHECK(log.critical_warning == 0x0a);
  CHECK(log.composite_temperature_kelvin() == 323);
  CHECK(log.available_spare == 100);
  CHECK(log.available_spare_threshold == 10);
  CHECK(log.percentage_used == 3);
  CHECK(log.endurance_group_critical_warning_summary == 0x04);
  CHECK(log.data_units_read.lo == 0x0102030405060708ull);
  CHECK(log.data_units_read.hi == 1);
  CHECK(log.data_units_written.low64() == 2000);
  CHECK(log.host_read_commands.low64() == 3);
  CHECK(log.host_write_commands.low64() == 4);
  CHECK(log.controller_busy_time.low64() == 5);
  CHECK(log.power_cycles.low64() == 6);
  CHECK(log.power_on_hours.low64() == 7);
  CHECK(log.unsafe_shutdowns.low64() == 8);
  CHECK(log.media_and_data_integrity_errors.low64() == 9);
  CHECK(log.number_of_error_information_log_entries.lo == 10);
  CHECK(log.number_of_error_information_log_entries.hi == 0xff);
  CHECK(log.warning_composite_temperature_time == 11);
  CHECK(log.critical_composite_temperature_time == 12);
  for (std::size_t i = 0; i < 8; ++i) {
    CAPTURE(i);
    CHECK(log.temperature_sensor[i] == 300 + i);
  }
  CHECK(log.thermal_management_temperature_1_transition_count == 13);
  CHECK(log.thermal_management_temperature_2_transition_count == 14);
  CHECK(log.total_time_for_thermal_management_temperature_1 == 15);
  CHECK(log.total_time_for_thermal_management_temperature_2 == 16);
  CHECK(log.reserved232[511 - 232] == 0xee);
}

TEST_CASE("set_composite_temperature_kelvin writes little-endian bytes 1 and 2") {
  constexpr auto log = [] {
    smart_health_information_log v{};
    v.set_composite_temperature_kelvin(0x0175);
    return v;
  }();
  static_assert(log.composite_temperature[0] == 0x75);
  static_assert(log.composite_temperature[1] == 0x01);
  static_assert(log.composite_temperature_kelvin() == 373);
  smart_health_information_log rt{};
  rt.critical_warning = 0xff;
  rt.available_spare = 0xff;
  rt.set_composite_temperature_kelvin(0xabcd);
  CHECK(rt.composite_temperature_kelvin() == 0xabcd);
  CHECK(rt.critical_warning == 0xff);
  CHECK(rt.available_spare == 0xff);
}

namespace {

using warning_flag = bool (smart_health_information_log::*)() const noexcept;

struct warning_at_bit {
  unsigned bit;
  warning_flag flag;
  const char* name;
};

const warning_at_bit critical_warnings[] = {
    {0, &smart_health_information_log::available_spare_below_threshold, "available_spare_below_threshold"},
    {1, &smart_health_information_log::temperature_out_of_range, "temperature_out_of_range"},
    {2, &smart_health_information_log::reliability_degraded, "reliability_degraded"},
    {3, &smart_health_information_log::read_only, "read_only"},
    {4, &smart_health_information_log::volatile_memory_backup_failed, "volatile_memory_backup_failed"},
    {5, &smart_health_information_log::persistent_memory_region_read_only, "persistent_memory_region_read_only"},
};

}  // namespace

TEST_CASE("each Critical Warning bit sets exactly its own accessor") {
  for (const auto& set : critical_warnings) {
    smart_health_information_log log{};
    log.critical_warning = static_cast<std::uint8_t>(1u << set.bit);
    for (const auto& probe : critical_warnings) {
      CAPTURE(set.name);
      CAPTURE(probe.name);
      CHECK((log.*probe.flag)() == (probe.bit == set.bit));
    }
  }
  smart_health_information_log reserved_only{};
  reserved_only.critical_warning = 0xc0;  // bits 7:6
  for (const auto& probe : critical_warnings) {
    CAPTURE(probe.name);
    CHECK_FALSE((reserved_only.*probe.flag)());
  }
}

#ifdef __CUDACC__
// Never launched: proves the accessors compile as device code.
__global__ void log_page_accessors_compile_for_the_device(const smart_health_information_log* log,
                                                          const error_information_log_entry* e,
                                                          std::uint64_t* out) {
  const auto dw = get_log_page_dwords::for_log(log_page_id::smart_health_information, 512);
  out[0] = dw.cdw10;
  out[1] = dw.number_of_dwords();
  out[2] = log->composite_temperature_kelvin() + log->read_only();
  u128_le units = log->data_units_read;
  units.add(data_units(8));
  out[3] = units.low64();
  out[4] = e->status_code() + e->parameter_error_byte();
}
#endif
