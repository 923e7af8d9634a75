// Volumes over several emulated controllers, driven by CPU threads through the code GPU threads
// run: striping puts each stripe on its member at the right LBA, mirroring writes every member
// and spreads reads, a failing member fails only what it served, the page cache and array<T>
// work unchanged over a volume, and bad shapes are refused with the reason.
#include <cunvme/cache/array.cuh>
#include <cunvme/cache/page_cache.cuh>
#include <cunvme/host/owners/page_cache_memory.cuh>
#include <cunvme/host/owners/volume_members.cuh>
#include <cunvme/volume/volume.cuh>

#include "../policies/policy_fixture.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <latch>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace test;
using namespace std::chrono_literals;
using cunvme::page_access;
using cunvme::volume_layout;

namespace {

using queue_t = cunvme::queue_policies<slots::multi_producer, completion::cooperative>;
using io_t = cunvme::volume_io<queue_t, doorbell::mmio>;
using cache_t = cunvme::page_cache<queue_t, doorbell::mmio>;

/// `n` emulated controllers (8 MiB of 512-byte blocks each unless `config` says otherwise),
/// member m's namespace filled with `word_at(offset, m)`, so every word names its member and
/// its place there; two queue pairs on each.
struct members_rig {
  explicit members_rig(unsigned n, const std::vector<emu::controller_config>& configs = {}, std::chrono::nanoseconds timeout = 10s) {
    for (unsigned m = 0; m < n; ++m) {
      rigs.push_back(std::make_unique<rig>(m < configs.size() ? configs[m] : small_config()));
      rigs.back()->fill(m);
      for (int k = 0; k < 2; ++k) queues.push_back(std::make_unique<host::io_queue>(*rigs.back()->ctrl, 64, host::queue_placement::host, timeout));
    }
  }
  [[nodiscard]] std::vector<host::volume::member> members() const {
    std::vector<host::volume::member> out;
    for (std::size_t m = 0; m < rigs.size(); ++m) out.push_back({{queues[2 * m].get(), queues[2 * m + 1].get()}, 1});
    return out;
  }
  [[nodiscard]] std::uint64_t io_commands(unsigned m) const { return rigs[m]->emulator->stats().io_commands; }
  /// The word at byte `offset` of member `m`'s namespace, as its store holds it.
  [[nodiscard]] std::uint64_t stored(unsigned m, std::uint64_t offset) const {
    std::uint64_t w = 0;
    rigs[m]->emulator->store(1).read(offset, &w, 8);
    return w;
  }

  std::vector<std::unique_ptr<rig>> rigs;
  std::vector<std::unique_ptr<host::io_queue>> queues;
};

/// `host::volume_memory` with a word reader.
struct shared_buffer : host::volume_memory {
  using host::volume_memory::volume_memory;
  [[nodiscard]] std::uint64_t word(std::size_t at) const {
    std::uint64_t w = 0;
    std::memcpy(&w, data() + at, 8);
    return w;
  }
};

}  // namespace

// ---- Where blocks are --------------------------------------------------------------------------

TEST_CASE("striped: stripe k lies on member k mod N at row k div N, and a run ends at its stripe's end") {
  cunvme::volume_view v;
  v.member_count = 3;
  v.stripe_shift = 3;  // 8 blocks
  v.blocks = 3 * 8 * 10;
  const auto at = [&](std::uint64_t lba, std::uint64_t count) { return v.locate(lba, count); };
  CHECK(at(0, 100).member == 0);
  CHECK(at(0, 100).lba == 0);
  CHECK(at(0, 100).blocks == 8);
  CHECK(at(8, 1).member == 1);
  CHECK(at(8, 1).lba == 0);
  CHECK(at(21, 50).member == 2);
  CHECK(at(21, 50).lba == 5);
  CHECK(at(21, 50).blocks == 3);
  CHECK(at(24, 2).member == 0);
  CHECK(at(24, 2).lba == 8);
  CHECK(at(24, 2).blocks == 2);
  CHECK(at(3 * 8 * 7 + 8 + 1, 1).lba == 7 * 8 + 1);
}

TEST_CASE("mirrored: a run is the whole request on one replica, and replicas take the stripes in turn") {
  cunvme::volume_view v;
  v.layout = volume_layout::mirrored;
  v.member_count = 2;
  v.stripe_shift = 7;
  v.blocks = 1 << 20;
  CHECK(v.locate(5, 1000).member == 0);
  CHECK(v.locate(5, 1000).lba == 5);
  CHECK(v.locate(5, 1000).blocks == 1000);
  CHECK(v.locate(128, 1).member == 1);
  CHECK(v.locate(256, 1).member == 0);
}

// ---- Striped I/O -------------------------------------------------------------------------------

TEST_CASE("a striped read across stripes and members brings each stripe from its member's blocks") {
  members_rig r(4);
  const auto vol = host::volume::striped(r.members(), 4096);  // 8 blocks a stripe
  CHECK(vol.blocks() == 4 * 16384);
  const io_t io(vol.view());
  shared_buffer buf(vol, 64 * 4096);
  const std::uint64_t first = 8 * 5 + 3;  // inside stripe 5 (member 1, row 1)
  const std::uint64_t blocks = 8 * 50;
  const io_result r0 = io.read(first, blocks, buf.buffers(), 0);
  REQUIRE_MESSAGE(r0.ok(), cunvme::to_string(r0));
  std::uint64_t bad = 0;
  for (std::uint64_t b = 0; b < blocks; ++b) {
    const cunvme::volume_run run = vol.view().locate(first + b, 1);
    for (std::uint64_t w = 0; w < 512 / 8; ++w) bad += buf.word(b * 512 + w * 8) != word_at(run.lba * 512 + w * 8, run.member);
  }
  CHECK(bad == 0);
  for (unsigned m = 0; m < 4; ++m) CHECK(r.io_commands(m) >= 12);
}

TEST_CASE("a striped write lands on each member at the place the layout gives") {
  members_rig r(3);
  const auto vol = host::volume::striped(r.members(), 8192);
  const io_t io(vol.view());
  shared_buffer buf(vol, 16 * 8192);
  for (std::size_t w = 0; w < buf.size() / 8; ++w) {
    const std::uint64_t v = 0xabc0'0000'0000'0000ull + w;
    std::memcpy(buf.data() + w * 8, &v, 8);
  }
  const std::uint64_t first = 16 * 2 + 7, blocks = 16 * 7;
  REQUIRE(io.write(first, blocks, buf.buffers(), 0).ok());
  std::uint64_t bad = 0;
  for (std::uint64_t b = 0; b < blocks; ++b) {
    const cunvme::volume_run run = vol.view().locate(first + b, 1);
    bad += r.stored(run.member, run.lba * 512) != 0xabc0'0000'0000'0000ull + b * 64;
  }
  CHECK(bad == 0);
  CHECK(io.flush().ok());
}

TEST_CASE("a striped volume's failing member fails the requests it served, with the volume's LBA, and no others") {
  // Member 1's rows 2.. fail: volume stripes 1 + 2k for k >= 2 (stripe 5 is member 1's row 2).
  members_rig r(2, {small_config(), with_rule(read_error_at(16, 1u << 20))});
  const auto vol = host::volume::striped(r.members(), 4096);
  const io_t io(vol.view());
  shared_buffer buf(vol, 4096 * 8);
  const io_result bad = io.read(8 * 5 + 2, 4, buf.buffers(), 0);
  CHECK(bad.error == io_error::nvme_status);
  CHECK(bad.status == spec::status::unrecovered_read_error);
  CHECK(bad.lba == 8 * 5 + 2);
  CHECK(io.read(8 * 4, 8, buf.buffers(), 0).ok());   // member 0's row 2
  CHECK(io.read(8 * 1, 8, buf.buffers(), 0).ok());   // member 1's row 0
  const io_result spanning = io.read(8 * 4, 16, buf.buffers(), 0);  // member 0 then member 1's bad row
  CHECK(spanning.error == io_error::nvme_status);
  CHECK(spanning.lba == 8 * 5);
}

TEST_CASE("a volume request past its end, of no blocks, or on an empty view is refused before any command") {
  members_rig r(2);
  const auto vol = host::volume::striped(r.members(), 4096);
  const io_t io(vol.view());
  shared_buffer buf(vol, 4096);
  CHECK(io.read(vol.blocks() - 1, 2, buf.buffers(), 0).error == io_error::invalid_request);
  CHECK(io.read(vol.blocks(), 1, buf.buffers(), 0).error == io_error::invalid_request);
  CHECK(io.read(0, 0, buf.buffers(), 0).error == io_error::invalid_request);
  CHECK(io.write(~std::uint64_t{0}, 2, buf.buffers(), 0).error == io_error::invalid_request);
  CHECK(io_t(cunvme::volume_view{}).read(0, 1, buf.buffers(), 0).error == io_error::invalid_request);
  CHECK(r.io_commands(0) + r.io_commands(1) == 0);
}

// ---- Mirrored I/O ------------------------------------------------------------------------------

TEST_CASE("a mirrored write reaches every member, and reads spread over the replicas") {
  members_rig r(3);
  const auto vol = host::volume::mirrored(r.members());
  CHECK(vol.blocks() == 16384);
  const io_t io(vol.view());
  shared_buffer buf(vol, 4096);
  const std::uint64_t v = 0x5eed'0000'0000'0001ull;
  std::memcpy(buf.data(), &v, 8);
  REQUIRE(io.write(1000, 8, buf.buffers(), 0).ok());
  for (unsigned m = 0; m < 3; ++m) CHECK(r.stored(m, 1000 * 512) == v);
  const std::uint64_t before[3] = {r.io_commands(0), r.io_commands(1), r.io_commands(2)};
  for (std::uint64_t stripe = 0; stripe < 30; ++stripe) REQUIRE(io.read(stripe * 128, 8, buf.buffers(), 0).ok());
  for (unsigned m = 0; m < 3; ++m) CHECK(r.io_commands(m) - before[m] == 10);
}

TEST_CASE("a mirrored read that one replica fails with an error status is served by the next replica") {
  members_rig r(2, {with_rule(read_error_at(0, 1u << 20)), small_config()});
  const auto vol = host::volume::mirrored(r.members());
  const io_t io(vol.view());
  shared_buffer buf(vol, 4096);
  const io_result got = io.read(3, 8, buf.buffers(), 0);  // stripe 0: replica 0 first, which fails
  REQUIRE_MESSAGE(got.ok(), cunvme::to_string(got));
  CHECK(buf.word(0) == word_at(3 * 512, 1));
  CHECK(r.rigs[0]->emulator->injected_faults().statuses == 1);
}

TEST_CASE("a mirrored read fails with the first replica's status only where every replica fails") {
  members_rig r(2, {with_rule(read_error_at(0, 100)), with_rule(read_error_at(0, 100))});
  const auto vol = host::volume::mirrored(r.members());
  const io_t io(vol.view());
  shared_buffer buf(vol, 4096);
  const io_result got = io.read(10, 1, buf.buffers(), 0);
  CHECK(got.error == io_error::nvme_status);
  CHECK(got.lba == 10);
  CHECK(io.read(200, 1, buf.buffers(), 0).ok());
}

TEST_CASE("a mirrored read that times out is not retried on another replica: the late command may still write the buffer") {
  emu::fault_rule lose;
  lose.action = emu::fault_action::lose_completion;
  lose.opcode = static_cast<std::uint8_t>(spec::nvm_opcode::read);
  lose.nth = 1;
  auto config = small_config();
  config.faults = {lose};
  members_rig r(2, {config, small_config()}, 500ms);
  const auto vol = host::volume::mirrored(r.members());
  const io_t io(vol.view());
  shared_buffer buf(vol, 4096);
  const std::uint64_t replica1_before = r.io_commands(1);
  const io_result got = io.read(0, 1, buf.buffers(), 0);
  CHECK(got.error == io_error::timeout);
  CHECK(r.io_commands(1) == replica1_before);
}

// ---- Shapes refused ----------------------------------------------------------------------------

TEST_CASE("host::volume refuses shapes it cannot serve, saying why") {
  members_rig r(2);
  const auto refused = [](auto make, const std::string& why) {
    try {
      (void)make();
      FAIL("accepted: " << why);
    } catch (const host::error& e) {
      CHECK_MESSAGE(std::string(e.what()).find(why) != std::string::npos, e.what());
    }
  };
  refused([] { return host::volume::striped({}, 4096); }, "0 members");
  refused([&] { return host::volume::striped({{{}, 1}}, 4096); }, "no queue pair");
  refused([&] { return host::volume::striped({{{r.queues[0].get(), r.queues[2].get()}, 1}}, 4096); }, "on two controllers");
  refused([&] { return host::volume::mirrored({{{r.queues[0].get()}, 1}, {{r.queues[1].get()}, 1}}); }, "is namespace 1 again");
  refused([&] { return host::volume::striped(r.members(), 3000); }, "not a power of two");
  refused([&] { return host::volume::striped(r.members(), 256); }, "not a power of two of at least one");
  refused([&] { return host::volume::striped(r.members(), std::uint64_t{1} << 40); }, "holds no whole stripe");
  refused([&] { return host::volume::mirrored({{{r.queues[0].get()}, 7}}); }, "namespace 7");
  rig other(small_config(4096));
  host::io_queue q4k(*other.ctrl, 16);
  refused([&] { return host::volume::striped({{{r.queues[0].get()}, 1}, {{&q4k}, 1}}, 65536); }, "members need one block size");
}

TEST_CASE("a striped volume's page cache refuses pages larger than the stripe, and a cache refuses another volume's view") {
  members_rig r(2), s(3);
  const auto vol = host::volume::striped(r.members(), 4096);
  CHECK_THROWS_WITH_AS((void)host::page_cache_memory(vol, 8192, 4), doctest::Contains("smaller than the page size"), host::error);
  const auto other = host::volume::striped(s.members(), 4096);
  host::page_cache_memory memory(vol, 4096, 4);
  const cache_t wrong(memory.view(), other.view());
  CHECK(wrong.acquire(0, page_access::read).result.error == io_error::invalid_request);
  const cache_t right(memory.view(), vol.view());
  CHECK(right.acquire(0, page_access::read).ok());
}

// ---- The page cache and array<T> over a volume ------------------------------------------------

TEST_CASE("a page cache over a striped volume of four controllers returns each page from its member, verified by four threads") {
  members_rig r(4);
  const auto vol = host::volume::striped(r.members(), 8192);
  host::page_cache_memory memory(vol, 4096, 16);
  const cache_t cache(memory.view(), vol.view());
  const std::uint64_t pages = cache.pages();
  REQUIRE(pages == 4 * 2048);
  std::vector<std::uint64_t> bad(4), failed(4);
  on_threads(4, [&](unsigned t) {
    std::mt19937_64 rng(t + 11);
    for (int i = 0; i < 300; ++i) {
      const std::uint64_t page = rng() % 512;
      const cunvme::page_ref p(cache, page, page_access::read);
      if (!p.ok()) {
        ++failed[t];
        continue;
      }
      const cunvme::volume_run run = vol.view().locate(page * 8, 8);
      for (std::uint64_t w = 0; w < 4096 / 8; ++w) {
        std::uint64_t got = 0;
        std::memcpy(&got, p.data() + w * 8, 8);
        bad[t] += got != word_at(run.lba * 512 + w * 8, run.member);
      }
    }
  });
  for (unsigned t = 0; t < 4; ++t) {
    CHECK(bad[t] == 0);
    CHECK(failed[t] == 0);
  }
  for (unsigned m = 0; m < 4; ++m) CHECK(r.io_commands(m) > 0);
}

TEST_CASE("writes through a cache over a mirrored volume reach every member on flush, and re-read after eviction") {
  members_rig r(2);
  const auto vol = host::volume::mirrored(r.members());
  host::page_cache_memory memory(vol, 4096, 4);
  const cache_t cache(memory.view(), vol.view());
  for (std::uint64_t page = 0; page < 8; ++page) {
    const std::uint64_t v = 0xd1d1'0000'0000'0000ull + page;
    REQUIRE(cache.write(page * 4096 + 16, 8, &v).ok());
  }
  REQUIRE(cache.flush().ok());
  for (std::uint64_t page = 0; page < 8; ++page) {
    for (unsigned m = 0; m < 2; ++m) CHECK(r.stored(m, page * 4096 + 16) == 0xd1d1'0000'0000'0000ull + page);
    std::uint64_t back = 0;
    REQUIRE(cache.read(page * 4096 + 16, 8, &back).ok());
    CHECK(back == 0xd1d1'0000'0000'0000ull + page);
  }
}

TEST_CASE("array<T> over a striped volume: elements read as the layout stores them, writes read back, and out of range is refused") {
  members_rig r(2);
  const auto vol = host::volume::striped(r.members(), 4096);
  host::page_cache_memory memory(vol, 4096, 8);
  const cache_t cache(memory.view(), vol.view());
  const cunvme::array<std::uint64_t, cache_t> a(cache, 0, vol.blocks() * 512 / 8);
  for (const std::uint64_t i : std::vector<std::uint64_t>{0, 1, 511, 512, 4097, a.size() - 1}) {
    const auto x = a[i];
    REQUIRE(x.ok());
    CHECK(x.value == volume_word_at(vol.view(), i));
  }
  CHECK(a[a.size()].result.error == io_error::invalid_request);
  REQUIRE(a.set(777, 42).ok());
  CHECK(a[777].value == 42);
  REQUIRE(cache.flush().ok());
  const cunvme::volume_run run = vol.view().locate(777 * 8 / 512, 1);
  CHECK(r.stored(run.member, run.lba * 512 + 777 * 8 % 512) == 42);
}

TEST_CASE("array<T> elements that straddle two pages read and write whole") {
  members_rig r(1);
  const auto vol = host::volume::striped(r.members(), 4096);
  host::page_cache_memory memory(vol, 4096, 4);
  const cache_t cache(memory.view(), vol.view());
  struct twelve {
    std::uint32_t a, b, c;
  };
  const cunvme::array<twelve, cache_t> a(cache, 8, 10000);  // element i at byte 8 + 12 i
  const std::uint64_t straddler = 340;                       // bytes 4088..4099: pages 0 and 1
  twelve t{1, 2, 3};
  REQUIRE(a.set(straddler, t).ok());
  const auto back = a[straddler];
  REQUIRE(back.ok());
  CHECK(back.value.a == 1);
  CHECK(back.value.b == 2);
  CHECK(back.value.c == 3);
  const auto next = a[straddler + 1];
  REQUIRE(next.ok());
  std::uint32_t want[3];
  for (int k = 0; k < 3; ++k) {
    const std::uint64_t at = 8 + (straddler + 1) * 12 + 4 * k;
    const std::uint64_t word = word_at(at / 8 * 8, 0);
    std::memcpy(&want[k], reinterpret_cast<const unsigned char*>(&word) + at % 8, 4);
  }
  CHECK(next.value.a == want[0]);
  CHECK(next.value.c == want[2]);
}

TEST_CASE("a group's gather returns every element, takes a page shared by the group once, and fails only the lanes whose index is bad") {
  members_rig r(2);
  const auto vol = host::volume::striped(r.members(), 4096);
  host::page_cache_memory memory(vol, 4096, 16);
  const cache_t cache(memory.view(), vol.view());
  const cunvme::array<std::uint64_t, cache_t> a(cache, 0, vol.blocks() * 512 / 8);
  std::vector<std::uint64_t> indices;
  for (std::uint64_t k = 0; k < 64; ++k) indices.push_back(k < 32 ? 5000 + k : (k * 7919) % a.size());
  indices[40] = a.size() + 3;  // out of range: lane 0 of the second round fails alone
  std::vector<std::uint64_t> out(indices.size(), 0);
  constexpr unsigned lanes = 4;
  cunvme::host_group group(lanes);
  std::vector<io_result> results(lanes);
  on_threads(lanes, [&](unsigned t) {
    auto member = group.member_at(t);
    results[t] = a.gather(member, indices.data(), indices.size(), out.data());
  });
  for (unsigned t = 0; t < lanes; ++t) CHECK((results[t].error == io_error::invalid_request) == (t == 40 % lanes));
  for (std::size_t k = 0; k < indices.size(); ++k) {
    if (k == 40) continue;
    const std::uint64_t i = indices[k];
    CHECK(out[k] == volume_word_at(vol.view(), i));
  }
  CHECK(out[40] == 0);
  // Indices 5000..5031 lie in one page (5000 × 8 = 40000 = page 9): four lanes, one acquire a round.
  const auto counters = memory.counters();
  CHECK(counters.hits + counters.misses <= 8 + 32);
}

TEST_CASE("array<T>::copy brings a run of elements across pages and stripes, and refuses a run past the end") {
  members_rig r(3);
  const auto vol = host::volume::striped(r.members(), 4096);
  host::page_cache_memory memory(vol, 4096, 8);
  const cache_t cache(memory.view(), vol.view());
  const cunvme::array<std::uint64_t, cache_t> a(cache, 8 * 100, vol.blocks() * 512 / 8 - 100);  // starts 100 words in
  std::vector<std::uint64_t> out(3000, 0);
  REQUIRE(a.copy(1234, out.size(), out.data()).ok());
  std::uint64_t bad = 0;
  for (std::uint64_t k = 0; k < out.size(); ++k) {
    bad += out[k] != volume_word_at(vol.view(), 100 + 1234 + k);  // element k is volume word 100 + 1234 + k
  }
  CHECK(bad == 0);
  CHECK(memory.counters().misses == (1234 + 100 + 2999) * 8 / 4096 - (1234 + 100) * 8 / 4096 + 1);
  CHECK(a.copy(a.size() - 2, 3, out.data()).error == io_error::invalid_request);
  CHECK(a.copy(0, 0, out.data()).ok());
}

TEST_CASE("members that share a controller (two namespaces on each of two) share its mapping of the memory, and write and read back") {
  std::vector<std::unique_ptr<rig>> rigs;
  std::vector<std::unique_ptr<host::io_queue>> queues;
  std::vector<host::volume::member> members;
  for (int c = 0; c < 2; ++c) {
    auto config = small_config();
    config.namespaces.push_back(emu::namespace_config::in_memory(512, 16384));
    rigs.push_back(std::make_unique<rig>(config));
    queues.push_back(std::make_unique<host::io_queue>(*rigs.back()->ctrl, 64));
    for (std::uint32_t nsid : {1u, 2u}) members.push_back({{queues.back().get()}, nsid});
  }
  const auto vol = host::volume::striped(members, 4096);
  shared_buffer buf(vol, 64 * 1024);
  for (std::size_t w = 0; w < buf.size() / 8; ++w) {
    const std::uint64_t v = 0x7700'0000'0000'0000ull + w;
    std::memcpy(buf.data() + w * 8, &v, 8);
  }
  const io_t io(vol.view());
  REQUIRE(io.write(8, 128, buf.buffers(), 0).ok());  // stripes 1..16: every member
  std::memset(buf.data(), 0, buf.size());
  const io_result back = io.read(8, 128, buf.buffers(), 0);
  REQUIRE_MESSAGE(back.ok(), cunvme::to_string(back));
  std::uint64_t bad = 0;
  for (std::uint64_t w = 0; w < 128 * 64; ++w) bad += buf.word(w * 8) != 0x7700'0000'0000'0000ull + w;
  CHECK(bad == 0);
  host::page_cache_memory memory(vol, 4096, 8);
  const cache_t cache(memory.view(), vol.view());
  for (std::uint64_t page = 1; page <= 16; ++page) {
    std::uint64_t v = 0;
    REQUIRE(cache.read(page * 4096, 8, &v).ok());
    CHECK(v == 0x7700'0000'0000'0000ull + (page - 1) * 512);
  }
}

namespace {

/// Emulators whose `memory_kind::device` regions are host memory reached through a counting
/// copier: "GPU memory" that CPU threads can also address, to drive the GPU-memory paths here.
std::vector<emu::controller_config> device_memory_configs(unsigned n, std::atomic<std::uint64_t>& device_copies) {
  std::vector<emu::controller_config> configs;
  for (unsigned m = 0; m < n; ++m) {
    auto c = small_config();
    c.memory.device_copy.copy = [&device_copies](void* dst, const void* src, std::uint64_t bytes, bool, int) {
      std::memcpy(dst, src, bytes);
      device_copies.fetch_add(1, std::memory_order_relaxed);
      return true;
    };
    c.memory.device_copy.wait = [] { return true; };
    configs.push_back(std::move(c));
  }
  return configs;
}

/// A slot allocator handing out such "GPU memory", mapped for the controller as GPU memory is.
host::slot_allocator fake_gpu_slots(std::size_t give_bytes_less = 0) {
  return [give_bytes_less](host::controller& ctrl, std::size_t bytes) {
    const std::size_t rounded = (bytes + 65535) / 65536 * 65536;
    void* p = std::aligned_alloc(65536, rounded);
    REQUIRE(p != nullptr);
    std::memset(p, 0, rounded);
    auto mapped = std::make_shared<host::dma_buffer>(ctrl.memory().map_gpu(p, bytes - give_bytes_less));
    std::vector<std::uint64_t> pages = mapped->pages();
    return host::dma_buffer(nullptr, p, bytes - give_bytes_less, mapped->page_size(), std::move(pages), host::memory_location::gpu, [mapped, p]() mutable {
      mapped.reset();
      std::free(p);
    });
  };
}

/// Bookkeeping that both sides address (as mapped pinned memory is), so `device_view()` works here.
host::io_queue_memory shared_bookkeeping() {
  host::io_queue_memory m;
  m.bookkeeping = [](std::size_t bytes) {
    const std::size_t rounded = (bytes + 4095) / 4096 * 4096;
    auto* p = static_cast<std::byte*>(std::aligned_alloc(4096, rounded));
    REQUIRE(p != nullptr);
    std::memset(p, 0, rounded);
    return host::dma_buffer(p, p, bytes, 4096, {}, host::memory_location::pinned_host, [p] { std::free(p); });
  };
  return m;
}

}  // namespace

TEST_CASE("a cache's slots in GPU memory are mapped for every member's controller, filled by DMA there, and refused to CPU threads") {
  std::atomic<std::uint64_t> device_copies{0};
  members_rig r(4, device_memory_configs(4, device_copies));
  const auto vol = host::volume::striped(r.members(), 8192);
  host::page_cache_memory memory(vol, 4096, 16, shared_bookkeeping(), fake_gpu_slots());
  CHECK_THROWS_WITH_AS((void)memory.view(), doctest::Contains("slots are in GPU memory"), host::error);
  // The device view's pointers are host addresses here: CPU threads stand in for GPU threads.
  const cache_t cache(memory.device_view(), vol.view());
  std::vector<std::uint64_t> bad(4), failed(4);
  on_threads(4, [&](unsigned t) {
    std::mt19937_64 rng(t + 21);
    for (int i = 0; i < 200; ++i) {
      const std::uint64_t page = rng() % 256;
      std::uint64_t v = 0;
      const std::uint64_t word = page * 512 + rng() % 512;
      if (!cache.read(word * 8, 8, &v).ok()) {
        ++failed[t];
        continue;
      }
      bad[t] += v != volume_word_at(vol.view(), word);
    }
  });
  for (unsigned t = 0; t < 4; ++t) {
    CHECK(bad[t] == 0);
    CHECK(failed[t] == 0);
  }
  for (unsigned m = 0; m < 4; ++m) CHECK(r.io_commands(m) > 0);  // every member filled slots, each through its own mapping
  CHECK(device_copies.load() >= memory.counters().fills);
  CHECK(memory.counters().fills > 16);  // more pages than slots: evicted and refilled
}

TEST_CASE("written pages in GPU-memory slots reach the members on flush and read back after eviction") {
  std::atomic<std::uint64_t> device_copies{0};
  members_rig r(2, device_memory_configs(2, device_copies));
  const auto vol = host::volume::mirrored(r.members());
  host::page_cache_memory memory(vol, 4096, 4, shared_bookkeeping(), fake_gpu_slots());
  const cache_t cache(memory.device_view(), vol.view());
  for (std::uint64_t page = 0; page < 8; ++page) {
    const std::uint64_t v = 0x5100 + page;
    REQUIRE(cache.write(page * 4096 + 16, 8, &v).ok());
  }
  REQUIRE(cache.flush().ok());
  for (std::uint64_t page = 0; page < 8; ++page) {
    for (unsigned m = 0; m < 2; ++m) CHECK(r.stored(m, page * 4096 + 16) == 0x5100 + page);
    std::uint64_t v = 0;
    REQUIRE(cache.read(page * 4096 + 16, 8, &v).ok());
    CHECK(v == 0x5100 + page);
  }
}

TEST_CASE("a slot allocator that gives less than asked is refused, naming it") {
  std::atomic<std::uint64_t> device_copies{0};
  members_rig r(2, device_memory_configs(2, device_copies));
  const auto vol = host::volume::striped(r.members(), 8192);
  CHECK_THROWS_WITH_AS((void)host::page_cache_memory(vol, 4096, 16, shared_bookkeeping(), fake_gpu_slots(4096)),
                       doctest::Contains("slot allocator gave"), host::error);
  CHECK_THROWS_WITH_AS((void)host::page_cache_memory(*r.rigs[0]->ctrl, r.queues[0]->namespace_view(1), 4096, 16, {}, fake_gpu_slots(4096)),
                       doctest::Contains("slot allocator gave"), host::error);
}

TEST_CASE("a gather whose lanes want more pages at once than the cache has slots completes: no lane holds a page while another waits for a slot") {
  members_rig r(1, {}, 2s);
  const auto vol = host::volume::striped(r.members(), 4096);
  host::page_cache_memory memory(vol, 4096, 2);  // two slots for four lanes wanting four pages each round
  const cache_t cache(memory.view(), vol.view());
  const cunvme::array<std::uint64_t, cache_t> a(cache, 0, vol.blocks() * 512 / 8);
  std::vector<std::uint64_t> indices;
  for (std::uint64_t k = 0; k < 64; ++k) indices.push_back(k * 512 * 3 + k);  // a page of its own each
  std::vector<std::uint64_t> out(indices.size(), 0);
  constexpr unsigned lanes = 4;
  cunvme::host_group group(lanes);
  std::vector<io_result> results(lanes);
  const auto start = std::chrono::steady_clock::now();
  on_threads(lanes, [&](unsigned t) {
    auto member = group.member_at(t);
    results[t] = a.gather(member, indices.data(), indices.size(), out.data());
  });
  CHECK(std::chrono::steady_clock::now() - start < 2s);  // no wait ran into the queue's timeout
  for (unsigned t = 0; t < lanes; ++t) CHECK_MESSAGE(results[t].ok(), cunvme::to_string(results[t]));
  std::uint64_t bad = 0;
  for (std::size_t k = 0; k < indices.size(); ++k) bad += out[k] != word_at(indices[k] * 8, 0);
  CHECK(bad == 0);
}
