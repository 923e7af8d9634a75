// File placement (file bytes → LBA ranges), read plans, and layer grouping.
#include <cunvme/loader/layers.cuh>
#include <cunvme/loader/placement.cuh>

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace loader = cunvme::loader;
using loader::block_read;

TEST_CASE("a contiguous file maps byte ranges to the blocks holding them") {
  const auto p = loader::file_placement::contiguous(512, 100, 10 * 512 + 7, 1000);
  REQUIRE(p.extents().size() == 1);
  CHECK(p.extents()[0] == loader::file_extent{0, 100, 11});
  CHECK(p.map(0, 1) == std::vector<block_read>{{100, 1, 0}});
  CHECK(p.map(511, 2, 4096) == std::vector<block_read>{{100, 2, 4096}});
  CHECK(p.map(5120, 7) == std::vector<block_read>{{110, 1, 0}});  // the partial last block
  CHECK(p.map(3, 0).empty());
  CHECK_THROWS_WITH_AS((void)p.map(5120, 8), doctest::Contains("run past the file"), cunvme::host::error);
  CHECK_THROWS_AS((void)p.map(~std::uint64_t{0}, 2), cunvme::host::error);
}

TEST_CASE("a device shorter than the file leaves its tail unreadable, and says why") {
  // A 10.5-block file on a device of 10 blocks.
  const auto p = loader::file_placement::contiguous(512, 0, 10 * 512 + 256, 10);
  CHECK(p.map(0, 5120) == std::vector<block_read>{{0, 10, 0}});
  CHECK_THROWS_WITH_AS((void)p.map(5000, 200), doctest::Contains("[5120, 5376) lie on no block"), cunvme::host::error);
  CHECK_THROWS_WITH_AS((void)p.map(5000, 200), doctest::Contains("a device shorter than the file"), cunvme::host::error);
  CHECK(loader::file_placement::contiguous(4096, 5, 100, 5).extents().empty());
}

TEST_CASE("extents split reads at their boundaries and holes are refused") {
  const auto p = loader::file_placement::from_extents(4096, 10 * 4096, {{0, 1000, 2}, {2 * 4096, 50, 3}, {7 * 4096, 9, 3}});
  CHECK(p.map(100, 3 * 4096) == std::vector<block_read>{{1000, 2, 0}, {50, 2, 2 * 4096}});
  CHECK(p.map(7 * 4096 + 1, 2 * 4096, 8192) == std::vector<block_read>{{9, 3, 8192}});
  CHECK_THROWS_WITH_AS((void)p.map(4 * 4096, 4096 * 2), doctest::Contains("[20480, 24576) lie on no block"), cunvme::host::error);
  using E = std::vector<loader::file_extent>;
  CHECK_THROWS_WITH_AS((void)loader::file_placement::from_extents(4096, 1, E{{1, 0, 1}}), doctest::Contains("does not start on"), cunvme::host::error);
  CHECK_THROWS_WITH_AS((void)loader::file_placement::from_extents(4096, 1, E{{0, 0, 0}}), doctest::Contains("empty"), cunvme::host::error);
  CHECK_THROWS_WITH_AS((void)loader::file_placement::from_extents(4096, 1, E{{0, 0, 2}, {4096, 9, 1}}), doctest::Contains("overlaps"), cunvme::host::error);
  CHECK_THROWS_WITH_AS((void)loader::file_placement::from_extents(4096, 1, E{{0, ~std::uint64_t{0}, 2}}), doctest::Contains("2^64"), cunvme::host::error);
  CHECK_THROWS_WITH_AS((void)loader::file_placement::contiguous(6, 0, 1, 1), doctest::Contains("multiple of 4"), cunvme::host::error);
}

TEST_CASE("a plan reads touching ranges once and starts each run on 4 KiB") {
  const auto p = loader::file_placement::contiguous(512, 0, 1 << 20, 1 << 11);
  // [100, 600) and [600, 1000) share block 1; [5000, 5004) is a run of its own; [0, 0) joins the first.
  const auto plan = loader::plan_reads(p, {{600, 400}, {5000, 4}, {100, 500}, {0, 0}});
  CHECK(plan.reads == std::vector<block_read>{{0, 2, 0}, {9, 1, 4096}});
  CHECK(plan.offsets == std::vector<std::uint64_t>{600, 4096 + 5000 - 9 * 512, 100, 0});
  CHECK(plan.buffer_bytes == 4096 + 512);
  // Each range keeps its file offset modulo 4 KiB in the buffer (aligned elements stay aligned).
  const auto q = loader::plan_reads(loader::file_placement::contiguous(4096, 0, 1 << 20, 256), {{8192 + 8, 8}, {65536 + 24, 8}});
  CHECK(q.offsets == std::vector<std::uint64_t>{8, 4096 + 24});
  CHECK(q.reads == std::vector<block_read>{{2, 1, 0}, {16, 1, 4096}});
  // A run ending in the file's partial last block reads that block whole.
  const auto r = loader::plan_reads(loader::file_placement::contiguous(512, 0, 1000, 2), {{900, 100}});
  CHECK(r.reads == std::vector<block_read>{{1, 1, 0}});
  CHECK(r.buffer_bytes == 512);
  CHECK_THROWS_AS((void)loader::plan_reads(p, {{(1 << 20) - 1, 2}}), cunvme::host::error);
}

TEST_CASE("tensors group by layer, in natural order, the unnumbered ones first") {
  CHECK(loader::default_layer_key("model.layers.12.attn.q.weight") == "model.layers.12");
  CHECK(loader::default_layer_key("h.0.w") == "h.0");
  CHECK(loader::default_layer_key("lm_head.weight") == "");
  CHECK(loader::default_layer_key("a.b1.c") == "");
  CHECK(loader::default_layer_key("7") == "7");
  CHECK(loader::natural_less("layers.9", "layers.10"));
  CHECK_FALSE(loader::natural_less("layers.10", "layers.9"));
  CHECK(loader::natural_less("", "a"));
  CHECK(loader::natural_less("a.2", "b.1"));
  CHECK(loader::natural_less("x.01", "x.001"));
  CHECK_FALSE(loader::natural_less("x.1", "x.1"));

  loader::safetensors_header h;
  for (const char* n : {"m.layers.10.w", "m.layers.2.w", "embed", "m.layers.2.b", "head"}) h.tensors.push_back({n, loader::dtype::U8, {}, 0, 0});
  const auto groups = loader::group_by_layer(h);
  REQUIRE(groups.size() == 3);
  CHECK(groups[0].key == "");
  CHECK(groups[0].tensors == std::vector<std::size_t>{2, 4});
  CHECK(groups[1].key == "m.layers.2");
  CHECK(groups[1].tensors == std::vector<std::size_t>{1, 3});
  CHECK(groups[2].key == "m.layers.10");
  const auto one = loader::group_by_layer(h, [](std::string_view) { return std::string("all"); });
  CHECK(one.size() == 1);
}

TEST_CASE("an extent map taken by the extent_map tool places the file it describes, and its holes are refused") {
  const std::string text =
      "cunvme-extent-map 1\nfile_size 20000\nfs_block_bytes 4096\ndevice_block_bytes 512\ndevice -\npartition - 0\n"
      "sha256 " + std::string(64, '0') + "\nextents 2\n0 1000 16\n10240 5000 20\nend\n";
  const cunvme::loader::extent_map m = cunvme::loader::parse_extent_map(text, "test map");
  const loader::file_placement where = loader::file_placement::from_extent_map(m);
  CHECK(where.block_bytes() == 512);
  CHECK(where.file_bytes() == 20000);
  CHECK(where.map(7000, 1000) == std::vector<block_read>{{1013, 3, 0}});
  CHECK(where.map(10340, 600) == std::vector<block_read>{{5000, 2, 0}});
  CHECK_THROWS_AS((void)where.map(9000, 10), cunvme::host::error);  // bytes 8192..10239 are a hole
}

TEST_CASE("an empty range lands inside the plan's buffer, whatever its offset in the file") {
  const auto where = loader::file_placement::contiguous(512, 0, 167, 1);
  const loader::read_plan alone = loader::plan_reads(where, {{117, 0}});
  REQUIRE(alone.offsets.size() == 1);
  CHECK(alone.offsets[0] <= alone.buffer_bytes);
  const loader::read_plan among = loader::plan_reads(where, {{100, 10}, {117, 0}, {150, 17}});
  for (std::size_t i = 0; i < 3; ++i) CHECK(among.offsets[i] + std::vector<std::uint64_t>{10, 0, 17}[i] <= among.buffer_bytes);
  CHECK(among.offsets[0] == 100);
  CHECK(among.offsets[2] == 150);
}

namespace {

constexpr std::uint64_t top = ~std::uint64_t{0};

/// Every range lies inside the plan's buffer, and so does every read: the property the plan
/// exists for, checked without a sum that could wrap.
void check_inside(const loader::read_plan& plan, const std::vector<loader::byte_range>& ranges, std::uint64_t block) {
  REQUIRE(plan.offsets.size() == ranges.size());
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    CHECK(plan.offsets[i] <= plan.buffer_bytes);
    CHECK(ranges[i].length <= plan.buffer_bytes - plan.offsets[i]);
  }
  for (const block_read& r : plan.reads) {
    CHECK(r.buffer_offset <= plan.buffer_bytes);
    CHECK(r.blocks <= (plan.buffer_bytes - r.buffer_offset) / block);
  }
}

}  // namespace

TEST_CASE("a placement whose last block would end past 2^64 bytes is refused, naming the size") {
  // 2^64 - 1 bytes in 4096-byte blocks: the last block ends at 2^64, which no offset holds.
  CHECK_THROWS_WITH_AS((void)loader::file_placement::from_extents(4096, top, {{0, 0, (top >> 12) + 1}}), doctest::Contains("2^64"),
                       cunvme::host::error);
  CHECK_THROWS_WITH_AS((void)loader::file_placement::contiguous(4096, 0, top, top), doctest::Contains("2^64"), cunvme::host::error);
}

TEST_CASE("a plan whose runs' padding would carry the buffer past 2^64 bytes is refused, not wrapped") {
  // 2^55 - 1 blocks of 512 bytes: the file ends 512 bytes short of 2^64. The second run starts
  // at 4 KiB in the buffer (after the first run's one block), 3.5 KiB later than in the file.
  const std::uint64_t blocks = (top >> 9);
  const auto where = loader::file_placement::from_extents(512, blocks * 512, {{0, 0, blocks}});
  const std::vector<loader::byte_range> ranges{{0, 1}, {1024, blocks * 512 - 1024}};
  CHECK_THROWS_WITH_AS((void)loader::plan_reads(where, ranges), doctest::Contains("2^64"), cunvme::host::error);
}

TEST_CASE("a plan near 2^64 bytes that fits puts every read and range inside its buffer") {
  const std::uint64_t blocks = (top >> 12);  // the file ends 4 KiB short of 2^64
  const auto where = loader::file_placement::from_extents(4096, blocks * 4096, {{0, 7, blocks}});
  const std::vector<loader::byte_range> ranges{{blocks * 4096 - 100, 100}, {0, 10}, {8192, 5}};
  const loader::read_plan plan = loader::plan_reads(where, ranges);
  check_inside(plan, ranges, 4096);
  CHECK(plan.buffer_bytes == 3 * 4096);
}

TEST_CASE("map refuses a buffer offset that its reads would carry past 2^64 bytes") {
  const auto where = loader::file_placement::contiguous(512, 0, 1 << 20, 1 << 11);
  CHECK_THROWS_WITH_AS((void)where.map(0, 4096, top - 1000), doctest::Contains("2^64"), cunvme::host::error);
}
