// The NVM command checks both emulated controllers make (emu/nvm_checks.cuh): the CPU emulator
// and the on-GPU null controller refuse a command with the same status because they ask the
// same functions. Here on the host and at compile time; the CPU emulator answers as they say.
#include "test_host.hpp"

#include <cunvme/emu/nvm_checks.cuh>

#include <cstdint>
#include <limits>

using namespace test;
namespace checks = cunvme::emu::nvm_checks;

namespace {

constexpr auto success = spec::status::successful_completion;
constexpr std::uint64_t u64_max = std::numeric_limits<std::uint64_t>::max();

// Usable in constant expressions, so on the device as on the host.
static_assert(checks::blocks_of(spec::make_rw(spec::nvm_opcode::read, 1, 7, 65536, 0)).blocks == 65536);
static_assert(checks::check_lba_range(999, 1, 1000) == success);
static_assert(checks::max_transfer_bytes(7, 4096) == 512 * 1024);

}  // namespace

TEST_CASE("the blocks of a command are SLBA from CDW10-11 and NLB + 1 from CDW12") {
  const auto first = checks::blocks_of(spec::make_rw(spec::nvm_opcode::read, 1, 0x1234'5678'9abcull, 1, 0));
  CHECK(first.slba == 0x1234'5678'9abcull);
  CHECK(first.blocks == 1);
  CHECK(checks::blocks_of(spec::make_rw(spec::nvm_opcode::write, 1, 0, 65536, 0)).blocks == 65536);
  CHECK(checks::blocks_of(spec::make_rw(spec::nvm_opcode::write_zeroes, 1, u64_max, 2, 0)).slba == u64_max);
}

TEST_CASE("a fused command or one with SGLs is Invalid Field in Command; a plain PRP command passes") {
  auto sqe = spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, 0);
  CHECK(checks::check_transfer_fields(sqe) == success);
  auto fused = sqe;
  fused.set_fuse(spec::fused_operation::first_command);
  CHECK(checks::check_transfer_fields(fused) == spec::status::invalid_field_in_command);
  fused.set_fuse(spec::fused_operation::second_command);
  CHECK(checks::check_transfer_fields(fused) == spec::status::invalid_field_in_command);
  for (const auto kind : {spec::data_transfer_kind::sgl_metadata_buffer, spec::data_transfer_kind::sgl_metadata_segment}) {
    auto sgl = sqe;
    sgl.set_psdt(kind);
    CHECK(checks::check_transfer_fields(sgl) == spec::status::invalid_field_in_command);
  }
}

TEST_CASE("an LBA range must lie in the namespace, without wrapping, and may be empty at its end") {
  CHECK(checks::check_lba_range(0, 1000, 1000) == success);
  CHECK(checks::check_lba_range(999, 1, 1000) == success);
  CHECK(checks::check_lba_range(999, 2, 1000) == spec::status::lba_out_of_range);
  CHECK(checks::check_lba_range(1000, 1, 1000) == spec::status::lba_out_of_range);
  CHECK(checks::check_lba_range(1000, 0, 1000) == success);  // an empty Dataset Management range
  CHECK(checks::check_lba_range(1001, 0, 1000) == spec::status::lba_out_of_range);
  // slba + blocks wraps to a small number: still out of range.
  CHECK(checks::check_lba_range(u64_max, 2, 1000) == spec::status::lba_out_of_range);
  CHECK(checks::check_lba_range(2, u64_max, 1000) == spec::status::lba_out_of_range);
  CHECK(checks::check_lba_range(0, 1, 0) == spec::status::lba_out_of_range);
}

TEST_CASE("MDTS is 2^MDTS minimum pages per command, no limit at 0 or where the product passes 64 bits") {
  CHECK(checks::max_transfer_bytes(0, 4096) == u64_max);
  CHECK(checks::max_transfer_bytes(1, 4096) == 8192);
  CHECK(checks::max_transfer_bytes(2, 16384) == 65536);
  CHECK(checks::max_transfer_bytes(51, 4096) == std::uint64_t{1} << 63);
  CHECK(checks::max_transfer_bytes(52, 4096) == u64_max);
  CHECK(checks::max_transfer_bytes(64, 4096) == u64_max);
  CHECK(checks::max_transfer_bytes(255, 4096) == u64_max);
}

TEST_CASE("a read or write is checked for its namespace, then its LBA range, then its size against MDTS") {
  const checks::namespace_limits ns{true, 1000, 512};
  const std::uint64_t max = 16 * 1024;  // 32 blocks of 512 bytes
  CHECK(checks::check_read_write({0, 32}, ns, max) == success);
  CHECK(checks::check_read_write({0, 33}, ns, max) == spec::status::invalid_field_in_command);
  CHECK(checks::check_read_write({990, 11}, ns, max) == spec::status::lba_out_of_range);
  // Precedence: a missing namespace before a bad range, a bad range before a size over MDTS.
  CHECK(checks::check_read_write({990, 40}, ns, max) == spec::status::lba_out_of_range);
  CHECK(checks::check_read_write({990, 40}, checks::namespace_limits{}, max) == spec::status::invalid_namespace_or_format);
  CHECK(checks::check_read_write({0, 1}, checks::namespace_limits{false, 1000, 512}, max) == spec::status::invalid_namespace_or_format);
  // Extended LBAs: the metadata each block carries in the data buffer counts against MDTS.
  CHECK(checks::check_read_write({0, 32}, checks::namespace_limits{true, 1000, 520}, max) == spec::status::invalid_field_in_command);
  CHECK(checks::check_read_write({0, 65536}, checks::namespace_limits{true, 1u << 20, 4096}, u64_max) == success);
}

TEST_CASE("the CPU emulator refuses each command with the status the shared checks give") {
  emu::controller_config config;
  config.mdts = 2;  // 16 KiB: 32 blocks of 512 bytes
  config.namespaces = {emu::namespace_config::in_memory(512, 1000)};
  emu::controller ctrl(config);
  test_host host(ctrl);
  REQUIRE(host.enable());
  auto q = host.create_pair(1, 64);
  dma_buffer list(ctrl, 4096), buf(ctrl, 8 * 4096);
  for (int i = 0; i < 7; ++i) list.as<std::uint64_t>()[i] = buf.bus + 4096u * (i + 1u);
  const checks::namespace_limits ns{true, 1000, 512};
  const std::uint64_t max = checks::max_transfer_bytes(config.mdts, 4096);
  struct command {
    std::uint32_t nsid;
    std::uint64_t slba;
    std::uint32_t blocks;
  };
  for (const command c : {command{1, 0, 32}, command{1, 0, 33}, command{1, 999, 1}, command{1, 999, 2}, command{1, 1000, 1}, command{1, 990, 40},
                          command{2, 0, 1}, command{0, 990, 40}}) {
    CAPTURE(c.nsid);
    CAPTURE(c.slba);
    CAPTURE(c.blocks);
    const auto sqe = spec::make_rw(spec::nvm_opcode::read, c.nsid, c.slba, c.blocks, buf.bus, list.bus);
    const spec::status expected = checks::check_read_write(checks::blocks_of(sqe), c.nsid == 1 ? ns : checks::namespace_limits{}, max);
    CHECK(host.run(*q, sqe).status() == expected);
  }
  auto fused = spec::make_rw(spec::nvm_opcode::write, 1, 0, 1, buf.bus);
  fused.set_fuse(spec::fused_operation::first_command);
  CHECK(host.run(*q, fused).status() == checks::check_transfer_fields(fused));
}
