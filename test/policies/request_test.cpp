// What a request becomes: the one planner's rules (MDTS and NLB split, dword-aligned command
// starts, LBA wrap, capacity, metadata), then what a reader does with each kind of request:
// asynchronous commands, splitting at MDTS, buffers described page by page, PRP lists that
// chain, and bad input refused with a reason.
#include "policy_fixture.hpp"

#include <cunvme/io/request_plan.cuh>

#include <chrono>
#include <vector>

using namespace test;

namespace {
using mp_reader = reader_of<slots::multi_producer, completion::cooperative, doorbell::mmio>;
using mp_writer = writer_of<slots::multi_producer, completion::cooperative, doorbell::mmio>;

std::uint64_t mismatches_in(const host::dma_buffer& buf, std::uint64_t byte_offset, std::uint64_t namespace_offset, std::uint64_t bytes,
                            std::uint64_t round = 0) {
  std::uint64_t bad = 0;
  const auto* words = reinterpret_cast<const std::uint64_t*>(buf.data() + byte_offset);
  for (std::uint64_t i = 0; i < bytes / 8; ++i) bad += words[i] != word_at(namespace_offset + i * 8, round);
  return bad;
}
using cunvme::plan_error;
using cunvme::plan_request;
using cunvme::request_geometry;

/// 512-byte blocks, 1 MiB of them, 1024 blocks per command (512 KiB MDTS).
constexpr request_geometry plain = request_geometry::of(512, 0, 1 << 20, cunvme::max_blocks_per_command(512 << 10, 512));
}  // namespace

// ---- the planner ---------------------------------------------------------------------------

TEST_CASE("the usage snippet of io/request_plan.cuh holds") {
  constexpr cunvme::request_geometry g = cunvme::request_geometry::of(512, 0, 1 << 20, cunvme::max_blocks_per_command(128 << 10, 512));
  constexpr cunvme::request_plan p = cunvme::plan_request(g, /*lba*/ 10, /*blocks*/ 600);
  static_assert(p.ok() && p.commands() == 3 && p.command(2).slba == 522 && p.command(2).blocks == 88);
  CHECK(p.bytes() == 600 * 512);
}

TEST_CASE("a request of at most one command's worth is one command carrying all of it") {
  constexpr auto p = plan_request(plain, 10, 1024);
  static_assert(p.ok() && p.commands() == 1);
  static_assert(p.command(0).slba == 10 && p.command(0).blocks == 1024 && p.command(0).nlb() == 1023 && p.command(0).byte_offset == 0);
  CHECK(plan_request(plain, 0, 1).commands() == 1);
}

TEST_CASE("one block more than MDTS allows is two commands, the second of one block") {
  constexpr auto p = plan_request(plain, 10, 1025);
  static_assert(p.ok() && p.commands() == 2 && p.per_command == 1024);
  static_assert(p.command(1).slba == 1034 && p.command(1).blocks == 1 && p.command(1).byte_offset == 1024 * 512);
  // 6000 blocks: five full commands and one of 880, each starting where the previous ended.
  const auto q = plan_request(plain, 10, 6000);
  REQUIRE(q.commands() == 6);
  std::uint64_t next = 10, bytes = 0;
  for (std::uint64_t i = 0; i < q.commands(); ++i) {
    CHECK(q.command(i).slba == next);
    CHECK(q.command(i).byte_offset == bytes);
    next += q.command(i).blocks;
    bytes += q.command(i).blocks * 512ull;
  }
  CHECK(next == 6010);
  CHECK(q.command(5).blocks == 880);
}

TEST_CASE("NLB caps a command at 65536 blocks however large MDTS is, and 65536 fits its 0's-based 16 bits") {
  static_assert(cunvme::max_blocks_per_command(~0ull, 512) == 65536);
  static_assert(cunvme::max_blocks_per_command(64ull << 20, 512) == 65536);
  static_assert(cunvme::max_blocks_per_command(32ull << 20, 512) == 65536);
  static_assert(cunvme::max_blocks_per_command((32ull << 20) - 512, 512) == 65535);
  constexpr request_geometry big = request_geometry::of(512, 0, 1ull << 40, cunvme::max_blocks_per_command(~0ull, 512));
  constexpr auto one = plan_request(big, 0, 65536);
  static_assert(one.commands() == 1 && one.command(0).nlb() == 0xffff);
  constexpr auto two = plan_request(big, 0, 65537);
  static_assert(two.commands() == 2 && two.command(0).blocks == 65536 && two.command(1).blocks == 1 && two.command(1).nlb() == 0);
  // A view claiming more per command than NLB can say is held to 65536 all the same.
  constexpr auto claimed = plan_request(request_geometry::of(512, 0, 1ull << 40, 1ull << 20), 0, 1ull << 20);
  static_assert(claimed.per_command == 65536 && claimed.commands() == 16);
}

TEST_CASE("MDTS smaller than one block is refused: no command could carry it") {
  static_assert(cunvme::max_blocks_per_command(4096, 4096) == 1);
  static_assert(cunvme::max_blocks_per_command(4095, 4096) == 0);
  constexpr auto p = plan_request(request_geometry::of(4096, 0, 100, cunvme::max_blocks_per_command(2048, 4096)), 0, 1);
  static_assert(p.error == plan_error::block_exceeds_mdts && p.commands() == 0);
}

TEST_CASE("zero blocks is refused") {
  constexpr auto p = plan_request(plain, 5, 0);
  static_assert(p.error == plan_error::zero_blocks && p.commands() == 0);
}

TEST_CASE("the last LBA of the namespace is reachable; a block past it is out of range, naming the command that crosses the end") {
  constexpr std::uint64_t end = 1 << 20;
  static_assert(plan_request(plain, end - 8, 8).ok());
  static_assert(plan_request(plain, end - 1, 1).ok());
  static_assert(plan_request(plain, 0, end).ok());
  constexpr auto over = plan_request(plain, end - 4, 8);
  static_assert(over.error == plan_error::past_capacity && over.fail_lba == end - 4 && over.fail_blocks == 8);
  constexpr auto at_end = plan_request(plain, end, 1);
  static_assert(at_end.error == plan_error::past_capacity && at_end.fail_lba == end && at_end.fail_blocks == 1);
  // Split, the commands inside the namespace are not the failing one: the one that crosses is.
  constexpr auto split = plan_request(plain, end - 1030, 1040);
  static_assert(split.error == plan_error::past_capacity && split.fail_lba == end - 6 && split.fail_blocks == 16);
  // The whole namespace and one block more: the fifth command of 1024 (one block) fails.
  constexpr auto small = plan_request(request_geometry::of(512, 0, 4096, 1024), 0, 4097);
  static_assert(small.fail_lba == 4096 && small.fail_blocks == 1);
  CHECK(cunvme::to_io_result(small).error == io_error::nvme_status);
  CHECK(cunvme::to_io_result(small).status == spec::status::lba_out_of_range);
  CHECK(cunvme::to_io_result(small).lba == 4096);
  CHECK(cunvme::to_io_result(small).blocks == 1);
}

TEST_CASE("an LBA range wrapping past 2^64 is refused as a wrap, not as out of range, and the last LBA 2^64 - 1 is not a wrap") {
  constexpr std::uint64_t last = ~0ull;
  constexpr request_geometry huge = request_geometry::of(512, 0, last, 1024);  // LBAs 0 .. 2^64 - 2
  static_assert(plan_request(huge, last - 1, 1).ok());
  static_assert(plan_request(huge, last, 1).error == plan_error::past_capacity);  // ends on 2^64 - 1: no wrap
  static_assert(plan_request(huge, last, 2).error == plan_error::lba_wrap);
  static_assert(plan_request(huge, last - 2, 8).error == plan_error::lba_wrap);
  static_assert(plan_request(huge, 2, last).error == plan_error::lba_wrap);
  static_assert(plan_request(huge, 1, last).error == plan_error::byte_count_overflow);  // ends on 2^64 - 1: no wrap
  static_assert(plan_request(plain, last - 2, 8).error == plan_error::lba_wrap);
  CHECK(cunvme::to_io_result(plan_request(plain, last - 2, 8)).error == io_error::invalid_request);
}

TEST_CASE("a block count whose bytes do not fit 64 bits is refused, for data and for separate metadata") {
  static_assert(plan_request(request_geometry::of(520, 0, ~0ull, 1024), 0, ~0ull / 520 + 1).error == plan_error::byte_count_overflow);
  static_assert(plan_request(request_geometry::of(512, 0, ~0ull, 1024), 0, (1ull << 55) + 8).error == plan_error::byte_count_overflow);
  static_assert(plan_request(request_geometry::of(512, 64, ~0ull, 1024), 0, ~0ull / 64 + 1).error == plan_error::byte_count_overflow);
  static_assert(plan_request(request_geometry::of(512, 0, ~0ull, 1024), 0, (1ull << 55) - 1).ok());
}

TEST_CASE("extended-LBA metadata counts toward MDTS, and commands after the first start dword aligned") {
  // 513-byte blocks, 512 KiB MDTS: 1022 blocks would start the second command at byte 524286.
  constexpr std::uint64_t per = cunvme::max_blocks_per_command(512 << 10, 513);
  static_assert(per == 1022);
  constexpr auto p = plan_request(request_geometry::of(513, 0, 1 << 20, per), 3, 2 * 1022 + 5);
  static_assert(p.ok() && p.per_command == 1020);
  for (std::uint64_t i = 0; i < p.commands(); ++i) CHECK(p.command(i).byte_offset % 4 == 0);
  // One command's worth needs no split, so no step down.
  static_assert(plan_request(request_geometry::of(513, 0, 1 << 20, per), 0, 1022).per_command == 1022);
  // 2561-byte blocks under 8 KiB: 1, 2 or 3 blocks are never whole dwords, so only one command can go.
  constexpr request_geometry odd = request_geometry::of(2561, 0, 64, cunvme::max_blocks_per_command(8192, 2561));
  static_assert(plan_request(odd, 0, 3).ok());
  static_assert(plan_request(odd, 0, 8).error == plan_error::unaligned_split);
}

TEST_CASE("separate metadata: each command's metadata starts dword aligned where its blocks' metadata begins") {
  // 4 KiB blocks with 3 bytes of metadata each in an MPTR buffer, 127 blocks per command: 124
  // is the largest count whose data and metadata are both whole dwords.
  constexpr auto p = plan_request(request_geometry::of(4096, 3, 1 << 20, 127), 7, 300);
  static_assert(p.ok() && p.per_command == 124 && p.commands() == 3);
  static_assert(p.command(1).slba == 131 && p.command(1).byte_offset == 124 * 4096 && p.command(1).metadata_offset == 124 * 3);
  static_assert(p.command(2).blocks == 52 && p.command(2).metadata_offset == 248 * 3);
  static_assert(cunvme::dword_aligned_split(3, 4096, 3) == 0);
  static_assert(cunvme::dword_aligned_split(7, 4096, 3) == 4);
}

TEST_CASE("the planner's checks come in one order: zero, wrap, byte count, MDTS, split, capacity") {
  constexpr request_geometry none_fit = request_geometry::of(2561, 0, 4, 0);
  static_assert(plan_request(none_fit, ~0ull, 0).error == plan_error::zero_blocks);
  static_assert(plan_request(none_fit, ~0ull, 2).error == plan_error::lba_wrap);
  static_assert(plan_request(none_fit, 100, 1).error == plan_error::block_exceeds_mdts);
  static_assert(plan_request(request_geometry::of(2561, 0, 4, 3), 100, 8).error == plan_error::unaligned_split);
  static_assert(plan_request(request_geometry::of(2561, 0, 4, 3), 100, 3).error == plan_error::past_capacity);
}

// ---- readers over the planner --------------------------------------------------------------

TEST_CASE("a read past the namespace's end sends no command, and fails as the controller would fail the command that crosses it") {
  rig r;
  host::io_queue q(*r.ctrl, 8);
  mp_reader reader(q.view(), q.namespace_view(1));
  const std::uint64_t end = q.namespace_view(1).lba_count;
  REQUIRE(q.namespace_view(1).max_blocks == 1024);
  auto buf = r.ctrl->memory().allocate(1040 * 512);
  const std::uint64_t before = r.emulator->stats().io_commands;
  const io_result res = reader.read(end - 1030, 1040, contiguous_of(buf), 0);
  CHECK(res.error == io_error::nvme_status);
  CHECK(res.status == spec::status::lba_out_of_range);
  CHECK(res.lba == end - 6);
  CHECK(res.blocks == 16);
  CHECK(r.emulator->stats().io_commands == before);
  CHECK(cunvme::cid_pool::in_use(q.view()) == 0);
  const auto h = reader.submit_read(end, 1, contiguous_of(buf), 0);
  CHECK(h.state == cunvme::io_handle::phase::finished);
  CHECK(h.result.status == spec::status::lba_out_of_range);
  CHECK(r.emulator->stats().io_commands == before);
}

TEST_CASE("the host's queue pair plans a read past the namespace's end alike: LBA Out of Range, no command sent") {
  rig r;
  auto qp = r.ctrl->create_queue_pair(8);
  const std::uint64_t end = r.ctrl->namespace_by_id(1).lba_count;
  auto buf = r.ctrl->memory().allocate(1040 * 512);
  const std::uint64_t before = r.emulator->stats().io_commands;
  CHECK(qp->read(1, end - 1030, 1040, buf) == spec::status::lba_out_of_range);
  CHECK(qp->write(1, end, 1, buf) == spec::status::lba_out_of_range);
  CHECK(r.emulator->stats().io_commands == before);
  CHECK(qp->read(1, end - 1024, 1024, buf) == spec::status::successful_completion);
}

TEST_CASE("one thread keeps many commands in flight with submit, test and wait") {
  rig r;
  r.fill();
  host::io_queue q(*r.ctrl, 64);
  mp_reader reader(q.view(), q.namespace_view(1));
  auto buf = r.ctrl->memory().allocate(48 * 4096);
  std::vector<cunvme::io_handle> handles;
  for (std::uint64_t i = 0; i < 48; ++i) handles.push_back(reader.submit_read(1000 + i * 8, 8, contiguous_of(buf), i * 4096));
  for (const auto& h : handles) CHECK(h.state == cunvme::io_handle::phase::in_flight);
  CHECK(cunvme::cid_pool::in_use(q.view()) == 48);
  std::uint64_t polls = 0;
  for (auto& h : handles) {
    while (!reader.test(h)) ++polls;
    CHECK(h.result.ok());
    CHECK(reader.wait(h).ok());  // waiting on a finished handle returns its result again
  }
  CHECK(cunvme::cid_pool::in_use(q.view()) == 0);
  CHECK(mismatches_in(buf, 0, 1000 * 512, 48 * 4096) == 0);
}

TEST_CASE("an asynchronous submit with every CID in flight is refused at once, and succeeds once a handle finished") {
  rig r;
  r.fill();
  host::io_queue q(*r.ctrl, 4);  // three CIDs
  mp_reader reader(q.view(), q.namespace_view(1));
  auto buf = r.ctrl->memory().allocate(16 * 4096);
  std::vector<cunvme::io_handle> handles;
  for (std::uint64_t i = 0; i < 3; ++i) handles.push_back(reader.submit_read(i * 8, 8, contiguous_of(buf), i * 4096));
  const auto start = std::chrono::steady_clock::now();
  auto refused = reader.submit_read(24, 8, contiguous_of(buf), 3 * 4096);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));  // not the 10 s timeout
  CHECK(refused.state == cunvme::io_handle::phase::finished);
  CHECK(refused.result.error == io_error::no_command_id);
  CHECK(reader.wait(handles[0]).ok());
  handles[0] = reader.submit_read(24, 8, contiguous_of(buf), 3 * 4096);
  CHECK(handles[0].state == cunvme::io_handle::phase::in_flight);
  for (auto& h : handles) CHECK(reader.wait(h).ok());
  CHECK(mismatches_in(buf, 0, 0, 4 * 4096) == 0);
}

TEST_CASE("an asynchronous submit larger than one command is refused, as are zero blocks") {
  rig r;
  host::io_queue q(*r.ctrl, 8);
  mp_reader reader(q.view(), q.namespace_view(1));
  auto buf = r.ctrl->memory().allocate(1 << 20);
  auto big = reader.submit_read(0, q.namespace_view(1).max_blocks + 1, contiguous_of(buf), 0);
  CHECK(big.state == cunvme::io_handle::phase::finished);
  CHECK(big.result.error == io_error::invalid_request);
  CHECK(reader.test(big));
  CHECK(reader.submit_read(0, 0, contiguous_of(buf), 0).result.error == io_error::invalid_request);
  CHECK(reader.read(0, 0, contiguous_of(buf), 0).error == io_error::invalid_request);
  CHECK(reader.read(~0ull - 2, 8, contiguous_of(buf), 0).error == io_error::invalid_request);  // the range wraps
  CHECK(cunvme::cid_pool::in_use(q.view()) == 0);
}

TEST_CASE("a buffer offset that is not dword aligned is refused before anything is submitted") {
  rig r;
  host::io_queue q(*r.ctrl, 8);
  mp_reader reader(q.view(), q.namespace_view(1));
  auto buf = r.ctrl->memory().allocate(64 * 1024);
  const std::uint64_t before = r.emulator->stats().io_commands;
  const io_result res = reader.read(0, 8, contiguous_of(buf), 2);
  CHECK(res.error == io_error::unaligned_buffer);
  CHECK(res.lba == 0);
  CHECK(res.blocks == 8);
  CHECK(r.emulator->stats().io_commands == before);
  CHECK(cunvme::cid_pool::in_use(q.view()) == 0);
}

TEST_CASE("a dword-aligned offset inside a page reads correctly (PRP1 carries the offset)") {
  rig r;
  r.fill();
  host::io_queue q(*r.ctrl, 8);
  mp_reader reader(q.view(), q.namespace_view(1));
  auto buf = r.ctrl->memory().allocate(256 * 1024);
  CHECK(reader.read(77, 300, contiguous_of(buf), 4092).ok());  // 4 bytes before a page boundary, then 38 pages
  std::uint32_t before_offset = 1;
  std::memcpy(&before_offset, buf.data() + 4088, 4);
  CHECK(before_offset == 0);  // the bytes before the offset were not touched
  std::uint64_t bad = 0;
  std::vector<std::uint64_t> got(300 * 512 / 8);
  std::memcpy(got.data(), buf.data() + 4092, got.size() * 8);
  for (std::size_t i = 0; i < got.size(); ++i) bad += got[i] != word_at(77 * 512 + i * 8);
  CHECK(bad == 0);
}

TEST_CASE("a buffer described page by page reads and writes like a contiguous one") {
  rig r;
  r.fill();
  host::io_queue q(*r.ctrl, 8);
  using reader_t = reader_of<slots::exclusive, completion::cooperative, doorbell::mmio, prp::page_list>;
  using writer_t = writer_of<slots::exclusive, completion::cooperative, doorbell::mmio, prp::page_list>;
  reader_t reader(q.view(), q.namespace_view(1));
  writer_t writer(q.view(), q.namespace_view(1));
  auto buf = r.ctrl->memory().allocate(1 << 20);
  auto* words = reinterpret_cast<std::uint64_t*>(buf.data());
  for (std::size_t i = 0; i < (1 << 20) / 8; ++i) words[i] = word_at(4096 * 512 + i * 8, 7);
  CHECK(writer.write(4096, 2048, pages_of(buf), 0).ok());
  std::memset(buf.data(), 0, 1 << 20);
  CHECK(reader.read(4096, 2048, pages_of(buf), 0).ok());
  CHECK(mismatches_in(buf, 0, 4096 * 512, 1 << 20, 7) == 0);
}

TEST_CASE("a page list may scatter the buffer: each page lands where its entry points") {
  rig r;
  r.fill();
  host::io_queue q(*r.ctrl, 8);
  auto buf = r.ctrl->memory().allocate(16 * 4096);
  std::vector<std::uint64_t> reversed(16);
  for (std::size_t i = 0; i < 16; ++i) reversed[i] = buf.bus((15 - i) * 4096);
  reader_of<slots::exclusive, completion::cooperative, doorbell::mmio, prp::page_list> reader(q.view(), q.namespace_view(1));
  CHECK(reader.read(0, 128, prp::page_list{reversed.data(), 12}, 0).ok());
  for (std::uint64_t page = 0; page < 16; ++page) CHECK(mismatches_in(buf, (15 - page) * 4096, page * 4096, 4096) == 0);
}

TEST_CASE("a page list whose pages are not aligned to the controller's pages is refused") {
  rig r;
  host::io_queue q(*r.ctrl, 8);
  auto buf = r.ctrl->memory().allocate(16 * 4096);
  std::vector<std::uint64_t> shifted(16);
  for (std::size_t i = 0; i < 16; ++i) shifted[i] = buf.bus(i * 4096) + (i == 3 ? 512 : 0);
  reader_of<slots::exclusive, completion::cooperative, doorbell::mmio, prp::page_list> reader(q.view(), q.namespace_view(1));
  const io_result res = reader.read(0, 128, prp::page_list{shifted.data(), 12}, 0);
  CHECK(res.error == io_error::buffer_pages_misaligned);
  CHECK(cunvme::cid_pool::in_use(q.view()) == 0);
}

TEST_CASE("with a large MDTS one command's PRP list spans several pages and chains between them") {
  auto config = small_config(512, 32 << 20);
  config.mdts = 11;  // 8 MiB per command: 2048 list entries, five 4 KiB list pages chained
  rig r(config);
  r.fill();
  host::io_queue q(*r.ctrl, 4);
  CHECK(q.view().list_entries >= 2048 + 4);
  const auto ns = q.namespace_view(1);
  CHECK(ns.max_blocks == 16384);
  reader_of<slots::exclusive, completion::cooperative, doorbell::mmio, prp::page_list> reader(q.view(), ns);
  auto buf = r.ctrl->memory().allocate(8 << 20);
  const std::uint64_t before = r.emulator->stats().io_commands;
  CHECK(reader.read(64, 16384, pages_of(buf), 0).ok());
  CHECK(r.emulator->stats().io_commands - before == 1);
  CHECK(mismatches_in(buf, 0, 64 * 512, 8 << 20) == 0);
}

TEST_CASE("commands larger than the queue's PRP lists can describe are refused before submission") {
  rig r;
  host::io_queue q(*r.ctrl, 8);  // lists sized for MDTS: 512 KiB
  auto ns = q.namespace_view(1);
  ns.max_blocks = 65536;         // a caller asking for 32 MiB commands
  reader_of<slots::exclusive, completion::cooperative, doorbell::mmio, prp::page_list> reader(q.view(), ns);
  auto buf = r.ctrl->memory().allocate(32 << 20);
  const std::uint64_t before = r.emulator->stats().io_commands;
  const io_result res = reader.read(0, 65536, pages_of(buf), 0);
  CHECK(res.error == io_error::prp_list_too_small);
  CHECK(res.lba == 0);
  CHECK(res.blocks == 65536);
  CHECK(r.emulator->stats().io_commands == before);
  CHECK(cunvme::cid_pool::in_use(q.view()) == 0);
}

TEST_CASE("a read larger than MDTS is split into commands of at most MDTS") {
  rig r;
  r.fill();
  host::io_queue q(*r.ctrl, 8);
  mp_reader reader(q.view(), q.namespace_view(1));
  auto buf = r.ctrl->memory().allocate(3 << 20);
  const std::uint64_t before = r.emulator->stats().io_commands;
  CHECK(reader.read(10, 6000, contiguous_of(buf), 0).ok());  // 1024 × 5 + 880
  CHECK(r.emulator->stats().io_commands - before == 6);
  CHECK(mismatches_in(buf, 0, 10 * 512, 6000 * 512) == 0);
}

TEST_CASE("4 KiB logical blocks: block counts, MDTS and offsets scale with the LBA size") {
  rig r(small_config(4096, 16 << 20));
  r.fill();
  host::io_queue q(*r.ctrl, 8);
  const auto ns = q.namespace_view(1);
  CHECK(ns.lba_shift == 12);
  CHECK(ns.max_blocks == 128);
  mp_reader reader(q.view(), ns);
  mp_writer writer(q.view(), ns);
  auto buf = r.ctrl->memory().allocate(2 << 20);
  CHECK(reader.read(3, 300, contiguous_of(buf), 0).ok());
  CHECK(mismatches_in(buf, 0, 3 * 4096, 300 * 4096) == 0);
  CHECK(writer.write(1000, 300, contiguous_of(buf), 0).ok());
  CHECK(reader.read(1000, 300, contiguous_of(buf), 0).ok());
  CHECK(mismatches_in(buf, 0, 3 * 4096, 300 * 4096) == 0);
}

TEST_CASE("a shadow-doorbell reader on a controller brought up without shadow doorbells refuses to run") {
  rig r;  // shadow_doorbells off
  host::io_queue q(*r.ctrl, 8);
  reader_of<slots::multi_producer, completion::cooperative, doorbell::shadow> reader(q.view(), q.namespace_view(1));
  auto buf = r.ctrl->memory().allocate(4096);
  CHECK(reader.read(0, 8, contiguous_of(buf), 0).error == io_error::doorbell_unusable);
  writer_of<slots::multi_producer, completion::cooperative, doorbell::coalescing<doorbell::shadow>> writer(q.view(), q.namespace_view(1));
  CHECK(writer.flush().error == io_error::doorbell_unusable);
}
