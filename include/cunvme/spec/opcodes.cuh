// Command opcodes and Feature Identifiers (NVMe Base Specification 2.0 Figures 28 and 285;
// NVM Command Set Specification 1.0 Figure 17).
#pragma once

#include <cunvme/config.cuh>

#include <cuda/std/cstdint>

CUNVME_NAMESPACE_BEGIN
namespace spec {

/// Admin command set opcodes (Figure 28).
enum class admin_opcode : cuda::std::uint8_t {
  delete_io_submission_queue = 0x00,
  create_io_submission_queue = 0x01,
  get_log_page = 0x02,
  delete_io_completion_queue = 0x04,
  create_io_completion_queue = 0x05,
  identify = 0x06,
  abort = 0x08,
  set_features = 0x09,
  get_features = 0x0a,
  asynchronous_event_request = 0x0c,
  namespace_management = 0x0d,
  firmware_commit = 0x10,
  firmware_image_download = 0x11,
  device_self_test = 0x14,
  namespace_attachment = 0x15,
  keep_alive = 0x18,
  directive_send = 0x19,
  directive_receive = 0x1a,
  virtualization_management = 0x1c,
  nvme_mi_send = 0x1d,
  nvme_mi_receive = 0x1e,
  capacity_management = 0x20,
  lockdown = 0x24,
  doorbell_buffer_config = 0x7c,
  fabrics_commands = 0x7f,
  format_nvm = 0x80,
  security_send = 0x81,
  security_receive = 0x82,
  sanitize = 0x84,
  get_lba_status = 0x86,
};

/// NVM command set I/O opcodes (NVM Command Set Specification, Figure 17).
enum class nvm_opcode : cuda::std::uint8_t {
  flush = 0x00,
  write = 0x01,
  read = 0x02,
  write_uncorrectable = 0x04,
  compare = 0x05,
  write_zeroes = 0x08,
  dataset_management = 0x09,
  verify = 0x0c,
  reservation_register = 0x0d,
  reservation_report = 0x0e,
  reservation_acquire = 0x11,
  reservation_release = 0x15,
  copy = 0x19,
};

/// Data transfer direction encoded in opcode bits 1:0 (Figure 28, "Data Transfer").
enum class data_direction : cuda::std::uint8_t {
  none = 0b00,
  host_to_controller = 0b01,
  controller_to_host = 0b10,
  bidirectional = 0b11,
};

[[nodiscard]] CUNVME_HOST_DEVICE constexpr data_direction direction_of(cuda::std::uint8_t opcode) noexcept {
  return static_cast<data_direction>(opcode & 0b11u);
}
[[nodiscard]] CUNVME_HOST_DEVICE constexpr data_direction direction_of(admin_opcode opcode) noexcept {
  return direction_of(static_cast<cuda::std::uint8_t>(opcode));
}
[[nodiscard]] CUNVME_HOST_DEVICE constexpr data_direction direction_of(nvm_opcode opcode) noexcept {
  return direction_of(static_cast<cuda::std::uint8_t>(opcode));
}

/// Feature Identifiers (Figure 285) a driver uses.
enum class feature_id : cuda::std::uint8_t {
  arbitration = 0x01,
  power_management = 0x02,
  lba_range_type = 0x03,
  temperature_threshold = 0x04,
  error_recovery = 0x05,
  volatile_write_cache = 0x06,
  number_of_queues = 0x07,
  interrupt_coalescing = 0x08,
  interrupt_vector_configuration = 0x09,
  write_atomicity_normal = 0x0a,
  asynchronous_event_configuration = 0x0b,
  autonomous_power_state_transition = 0x0c,
  host_memory_buffer = 0x0d,
  timestamp = 0x0e,
  keep_alive_timer = 0x0f,
  host_controlled_thermal_management = 0x10,
  non_operational_power_state_config = 0x11,
};

/// Get Features SEL (Figure 280): which value of a feature to return.
enum class feature_select : cuda::std::uint8_t {
  current = 0b000,
  default_ = 0b001,
  saved = 0b010,
  supported_capabilities = 0b011,
};

}  // namespace spec
CUNVME_NAMESPACE_END
