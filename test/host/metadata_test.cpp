// Namespaces formatted with metadata (LBAF.MS > 0) on the host path: extended LBAs move data
// and metadata per block, separate metadata goes through MPTR from a caller's buffer, and what
// cannot be done right is refused before any DMA. Never a transfer past the caller's buffer.
#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/backend/emu_backend.cuh>
#include <cunvme/host/open.cuh>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace host = cunvme::host;
namespace emu = cunvme::emu;
namespace spec = cunvme::spec;

namespace {

constexpr std::byte guard_byte{0xa5};

std::unique_ptr<host::controller> controller_with(emu::namespace_config ns) {
  emu::controller_config config;
  config.namespaces = {std::move(ns)};
  return std::make_unique<host::controller>(std::make_unique<host::emu_backend>(std::move(config)));
}

/// The first `bytes` of `memory` as a buffer of its own (not owning), so the bytes after it
/// are a guard region a transfer past the buffer's end would change.
host::dma_buffer guarded_view(const host::dma_buffer& memory, std::size_t bytes) {
  std::memset(memory.data(), static_cast<int>(guard_byte), memory.size());
  return host::dma_buffer(memory.data(), nullptr, bytes, memory.page_size(), memory.pages(), memory.location(), {});
}

bool guard_intact(const host::dma_buffer& memory, std::size_t from) {
  return std::all_of(memory.data() + from, memory.data() + memory.size(), [](std::byte b) { return b == guard_byte; });
}

void fill_random(std::byte* p, std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>(rng());
}

}  // namespace

TEST_CASE("a 7-block read on an extended-LBA namespace into a 3584-byte buffer is refused and writes nothing past it") {
  auto ctrl = controller_with(emu::namespace_config::in_memory(512, 64).with_metadata(8, true));
  auto q = ctrl->create_queue_pair(8);
  auto memory = ctrl->memory().allocate(8192);
  auto buffer = guarded_view(memory, 7 * 512);
  CHECK_THROWS_WITH_AS((void)q->read(1, 0, 7, buffer), doctest::Contains("520"), host::error);
  CHECK(guard_intact(memory, 0));
}

TEST_CASE("a plain read on a separate-metadata namespace is refused before any DMA, naming the metadata buffer") {
  auto ctrl = controller_with(emu::namespace_config::in_memory(512, 64).with_metadata(8, false));
  auto q = ctrl->create_queue_pair(8);
  auto memory = ctrl->memory().allocate(8192);
  auto buffer = guarded_view(memory, 7 * 512);
  CHECK_THROWS_WITH_AS((void)q->read(1, 0, 7, buffer), doctest::Contains("metadata buffer"), host::error);
  CHECK_THROWS_WITH_AS((void)q->write(1, 0, 7, buffer), doctest::Contains("metadata buffer"), host::error);
  CHECK(guard_intact(memory, 0));
  CHECK(dynamic_cast<host::emu_backend&>(ctrl->backend()).controller().stats().io_commands == 0);
}

TEST_CASE("transfers on an extended-LBA namespace are split so each command's data and metadata fit MDTS") {
  auto ctrl = controller_with(emu::namespace_config::in_memory(512, 8192).with_metadata(8, true));
  auto q = ctrl->create_queue_pair(8);
  const std::uint64_t blocks = 2 * ctrl->max_transfer_bytes() / 512 + 3;
  auto out = ctrl->memory().allocate(blocks * 520);
  auto in = ctrl->memory().allocate(blocks * 520);
  fill_random(out.data(), out.size(), 1);
  REQUIRE(q->write(1, 100, blocks, out) == spec::status::successful_completion);
  REQUIRE(q->read(1, 100, blocks, in) == spec::status::successful_completion);
  CHECK(std::memcmp(out.data(), in.data(), out.size()) == 0);
}

TEST_CASE("a transfer longer than MDTS on extended LBAs of 513 bytes starts every command dword aligned and moves all of it") {
  // 524288 / 513 = 1022 blocks per command would put the second command at byte 524286.
  auto ctrl = controller_with(emu::namespace_config::in_memory(512, 4096).with_metadata(1, true));
  auto q = ctrl->create_queue_pair(8);
  const std::uint64_t blocks = 2 * ctrl->max_transfer_bytes() / 513 + 5;
  auto out = ctrl->memory().allocate(blocks * 513);
  auto in = ctrl->memory().allocate(blocks * 513);
  fill_random(out.data(), out.size(), 9);
  REQUIRE(q->write(1, 3, blocks, out) == spec::status::successful_completion);
  REQUIRE(q->read(1, 3, blocks, in) == spec::status::successful_completion);
  CHECK(std::memcmp(out.data(), in.data(), out.size()) == 0);
}

TEST_CASE("a transfer that cannot be split with every command dword aligned is refused before any command") {
  // 8 KiB MDTS, 2561-byte blocks: at most 3 per command, and 1, 2 or 3 of them are never a
  // multiple of 4 bytes, so a second command could not start dword aligned.
  emu::controller_config config;
  config.mdts = 1;
  config.namespaces = {emu::namespace_config::in_memory(512, 64).with_metadata(2049, true)};
  host::controller ctrl(std::make_unique<host::emu_backend>(std::move(config)));
  auto q = ctrl.create_queue_pair(8);
  auto out = ctrl.memory().allocate(8 * 2561);
  fill_random(out.data(), out.size(), 10);
  CHECK_THROWS_WITH_AS((void)q->write(1, 0, 8, out), doctest::Contains("dword"), host::error);
  CHECK(dynamic_cast<host::emu_backend&>(ctrl.backend()).controller().stats().io_commands == 0);
  // One command's worth still goes.
  CHECK(q->write(1, 0, 3, out) == spec::status::successful_completion);
}

TEST_CASE("a read overlapping writes on a separate-metadata namespace returns one write's data and that write's metadata") {
  // Every write stores generation g in all its data and metadata words; a read must see one g
  // throughout. Data and metadata were locked in two scopes: a write could land between them.
  emu::controller_config config;
  config.workers = 4;
  config.namespaces = {emu::namespace_config::in_memory(512, 64).with_metadata(8, false)};
  host::controller ctrl(std::make_unique<host::emu_backend>(std::move(config)));
  constexpr std::uint64_t blocks = 8;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> next_generation{1}, reads{0}, torn{0}, failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      try {
        auto q = ctrl.create_queue_pair(8);
        auto data = ctrl.memory().allocate(blocks * 512);
        auto metadata = ctrl.memory().allocate(4096);
        auto* d = reinterpret_cast<std::uint64_t*>(data.data());
        auto* m = reinterpret_cast<std::uint64_t*>(metadata.data());
        while (!stop.load()) {
          if (t % 2 == 0) {
            const std::uint64_t g = next_generation.fetch_add(1);
            std::fill(d, d + blocks * 512 / 8, g);
            std::fill(m, m + blocks, g);
            if (q->write(1, 0, blocks, data, 0, metadata) != spec::status::successful_completion) failed.fetch_add(1);
          } else {
            if (q->read(1, 0, blocks, data, 0, metadata) != spec::status::successful_completion) failed.fetch_add(1);
            const std::uint64_t g = d[0];
            const bool same = std::all_of(d, d + blocks * 512 / 8, [g](std::uint64_t w) { return w == g; }) &&
                              std::all_of(m, m + blocks, [g](std::uint64_t w) { return w == g; });
            if (!same) torn.fetch_add(1);
            reads.fetch_add(1);
          }
        }
      } catch (...) {
        failed.fetch_add(1);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  stop.store(true);
  for (auto& th : threads) th.join();
  CHECK(failed.load() == 0);
  CHECK(reads.load() > 0);
  CHECK_MESSAGE(torn.load() == 0, torn.load() << " of " << reads.load() << " reads mixed two writes");
}

TEST_CASE("namespace_info carries the metadata size and whether it travels with the data") {
  emu::controller_config config;
  config.namespaces = {emu::namespace_config::in_memory(512, 64).with_metadata(8, true),
                       emu::namespace_config::in_memory(4096, 64).with_metadata(64, false), emu::namespace_config::in_memory(512, 64)};
  host::controller ctrl(std::make_unique<host::emu_backend>(std::move(config)));
  REQUIRE(ctrl.namespaces().size() == 3);
  const auto& extended = ctrl.namespaces()[0];
  CHECK(extended.lba_size == 512);
  CHECK(extended.metadata_size == 8);
  CHECK(extended.extended_lba);
  CHECK(extended.block_bytes() == 520);
  CHECK_FALSE(extended.separate_metadata());
  CHECK(extended.bytes() == 64 * 512);
  const auto& separate = ctrl.namespaces()[1];
  CHECK(separate.lba_size == 4096);
  CHECK(separate.metadata_size == 64);
  CHECK_FALSE(separate.extended_lba);
  CHECK(separate.block_bytes() == 4096);
  CHECK(separate.separate_metadata());
  const auto& plain = ctrl.namespaces()[2];
  CHECK(plain.metadata_size == 0);
  CHECK(plain.block_bytes() == 512);
  CHECK(plain.protection_type == 0);
}

TEST_CASE("an extended-LBA round trip moves 520 bytes per block and stops at the buffer's end") {
  auto ctrl = controller_with(emu::namespace_config::in_memory(512, 64).with_metadata(8, true));
  auto q = ctrl->create_queue_pair(8);
  auto out = ctrl->memory().allocate(7 * 520);
  fill_random(out.data(), out.size(), 2);
  auto memory = ctrl->memory().allocate(8192);
  auto in = guarded_view(memory, 7 * 520);
  REQUIRE(q->write(1, 5, 7, out) == spec::status::successful_completion);
  REQUIRE(q->read(1, 5, 7, in) == spec::status::successful_completion);
  CHECK(std::memcmp(out.data(), in.data(), 7 * 520) == 0);
  CHECK(guard_intact(memory, 7 * 520));
  std::vector<std::byte> stored(7 * 520);
  dynamic_cast<host::emu_backend&>(ctrl->backend()).controller().store(1).read(5 * 520, stored.data(), stored.size());
  CHECK(std::memcmp(out.data(), stored.data(), stored.size()) == 0);
}

TEST_CASE("a separate-metadata round trip moves data through the PRPs and metadata through MPTR, nothing past either buffer") {
  auto ctrl = controller_with(emu::namespace_config::in_memory(512, 4096).with_metadata(8, false));
  auto q = ctrl->create_queue_pair(8);
  // More than MDTS: the metadata pointer advances with each command.
  const std::uint64_t blocks = ctrl->max_transfer_bytes() / 512 + 5;
  auto out = ctrl->memory().allocate(blocks * 512);
  auto meta_out = ctrl->memory().allocate(blocks * 8);
  fill_random(out.data(), out.size(), 3);
  fill_random(meta_out.data(), meta_out.size(), 4);
  auto data_memory = ctrl->memory().allocate(blocks * 512 + 4096);
  auto meta_memory = ctrl->memory().allocate(blocks * 8 + 4096);
  auto in = guarded_view(data_memory, blocks * 512);
  auto meta_in = guarded_view(meta_memory, blocks * 8 + 8);
  REQUIRE(q->write(1, 30, blocks, out, 0, meta_out) == spec::status::successful_completion);
  REQUIRE(q->read(1, 30, blocks, in, 0, meta_in, 8) == spec::status::successful_completion);
  CHECK(std::memcmp(out.data(), in.data(), out.size()) == 0);
  CHECK(guard_intact(data_memory, blocks * 512));
  CHECK(std::memcmp(meta_out.data(), meta_in.data() + 8, meta_out.size()) == 0);
  CHECK(std::all_of(meta_memory.data(), meta_memory.data() + 8, [](std::byte b) { return b == guard_byte; }));
  CHECK(guard_intact(meta_memory, blocks * 8 + 8));
}

TEST_CASE("a metadata buffer that is too small, misaligned or given for a namespace without separate metadata is refused") {
  auto ctrl = controller_with(emu::namespace_config::in_memory(512, 64).with_metadata(8, false));
  auto q = ctrl->create_queue_pair(8);
  auto data = ctrl->memory().allocate(4096);
  auto meta = ctrl->memory().allocate(4096);
  CHECK_THROWS_WITH_AS((void)q->read(1, 0, 8, data, 0, meta, 4096 - 60), doctest::Contains("do not fit the metadata buffer"), host::error);
  CHECK_THROWS_WITH_AS((void)q->read(1, 0, 1, data, 0, meta, 2), doctest::Contains("dword"), host::error);
  auto plain = controller_with(emu::namespace_config::in_memory(512, 64));
  auto pq = plain->create_queue_pair(8);
  auto pdata = plain->memory().allocate(4096);
  auto pmeta = plain->memory().allocate(4096);
  CHECK_THROWS_WITH_AS((void)pq->read(1, 0, 1, pdata, 0, pmeta), doctest::Contains("no metadata"), host::error);
  CHECK(dynamic_cast<host::emu_backend&>(ctrl->backend()).controller().stats().io_commands == 0);
}

namespace {

spec::identify_namespace identify_with(std::uint8_t lbads, std::uint16_t ms, bool extended, std::uint64_t nsze = 100) {
  spec::identify_namespace id{};
  id.nsze = id.ncap = id.nuse = nsze;
  id.nlbaf = 0;
  id.lbaf[0] = spec::lba_format{}.set_lbads(lbads).set_ms(ms);
  id.set_metadata_at_end_of_lba(extended);
  return id;
}

}  // namespace

TEST_CASE("Identify Namespace with LBADS below 9 (or above 31) is refused, not taken as a 0-byte block") {
  CHECK_THROWS_WITH_AS((void)host::describe_namespace(1, identify_with(8, 0, false), "t"), doctest::Contains("LBADS 8"), host::error);
  CHECK_THROWS_WITH_AS((void)host::describe_namespace(1, identify_with(0, 0, false), "t"), doctest::Contains("LBADS 0"), host::error);
  CHECK_THROWS_WITH_AS((void)host::describe_namespace(1, identify_with(32, 0, false), "t"), doctest::Contains("LBADS 32"), host::error);
  CHECK(host::describe_namespace(1, identify_with(9, 0, false), "t").lba_size == 512);
}

TEST_CASE("Identify Namespace whose FLBAS selects a format past NLBAF is refused") {
  auto id = identify_with(9, 0, false);
  id.lbaf[1] = spec::lba_format{}.set_lbads(12);
  id.set_formatted_lba_index(1);  // NLBAF = 0: only format 0 exists
  CHECK_THROWS_WITH_AS((void)host::describe_namespace(1, id, "t"), doctest::Contains("NLBAF"), host::error);
}

TEST_CASE("Identify Namespace with more than 16 formats takes FLBAS bits 6:5 as the index's upper bits") {
  spec::identify_namespace id{};
  id.nsze = 10;
  id.nlbaf = 19;  // 20 formats
  for (auto& f : id.lbaf) f = spec::lba_format{}.set_lbads(9);
  id.lbaf[18] = spec::lba_format{}.set_lbads(12).set_ms(16);
  id.set_formatted_lba_index(18).set_metadata_at_end_of_lba(true);
  const auto info = host::describe_namespace(1, id, "t");
  CHECK(info.lba_size == 4096);
  CHECK(info.metadata_size == 16);
  CHECK(info.extended_lba);
}

TEST_CASE("Identify Namespace whose capacity in bytes (with metadata) does not fit 64 bits is refused") {
  CHECK_THROWS_WITH_AS((void)host::describe_namespace(1, identify_with(12, 8, true, ~std::uint64_t{0} / 4096), "t"), doctest::Contains("2^64"),
                       host::error);
  CHECK(host::describe_namespace(1, identify_with(12, 0, false, ~std::uint64_t{0} / 4096), "t").bytes() == (~std::uint64_t{0} / 4096) * 4096);
}

TEST_CASE("FLBAS bit 4 without metadata is no extended LBA") {
  const auto info = host::describe_namespace(1, identify_with(9, 0, true), "t");
  CHECK_FALSE(info.extended_lba);
  CHECK(info.block_bytes() == 512);
}

TEST_CASE("a namespace with end-to-end protection information is refused for I/O, naming DPS") {
  auto id = identify_with(9, 8, true);
  id.dps = 1;  // Type 1
  const auto info = host::describe_namespace(1, id, "t");
  CHECK(info.protection_type == 1);
  CHECK_THROWS_WITH_AS(host::require_transferable(info, false, "Read", "t"), doctest::Contains("protection information"), host::error);
  id.dps = 0x08;  // PI in the first bytes of the metadata, but no type: no protection
  CHECK_NOTHROW(host::require_transferable(host::describe_namespace(1, id, "t"), false, "Read", "t"));
}

TEST_CASE("emu:ms=8,mset=1 opens an extended-LBA namespace and emu:ms=8,mset=0 a separate-metadata one") {
  auto extended = host::open("emu:blocks=64,ms=8,mset=1");
  CHECK(extended->namespace_by_id(1).metadata_size == 8);
  CHECK(extended->namespace_by_id(1).extended_lba);
  auto separate = host::open("emu:blocks=64,ms=8,mset=0");
  CHECK(separate->namespace_by_id(1).metadata_size == 8);
  CHECK(separate->namespace_by_id(1).separate_metadata());
  auto by_default = host::open("emu:blocks=64,ms=16");
  CHECK(by_default->namespace_by_id(1).separate_metadata());
}

TEST_CASE("emu:ms above 4096 and emu:mset other than 0 or 1 are refused, naming the key and value") {
  CHECK_THROWS_WITH_AS((void)host::open("emu:ms=4097"), doctest::Contains("'ms'"), host::error);
  CHECK_THROWS_WITH_AS((void)host::open("emu:ms=65544"), doctest::Contains("65544"), host::error);
  CHECK_THROWS_WITH_AS((void)host::open("emu:ms=8,mset=2"), doctest::Contains("'mset'"), host::error);
  CHECK_THROWS_WITH_AS((void)host::open("emu:ms=8,mset="), doctest::Contains("'mset'"), host::error);
  CHECK_THROWS_WITH_AS((void)host::open("emu:mset=1"), doctest::Contains("'ms'"), host::error);
}
