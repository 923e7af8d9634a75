// Status codes, their names and the CQE status field (NVMe Base Specification 2.0, 4.6.1).
#include <cunvme/spec/status.cuh>

#include <doctest/doctest.h>

#include <cuda/std/cstdint>

#include <set>
#include <string>
#include <string_view>

namespace {

namespace spec = cunvme::spec;
using spec::status;
using spec::status_code_type;

// Content, not address: two evaluations of one string literal need not give one pointer.
CUNVME_HOST_DEVICE constexpr bool same_text(const char* a, const char* b) {
  if (a == nullptr || b == nullptr) return false;
  for (; *a != '\0' && *a == *b; ++a, ++b) {
  }
  return *a == *b;
}

// Written once for the host (static_assert and a TEST_CASE) and for a kernel, as libcu++ tests
// are: what holds on one side must hold on the other.
CUNVME_HOST_DEVICE constexpr bool status_field_fields_round_trip() {
  namespace cqe = spec::cqe_status;
  // Plain arrays: std::initializer_list is host-only.
  constexpr unsigned types[] = {0, 1, 2, 3, 7};
  constexpr unsigned codes[] = {0x00, 0x01, 0x7f, 0x80, 0xc0, 0xff};
  for (unsigned sct : types) {
    for (unsigned sc : codes) {
      const auto s = spec::make_status(static_cast<status_code_type>(sct),
                                       static_cast<cuda::std::uint8_t>(sc));
      for (unsigned flags = 0; flags < 8; ++flags) {
        const bool phase = flags & 1u;
        const bool dnr = flags & 2u;
        const bool more = flags & 4u;
        for (cuda::std::uint8_t crd = 0; crd < 4; ++crd) {
          const auto word = cqe::make_status_field(s, phase, dnr, more, crd);
          if (cqe::phase(word) != phase || cqe::status_of(word) != s ||
              spec::code_type(cqe::status_of(word)) != static_cast<status_code_type>(sct) ||
              spec::code(cqe::status_of(word)) != sc || cqe::crd(word) != crd ||
              cqe::more(word) != more || cqe::dnr(word) != dnr) {
            return false;
          }
        }
      }
    }
  }
  return true;
}

CUNVME_HOST_DEVICE constexpr bool names_are_found_by_value() {
  for (const auto& row : spec::status_names()) {
    if (!same_text(spec::name(row.value), row.name)) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("the name table lists every defined code of each type once, in increasing order") {
  constexpr auto table = spec::status_names();
  static_assert(cunvme::spec::detail::status_names_strictly_increasing());

  unsigned per_type[8] = {};
  std::set<unsigned> seen;
  for (const auto& row : table) {
    ++per_type[static_cast<unsigned>(spec::code_type(row.value))];
    seen.insert(static_cast<unsigned>(row.value));
  }
  CHECK(seen.size() == table.size());
  // Generic 00h–24h less reserved 17h, and NVM 80h–84h.
  CHECK(per_type[0] == 36 + 5);
  // Command specific 00h–2Dh less reserved 04h and 17h, and NVM 80h–83h.
  CHECK(per_type[1] == 44 + 4);
  CHECK(per_type[2] == 8);
  CHECK(per_type[3] == 7);
  CHECK(per_type[4] + per_type[5] + per_type[6] + per_type[7] == 0);
}

TEST_CASE("every table entry has a real spec name") {
  for (const auto& row : spec::status_names()) {
    CAPTURE(static_cast<unsigned>(row.value));
    REQUIRE(row.name != nullptr);
    CHECK(std::string_view{row.name} != "");
    CHECK(std::string_view{row.name} != "Reserved");
    CHECK(std::string_view{row.name} != "Vendor Specific");
  }
}

TEST_CASE("name finds each table entry by its value") {
  static_assert(names_are_found_by_value());
  CHECK(names_are_found_by_value());
}

TEST_CASE("name uses the spec's capitalisation") {
  static_assert(same_text(spec::name(status::lba_out_of_range), "LBA Out of Range"));
  static_assert(same_text(spec::name(status::invalid_field_in_command), "Invalid Field in Command"));
  static_assert(same_text(spec::name(status::successful_completion), "Successful Completion"));
  static_assert(same_text(spec::name(status::command_aborted_due_to_sq_deletion),
                          "Command Aborted due to SQ Deletion"));
  static_assert(same_text(spec::name(status::end_to_end_guard_check_error),
                          "End-to-end Guard Check Error"));
  static_assert(same_text(spec::name(status::command_aborted_by_host), "Command Aborted By Host"));
  CHECK(std::string_view{spec::name(status::invalid_use_of_controller_memory_buffer)} ==
        "Invalid Use of Controller Memory Buffer");
}

TEST_CASE("enumerators carry the spec's type and code") {
  static_assert(static_cast<unsigned>(status::invalid_use_of_controller_memory_buffer) == 0x012);
  static_assert(static_cast<unsigned>(status::prp_offset_invalid) == 0x013);
  static_assert(static_cast<unsigned>(status::admin_command_media_not_ready) == 0x024);
  static_assert(static_cast<unsigned>(status::format_in_progress) == 0x084);
  static_assert(static_cast<unsigned>(status::invalid_interrupt_vector) == 0x108);
  static_assert(static_cast<unsigned>(status::invalid_log_page) == 0x109);
  static_assert(static_cast<unsigned>(status::invalid_format) == 0x10a);
  static_assert(static_cast<unsigned>(status::invalid_queue_deletion) == 0x10c);
  static_assert(static_cast<unsigned>(status::identifier_unavailable) == 0x12d);
  static_assert(static_cast<unsigned>(status::command_size_limit_exceeded) == 0x183);
  static_assert(static_cast<unsigned>(status::deallocated_or_unwritten_logical_block) == 0x287);
  static_assert(static_cast<unsigned>(status::controller_pathing_error) == 0x360);
  static_assert(static_cast<unsigned>(status::command_aborted_by_host) == 0x371);
  CHECK(spec::code(status::write_fault) == 0x80);
}

TEST_CASE("make_status, code_type and code round trip every type and code") {
  static_assert(spec::make_status(status_code_type::generic, 0x80) == status::lba_out_of_range);
  static_assert(spec::make_status(status_code_type::command_specific, 0x02) ==
                status::invalid_queue_size);
  static_assert(spec::code_type(status::unrecovered_read_error) ==
                status_code_type::media_and_data_integrity);
  static_assert(spec::code(status::unrecovered_read_error) == 0x81);

  for (unsigned sct = 0; sct < 8; ++sct) {
    for (unsigned sc = 0; sc < 256; ++sc) {
      const auto s = spec::make_status(static_cast<status_code_type>(sct),
                                       static_cast<cuda::std::uint8_t>(sc));
      REQUIRE(static_cast<unsigned>(spec::code_type(s)) == sct);
      REQUIRE(spec::code(s) == sc);
      REQUIRE(static_cast<unsigned>(s) == (sct << 8 | sc));
    }
  }
}

TEST_CASE("only Successful Completion is success") {
  static_assert(spec::is_success(status::successful_completion));
  static_assert(!spec::is_success(status::lba_out_of_range));
  static_assert(!spec::is_success(status::completion_queue_invalid));  // SC 00h of another type
  static_assert(!spec::is_success(spec::make_status(status_code_type::vendor_specific, 0)));
}

TEST_CASE("to_string names generic codes with their type and code") {
  CHECK(spec::to_string(status::successful_completion) == "Successful Completion (0/0x00)");
  CHECK(spec::to_string(status::invalid_field_in_command) == "Invalid Field in Command (0/0x02)");
  CHECK(spec::to_string(status::prp_offset_invalid) == "PRP Offset Invalid (0/0x13)");
  CHECK(spec::to_string(status::lba_out_of_range) == "LBA Out of Range (0/0x80)");
}

TEST_CASE("to_string names command specific codes with their type and code") {
  CHECK(spec::to_string(status::invalid_queue_size) == "Invalid Queue Size (1/0x02)");
  CHECK(spec::to_string(status::invalid_format) == "Invalid Format (1/0x0a)");
  CHECK(spec::to_string(status::identifier_unavailable) == "Identifier Unavailable (1/0x2d)");
  CHECK(spec::to_string(status::attempted_write_to_read_only_range) ==
        "Attempted Write to Read Only Range (1/0x82)");
}

TEST_CASE("to_string names media and data integrity errors with their type and code") {
  CHECK(spec::to_string(status::write_fault) == "Write Fault (2/0x80)");
  CHECK(spec::to_string(status::unrecovered_read_error) == "Unrecovered Read Error (2/0x81)");
  CHECK(spec::to_string(status::deallocated_or_unwritten_logical_block) ==
        "Deallocated or Unwritten Logical Block (2/0x87)");
}

TEST_CASE("to_string names path related codes with their type and code") {
  CHECK(spec::to_string(status::internal_path_error) == "Internal Path Error (3/0x00)");
  CHECK(spec::to_string(status::asymmetric_access_transition) ==
        "Asymmetric Access Transition (3/0x03)");
  CHECK(spec::to_string(status::command_aborted_by_host) == "Command Aborted By Host (3/0x71)");
}

TEST_CASE("to_string falls back to Reserved and Vendor Specific for codes the table lacks") {
  CHECK(spec::to_string(spec::make_status(status_code_type::generic, 0x7f)) == "Reserved (0/0x7f)");
  CHECK(spec::to_string(spec::make_status(status_code_type::generic, 0x17)) == "Reserved (0/0x17)");
  CHECK(spec::to_string(spec::make_status(status_code_type::command_specific, 0x04)) ==
        "Reserved (1/0x04)");
  CHECK(spec::to_string(spec::make_status(static_cast<status_code_type>(5), 0x00)) ==
        "Reserved (5/0x00)");
  CHECK(spec::to_string(spec::make_status(status_code_type::vendor_specific, 0xc0)) ==
        "Vendor Specific (7/0xc0)");
  CHECK(spec::to_string(spec::make_status(status_code_type::vendor_specific, 0x00)) ==
        "Vendor Specific (7/0x00)");
  CHECK(spec::to_string(spec::make_status(status_code_type::media_and_data_integrity, 0xff)) ==
        "Vendor Specific (2/0xff)");
}

TEST_CASE("name gives every value outside the table a fallback by its range") {
  std::set<unsigned> listed;
  for (const auto& row : spec::status_names()) listed.insert(static_cast<unsigned>(row.value));

  for (unsigned sct = 0; sct < 8; ++sct) {
    for (unsigned sc = 0; sc < 256; ++sc) {
      if (listed.count(sct << 8 | sc) != 0) continue;
      CAPTURE(sct);
      CAPTURE(sc);
      const std::string_view expected = sct == 7 || sc >= 0xc0 ? "Vendor Specific" : "Reserved";
      REQUIRE(spec::name(spec::make_status(static_cast<status_code_type>(sct),
                                           static_cast<cuda::std::uint8_t>(sc))) == expected);
    }
  }
}

TEST_CASE("status field layout covers the 16-bit word with no overlap") {
  namespace cqe = spec::cqe_status;
  static_assert((cqe::phase_tag_field::mask | cqe::sc_field::mask | cqe::sct_field::mask |
                 cqe::crd_field::mask | cqe::more_field::mask | cqe::dnr_field::mask) == 0xffff);
  static_assert(cqe::phase_tag_field::mask + cqe::sc_field::mask + cqe::sct_field::mask +
                    cqe::crd_field::mask + cqe::more_field::mask + cqe::dnr_field::mask ==
                0xffff);
  static_assert(cqe::status_bits::mask == (cqe::sc_field::mask | cqe::sct_field::mask));
}

TEST_CASE("status field accessors round trip phase, SC, SCT, CRD, M and DNR") {
  static_assert(status_field_fields_round_trip());
  CHECK(status_field_fields_round_trip());
}

TEST_CASE("status field decodes LBA Out of Range posted with phase 1 and DNR") {
  namespace cqe = spec::cqe_status;
  // DNR bit 15, SCT 0 in bits 11:9, SC 80h in bits 8:1, P bit 0.
  constexpr cuda::std::uint16_t word = 0x8101;
  static_assert(cqe::make_status_field(status::lba_out_of_range, true, true) == word);
  static_assert(cqe::phase(word));
  static_assert(cqe::status_of(word) == status::lba_out_of_range);
  static_assert(cqe::dnr(word));
  static_assert(!cqe::more(word));
  static_assert(cqe::crd(word) == 0);
  CHECK(spec::to_string(cqe::status_of(word)) == "LBA Out of Range (0/0x80)");
}

TEST_CASE("status field decodes a retryable Namespace Not Ready with CRD and More") {
  namespace cqe = spec::cqe_status;
  // DNR 0, M 1, CRD 2, SCT 0, SC 82h, P 0.
  constexpr cuda::std::uint16_t word = (1u << 14) | (2u << 12) | (0x82u << 1);
  static_assert(word == 0x6104);
  static_assert(cqe::make_status_field(status::namespace_not_ready, false, false, true, 2) == word);
  static_assert(!cqe::phase(word));
  static_assert(cqe::status_of(word) == status::namespace_not_ready);
  static_assert(!cqe::dnr(word));
  static_assert(cqe::more(word));
  static_assert(cqe::crd(word) == 2);
}

TEST_CASE("status field keeps SCT apart from the phase bit for Invalid Queue Size") {
  namespace cqe = spec::cqe_status;
  // SCT 1 in bits 11:9, SC 02h in bits 8:1, P 1.
  constexpr cuda::std::uint16_t word = (1u << 9) | (0x02u << 1) | 1u;
  static_assert(word == 0x0205);
  static_assert(cqe::make_status_field(status::invalid_queue_size, true) == word);
  static_assert(cqe::status_of(word) == status::invalid_queue_size);
  static_assert(cqe::status_of(static_cast<cuda::std::uint16_t>(word & ~1u)) == status::invalid_queue_size);
}

TEST_CASE("make_status_field drops CRD bits beyond its 2-bit field") {
  namespace cqe = spec::cqe_status;
  constexpr auto word = cqe::make_status_field(status::successful_completion, false, false, false, 7);
  static_assert(cqe::crd(word) == 3);
  static_assert(!cqe::more(word) && !cqe::dnr(word));
}

#ifdef __CUDACC__
// Never launched (the tests run without a GPU): compiling it for sm_80/sm_90 is the test that
// name() and the status-field accessors are usable in device code.
namespace status_test_device {

__global__ void decode_status_word(cuda::std::uint16_t word, const char** name_out, bool* ok_out) {
  namespace cqe = spec::cqe_status;
  *name_out = spec::name(cqe::status_of(word));
  *ok_out = cqe::phase(word) && cqe::dnr(word) && !cqe::more(word) && cqe::crd(word) == 0 &&
            spec::code(cqe::status_of(word)) == 0x80 && status_field_fields_round_trip() &&
            names_are_found_by_value();
}

}  // namespace status_test_device
#endif
