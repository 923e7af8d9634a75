#include <cunvme/spec/command_fields.cuh>

#include <doctest/doctest.h>

#include <cstdint>

namespace spec = cunvme::spec;

TEST_CASE("Create I/O Completion Queue encodes QID, 0-based size, PC, IEN and IV") {
  constexpr auto e = spec::make_create_io_cq(3, 1024, 0x1000, true, true, 7);
  static_assert(e.opcode() == static_cast<std::uint8_t>(spec::admin_opcode::create_io_completion_queue));
  static_assert(e.prp1 == 0x1000);
  static_assert(e.cdw10 == (3u | 1023u << 16));
  static_assert(e.cdw11 == (1u | 1u << 1 | 7u << 16));
  static_assert(spec::create_io_cq_fields::qid::get(e.cdw10) == 3);
  static_assert(spec::create_io_cq_fields::qsize::get(e.cdw10) == 1023);
  static_assert(spec::create_io_cq_fields::pc::get(e.cdw11));
  static_assert(spec::create_io_cq_fields::ien::get(e.cdw11));
  static_assert(spec::create_io_cq_fields::iv::get(e.cdw11) == 7);
  CHECK(spec::make_create_io_cq(1, 2, 0).cdw11 == 1u);
}

TEST_CASE("Create I/O Submission Queue encodes QID, size, PC, priority and its CQ") {
  constexpr auto e = spec::make_create_io_sq(5, 64, 0x2000, 2, false, spec::queue_priority::low);
  static_assert(e.opcode() == static_cast<std::uint8_t>(spec::admin_opcode::create_io_submission_queue));
  static_assert(e.cdw10 == (5u | 63u << 16));
  static_assert(e.cdw11 == (0u | 0b11u << 1 | 2u << 16));
  static_assert(spec::create_io_sq_fields::cqid::get(e.cdw11) == 2);
  static_assert(spec::create_io_sq_fields::qprio::get(e.cdw11) == spec::queue_priority::low);
  static_assert(!spec::create_io_sq_fields::pc::get(e.cdw11));
  static_assert(spec::create_io_sq_fields::nvmsetid::get(0xffff0007u) == 7);
  CHECK(spec::create_io_sq_fields::qsize::get(e.cdw10) == 63);
}

TEST_CASE("Delete I/O queue commands name the queue in CDW10") {
  static_assert(spec::make_delete_io_sq(9).cdw10 == 9);
  static_assert(spec::make_delete_io_sq(9).opcode() == 0x00);
  static_assert(spec::make_delete_io_cq(9).opcode() == 0x04);
  CHECK(spec::delete_io_queue_fields::qid::get(spec::make_delete_io_cq(0xabc).cdw10) == 0xabc);
}

TEST_CASE("Identify puts CNS in CDW10 and the namespace in NSID") {
  constexpr auto e = spec::make_identify(spec::identify_cns::controller, 0, 0x3000);
  static_assert(e.opcode() == 0x06 && e.cdw10 == 0x01 && e.nsid == 0 && e.prp1 == 0x3000);
  constexpr auto ns = spec::make_identify(static_cast<spec::identify_cns>(0x00), 1, 0x4000, 0x5000);
  static_assert(ns.cdw10 == 0x00 && ns.nsid == 1 && ns.prp2 == 0x5000);
  static_assert(spec::identify_fields::cntid::get(0x00420002u) == 0x42);
  static_assert(spec::identify_fields::csi::get(0x02000000u) == 2);
  static_assert(spec::identify_fields::cnssid::get(0xffff1234u) == 0x1234);
  CHECK(spec::identify_fields::cns::get(e.cdw10) == spec::identify_cns::controller);
}

TEST_CASE("an Asynchronous Event completion DW0 holds the event type, information and log page") {
  using fields = spec::async_event_fields;
  // Error status (000b), Invalid Doorbell Write Value (01h), Error Information log (01h).
  constexpr std::uint32_t dw0 = 0x00010100u;
  static_assert(fields::aet::get(dw0) == spec::async_event_type::error_status);
  static_assert(fields::aei::get(dw0) == 0x01);
  static_assert(fields::lid::get(dw0) == spec::log_page_id::error_information);
  static_assert(fields::aet::get(0x00000002u) == spec::async_event_type::notice);
  static_assert(fields::aet::mask == 0x7u && fields::aei::mask == 0xff00u && fields::lid::mask == 0xff0000u);
  CHECK(fields::lid::set(fields::aei::set(0, 0x01), spec::log_page_id::error_information) == dw0);
}

TEST_CASE("Set Features Number of Queues asks for 0-based counts, SQs low and CQs high") {
  constexpr auto e = spec::make_set_number_of_queues(16, 8);
  static_assert(e.opcode() == 0x09);
  static_assert(spec::features_fields::fid::get(e.cdw10) == spec::feature_id::number_of_queues);
  static_assert(!spec::features_fields::sv::get(e.cdw10));
  static_assert(e.cdw11 == (15u | 7u << 16));
  static_assert(spec::number_of_queues_fields::nsqr::get(e.cdw11) == 15);
  static_assert(spec::number_of_queues_fields::ncqr::get(e.cdw11) == 7);
  CHECK(spec::make_set_features(spec::feature_id::volatile_write_cache, 1, true).cdw10 == (0x06u | 1u << 31));
}

TEST_CASE("Get Log Page carries the log, its 0-based dword count and the offset") {
  constexpr auto e = spec::make_get_log_page(spec::log_page_id::smart_health_information, 512, 0x7000, 0, 64);
  static_assert(e.opcode() == 0x02 && e.prp1 == 0x7000 && e.nsid == 0xffffffffu);
  static_assert(e.cdw10 == (0x02u | 127u << 16));  // NUMDL = 512 / 4 - 1
  static_assert(e.cdw11 == 0 && e.cdw12 == 64 && e.cdw13 == 0);
  CHECK(spec::make_get_log_page(spec::log_page_id::error_information, 64, 0, 0, 0, 1).nsid == 1);
}

TEST_CASE("Get Features selects which value of a feature to return") {
  constexpr auto e = spec::make_get_features(spec::feature_id::volatile_write_cache, spec::feature_select::saved);
  static_assert(e.opcode() == 0x0a);
  static_assert(e.cdw10 == (0x06u | 0b010u << 8));
  static_assert(spec::features_fields::sel::get(e.cdw10) == spec::feature_select::saved);
  static_assert(spec::volatile_write_cache_fields::wce::get(1u));
  CHECK(spec::features_fields::fid::get(e.cdw10) == spec::feature_id::volatile_write_cache);
}

TEST_CASE("Abort names the SQ and CID of the victim; DW0 bit 0 says whether it was not aborted") {
  constexpr auto e = spec::make_abort(2, 0x77);
  static_assert(e.opcode() == 0x08 && e.cdw10 == (2u | 0x77u << 16));
  static_assert(spec::abort_fields::not_aborted::get(1u));
  CHECK_FALSE(spec::abort_fields::not_aborted::get(0u));
}

TEST_CASE("Doorbell Buffer Config carries the shadow and EventIdx buffers in PRP1 and PRP2") {
  constexpr auto e = spec::make_doorbell_buffer_config(0x10000, 0x11000);
  static_assert(e.opcode() == 0x7c && e.prp1 == 0x10000 && e.prp2 == 0x11000);
  CHECK(e.cdw10 == 0);
}

TEST_CASE("Read and Write split the 64-bit SLBA over CDW10/11 and encode a 0-based NLB") {
  constexpr auto e = spec::make_rw(spec::nvm_opcode::read, 1, 0x0000000123456789ull, 8, 0xa000, 0xb000, true);
  static_assert(e.opcode() == 0x02 && e.nsid == 1);
  static_assert(e.cdw10 == 0x23456789u && e.cdw11 == 0x1u);
  static_assert(spec::starting_lba(e) == 0x0000000123456789ull);
  static_assert(spec::rw_fields::nlb::get(e.cdw12) == 7);
  static_assert(spec::rw_fields::fua::get(e.cdw12));
  static_assert(!spec::rw_fields::lr::get(e.cdw12));
  static_assert(e.prp1 == 0xa000 && e.prp2 == 0xb000);
  // 65536 blocks is the most one command names: NLB 0xffff.
  static_assert(spec::rw_fields::nlb::get(spec::make_rw(spec::nvm_opcode::write, 1, 0, spec::rw_fields::max_blocks).cdw12) == 0xffff);
  CHECK(spec::starting_lba(spec::make_rw(spec::nvm_opcode::write, 1, ~0ull, 1)) == ~0ull);
}

TEST_CASE("CDW12 fields of Read/Write/Write Zeroes sit where the NVM Command Set puts them") {
  static_assert(spec::rw_fields::deac::mask == 1u << 25);
  static_assert(spec::rw_fields::prinfo::mask == 0xfu << 26);
  static_assert(spec::rw_fields::fua::mask == 1u << 30);
  static_assert(spec::rw_fields::lr::mask == 1u << 31);
  CHECK(spec::rw_fields::prinfo::get(0x3c000000u) == 0xf);
}

TEST_CASE("Flush names only the namespace") {
  constexpr auto e = spec::make_flush(0xffffffff);
  static_assert(e.opcode() == 0x00 && e.nsid == 0xffffffffu && e.cdw10 == 0 && e.prp1 == 0);
  CHECK(e.cdw12 == 0);
}

TEST_CASE("Dataset Management counts ranges 0-based and sets the deallocate attribute") {
  constexpr auto e = spec::make_dataset_management(1, 256, 0xc000);
  static_assert(e.opcode() == 0x09 && e.cdw10 == 255 && e.cdw11 == 0b100);
  static_assert(spec::dataset_management_fields::ad::get(e.cdw11));
  static_assert(!spec::dataset_management_fields::idr::get(e.cdw11));
  static_assert(spec::dataset_management_fields::idw::get(0b10u));
  static_assert(spec::dataset_management_fields::nr::get(e.cdw10) == 255);
  CHECK(spec::make_dataset_management(1, 1, 0, 0, false).cdw11 == 0);
}

TEST_CASE("a Dataset Management range is 16 bytes: attributes, length, starting LBA") {
  constexpr spec::dsm_range r{0, 8, 0x100};
  static_assert(r.length_in_logical_blocks == 8 && r.starting_lba == 0x100);
  CHECK(sizeof(spec::dsm_range) * spec::dataset_management_fields::max_ranges == 4096);
}

#ifdef __CUDACC__
__global__ void build_read_on_device(spec::submission_entry* out, std::uint64_t lba) {
  *out = spec::make_rw(spec::nvm_opcode::read, 1, lba, 8, 0x1000);
}
#endif
