// Conformance: admin commands (NVMe 2.0 chapter 5) and their statuses.
#include "test_host.hpp"

#include <string>

using namespace test;

namespace {

struct ready_controller {
  explicit ready_controller(emu::controller_config config = {}) : ctrl(std::move(config)), host(ctrl) { REQUIRE(host.enable()); }
  emu::controller ctrl;
  test_host host;
};

}  // namespace

TEST_CASE("Identify Controller reports identity, limits and optional command support") {
  ready_controller r;
  dma_buffer page(r.ctrl, 4096);
  REQUIRE(r.host.admin_status(spec::make_identify(spec::identify_cns::controller, 0, page.bus)) == spec::status::successful_completion);
  const auto& id = *page.as<spec::identify_controller>();
  CHECK(id.vid == 0xc0de);
  CHECK(spec::trimmed(id.sn) == "CUNVME-EMU-0001");
  CHECK(spec::trimmed(id.mn) == "cunvme emulated NVMe controller");
  CHECK(spec::trimmed(id.fr) == "0.1.0");
  CHECK(id.mdts == 7);
  CHECK(id.mdts_bytes(4096) == 512 * 1024);
  CHECK(id.sqes == 0x66);
  CHECK(id.cqes == 0x44);
  CHECK(id.nn == 1);
  CHECK(id.supports_doorbell_buffer_config());
  CHECK(id.supports_dataset_management());
  CHECK(id.supports_write_zeroes());
  CHECK(id.volatile_write_cache_present());
  CHECK(id.ver == r.host.reg(spec::register_offset::vs));
  CHECK(std::string(id.subnqn).rfind("nqn.", 0) == 0);
}

TEST_CASE("Identify Namespace reports size and the formatted LBA size") {
  emu::controller_config config;
  config.namespaces = {emu::namespace_config::in_memory(512, 2048), emu::namespace_config::in_memory(4096, 100)};
  ready_controller r(config);
  dma_buffer page(r.ctrl, 4096);
  REQUIRE(r.host.admin_status(spec::make_identify(spec::identify_cns::namespace_data, 2, page.bus)) == spec::status::successful_completion);
  const auto& ns = *page.as<spec::identify_namespace>();
  CHECK(ns.nsze == 100);
  CHECK(ns.ncap == 100);
  CHECK(ns.lba_size_bytes() == 4096);
  CHECK(ns.number_of_lba_formats() == 2);
  REQUIRE(r.host.admin_status(spec::make_identify(spec::identify_cns::namespace_data, 1, page.bus)) == spec::status::successful_completion);
  CHECK(ns.nsze == 2048);
  CHECK(ns.lba_size_bytes() == 512);
}

TEST_CASE("Identify Namespace reports a metadata format: LBAF.MS, FLBAS bit 4 for extended LBAs, MC for the mode") {
  emu::controller_config config;
  config.namespaces = {emu::namespace_config::in_memory(512, 64).with_metadata(8, true),
                       emu::namespace_config::in_memory(4096, 64).with_metadata(64, false),
                       emu::namespace_config::in_memory(512, 64)};
  ready_controller r(config);
  dma_buffer page(r.ctrl, 4096);
  const auto& ns = *page.as<spec::identify_namespace>();
  REQUIRE(r.host.admin_status(spec::make_identify(spec::identify_cns::namespace_data, 1, page.bus)) == spec::status::successful_completion);
  CHECK(ns.lba_size_bytes() == 512);
  CHECK(ns.metadata_size_bytes() == 8);
  CHECK(ns.metadata_at_end_of_lba());
  CHECK(ns.mc == 0x01);
  CHECK(ns.dps == 0);
  REQUIRE(r.host.admin_status(spec::make_identify(spec::identify_cns::namespace_data, 2, page.bus)) == spec::status::successful_completion);
  CHECK(ns.lba_size_bytes() == 4096);
  CHECK(ns.metadata_size_bytes() == 64);
  CHECK_FALSE(ns.metadata_at_end_of_lba());
  CHECK(ns.mc == 0x02);
  REQUIRE(r.host.admin_status(spec::make_identify(spec::identify_cns::namespace_data, 3, page.bus)) == spec::status::successful_completion);
  CHECK(ns.metadata_size_bytes() == 0);
  CHECK_FALSE(ns.metadata_at_end_of_lba());
}

TEST_CASE("Identify with a namespace that does not exist is Invalid Namespace or Format") {
  ready_controller r;
  dma_buffer page(r.ctrl, 4096);
  CHECK(r.host.admin_status(spec::make_identify(spec::identify_cns::namespace_data, 0, page.bus)) ==
        spec::status::invalid_namespace_or_format);
  CHECK(r.host.admin_status(spec::make_identify(spec::identify_cns::namespace_data, 2, page.bus)) ==
        spec::status::invalid_namespace_or_format);
  CHECK(r.host.admin_status(spec::make_identify(spec::identify_cns::active_namespace_list, 0xfffffffe, page.bus)) ==
        spec::status::invalid_namespace_or_format);
}

TEST_CASE("Identify active namespace list returns the NSIDs above the given one, ascending") {
  emu::controller_config config;
  config.namespaces.assign(3, emu::namespace_config::in_memory(512, 64));
  ready_controller r(config);
  dma_buffer page(r.ctrl, 4096);
  REQUIRE(r.host.admin_status(spec::make_identify(spec::identify_cns::active_namespace_list, 1, page.bus)) ==
          spec::status::successful_completion);
  const auto& list = *page.as<spec::active_namespace_list>();
  CHECK(list.nsid[0] == 2);
  CHECK(list.nsid[1] == 3);
  CHECK(list.nsid[2] == 0);
}

TEST_CASE("Identify with an unsupported CNS is Invalid Field in Command") {
  ready_controller r;
  dma_buffer page(r.ctrl, 4096);
  CHECK(r.host.admin_status(spec::make_identify(static_cast<spec::identify_cns>(0x10), 0, page.bus)) ==
        spec::status::invalid_field_in_command);
}

TEST_CASE("an unknown admin opcode is Invalid Command Opcode") {
  ready_controller r;
  spec::submission_entry sqe{};
  sqe.set_opcode(std::uint8_t{0xc3});
  CHECK(r.host.admin_status(sqe) == spec::status::invalid_command_opcode);
}

TEST_CASE("Set Features Number of Queues grants at most what the controller has") {
  emu::controller_config config;
  config.max_io_queues = 8;
  ready_controller r(config);
  auto cqe = r.host.run(*r.host.admin, spec::make_set_number_of_queues(4, 2));
  REQUIRE(cqe.status() == spec::status::successful_completion);
  CHECK(spec::number_of_queues_fields::nsqr::get(cqe.dw0) == 3);
  CHECK(spec::number_of_queues_fields::ncqr::get(cqe.dw0) == 1);
  cqe = r.host.run(*r.host.admin, spec::make_get_features(spec::feature_id::number_of_queues));
  CHECK(spec::number_of_queues_fields::nsqr::get(cqe.dw0) == 3);
  // Queue identifiers past the allocation are refused.
  dma_buffer mem(r.ctrl, 65536);
  CHECK(r.host.admin_status(spec::make_create_io_cq(3, 16, mem.bus)) == spec::status::invalid_queue_identifier);
  cqe = r.host.run(*r.host.admin, spec::make_set_number_of_queues(100, 100));
  CHECK(spec::number_of_queues_fields::nsqr::get(cqe.dw0) == 7);
}

TEST_CASE("Set Features Number of Queues asking for 65536 queues is Invalid Field in Command") {
  ready_controller r;
  spec::submission_entry sqe = spec::make_set_features(spec::feature_id::number_of_queues, 0xffffu);
  CHECK(r.host.admin_status(sqe) == spec::status::invalid_field_in_command);
}

TEST_CASE("Set Features Number of Queues after an I/O queue exists is Command Sequence Error") {
  ready_controller r;
  auto q = r.host.create_pair(1, 8);
  CHECK(r.host.admin_status(spec::make_set_number_of_queues(2, 2)) == spec::status::command_sequence_error);
}

TEST_CASE("Volatile Write Cache can be read, changed and read back") {
  ready_controller r;
  CHECK(r.host.run(*r.host.admin, spec::make_get_features(spec::feature_id::volatile_write_cache)).dw0 == 1);
  CHECK(r.host.admin_status(spec::make_set_features(spec::feature_id::volatile_write_cache, 0)) == spec::status::successful_completion);
  CHECK(r.host.run(*r.host.admin, spec::make_get_features(spec::feature_id::volatile_write_cache)).dw0 == 0);
}

TEST_CASE("Volatile Write Cache on a controller without one is Invalid Field in Command") {
  emu::controller_config config;
  config.volatile_write_cache = false;
  ready_controller r(config);
  CHECK(r.host.admin_status(spec::make_get_features(spec::feature_id::volatile_write_cache)) == spec::status::invalid_field_in_command);
}

TEST_CASE("saving a feature is Feature Identifier Not Saveable, an unknown one Invalid Field") {
  ready_controller r;
  CHECK(r.host.admin_status(spec::make_set_features(spec::feature_id::arbitration, 0, true)) ==
        spec::status::feature_identifier_not_saveable);
  CHECK(r.host.admin_status(spec::make_get_features(static_cast<spec::feature_id>(0x7e))) == spec::status::invalid_field_in_command);
  CHECK(r.host.admin_status(spec::make_set_features(spec::feature_id::interrupt_coalescing, 0x0305)) ==
        spec::status::successful_completion);
  CHECK(r.host.run(*r.host.admin, spec::make_get_features(spec::feature_id::interrupt_coalescing)).dw0 == 0x0305);
}

TEST_CASE("Create I/O Completion Queue validates identifier, size, contiguity, vector and memory") {
  emu::controller_config config;
  config.max_queue_entries = 64;
  ready_controller r(config);
  dma_buffer mem(r.ctrl, 65536);
  auto status = [&](spec::submission_entry sqe) { return r.host.admin_status(sqe); };
  CHECK(status(spec::make_create_io_cq(0, 16, mem.bus)) == spec::status::invalid_queue_identifier);
  CHECK(status(spec::make_create_io_cq(65, 16, mem.bus)) == spec::status::invalid_queue_identifier);
  CHECK(status(spec::make_create_io_cq(1, 1, mem.bus)) == spec::status::invalid_queue_size);
  CHECK(status(spec::make_create_io_cq(1, 65, mem.bus)) == spec::status::invalid_queue_size);
  CHECK(status(spec::make_create_io_cq(1, 16, mem.bus, /*pc*/ false)) == spec::status::invalid_field_in_command);
  CHECK(status(spec::make_create_io_cq(1, 16, mem.bus, true, /*ien*/ true, 32)) == spec::status::invalid_interrupt_vector);
  CHECK(status(spec::make_create_io_cq(1, 16, mem.bus + 64)) == spec::status::prp_offset_invalid);
  CHECK(status(spec::make_create_io_cq(1, 16, 0x1000)) == spec::status::data_transfer_error);
  CHECK(status(spec::make_create_io_cq(1, 16, mem.bus, true, true, 31)) == spec::status::successful_completion);
  CHECK(status(spec::make_create_io_cq(1, 16, mem.bus + 4096)) == spec::status::invalid_queue_identifier);  // in use
}

TEST_CASE("Create I/O Submission Queue validates its completion queue") {
  ready_controller r;
  dma_buffer mem(r.ctrl, 65536);
  auto status = [&](spec::submission_entry sqe) { return r.host.admin_status(sqe); };
  CHECK(status(spec::make_create_io_sq(1, 16, mem.bus, 0)) == spec::status::completion_queue_invalid);
  CHECK(status(spec::make_create_io_sq(1, 16, mem.bus, 5)) == spec::status::completion_queue_invalid);
  REQUIRE(status(spec::make_create_io_cq(5, 16, mem.bus)) == spec::status::successful_completion);
  CHECK(status(spec::make_create_io_sq(1, 16, mem.bus + 4096, 5, false)) == spec::status::invalid_field_in_command);
  CHECK(status(spec::make_create_io_sq(1, 4097, mem.bus + 4096, 5)) == spec::status::invalid_queue_size);
  CHECK(status(spec::make_create_io_sq(0, 16, mem.bus + 4096, 5)) == spec::status::invalid_queue_identifier);
  CHECK(status(spec::make_create_io_sq(1, 16, mem.bus + 4096, 5)) == spec::status::successful_completion);
  CHECK(status(spec::make_create_io_sq(1, 16, mem.bus + 8192, 5)) == spec::status::invalid_queue_identifier);
}

TEST_CASE("deleting a completion queue that a submission queue still uses is Invalid Queue Deletion") {
  ready_controller r;
  auto q = r.host.create_pair(1, 8);
  CHECK(r.host.admin_status(spec::make_delete_io_cq(1)) == spec::status::invalid_queue_deletion);
  CHECK(r.host.admin_status(spec::make_delete_io_sq(1)) == spec::status::successful_completion);
  CHECK(r.host.admin_status(spec::make_delete_io_cq(1)) == spec::status::successful_completion);
  CHECK(r.host.admin_status(spec::make_delete_io_sq(1)) == spec::status::invalid_queue_identifier);
  CHECK(r.host.admin_status(spec::make_delete_io_cq(0)) == spec::status::invalid_queue_identifier);
}

TEST_CASE("a deleted queue pair can be created again and works") {
  ready_controller r;
  auto q = r.host.create_pair(1, 8);
  dma_buffer data(r.ctrl, 4096);
  CHECK(r.host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 8, data.bus)).status() == spec::status::successful_completion);
  REQUIRE(r.host.admin_status(spec::make_delete_io_sq(1)) == spec::status::successful_completion);
  REQUIRE(r.host.admin_status(spec::make_delete_io_cq(1)) == spec::status::successful_completion);
  q = r.host.create_pair(1, 8);
  CHECK(r.host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 8, data.bus)).status() == spec::status::successful_completion);
  CHECK(r.ctrl.stats().doorbell_errors == 0);
}

TEST_CASE("Get Log Page SMART counts data units and host commands") {
  ready_controller r;
  auto q = r.host.create_pair(1, 16);
  dma_buffer data(r.ctrl, 65536);
  for (int i = 0; i < 3; ++i) {
    REQUIRE(r.host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 8, data.bus)).status() == spec::status::successful_completion);
  }
  REQUIRE(r.host.run(*q, spec::make_rw(spec::nvm_opcode::write, 1, 0, 8, data.bus)).status() == spec::status::successful_completion);
  dma_buffer page(r.ctrl, 4096);
  auto sqe = spec::make_get_log_page(spec::log_page_id::smart_health_information, 512, page.bus);
  REQUIRE(r.host.admin_status(sqe) == spec::status::successful_completion);
  const auto& smart = *page.as<spec::smart_health_information_log>();
  CHECK(smart.host_read_commands.low64() == 3);
  CHECK(smart.host_write_commands.low64() == 1);
  CHECK(smart.data_units_read.low64() == 1);  // 24 blocks of 512 B: rounded up to one unit
  CHECK(smart.data_units_written.low64() == 1);
  CHECK(smart.composite_temperature_kelvin() == 300);
  sqe.nsid = 1;
  CHECK(r.host.admin_status(sqe) == spec::status::invalid_field_in_command);
}

TEST_CASE("Get Log Page of an unsupported log is Invalid Log Page, a bad offset Invalid Field") {
  ready_controller r;
  dma_buffer page(r.ctrl, 4096);
  CHECK(r.host.admin_status(spec::make_get_log_page(static_cast<spec::log_page_id>(0xbf), 512, page.bus)) ==
        spec::status::invalid_log_page);
  CHECK(r.host.admin_status(spec::make_get_log_page(spec::log_page_id::smart_health_information, 512, page.bus, 0, 512)) ==
        spec::status::invalid_field_in_command);
}

TEST_CASE("failed commands are recorded in the Error Information log, newest first") {
  ready_controller r;
  auto q = r.host.create_pair(1, 16);
  dma_buffer data(r.ctrl, 4096);
  const auto first = r.host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 1ull << 40, 1, data.bus));
  REQUIRE(first.status() == spec::status::lba_out_of_range);
  CHECK(first.dnr());
  const auto second = r.host.run(*q, spec::make_rw(spec::nvm_opcode::read, 9, 0, 1, data.bus));
  REQUIRE(second.status() == spec::status::invalid_namespace_or_format);
  dma_buffer log(r.ctrl, 4096);
  REQUIRE(r.host.admin_status(spec::make_get_log_page(spec::log_page_id::error_information, 4096, log.bus)) ==
          spec::status::successful_completion);
  const auto* entries = log.as<spec::error_information_log_entry>();
  CHECK(entries[0].error_count == 2);
  CHECK(entries[0].cid == second.cid);
  CHECK(spec::cqe_status::status_of(entries[0].status_field) == spec::status::invalid_namespace_or_format);
  CHECK(entries[1].error_count == 1);
  CHECK(entries[1].sqid == 1);
  CHECK(entries[1].lba == 1ull << 40);
  CHECK(spec::cqe_status::status_of(entries[1].status_field) == spec::status::lba_out_of_range);
  CHECK(entries[2].error_count == 0);
}

TEST_CASE("a write to the doorbell of a missing queue is logged and completes an Asynchronous Event Request") {
  ready_controller r;
  auto aer = spec::submission_entry{};
  aer.set_opcode(spec::admin_opcode::asynchronous_event_request);
  const std::uint16_t cid = r.host.place(*r.host.admin, aer);
  r.host.ring_sq(*r.host.admin);
  r.host.write32(spec::sq_tail_doorbell_offset(7, 0), 3);
  const auto cqe = r.host.next_completion(*r.host.admin);
  REQUIRE(cqe.has_value());
  CHECK(cqe->cid == cid);
  CHECK(cqe->status() == spec::status::successful_completion);
  CHECK((cqe->dw0 & 0x7u) == 0);            // error status event
  CHECK(((cqe->dw0 >> 8) & 0xffu) == 0x00);  // write to invalid doorbell register
  CHECK(((cqe->dw0 >> 16) & 0xffu) == 0x01);  // see the Error Information log
  CHECK(r.ctrl.stats().doorbell_errors == 1);
}

TEST_CASE("an out-of-range doorbell value is ignored, logged and reported") {
  ready_controller r;
  auto q = r.host.create_pair(1, 8);
  auto aer = spec::submission_entry{};
  aer.set_opcode(spec::admin_opcode::asynchronous_event_request);
  r.host.place(*r.host.admin, aer);
  r.host.ring_sq(*r.host.admin);
  r.host.write32(spec::sq_tail_doorbell_offset(1, 0), 8);  // tail must be below the queue size
  const auto cqe = r.host.next_completion(*r.host.admin);
  REQUIRE(cqe.has_value());
  CHECK(((cqe->dw0 >> 8) & 0xffu) == 0x01);  // invalid doorbell write value
  // The queue still works once the host writes a valid tail.
  r.host.write32(spec::sq_tail_doorbell_offset(1, 0), 0);
  dma_buffer data(r.ctrl, 4096);
  CHECK(r.host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, data.bus)).status() == spec::status::successful_completion);
}

TEST_CASE("more outstanding Asynchronous Event Requests than AERL allows is AER Limit Exceeded") {
  emu::controller_config config;
  config.async_event_request_limit = 1;  // two outstanding
  ready_controller r(config);
  auto aer = spec::submission_entry{};
  aer.set_opcode(spec::admin_opcode::asynchronous_event_request);
  r.host.place(*r.host.admin, aer);
  r.host.place(*r.host.admin, aer);
  r.host.ring_sq(*r.host.admin);
  CHECK(r.host.run(*r.host.admin, aer).status() == spec::status::asynchronous_event_request_limit_exceeded);
}

TEST_CASE("Abort of a command that already completed reports it was not aborted") {
  ready_controller r;
  const auto cqe = r.host.run(*r.host.admin, spec::make_abort(0, 0x1234));
  CHECK(cqe.status() == spec::status::successful_completion);
  CHECK(spec::abort_fields::not_aborted::get(cqe.dw0));
}

namespace {

/// Aborts `victim` of I/O queue 1: the Abort says it aborted it, and the command completes at
/// once with Command Abort Requested (not after its 2 s latency).
void abort_and_expect_aborted(ready_controller& r, queue_pair& q, std::uint16_t victim) {
  const auto abort = r.host.run(*r.host.admin, spec::make_abort(1, victim));
  CHECK_FALSE(spec::abort_fields::not_aborted::get(abort.dw0));
  const auto cqe = r.host.next_completion(q, std::chrono::milliseconds(1000));
  REQUIRE(cqe.has_value());
  CHECK(cqe->cid == victim);
  CHECK(cqe->status() == spec::status::command_abort_requested);
}

}  // namespace

TEST_CASE("Abort of a command still in flight completes it with Command Abort Requested") {
  emu::controller_config config;
  config.timing.read_latency_ns = 2'000'000'000;  // 2 s: it is still in flight when the Abort arrives
  ready_controller r(config);
  auto q = r.host.create_pair(1, 8);
  dma_buffer data(r.ctrl, 4096);
  const std::uint16_t victim = r.host.place(*q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, data.bus));
  r.host.ring_sq(*q);
  REQUIRE(test_host::eventually([&] { return r.ctrl.stats().io_commands == 1; }));
  abort_and_expect_aborted(r, *q, victim);
}

TEST_CASE("Abort finds a command whose burst is still executing: the worker's burst finishes first, then the command is aborted") {
  emu::controller_config config;
  config.timing.read_latency_ns = 2'000'000'000;  // every read stays parked 2 s after its burst
  ready_controller r(config);
  auto q = r.host.create_pair(1, 128);
  // The victim first, then 63 reads of 512 KiB whose copies keep the same burst busy for
  // milliseconds after the victim was counted: an Abort arriving then must still find it.
  constexpr std::size_t big = 512 * 1024;
  dma_buffer data(r.ctrl, big), list(r.ctrl, 4096);
  for (std::size_t k = 0; k + 1 < big / 4096; ++k) list.as<std::uint64_t>()[k] = data.bus + (k + 1) * 4096;
  const std::uint16_t victim = r.host.place(*q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, data.bus));
  for (std::uint64_t i = 1; i < 64; ++i) (void)r.host.place(*q, spec::make_rw(spec::nvm_opcode::read, 1, i * 1024, 1024, data.bus, list.bus));
  r.host.ring_sq(*q);
  REQUIRE(test_host::eventually([&] { return r.ctrl.stats().io_commands >= 1; }));
  abort_and_expect_aborted(r, *q, victim);
}

TEST_CASE("Doorbell Buffer Config with unaligned or unregistered buffers is Invalid Field in Command") {
  ready_controller r;
  dma_buffer pages(r.ctrl, 8192);
  CHECK(r.host.admin_status(spec::make_doorbell_buffer_config(pages.bus + 8, pages.bus + 4096)) ==
        spec::status::invalid_field_in_command);
  CHECK(r.host.admin_status(spec::make_doorbell_buffer_config(0x4000, pages.bus + 4096)) == spec::status::invalid_field_in_command);
  CHECK(r.host.admin_status(spec::make_doorbell_buffer_config(pages.bus, pages.bus + 4096)) == spec::status::successful_completion);
}

TEST_CASE("with shadow doorbells the controller reads the shadow tail and publishes EventIdx") {
  ready_controller r;
  dma_buffer shadow(r.ctrl, 4096);
  dma_buffer event_index(r.ctrl, 4096);
  REQUIRE(r.host.admin_status(spec::make_doorbell_buffer_config(shadow.bus, event_index.bus)) == spec::status::successful_completion);
  auto q = r.host.create_pair(1, 8);
  dma_buffer data(r.ctrl, 4096);
  auto* shadow_sq_tail = shadow.as<std::uint32_t>() + 2;  // SQ 1 tail: slot 2 at DSTRD 0
  auto* shadow_cq_head = shadow.as<std::uint32_t>() + 3;
  auto* event_sq_tail = event_index.as<std::uint32_t>() + 2;
  for (int i = 0; i < 20; ++i) {  // wraps the 8-entry queues twice, no MMIO write at all
    const std::uint16_t cid = r.host.place(*q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, data.bus));
    std::atomic_ref<std::uint32_t>(*shadow_sq_tail).store(q->sq_tail, std::memory_order_release);
    auto* slot = reinterpret_cast<spec::completion_entry*>(q->cq.data) + q->cq_head;
    REQUIRE(test_host::eventually([&] {
      return test_host::phase_of(slot) == q->phase;
    }));
    CHECK(slot->cid == cid);
    CHECK(slot->status() == spec::status::successful_completion);
    q->cq_head = (q->cq_head + 1) % q->entries;
    if (q->cq_head == 0) q->phase = !q->phase;
    std::atomic_ref<std::uint32_t>(*shadow_cq_head).store(q->cq_head, std::memory_order_release);
    CHECK(test_host::eventually([&] { return std::atomic_ref<std::uint32_t>(*event_sq_tail).load() == q->sq_tail; }));
  }
  CHECK(r.host.read32(spec::sq_tail_doorbell_offset(1, 0)) == 0);
  CHECK(r.ctrl.stats().doorbell_errors == 0);
}

TEST_CASE("a queue re-created on a deleted queue's identifier does not execute the stale shadow tail") {
  ready_controller r;
  dma_buffer shadow(r.ctrl, 4096);
  dma_buffer event_index(r.ctrl, 4096);
  REQUIRE(r.host.admin_status(spec::make_doorbell_buffer_config(shadow.bus, event_index.bus)) == spec::status::successful_completion);
  auto* shadow_sq_tail = shadow.as<std::uint32_t>() + 2;  // SQ 1 tail: slot 2 at DSTRD 0
  auto* shadow_cq_head = shadow.as<std::uint32_t>() + 3;
  auto* event_sq_tail = event_index.as<std::uint32_t>() + 2;
  auto* event_cq_head = event_index.as<std::uint32_t>() + 3;
  dma_buffer data(r.ctrl, 4096);
  {
    auto q = r.host.create_pair(1, 8);
    for (int i = 0; i < 5; ++i) {
      const std::uint16_t cid = r.host.place(*q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, data.bus));
      std::atomic_ref<std::uint32_t>(*shadow_sq_tail).store(q->sq_tail, std::memory_order_release);
      const auto cqe = r.host.next_completion(*q);  // rings the CQ head by MMIO; the shadow follows
      std::atomic_ref<std::uint32_t>(*shadow_cq_head).store(q->cq_head, std::memory_order_release);
      REQUIRE(cqe.has_value());
      CHECK(cqe->cid == cid);
    }
    REQUIRE(r.host.admin_status(spec::make_delete_io_sq(1)) == spec::status::successful_completion);
    REQUIRE(r.host.admin_status(spec::make_delete_io_cq(1)) == spec::status::successful_completion);
  }
  const std::uint64_t commands = r.ctrl.stats().io_commands;
  // The host leaves the old queue's shadow values (5, 5) in place: the new queue's SQ is all
  // zeroes, so fetching up to a stale tail of 5 would run five commands nobody submitted.
  auto q = r.host.create_pair(1, 8);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(r.ctrl.stats().io_commands == commands);
  CHECK(r.ctrl.stats().doorbell_errors == 0);
  CHECK(std::atomic_ref<std::uint32_t>(*event_sq_tail).load() == 0);
  CHECK(std::atomic_ref<std::uint32_t>(*event_cq_head).load() == 0);
  const std::uint16_t cid = r.host.place(*q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, data.bus));
  std::atomic_ref<std::uint32_t>(*shadow_sq_tail).store(q->sq_tail, std::memory_order_release);
  r.host.ring_sq(*q);
  const auto cqe = r.host.next_completion(*q);
  REQUIRE(cqe.has_value());
  CHECK(cqe->cid == cid);
  CHECK(cqe->status() == spec::status::successful_completion);
  CHECK(r.ctrl.stats().io_commands == commands + 1);
}

TEST_CASE("Doorbell Buffer Config on queues that already moved does not take their tails back to the shadow buffer's zeroes") {
  ready_controller r;
  auto q = r.host.create_pair(1, 8);
  dma_buffer data(r.ctrl, 4096);
  for (int i = 0; i < 3; ++i) (void)r.host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, data.bus));
  const std::uint64_t commands = r.ctrl.stats().io_commands;
  dma_buffer shadow(r.ctrl, 4096);
  dma_buffer event_index(r.ctrl, 4096);
  REQUIRE(r.host.admin_status(spec::make_doorbell_buffer_config(shadow.bus, event_index.bus)) == spec::status::successful_completion);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // A tail read back as 0 from the zeroed buffer would send the controller around the ring.
  CHECK(r.ctrl.stats().io_commands == commands);
  CHECK(r.ctrl.stats().doorbell_errors == 0);
  CHECK(std::atomic_ref<std::uint32_t>(shadow.as<std::uint32_t>()[2]).load() == 3);
  CHECK(std::atomic_ref<std::uint32_t>(shadow.as<std::uint32_t>()[3]).load() == 3);
}

TEST_CASE("shadow doorbell and EventIdx slots beyond the buffers' one page are never touched; those queues use MMIO") {
  emu::controller_config config;
  config.doorbell_stride = 10;  // 4 KiB between doorbells: I/O queue 1's slots lie 8 KiB into each buffer
  ready_controller r(config);
  REQUIRE(r.host.dstrd() == 10);
  // Each buffer is one page (5.8) followed by guard pages in the same registered region.
  dma_buffer shadow(r.ctrl, 4 * 4096);
  dma_buffer event_index(r.ctrl, 4 * 4096);
  std::memset(shadow.data + 4096, 0x5a, 3 * 4096);
  std::memset(event_index.data + 4096, 0x5a, 3 * 4096);
  REQUIRE(r.host.admin_status(spec::make_doorbell_buffer_config(shadow.bus, event_index.bus)) == spec::status::successful_completion);
  auto q = r.host.create_pair(1, 8);
  dma_buffer data(r.ctrl, 4096);
  for (int i = 0; i < 10; ++i) (void)r.host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, data.bus));  // MMIO only
  std::size_t changed = 0;
  for (std::size_t i = 4096; i < 4 * 4096; ++i) changed += (shadow.data[i] != std::byte{0x5a}) + (event_index.data[i] != std::byte{0x5a});
  CHECK(changed == 0);
  CHECK(r.ctrl.stats().doorbell_errors == 0);
}

TEST_CASE("deleting a submission queue completes its commands in flight as Command Aborted due to SQ Deletion") {
  emu::controller_config config;
  config.timing.read_latency_ns = 5'000'000'000;  // still in flight when the deletion arrives
  ready_controller r(config);
  auto q = r.host.create_pair(1, 8);
  dma_buffer data(r.ctrl, 4096);
  const std::uint16_t a = r.host.place(*q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, data.bus));
  const std::uint16_t b = r.host.place(*q, spec::make_rw(spec::nvm_opcode::read, 1, 1, 1, data.bus));
  r.host.ring_sq(*q);
  REQUIRE(test_host::eventually([&] { return r.ctrl.stats().io_commands == 2; }));
  REQUIRE(r.host.admin_status(spec::make_delete_io_sq(1)) == spec::status::successful_completion);
  // Both aborted completions are in the CQ by the time the deletion has completed.
  for (std::uint16_t cid : {a, b}) {
    const auto cqe = r.host.next_completion(*q, std::chrono::milliseconds(0));
    REQUIRE(cqe.has_value());
    CHECK(cqe->cid == cid);
    CHECK(cqe->status() == spec::status::command_aborted_due_to_sq_deletion);
  }
}

TEST_CASE("queues are served round robin: one command on a quiet queue does not wait behind a flood") {
  emu::controller_config config;
  config.workers = 1;               // both queues on one worker
  config.timing.max_iops = 1'000;   // 1000 commands take 1 s of device time
  // An idle worker sleeps long enough that it wakes to find both doorbells rung. The quiet
  // queue is rung first: should this thread be descheduled between the two writes past the
  // sleep, the worker finds the quiet command alone, and a flood already being served cannot
  // be mistaken for a round-robin failure (seen under TSan on a loaded 2-core machine).
  config.idle.spins = 0;
  config.idle.sleep = std::chrono::microseconds(200'000);
  ready_controller r(config);
  auto flood = r.host.create_pair(1, 1024);
  auto quiet = r.host.create_pair(2, 8);
  dma_buffer data(r.ctrl, 4096);
  for (int i = 0; i < 1000; ++i) r.host.place(*flood, spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, data.bus));
  const std::uint16_t cid = r.host.place(*quiet, spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, data.bus));
  r.host.ring_sq(*quiet);
  r.host.ring_sq(*flood);
  const auto cqe = r.host.next_completion(*quiet);
  REQUIRE(cqe.has_value());
  CHECK(cqe->cid == cid);
  CHECK(cqe->status() == spec::status::successful_completion);
  // Count the flood's completions already posted (phase 1 on the first pass), without consuming.
  int done = 0;
  for (std::uint32_t i = 0; i < 1000; ++i) done += test_host::phase_of(flood->cq.as<spec::completion_entry>() + i) ? 1 : 0;
  CHECK(done < 500);
}
