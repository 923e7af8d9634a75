#include <cunvme/spec/opcodes.cuh>

#include <doctest/doctest.h>

namespace spec = cunvme::spec;

TEST_CASE("admin opcodes carry the values of Figure 28") {
  static_assert(static_cast<int>(spec::admin_opcode::delete_io_submission_queue) == 0x00);
  static_assert(static_cast<int>(spec::admin_opcode::create_io_submission_queue) == 0x01);
  static_assert(static_cast<int>(spec::admin_opcode::get_log_page) == 0x02);
  static_assert(static_cast<int>(spec::admin_opcode::delete_io_completion_queue) == 0x04);
  static_assert(static_cast<int>(spec::admin_opcode::create_io_completion_queue) == 0x05);
  static_assert(static_cast<int>(spec::admin_opcode::identify) == 0x06);
  static_assert(static_cast<int>(spec::admin_opcode::abort) == 0x08);
  static_assert(static_cast<int>(spec::admin_opcode::set_features) == 0x09);
  static_assert(static_cast<int>(spec::admin_opcode::get_features) == 0x0a);
  static_assert(static_cast<int>(spec::admin_opcode::asynchronous_event_request) == 0x0c);
  static_assert(static_cast<int>(spec::admin_opcode::keep_alive) == 0x18);
  static_assert(static_cast<int>(spec::admin_opcode::doorbell_buffer_config) == 0x7c);
  static_assert(static_cast<int>(spec::admin_opcode::format_nvm) == 0x80);
  static_assert(static_cast<int>(spec::admin_opcode::sanitize) == 0x84);
  CHECK(static_cast<int>(spec::admin_opcode::get_lba_status) == 0x86);
}

TEST_CASE("NVM opcodes carry the values of the NVM Command Set's Figure 17") {
  static_assert(static_cast<int>(spec::nvm_opcode::flush) == 0x00);
  static_assert(static_cast<int>(spec::nvm_opcode::write) == 0x01);
  static_assert(static_cast<int>(spec::nvm_opcode::read) == 0x02);
  static_assert(static_cast<int>(spec::nvm_opcode::write_uncorrectable) == 0x04);
  static_assert(static_cast<int>(spec::nvm_opcode::compare) == 0x05);
  static_assert(static_cast<int>(spec::nvm_opcode::write_zeroes) == 0x08);
  static_assert(static_cast<int>(spec::nvm_opcode::dataset_management) == 0x09);
  static_assert(static_cast<int>(spec::nvm_opcode::verify) == 0x0c);
  CHECK(static_cast<int>(spec::nvm_opcode::copy) == 0x19);
}

TEST_CASE("an opcode's low two bits give its data direction") {
  static_assert(spec::direction_of(spec::nvm_opcode::read) == spec::data_direction::controller_to_host);
  static_assert(spec::direction_of(spec::nvm_opcode::write) == spec::data_direction::host_to_controller);
  static_assert(spec::direction_of(spec::nvm_opcode::flush) == spec::data_direction::none);
  static_assert(spec::direction_of(spec::nvm_opcode::dataset_management) == spec::data_direction::host_to_controller);
  static_assert(spec::direction_of(spec::admin_opcode::identify) == spec::data_direction::controller_to_host);
  static_assert(spec::direction_of(spec::admin_opcode::get_log_page) == spec::data_direction::controller_to_host);
  static_assert(spec::direction_of(spec::admin_opcode::create_io_completion_queue) == spec::data_direction::host_to_controller);
  static_assert(spec::direction_of(spec::admin_opcode::doorbell_buffer_config) == spec::data_direction::none);
  CHECK(spec::direction_of(std::uint8_t{0x03}) == spec::data_direction::bidirectional);
}

TEST_CASE("feature identifiers and select values carry the values of Figures 280 and 285") {
  static_assert(static_cast<int>(spec::feature_id::arbitration) == 0x01);
  static_assert(static_cast<int>(spec::feature_id::volatile_write_cache) == 0x06);
  static_assert(static_cast<int>(spec::feature_id::number_of_queues) == 0x07);
  static_assert(static_cast<int>(spec::feature_id::interrupt_coalescing) == 0x08);
  static_assert(static_cast<int>(spec::feature_id::asynchronous_event_configuration) == 0x0b);
  static_assert(static_cast<int>(spec::feature_id::host_memory_buffer) == 0x0d);
  static_assert(static_cast<int>(spec::feature_id::keep_alive_timer) == 0x0f);
  static_assert(static_cast<int>(spec::feature_select::supported_capabilities) == 0b011);
  CHECK(static_cast<int>(spec::feature_id::timestamp) == 0x0e);
}
