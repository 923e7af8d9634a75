#include <cunvme/spec/opcodes.cuh>
#include <cunvme/spec/queue_entry.cuh>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>

namespace spec = cunvme::spec;

TEST_CASE("CDW0 packs opcode, fuse, PSDT and CID at the bit positions of Figure 88") {
  constexpr auto sqe = spec::submission_entry{}
                           .set_opcode(spec::nvm_opcode::read)
                           .set_fuse(spec::fused_operation::second_command)
                           .set_psdt(spec::data_transfer_kind::sgl_metadata_segment)
                           .set_cid(0xbeef);
  static_assert(sqe.cdw0 == (0x02u | 0b10u << 8 | 0b10u << 14 | 0xbeefu << 16));
  static_assert(sqe.opcode() == 0x02);
  static_assert(sqe.fuse() == spec::fused_operation::second_command);
  static_assert(sqe.psdt() == spec::data_transfer_kind::sgl_metadata_segment);
  static_assert(sqe.cid() == 0xbeef);
  CHECK(sqe.cdw0 == 0xbeef8202u);
}

TEST_CASE("every CDW0 field round-trips without touching the others") {
  spec::submission_entry sqe{};
  sqe.cdw0 = ~0u;
  sqe.set_cid(0);
  CHECK(sqe.cdw0 == 0x0000ffffu);
  sqe.set_opcode(std::uint8_t{0});
  CHECK(sqe.cdw0 == 0x0000ff00u);
  sqe.set_fuse(spec::fused_operation::normal);
  CHECK(sqe.cdw0 == 0x0000fc00u);
  sqe.set_psdt(spec::data_transfer_kind::prp);
  CHECK(sqe.cdw0 == 0x00003c00u);
  sqe.set_opcode(spec::admin_opcode::doorbell_buffer_config);
  CHECK(sqe.opcode() == 0x7c);
  CHECK(sqe.fuse() == spec::fused_operation::normal);
  sqe.set_fuse(spec::fused_operation::first_command);
  CHECK(sqe.fuse() == spec::fused_operation::first_command);
  sqe.set_psdt(spec::data_transfer_kind::sgl_metadata_buffer);
  CHECK(sqe.psdt() == spec::data_transfer_kind::sgl_metadata_buffer);
  CHECK(sqe.opcode() == 0x7c);
  CHECK(sqe.cid() == 0);
}

TEST_CASE("a submission entry is 64 bytes laid out as the spec lays it out") {
  spec::submission_entry sqe{};
  sqe.set_opcode(spec::nvm_opcode::write).set_cid(0x1234);
  sqe.nsid = 0x11111111;
  sqe.cdw2 = 0x22222222;
  sqe.cdw3 = 0x33333333;
  sqe.mptr = 0x4444444444444444ull;
  sqe.prp1 = 0x5555555555555555ull;
  sqe.prp2 = 0x6666666666666666ull;
  sqe.cdw10 = 0xaaaaaaaa;
  sqe.cdw11 = 0xbbbbbbbb;
  sqe.cdw12 = 0xcccccccc;
  sqe.cdw13 = 0xdddddddd;
  sqe.cdw14 = 0xeeeeeeee;
  sqe.cdw15 = 0xffffffff;
  std::uint32_t dw[16];
  std::memcpy(dw, &sqe, sizeof dw);
  CHECK(dw[0] == 0x12340001u);
  CHECK(dw[1] == 0x11111111u);
  CHECK(dw[2] == 0x22222222u);
  CHECK(dw[3] == 0x33333333u);
  CHECK(dw[4] == 0x44444444u);
  CHECK(dw[6] == 0x55555555u);
  CHECK(dw[8] == 0x66666666u);
  CHECK(dw[10] == 0xaaaaaaaau);
  CHECK(dw[11] == 0xbbbbbbbbu);
  CHECK(dw[12] == 0xccccccccu);
  CHECK(dw[13] == 0xddddddddu);
  CHECK(dw[14] == 0xeeeeeeeeu);
  CHECK(dw[15] == 0xffffffffu);
}

TEST_CASE("a completion entry decodes SQHD, SQID, CID, phase and status from raw dwords") {
  // DW2: SQID 3, SQHD 17. DW3: status LBA Out of Range with DNR, phase 1, CID 0x42.
  const std::uint32_t raw[4] = {0xdeadbeef, 0x0, (3u << 16) | 17u, (0x8101u << 16) | 0x42u};
  spec::completion_entry cqe;
  std::memcpy(&cqe, raw, sizeof cqe);
  CHECK(cqe.dw0 == 0xdeadbeefu);
  CHECK(cqe.dw1 == 0u);
  CHECK(cqe.sqhd == 17);
  CHECK(cqe.sqid == 3);
  CHECK(cqe.cid == 0x42);
  CHECK(cqe.phase());
  CHECK(cqe.status() == spec::status::lba_out_of_range);
  CHECK(cqe.dnr());
  CHECK_FALSE(cqe.more());
  CHECK(cqe.crd() == 0);
}

TEST_CASE("CQE dwords composed by make_dw2 and make_dw3 land in the entry's fields and decode back") {
  const std::uint16_t status = spec::cqe_status::make_status_field(spec::status::lba_out_of_range, /*phase=*/true, /*dnr=*/true);
  const std::uint32_t raw[4] = {0, 0, spec::cqe_dword::make_dw2(17, 3), spec::cqe_dword::make_dw3(0x42, status)};
  spec::completion_entry cqe;
  std::memcpy(&cqe, raw, sizeof cqe);
  CHECK(cqe.sqhd == 17);
  CHECK(cqe.sqid == 3);
  CHECK(cqe.cid == 0x42);
  CHECK(cqe.phase());
  CHECK(cqe.status() == spec::status::lba_out_of_range);
  CHECK(cqe.dnr());
  CHECK(spec::cqe_dword::sq_head(raw[spec::cqe_dword::dw2_offset / 4]) == 17);
  CHECK(spec::cqe_dword::sq_id(raw[spec::cqe_dword::dw2_offset / 4]) == 3);
  CHECK(spec::cqe_dword::cid(raw[spec::cqe_dword::dw3_offset / 4]) == 0x42);
  CHECK(spec::cqe_dword::phase(raw[spec::cqe_dword::dw3_offset / 4]));
  CHECK(spec::cqe_dword::status_of(raw[spec::cqe_dword::dw3_offset / 4]) == spec::status::lba_out_of_range);
}

TEST_CASE("a completion entry reports More, CRD and a successful status") {
  constexpr spec::completion_entry ok{0, 0, 0, 0, 0, 0x0000};
  static_assert(!ok.phase() && ok.status() == spec::status::successful_completion && !ok.dnr());
  constexpr spec::completion_entry retry{0, 0, 0, 0, 0, static_cast<std::uint16_t>((1u << 14) | (2u << 12) | 1u)};
  static_assert(retry.more() && retry.crd() == 2 && retry.phase());
  CHECK(retry.status() == spec::status::successful_completion);
}

TEST_CASE("a PRP entry is dword aligned when its bits 1:0 are zero, whatever its page offset") {
  CHECK(spec::prp_dword_aligned(0x1000));
  CHECK(spec::prp_dword_aligned(0x1ffc));
  CHECK_FALSE(spec::prp_dword_aligned(0x1001));
  CHECK_FALSE(spec::prp_dword_aligned(0x1002));
  CHECK_FALSE(spec::prp_dword_aligned(~std::uint64_t{0}));
}

TEST_CASE("entry sizes match the log2 values CC.IOSQES and CC.IOCQES carry") {
  static_assert(sizeof(spec::submission_entry) == (1u << spec::submission_entry_size_log2));
  static_assert(sizeof(spec::completion_entry) == (1u << spec::completion_entry_size_log2));
  CHECK(spec::submission_entry_size_log2 == 6);
  CHECK(spec::completion_entry_size_log2 == 4);
}

#ifdef __CUDACC__
__global__ void build_entry_on_device(spec::submission_entry* out, spec::completion_entry const* cqe, int* status) {
  out->set_opcode(spec::nvm_opcode::read).set_cid(static_cast<std::uint16_t>(threadIdx.x));
  *status = cqe->phase() ? static_cast<int>(cqe->status()) : -1;
}
#endif
