// Completion status codes (NVMe Base Specification 2.0, "Status Field Definition" in section
// 4.6, and the NVM Command Set Specification 1.0 for the NVM-specific codes) and accessors for
// the 16-bit status field of a completion queue entry.
//
// One flat enum, (SCT << 8) | SC, as Linux's nvme.h has it: a status then fits in one 16-bit
// value that is compared, switched on and logged without carrying the type separately, and it
// is exactly bits 11:1 of the CQE status field, so decoding is one shift. One name table
// serves every status code type (SPDK keeps one per type): one list to check against the spec.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/spec/bit_field.cuh>

#include <cuda/std/array>
#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/utility>

#include <string>

CUNVME_NAMESPACE_BEGIN
namespace spec {

/// Status Code Type, the SCT field of the completion status ("Status Code Type Values").
enum class status_code_type : cuda::std::uint8_t {
  generic = 0,
  command_specific = 1,
  media_and_data_integrity = 2,
  path_related = 3,
  // 4–6 reserved
  vendor_specific = 7,
};

/// A completion status: (SCT << 8) | SC.
///
/// Codes the spec reserves are left out; a device can still report one (or a vendor specific
/// one), so a `status` may hold any 11-bit value, not only the enumerators.
/// Usage: examples/snippets/spec.cpp, `describe`.
enum class status : cuda::std::uint16_t {
  // "Generic Command Status Values".
  successful_completion = 0x000,
  invalid_command_opcode = 0x001,
  invalid_field_in_command = 0x002,
  command_id_conflict = 0x003,
  data_transfer_error = 0x004,
  commands_aborted_due_to_power_loss_notification = 0x005,
  internal_error = 0x006,
  command_abort_requested = 0x007,
  command_aborted_due_to_sq_deletion = 0x008,
  command_aborted_due_to_failed_fused_command = 0x009,
  command_aborted_due_to_missing_fused_command = 0x00a,
  invalid_namespace_or_format = 0x00b,
  command_sequence_error = 0x00c,
  invalid_sgl_segment_descriptor = 0x00d,
  invalid_number_of_sgl_descriptors = 0x00e,
  data_sgl_length_invalid = 0x00f,
  metadata_sgl_length_invalid = 0x010,
  sgl_descriptor_type_invalid = 0x011,
  invalid_use_of_controller_memory_buffer = 0x012,
  prp_offset_invalid = 0x013,
  atomic_write_unit_exceeded = 0x014,
  operation_denied = 0x015,
  sgl_offset_invalid = 0x016,
  host_identifier_inconsistent_format = 0x018,
  keep_alive_timer_expired = 0x019,
  keep_alive_timeout_invalid = 0x01a,
  command_aborted_due_to_preempt_and_abort = 0x01b,
  sanitize_failed = 0x01c,
  sanitize_in_progress = 0x01d,
  sgl_data_block_granularity_invalid = 0x01e,
  command_not_supported_for_queue_in_cmb = 0x01f,
  namespace_is_write_protected = 0x020,
  command_interrupted = 0x021,
  transient_transport_error = 0x022,
  command_prohibited_by_command_and_feature_lockdown = 0x023,
  admin_command_media_not_ready = 0x024,
  // Generic, NVM Command Set specific (NVM Command Set Specification 1.0).
  lba_out_of_range = 0x080,
  capacity_exceeded = 0x081,
  namespace_not_ready = 0x082,
  reservation_conflict = 0x083,
  format_in_progress = 0x084,

  // "Command Specific Status Values".
  completion_queue_invalid = 0x100,
  invalid_queue_identifier = 0x101,
  invalid_queue_size = 0x102,
  abort_command_limit_exceeded = 0x103,
  asynchronous_event_request_limit_exceeded = 0x105,
  invalid_firmware_slot = 0x106,
  invalid_firmware_image = 0x107,
  invalid_interrupt_vector = 0x108,
  invalid_log_page = 0x109,
  invalid_format = 0x10a,
  firmware_activation_requires_conventional_reset = 0x10b,
  invalid_queue_deletion = 0x10c,
  feature_identifier_not_saveable = 0x10d,
  feature_not_changeable = 0x10e,
  feature_not_namespace_specific = 0x10f,
  firmware_activation_requires_nvm_subsystem_reset = 0x110,
  firmware_activation_requires_controller_level_reset = 0x111,
  firmware_activation_requires_maximum_time_violation = 0x112,
  firmware_activation_prohibited = 0x113,
  overlapping_range = 0x114,
  namespace_insufficient_capacity = 0x115,
  namespace_identifier_unavailable = 0x116,
  namespace_already_attached = 0x118,
  namespace_is_private = 0x119,
  namespace_not_attached = 0x11a,
  thin_provisioning_not_supported = 0x11b,
  controller_list_invalid = 0x11c,
  device_self_test_in_progress = 0x11d,
  boot_partition_write_prohibited = 0x11e,
  invalid_controller_identifier = 0x11f,
  invalid_secondary_controller_state = 0x120,
  invalid_number_of_controller_resources = 0x121,
  invalid_resource_identifier = 0x122,
  sanitize_prohibited_while_persistent_memory_region_is_enabled = 0x123,
  ana_group_identifier_invalid = 0x124,
  ana_attach_failed = 0x125,
  insufficient_capacity = 0x126,
  namespace_attachment_limit_exceeded = 0x127,
  prohibition_of_command_execution_not_supported = 0x128,
  io_command_set_not_supported = 0x129,
  io_command_set_not_enabled = 0x12a,
  io_command_set_combination_rejected = 0x12b,
  invalid_io_command_set = 0x12c,
  identifier_unavailable = 0x12d,
  // Command specific, NVM Command Set specific (NVM Command Set Specification 1.0).
  conflicting_attributes = 0x180,
  invalid_protection_information = 0x181,
  attempted_write_to_read_only_range = 0x182,
  command_size_limit_exceeded = 0x183,

  // "Media and Data Integrity Errors Values".
  write_fault = 0x280,
  unrecovered_read_error = 0x281,
  end_to_end_guard_check_error = 0x282,
  end_to_end_application_tag_check_error = 0x283,
  end_to_end_reference_tag_check_error = 0x284,
  compare_failure = 0x285,
  access_denied = 0x286,
  deallocated_or_unwritten_logical_block = 0x287,

  // "Path Related Status Values".
  internal_path_error = 0x300,
  asymmetric_access_persistent_loss = 0x301,
  asymmetric_access_inaccessible = 0x302,
  asymmetric_access_transition = 0x303,
  controller_pathing_error = 0x360,
  host_pathing_error = 0x370,
  command_aborted_by_host = 0x371,
};

/// The status with type `sct` and code `sc`.
///
/// Usage: examples/snippets/spec.cpp (the `make_status` static_assert).
[[nodiscard]] CUNVME_HOST_DEVICE constexpr status make_status(status_code_type sct,
                                                              cuda::std::uint8_t sc) noexcept {
  return static_cast<status>((static_cast<unsigned>(sct) & 0x7u) << 8 | sc);
}

/// SCT of `s`.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr status_code_type code_type(status s) noexcept {
  return static_cast<status_code_type>((static_cast<unsigned>(s) >> 8) & 0x7u);
}

/// SC of `s`: meaningful only together with `code_type(s)`.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t code(status s) noexcept {
  return static_cast<cuda::std::uint8_t>(static_cast<unsigned>(s) & 0xffu);
}

/// Whether the command completed successfully. Only Generic 00h is success: every other code,
/// vendor specific ones included, reports a failure.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr bool is_success(status s) noexcept {
  return s == status::successful_completion;
}

/// One row of the status name table.
struct status_name {
  status value;
  const char* name;  ///< as the spec writes it, capitalisation included
};

/// Every status the enum lists with its spec name, sorted by value.
///
/// A function, not a namespace-scope array: device code may not read a constexpr variable that
/// lacks `__device__` at a run-time index, and giving it `__device__` hides it from the host.
/// Usage: examples/snippets/spec.cpp, `count_status_names`.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr auto status_names() noexcept {
  return cuda::std::array{
      status_name{status::successful_completion, "Successful Completion"},
      status_name{status::invalid_command_opcode, "Invalid Command Opcode"},
      status_name{status::invalid_field_in_command, "Invalid Field in Command"},
      status_name{status::command_id_conflict, "Command ID Conflict"},
      status_name{status::data_transfer_error, "Data Transfer Error"},
      status_name{status::commands_aborted_due_to_power_loss_notification,
                  "Commands Aborted due to Power Loss Notification"},
      status_name{status::internal_error, "Internal Error"},
      status_name{status::command_abort_requested, "Command Abort Requested"},
      status_name{status::command_aborted_due_to_sq_deletion, "Command Aborted due to SQ Deletion"},
      status_name{status::command_aborted_due_to_failed_fused_command,
                  "Command Aborted due to Failed Fused Command"},
      status_name{status::command_aborted_due_to_missing_fused_command,
                  "Command Aborted due to Missing Fused Command"},
      status_name{status::invalid_namespace_or_format, "Invalid Namespace or Format"},
      status_name{status::command_sequence_error, "Command Sequence Error"},
      status_name{status::invalid_sgl_segment_descriptor, "Invalid SGL Segment Descriptor"},
      status_name{status::invalid_number_of_sgl_descriptors, "Invalid Number of SGL Descriptors"},
      status_name{status::data_sgl_length_invalid, "Data SGL Length Invalid"},
      status_name{status::metadata_sgl_length_invalid, "Metadata SGL Length Invalid"},
      status_name{status::sgl_descriptor_type_invalid, "SGL Descriptor Type Invalid"},
      status_name{status::invalid_use_of_controller_memory_buffer,
                  "Invalid Use of Controller Memory Buffer"},
      status_name{status::prp_offset_invalid, "PRP Offset Invalid"},
      status_name{status::atomic_write_unit_exceeded, "Atomic Write Unit Exceeded"},
      status_name{status::operation_denied, "Operation Denied"},
      status_name{status::sgl_offset_invalid, "SGL Offset Invalid"},
      status_name{status::host_identifier_inconsistent_format, "Host Identifier Inconsistent Format"},
      status_name{status::keep_alive_timer_expired, "Keep Alive Timer Expired"},
      status_name{status::keep_alive_timeout_invalid, "Keep Alive Timeout Invalid"},
      status_name{status::command_aborted_due_to_preempt_and_abort,
                  "Command Aborted due to Preempt and Abort"},
      status_name{status::sanitize_failed, "Sanitize Failed"},
      status_name{status::sanitize_in_progress, "Sanitize In Progress"},
      status_name{status::sgl_data_block_granularity_invalid, "SGL Data Block Granularity Invalid"},
      status_name{status::command_not_supported_for_queue_in_cmb,
                  "Command Not Supported for Queue in CMB"},
      status_name{status::namespace_is_write_protected, "Namespace is Write Protected"},
      status_name{status::command_interrupted, "Command Interrupted"},
      status_name{status::transient_transport_error, "Transient Transport Error"},
      status_name{status::command_prohibited_by_command_and_feature_lockdown,
                  "Command Prohibited by Command and Feature Lockdown"},
      status_name{status::admin_command_media_not_ready, "Admin Command Media Not Ready"},
      status_name{status::lba_out_of_range, "LBA Out of Range"},
      status_name{status::capacity_exceeded, "Capacity Exceeded"},
      status_name{status::namespace_not_ready, "Namespace Not Ready"},
      status_name{status::reservation_conflict, "Reservation Conflict"},
      status_name{status::format_in_progress, "Format In Progress"},

      status_name{status::completion_queue_invalid, "Completion Queue Invalid"},
      status_name{status::invalid_queue_identifier, "Invalid Queue Identifier"},
      status_name{status::invalid_queue_size, "Invalid Queue Size"},
      status_name{status::abort_command_limit_exceeded, "Abort Command Limit Exceeded"},
      status_name{status::asynchronous_event_request_limit_exceeded,
                  "Asynchronous Event Request Limit Exceeded"},
      status_name{status::invalid_firmware_slot, "Invalid Firmware Slot"},
      status_name{status::invalid_firmware_image, "Invalid Firmware Image"},
      status_name{status::invalid_interrupt_vector, "Invalid Interrupt Vector"},
      status_name{status::invalid_log_page, "Invalid Log Page"},
      status_name{status::invalid_format, "Invalid Format"},
      status_name{status::firmware_activation_requires_conventional_reset,
                  "Firmware Activation Requires Conventional Reset"},
      status_name{status::invalid_queue_deletion, "Invalid Queue Deletion"},
      status_name{status::feature_identifier_not_saveable, "Feature Identifier Not Saveable"},
      status_name{status::feature_not_changeable, "Feature Not Changeable"},
      status_name{status::feature_not_namespace_specific, "Feature Not Namespace Specific"},
      status_name{status::firmware_activation_requires_nvm_subsystem_reset,
                  "Firmware Activation Requires NVM Subsystem Reset"},
      status_name{status::firmware_activation_requires_controller_level_reset,
                  "Firmware Activation Requires Controller Level Reset"},
      status_name{status::firmware_activation_requires_maximum_time_violation,
                  "Firmware Activation Requires Maximum Time Violation"},
      status_name{status::firmware_activation_prohibited, "Firmware Activation Prohibited"},
      status_name{status::overlapping_range, "Overlapping Range"},
      status_name{status::namespace_insufficient_capacity, "Namespace Insufficient Capacity"},
      status_name{status::namespace_identifier_unavailable, "Namespace Identifier Unavailable"},
      status_name{status::namespace_already_attached, "Namespace Already Attached"},
      status_name{status::namespace_is_private, "Namespace Is Private"},
      status_name{status::namespace_not_attached, "Namespace Not Attached"},
      status_name{status::thin_provisioning_not_supported, "Thin Provisioning Not Supported"},
      status_name{status::controller_list_invalid, "Controller List Invalid"},
      status_name{status::device_self_test_in_progress, "Device Self-test In Progress"},
      status_name{status::boot_partition_write_prohibited, "Boot Partition Write Prohibited"},
      status_name{status::invalid_controller_identifier, "Invalid Controller Identifier"},
      status_name{status::invalid_secondary_controller_state, "Invalid Secondary Controller State"},
      status_name{status::invalid_number_of_controller_resources,
                  "Invalid Number of Controller Resources"},
      status_name{status::invalid_resource_identifier, "Invalid Resource Identifier"},
      status_name{status::sanitize_prohibited_while_persistent_memory_region_is_enabled,
                  "Sanitize Prohibited While Persistent Memory Region is Enabled"},
      status_name{status::ana_group_identifier_invalid, "ANA Group Identifier Invalid"},
      status_name{status::ana_attach_failed, "ANA Attach Failed"},
      status_name{status::insufficient_capacity, "Insufficient Capacity"},
      status_name{status::namespace_attachment_limit_exceeded, "Namespace Attachment Limit Exceeded"},
      status_name{status::prohibition_of_command_execution_not_supported,
                  "Prohibition of Command Execution Not Supported"},
      status_name{status::io_command_set_not_supported, "I/O Command Set Not Supported"},
      status_name{status::io_command_set_not_enabled, "I/O Command Set Not Enabled"},
      status_name{status::io_command_set_combination_rejected, "I/O Command Set Combination Rejected"},
      status_name{status::invalid_io_command_set, "Invalid I/O Command Set"},
      status_name{status::identifier_unavailable, "Identifier Unavailable"},
      status_name{status::conflicting_attributes, "Conflicting Attributes"},
      status_name{status::invalid_protection_information, "Invalid Protection Information"},
      status_name{status::attempted_write_to_read_only_range, "Attempted Write to Read Only Range"},
      status_name{status::command_size_limit_exceeded, "Command Size Limit Exceeded"},

      status_name{status::write_fault, "Write Fault"},
      status_name{status::unrecovered_read_error, "Unrecovered Read Error"},
      status_name{status::end_to_end_guard_check_error, "End-to-end Guard Check Error"},
      status_name{status::end_to_end_application_tag_check_error,
                  "End-to-end Application Tag Check Error"},
      status_name{status::end_to_end_reference_tag_check_error, "End-to-end Reference Tag Check Error"},
      status_name{status::compare_failure, "Compare Failure"},
      status_name{status::access_denied, "Access Denied"},
      status_name{status::deallocated_or_unwritten_logical_block,
                  "Deallocated or Unwritten Logical Block"},

      status_name{status::internal_path_error, "Internal Path Error"},
      status_name{status::asymmetric_access_persistent_loss, "Asymmetric Access Persistent Loss"},
      status_name{status::asymmetric_access_inaccessible, "Asymmetric Access Inaccessible"},
      status_name{status::asymmetric_access_transition, "Asymmetric Access Transition"},
      status_name{status::controller_pathing_error, "Controller Pathing Error"},
      status_name{status::host_pathing_error, "Host Pathing Error"},
      status_name{status::command_aborted_by_host, "Command Aborted By Host"},
  };
}

namespace detail {

// Every row is read at a constant index, so the table never has to exist at run time: the
// compiler folds the comparisons into a switch (a decision tree in device code). A loop with a
// run-time index would instead copy the whole table into the stack frame of every kernel that
// can reach `name`, 1.6 KiB per thread.
template <cuda::std::size_t... Row>
[[nodiscard]] CUNVME_HOST_DEVICE constexpr const char* find_status_name(
    status s, cuda::std::index_sequence<Row...>) noexcept {
  constexpr auto table = status_names();
  const char* found = nullptr;
  (void)(((table[Row].value == s) && (found = table[Row].name, true)) || ...);
  return found;
}

[[nodiscard]] CUNVME_HOST_DEVICE constexpr bool status_names_strictly_increasing() noexcept {
  constexpr auto table = status_names();
  for (cuda::std::size_t i = 1; i < table.size(); ++i) {
    if (!(static_cast<unsigned>(table[i - 1].value) < static_cast<unsigned>(table[i].value))) {
      return false;
    }
  }
  return true;
}

}  // namespace detail

// `name` takes the first row that matches, so a duplicate would hide its twin; sorting keeps
// the check linear and the table readable next to the spec's figures.
static_assert(detail::status_names_strictly_increasing(),
              "status_names() must be sorted by value without duplicates");

/// The spec's name for `s`: "Vendor Specific" for a vendor specific code (SCT 7, or SC C0h–FFh
/// of any type), "Reserved" for any other code the table lacks. Never null, so it can go
/// straight into a message, on the host or in a kernel's `printf`.
///
/// Usage: examples/snippets/spec.cpp, `print_failure`.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr const char* name(status s) noexcept {
  if (const char* found = detail::find_status_name(
          s, cuda::std::make_index_sequence<status_names().size()>{})) {
    return found;
  }
  // The spec gives C0h–FFh of every type to vendors, as well as all of SCT 7.
  if (code_type(s) == status_code_type::vendor_specific || code(s) >= 0xc0) {
    return "Vendor Specific";
  }
  return "Reserved";
}

/// `s` for a log or an exception message: its name, then SCT/SC as the spec tabulates them.
/// Host only.
///
/// Usage: examples/snippets/spec.cpp, `describe`.
[[nodiscard]] inline std::string to_string(status s) {
  constexpr char hex_digits[] = "0123456789abcdef";
  const auto sc = code(s);
  std::string text = name(s);
  text += " (";
  text += static_cast<char>('0' + static_cast<unsigned>(code_type(s)));
  text += "/0x";
  text += hex_digits[sc >> 4];
  text += hex_digits[sc & 0xf];
  text += ')';
  return text;
}

/// The 16-bit status field of a completion queue entry, DW3 bits 31:16 ("Completion Queue
/// Entry: Status Field"), as a raw word with accessors.
///
/// A namespace of free functions rather than a struct: the CQE keeps the raw word
/// (`completion_entry::status_field`) and forwards to these, and code that polls a CQ in place
/// reads the word without building an object around it.
/// Usage: examples/snippets/spec.cpp, `posted_with_dnr`.
namespace cqe_status {

using phase_tag_field = bit_field<cuda::std::uint16_t, 0, 1, bool>;
using sc_field        = bit_field<cuda::std::uint16_t, 1, 8, cuda::std::uint8_t>;
using sct_field       = bit_field<cuda::std::uint16_t, 9, 3, status_code_type>;
/// SC and SCT read as one: SCT sits directly above SC, so bits 11:1 are already the flat
/// (SCT << 8) | SC value of `status`.
using status_bits     = bit_field<cuda::std::uint16_t, 1, 11, status>;
using crd_field       = bit_field<cuda::std::uint16_t, 12, 2, cuda::std::uint8_t>;
using more_field      = bit_field<cuda::std::uint16_t, 14, 1, bool>;
using dnr_field       = bit_field<cuda::std::uint16_t, 15, 1, bool>;

/// Phase Tag: flips each pass through the CQ, telling a new entry from a stale one.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr bool phase(cuda::std::uint16_t word) noexcept {
  return phase_tag_field::get(word);
}

[[nodiscard]] CUNVME_HOST_DEVICE constexpr status status_of(cuda::std::uint16_t word) noexcept {
  return status_bits::get(word);
}

/// Command Retry Delay: 0 retry at once, 1–3 wait CRDT1–CRDT3 of Identify Controller
/// (100 ms units) before retrying; only meaningful when `dnr` is clear.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint8_t crd(cuda::std::uint16_t word) noexcept {
  return crd_field::get(word);
}

/// More: further information is in the Error Information log page.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr bool more(cuda::std::uint16_t word) noexcept {
  return more_field::get(word);
}

/// Do Not Retry: the same command would fail again if resubmitted.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr bool dnr(cuda::std::uint16_t word) noexcept {
  return dnr_field::get(word);
}

/// The status field a controller would post, for emulators and tests. Bits of `crd` above
/// its 2-bit field are dropped.
///
/// Usage: examples/snippets/spec.cpp (the `make_status_field` static_assert).
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint16_t make_status_field(
    status s, bool phase, bool dnr = false, bool more = false, cuda::std::uint8_t crd = 0) noexcept {
  cuda::std::uint16_t word = 0;
  word = phase_tag_field::set(word, phase);
  word = status_bits::set(word, s);
  word = crd_field::set(word, crd);
  word = more_field::set(word, more);
  word = dnr_field::set(word, dnr);
  return word;
}

}  // namespace cqe_status

}  // namespace spec
CUNVME_NAMESPACE_END
