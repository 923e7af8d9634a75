// Conformance: NVM commands, PRP handling, queues (NVMe 2.0 sections 4.1, 4.6; NVM Command Set).
#include "test_host.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <set>

using namespace test;

namespace {

struct io_fixture {
  explicit io_fixture(emu::controller_config config = {}) : ctrl(std::move(config)), host(ctrl) {
    REQUIRE(host.enable());
    q = host.create_pair(1, 64);
  }
  spec::status io(const spec::submission_entry& sqe) { return host.run(*q, sqe).status(); }
  emu::controller ctrl;
  test_host host;
  std::unique_ptr<queue_pair> q;
};

/// I/O queue pair 1 with an SQ of `sq_entries` feeding a CQ of only `cq_entries`; the CQ is
/// returned as raw memory for the test to consume by hand.
std::pair<std::unique_ptr<queue_pair>, std::unique_ptr<dma_buffer>> pair_with_small_cq(emu::controller& ctrl, test_host& host,
                                                                                      std::uint32_t sq_entries, std::uint32_t cq_entries) {
  auto q = std::make_unique<queue_pair>(ctrl, 1, sq_entries);
  auto cq = std::make_unique<dma_buffer>(ctrl, 4096);
  REQUIRE(host.admin_status(spec::make_create_io_cq(1, cq_entries, cq->bus)) == spec::status::successful_completion);
  REQUIRE(host.admin_status(spec::make_create_io_sq(1, sq_entries, q->sq_bus, 1)) == spec::status::successful_completion);
  return {std::move(q), std::move(cq)};
}

void fill_pattern(std::byte* p, std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>(rng());
}

}  // namespace

TEST_CASE("a write then a read returns the same bytes, and the namespace holds them") {
  io_fixture f;
  dma_buffer out(f.ctrl, 4096), in(f.ctrl, 4096);
  fill_pattern(out.data, 4096, 1);
  REQUIRE(f.io(spec::make_rw(spec::nvm_opcode::write, 1, 100, 8, out.bus)) == spec::status::successful_completion);
  REQUIRE(f.io(spec::make_rw(spec::nvm_opcode::read, 1, 100, 8, in.bus)) == spec::status::successful_completion);
  CHECK(std::memcmp(out.data, in.data, 4096) == 0);
  std::vector<std::byte> direct(4096);
  f.ctrl.store(1).read(100 * 512, direct.data(), direct.size());
  CHECK(std::memcmp(out.data, direct.data(), 4096) == 0);
}

TEST_CASE("PRP1 with an offset covers the rest of its page and PRP2 the next page") {
  io_fixture f;
  dma_buffer buf(f.ctrl, 3 * 4096);
  std::vector<std::byte> expect(4096);
  fill_pattern(expect.data(), expect.size(), 2);
  f.ctrl.store(1).write(0, expect.data(), expect.size());
  // 4 KiB starting 512 bytes into a page: 3.5 KiB from PRP1, 512 B from PRP2.
  REQUIRE(f.io(spec::make_rw(spec::nvm_opcode::read, 1, 0, 8, buf.bus + 512, buf.bus + 4096)) == spec::status::successful_completion);
  CHECK(std::memcmp(buf.data + 512, expect.data(), 4096) == 0);
}

TEST_CASE("PRP2 points to a PRP list when the transfer spans more than two pages") {
  io_fixture f;
  dma_buffer list(f.ctrl, 4096);
  dma_buffer a(f.ctrl, 4096), b(f.ctrl, 4096), c(f.ctrl, 4096), d(f.ctrl, 4096);
  std::vector<std::byte> expect(4 * 4096);
  fill_pattern(expect.data(), expect.size(), 3);
  f.ctrl.store(1).write(4096, expect.data(), expect.size());
  // Scattered pages, in an order unlike their addresses.
  list.as<std::uint64_t>()[0] = c.bus;
  list.as<std::uint64_t>()[1] = a.bus;
  list.as<std::uint64_t>()[2] = d.bus;
  REQUIRE(f.io(spec::make_rw(spec::nvm_opcode::read, 1, 8, 32, b.bus, list.bus)) == spec::status::successful_completion);
  CHECK(std::memcmp(b.data, expect.data(), 4096) == 0);
  CHECK(std::memcmp(c.data, expect.data() + 4096, 4096) == 0);
  CHECK(std::memcmp(a.data, expect.data() + 8192, 4096) == 0);
  CHECK(std::memcmp(d.data, expect.data() + 12288, 4096) == 0);
}

TEST_CASE("a PRP list that reaches the end of its page chains to the next list page") {
  io_fixture f;
  dma_buffer lists(f.ctrl, 2 * 4096);
  dma_buffer data(f.ctrl, 5 * 4096);
  std::vector<std::byte> expect(5 * 4096);
  fill_pattern(expect.data(), expect.size(), 4);
  f.ctrl.store(1).write(0, expect.data(), expect.size());
  // The list starts 16 bytes before the end of its page: one data entry, then a chain pointer.
  auto* first = reinterpret_cast<std::uint64_t*>(lists.data + 4096 - 16);
  auto* second = reinterpret_cast<std::uint64_t*>(lists.data + 4096);
  first[0] = data.bus + 4096;
  first[1] = lists.bus + 4096;
  second[0] = data.bus + 2 * 4096;
  second[1] = data.bus + 3 * 4096;
  second[2] = data.bus + 4 * 4096;
  REQUIRE(f.io(spec::make_rw(spec::nvm_opcode::read, 1, 0, 40, data.bus, lists.bus + 4096 - 16)) == spec::status::successful_completion);
  CHECK(std::memcmp(data.data, expect.data(), expect.size()) == 0);
}

TEST_CASE("a PRP1 that is not dword aligned is PRP Offset Invalid") {
  io_fixture f;
  dma_buffer buf(f.ctrl, 8192);
  CHECK(f.io(spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, buf.bus + 2)) == spec::status::prp_offset_invalid);
}

TEST_CASE("a PRP2 page entry with an offset is PRP Offset Invalid") {
  io_fixture f;
  dma_buffer buf(f.ctrl, 3 * 4096);
  CHECK(f.io(spec::make_rw(spec::nvm_opcode::read, 1, 0, 16, buf.bus, buf.bus + 4096 + 8)) == spec::status::prp_offset_invalid);
}

TEST_CASE("a PRP list entry with an offset is PRP Offset Invalid") {
  io_fixture f;
  dma_buffer list(f.ctrl, 4096), buf(f.ctrl, 4 * 4096);
  list.as<std::uint64_t>()[0] = buf.bus + 4096;
  list.as<std::uint64_t>()[1] = buf.bus + 2 * 4096 + 512;
  CHECK(f.io(spec::make_rw(spec::nvm_opcode::read, 1, 0, 24, buf.bus, list.bus)) == spec::status::prp_offset_invalid);
}

TEST_CASE("a PRP list pointer that is not dword aligned is PRP Offset Invalid") {
  io_fixture f;
  dma_buffer list(f.ctrl, 4096), buf(f.ctrl, 4 * 4096);
  CHECK(f.io(spec::make_rw(spec::nvm_opcode::read, 1, 0, 24, buf.bus, list.bus + 6)) == spec::status::prp_offset_invalid);
}

TEST_CASE("a PRP pointing outside registered memory is Data Transfer Error and touches nothing") {
  io_fixture f;
  dma_buffer buf(f.ctrl, 4096);
  const auto faults = f.ctrl.stats().dma_faults;
  CHECK(f.io(spec::make_rw(spec::nvm_opcode::read, 1, 0, 8, 0xdead0000)) == spec::status::data_transfer_error);
  // Runs off the end of a registered region: the second page is not registered.
  CHECK(f.io(spec::make_rw(spec::nvm_opcode::read, 1, 0, 16, buf.bus, buf.bus + 4096)) == spec::status::data_transfer_error);
  dma_buffer list(f.ctrl, 4096);
  list.as<std::uint64_t>()[0] = 0x7777000;
  CHECK(f.io(spec::make_rw(spec::nvm_opcode::read, 1, 0, 24, buf.bus, list.bus)) == spec::status::data_transfer_error);
  CHECK(f.ctrl.stats().dma_faults >= faults + 3);
}

TEST_CASE("an LBA range past the end of the namespace is LBA Out of Range") {
  emu::controller_config config;
  config.namespaces = {emu::namespace_config::in_memory(512, 1000)};
  io_fixture f(config);
  dma_buffer buf(f.ctrl, 8192);
  CHECK(f.io(spec::make_rw(spec::nvm_opcode::read, 1, 999, 1, buf.bus)) == spec::status::successful_completion);
  CHECK(f.io(spec::make_rw(spec::nvm_opcode::read, 1, 999, 2, buf.bus)) == spec::status::lba_out_of_range);
  CHECK(f.io(spec::make_rw(spec::nvm_opcode::write, 1, 1000, 1, buf.bus)) == spec::status::lba_out_of_range);
  CHECK(f.io(spec::make_rw(spec::nvm_opcode::read, 1, ~0ull, 1, buf.bus)) == spec::status::lba_out_of_range);
  spec::submission_entry wz = spec::make_rw(spec::nvm_opcode::write_zeroes, 1, 990, 11);
  CHECK(f.io(wz) == spec::status::lba_out_of_range);
}

TEST_CASE("I/O to a namespace that does not exist is Invalid Namespace or Format") {
  io_fixture f;
  dma_buffer buf(f.ctrl, 4096);
  CHECK(f.io(spec::make_rw(spec::nvm_opcode::read, 0, 0, 1, buf.bus)) == spec::status::invalid_namespace_or_format);
  CHECK(f.io(spec::make_rw(spec::nvm_opcode::read, 2, 0, 1, buf.bus)) == spec::status::invalid_namespace_or_format);
  CHECK(f.io(spec::make_flush(3)) == spec::status::invalid_namespace_or_format);
}

TEST_CASE("a transfer larger than MDTS is Invalid Field in Command") {
  emu::controller_config config;
  config.mdts = 2;  // 16 KiB
  io_fixture f(config);
  dma_buffer list(f.ctrl, 4096), buf(f.ctrl, 8 * 4096);
  for (int i = 0; i < 7; ++i) list.as<std::uint64_t>()[i] = buf.bus + 4096u * (i + 1u);
  CHECK(f.io(spec::make_rw(spec::nvm_opcode::read, 1, 0, 32, buf.bus, list.bus)) == spec::status::successful_completion);
  CHECK(f.io(spec::make_rw(spec::nvm_opcode::read, 1, 0, 33, buf.bus, list.bus)) == spec::status::invalid_field_in_command);
}

TEST_CASE("an unknown I/O opcode is Invalid Command Opcode, a fused one Invalid Field") {
  io_fixture f;
  spec::submission_entry sqe{};
  sqe.set_opcode(std::uint8_t{0x7d});
  sqe.nsid = 1;
  CHECK(f.io(sqe) == spec::status::invalid_command_opcode);
  auto fused = spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, 0);
  fused.set_fuse(spec::fused_operation::first_command);
  CHECK(f.io(fused) == spec::status::invalid_field_in_command);
  auto sgl = spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, 0);
  sgl.set_psdt(spec::data_transfer_kind::sgl_metadata_buffer);
  CHECK(f.io(sgl) == spec::status::invalid_field_in_command);
}

TEST_CASE("Write Zeroes makes the range read back as zeros") {
  io_fixture f;
  std::vector<std::byte> junk(8192, std::byte{0xa5});
  f.ctrl.store(1).write(0, junk.data(), junk.size());
  REQUIRE(f.io(spec::make_rw(spec::nvm_opcode::write_zeroes, 1, 4, 8)) == spec::status::successful_completion);
  dma_buffer in(f.ctrl, 8192);
  REQUIRE(f.io(spec::make_rw(spec::nvm_opcode::read, 1, 0, 16, in.bus, in.bus + 4096)) == spec::status::successful_completion);
  for (std::size_t i = 0; i < 8192; ++i) {
    const bool zeroed = i >= 4 * 512 && i < 12 * 512;
    if (in.data[i] != (zeroed ? std::byte{0} : std::byte{0xa5})) FAIL("byte " << i << " is wrong");
  }
}

TEST_CASE("Dataset Management deallocate makes each range read as zeros; a bad range fails the whole command") {
  io_fixture f;
  std::vector<std::byte> junk(64 * 512, std::byte{0x5a});
  f.ctrl.store(1).write(0, junk.data(), junk.size());
  dma_buffer ranges(f.ctrl, 4096);
  auto* r = ranges.as<spec::dsm_range>();
  r[0] = spec::dsm_range{0, 4, 8};
  r[1] = spec::dsm_range{0, 2, 40};
  REQUIRE(f.io(spec::make_dataset_management(1, 2, ranges.bus)) == spec::status::successful_completion);
  std::vector<std::byte> got(64 * 512);
  f.ctrl.store(1).read(0, got.data(), got.size());
  for (std::size_t lba = 0; lba < 64; ++lba) {
    const bool zeroed = (lba >= 8 && lba < 12) || (lba >= 40 && lba < 42);
    CHECK_MESSAGE(got[lba * 512] == (zeroed ? std::byte{0} : std::byte{0x5a}), "LBA " << lba);
  }
  r[0] = spec::dsm_range{0, 4, 20};
  r[1] = spec::dsm_range{0, 4, f.ctrl.store(1).size() / 512};
  CHECK(f.io(spec::make_dataset_management(1, 2, ranges.bus)) == spec::status::lba_out_of_range);
  f.ctrl.store(1).read(20 * 512, got.data(), 512);
  CHECK(got[0] == std::byte{0x5a});
}

TEST_CASE("Flush completes for a namespace and for all namespaces") {
  io_fixture f;
  CHECK(f.io(spec::make_flush(1)) == spec::status::successful_completion);
  CHECK(f.io(spec::make_flush(0xffffffff)) == spec::status::successful_completion);
}

TEST_CASE("queues wrap and the phase tag flips on every pass") {
  emu::controller ctrl;
  test_host host(ctrl);
  REQUIRE(host.enable());
  auto q = host.create_pair(2, 4);
  dma_buffer buf(ctrl, 4096);
  std::set<bool> phases;
  for (int i = 0; i < 13; ++i) {
    phases.insert(q->phase);
    const auto cqe = host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, static_cast<std::uint64_t>(i), 1, buf.bus));
    CHECK(cqe.status() == spec::status::successful_completion);
    CHECK(cqe.sqhd == (i + 1) % 4);
  }
  CHECK(phases.size() == 2);
}

TEST_CASE("a full completion queue holds completions back until the host frees entries") {
  emu::controller ctrl;
  test_host host(ctrl);
  REQUIRE(host.enable());
  // A 4-entry CQ behind an 8-entry SQ: at most 3 completions fit before the host consumes.
  auto [q, cq] = pair_with_small_cq(ctrl, host, 8, 4);
  dma_buffer buf(ctrl, 4096);
  for (int i = 0; i < 6; ++i) host.place(*q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, buf.bus));
  host.ring_sq(*q);
  REQUIRE(test_host::eventually([&] { return ctrl.stats().io_commands == 6; }));
  // Three I/O completions fit (two admin commands came before them), however slowly they are
  // posted on a loaded machine; then no more may come while the host consumes nothing.
  REQUIRE(test_host::eventually([&] { return ctrl.stats().completions_posted == 2 + 3; }));
  std::this_thread::sleep_for(20ms);
  CHECK(ctrl.stats().completions_posted == 2 + 3);
  // Consume through a view of the 4-entry CQ.
  std::uint32_t head = 0;
  bool phase = true;
  int seen = 0;
  for (; seen < 6; ++seen) {
    auto* slot = cq->as<spec::completion_entry>() + head;
    REQUIRE(test_host::eventually([&] {
      return test_host::phase_of(slot) == phase;
    }));
    CHECK(slot->status() == spec::status::successful_completion);
    head = (head + 1) % 4;
    if (head == 0) phase = !phase;
    host.write32(spec::cq_head_doorbell_offset(1, 0), head);
  }
  CHECK(seen == 6);
}

TEST_CASE("with out-of-order completion a batch completes in a different order, every command once") {
  emu::controller_config config;
  config.out_of_order_completions = true;
  config.seed = 7;
  io_fixture f(config);
  dma_buffer buf(f.ctrl, 64 * 512);
  std::vector<std::uint16_t> submitted, completed;
  for (int i = 0; i < 32; ++i) submitted.push_back(f.host.place(*f.q, spec::make_rw(spec::nvm_opcode::read, 1, i, 1, buf.bus + 512u * i)));
  f.host.ring_sq(*f.q);
  for (int i = 0; i < 32; ++i) {
    const auto cqe = f.host.next_completion(*f.q);
    REQUIRE(cqe.has_value());
    CHECK(cqe->status() == spec::status::successful_completion);
    completed.push_back(cqe->cid);
  }
  CHECK(completed != submitted);
  std::sort(completed.begin(), completed.end());
  CHECK(completed == submitted);
}

TEST_CASE("a file-backed namespace reads the file and writes reach it") {
  const auto dir = std::filesystem::temp_directory_path() / ("cunvme-emu-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "disk.img";
  {
    std::ofstream file(path, std::ios::binary);
    for (int i = 0; i < 64 * 1024; ++i) file.put(static_cast<char>(i * 7));
  }
  {
    emu::controller_config config;
    config.namespaces = {emu::namespace_config::from_file(path.string())};
    io_fixture f(config);
    dma_buffer page(f.ctrl, 4096);
    REQUIRE(f.host.admin_status(spec::make_identify(spec::identify_cns::namespace_data, 1, page.bus)) == spec::status::successful_completion);
    CHECK(page.as<spec::identify_namespace>()->nsze == 128);
    dma_buffer in(f.ctrl, 4096);
    REQUIRE(f.io(spec::make_rw(spec::nvm_opcode::read, 1, 16, 8, in.bus)) == spec::status::successful_completion);
    for (int i = 0; i < 4096; ++i) {
      if (in.data[i] != static_cast<std::byte>((16 * 512 + i) * 7)) FAIL("byte " << i);
    }
    std::memset(in.data, 0xee, 4096);
    REQUIRE(f.io(spec::make_rw(spec::nvm_opcode::write, 1, 0, 8, in.bus)) == spec::status::successful_completion);
    REQUIRE(f.io(spec::make_flush(1)) == spec::status::successful_completion);
  }
  std::ifstream file(path, std::ios::binary);
  CHECK(file.get() == 0xee);
  std::filesystem::remove_all(dir);
}

TEST_CASE("writes to a read-only file namespace fail with Namespace is Write Protected") {
  const auto dir = std::filesystem::temp_directory_path() / ("cunvme-emu-ro-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "ro.img";
  { std::ofstream(path, std::ios::binary) << std::string(8192, 'x'); }
  {
    emu::controller_config config;
    auto ns = emu::namespace_config::from_file(path.string());
    ns.read_only = true;
    config.namespaces = {ns};
    io_fixture f(config);
    dma_buffer buf(f.ctrl, 4096);
    CHECK(f.io(spec::make_rw(spec::nvm_opcode::read, 1, 0, 8, buf.bus)) == spec::status::successful_completion);
    CHECK(buf.data[0] == std::byte{'x'});
    CHECK(f.io(spec::make_rw(spec::nvm_opcode::write, 1, 0, 8, buf.bus)) == spec::status::namespace_is_write_protected);
    CHECK(f.io(spec::make_rw(spec::nvm_opcode::write_zeroes, 1, 0, 8)) == spec::status::namespace_is_write_protected);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("4 KiB-block namespaces move 4 KiB per logical block") {
  emu::controller_config config;
  config.namespaces = {emu::namespace_config::in_memory(4096, 256)};
  io_fixture f(config);
  dma_buffer out(f.ctrl, 8192), in(f.ctrl, 8192);
  fill_pattern(out.data, 8192, 9);
  REQUIRE(f.io(spec::make_rw(spec::nvm_opcode::write, 1, 255, 1, out.bus)) == spec::status::successful_completion);
  CHECK(f.io(spec::make_rw(spec::nvm_opcode::write, 1, 255, 2, out.bus, out.bus + 4096)) == spec::status::lba_out_of_range);
  REQUIRE(f.io(spec::make_rw(spec::nvm_opcode::read, 1, 255, 1, in.bus)) == spec::status::successful_completion);
  CHECK(std::memcmp(out.data, in.data, 4096) == 0);
}

TEST_CASE("extended-LBA namespaces move lba_size + ms bytes per block, data and metadata interleaved") {
  emu::controller_config config;
  config.namespaces = {emu::namespace_config::in_memory(512, 64).with_metadata(8, true)};
  io_fixture f(config);
  constexpr std::size_t bytes = 7 * 520;
  dma_buffer out(f.ctrl, 3 * 4096), in(f.ctrl, 3 * 4096);
  fill_pattern(out.data, bytes, 11);
  std::memset(in.data, 0xa5, in.size);
  REQUIRE(f.io(spec::make_rw(spec::nvm_opcode::write, 1, 10, 7, out.bus)) == spec::status::successful_completion);
  REQUIRE(f.io(spec::make_rw(spec::nvm_opcode::read, 1, 10, 7, in.bus)) == spec::status::successful_completion);
  CHECK(std::memcmp(out.data, in.data, bytes) == 0);
  CHECK(std::all_of(in.data + bytes, in.data + in.size, [](std::byte b) { return b == std::byte{0xa5}; }));
  std::vector<std::byte> direct(bytes);
  f.ctrl.store(1).read(10 * 520, direct.data(), direct.size());
  CHECK(std::memcmp(out.data, direct.data(), bytes) == 0);
}

TEST_CASE("MDTS counts interleaved metadata: as many 520-byte blocks as 512-byte ones are Invalid Field") {
  emu::controller_config config;
  config.namespaces = {emu::namespace_config::in_memory(512, 4096).with_metadata(8, true)};
  io_fixture f(config);
  dma_buffer buf(f.ctrl, 4096);
  const std::uint32_t mdts_blocks = (512u << 10) / 512;  // fits MDTS as plain 512-byte blocks
  CHECK(f.io(spec::make_rw(spec::nvm_opcode::read, 1, 0, mdts_blocks, buf.bus)) == spec::status::invalid_field_in_command);
}

TEST_CASE("separate-metadata namespaces move ms bytes per block through MPTR and lba_size through the PRPs") {
  emu::controller_config config;
  config.namespaces = {emu::namespace_config::in_memory(512, 64).with_metadata(8, false)};
  io_fixture f(config);
  dma_buffer out(f.ctrl, 4096), in(f.ctrl, 4096), meta_out(f.ctrl, 4096), meta_in(f.ctrl, 4096);
  fill_pattern(out.data, 7 * 512, 12);
  fill_pattern(meta_out.data, 7 * 8, 13);
  std::memset(in.data, 0xa5, in.size);
  std::memset(meta_in.data, 0xa5, meta_in.size);
  auto write = spec::make_rw(spec::nvm_opcode::write, 1, 20, 7, out.bus);
  write.mptr = meta_out.bus;
  REQUIRE(f.io(write) == spec::status::successful_completion);
  auto read = spec::make_rw(spec::nvm_opcode::read, 1, 20, 7, in.bus);
  read.mptr = meta_in.bus + 4;
  REQUIRE(f.io(read) == spec::status::successful_completion);
  CHECK(std::memcmp(out.data, in.data, 7 * 512) == 0);
  CHECK(std::all_of(in.data + 7 * 512, in.data + in.size, [](std::byte b) { return b == std::byte{0xa5}; }));
  CHECK(std::memcmp(meta_out.data, meta_in.data + 4, 7 * 8) == 0);
  CHECK(std::all_of(meta_in.data, meta_in.data + 4, [](std::byte b) { return b == std::byte{0xa5}; }));
  CHECK(std::all_of(meta_in.data + 4 + 7 * 8, meta_in.data + meta_in.size, [](std::byte b) { return b == std::byte{0xa5}; }));
  // The store keeps data, then metadata (namespace_config).
  std::vector<std::byte> direct(7 * 8);
  f.ctrl.store(1).read(64 * 512 + 20 * 8, direct.data(), direct.size());
  CHECK(std::memcmp(meta_out.data, direct.data(), direct.size()) == 0);
}

TEST_CASE("an MPTR that is not dword aligned is Invalid Field; one outside registered memory is Data Transfer Error") {
  emu::controller_config config;
  config.namespaces = {emu::namespace_config::in_memory(512, 64).with_metadata(8, false)};
  io_fixture f(config);
  dma_buffer data(f.ctrl, 4096), meta(f.ctrl, 4096);
  std::memset(meta.data, 0xa5, meta.size);
  auto read = spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, data.bus);
  read.mptr = meta.bus + 2;
  CHECK(f.io(read) == spec::status::invalid_field_in_command);
  read.mptr = meta.bus + 4096 - 4;  // the 8 bytes run past the registered page
  CHECK(f.io(read) == spec::status::data_transfer_error);
  CHECK(std::all_of(meta.data, meta.data + meta.size, [](std::byte b) { return b == std::byte{0xa5}; }));
}

TEST_CASE("Write Zeroes on a separate-metadata namespace zeroes the blocks' metadata too") {
  emu::controller_config config;
  config.namespaces = {emu::namespace_config::in_memory(512, 64).with_metadata(8, false)};
  io_fixture f(config);
  dma_buffer data(f.ctrl, 4096), meta(f.ctrl, 4096);
  std::memset(meta.data, 0x5a, 16);
  auto write = spec::make_rw(spec::nvm_opcode::write, 1, 3, 2, data.bus);
  write.mptr = meta.bus;
  REQUIRE(f.io(write) == spec::status::successful_completion);
  REQUIRE(f.io(spec::make_rw(spec::nvm_opcode::write_zeroes, 1, 3, 2)) == spec::status::successful_completion);
  auto read = spec::make_rw(spec::nvm_opcode::read, 1, 3, 2, data.bus);
  read.mptr = meta.bus;
  REQUIRE(f.io(read) == spec::status::successful_completion);
  CHECK(std::all_of(meta.data, meta.data + 16, [](std::byte b) { return b == std::byte{0}; }));
}

TEST_CASE("a metadata size above 4096 or a namespace of more than 2^64 bytes is refused at construction") {
  emu::controller_config config;
  config.namespaces = {emu::namespace_config::in_memory(512, 64).with_metadata(4097, true)};
  CHECK_THROWS_AS(emu::controller{config}, std::invalid_argument);
  config.namespaces = {emu::namespace_config::in_memory(512, (~std::uint64_t{0} / 512)).with_metadata(8, true)};
  CHECK_THROWS_AS(emu::controller{config}, std::invalid_argument);
}

TEST_CASE("submission queues and PRP lists may live in the controller memory buffer") {
  emu::controller_config config;
  config.cmb_bytes = 64 * 1024;
  emu::controller ctrl(config);
  test_host host(ctrl);
  CHECK(host.cap().cmbs());
  // CMBLOC/CMBSZ read zero until CMBMSC.CRE is set (NVMe 1.4).
  CHECK(host.reg(spec::register_offset::cmbsz) == 0);
  host.set_reg64(spec::register_offset::cmbmsc,
                 spec::cmbmsc_register{}.set_cre(true).set_cmse(true).set_controller_base_address(emu::controller::suggested_cmb_address).raw);
  REQUIRE(test_host::eventually([&] { return host.reg(spec::register_offset::cmbsz) != 0; }));
  const spec::cmbsz_register sz{host.reg(spec::register_offset::cmbsz)};
  CHECK(sz.sqs());
  CHECK(sz.lists());
  CHECK_FALSE(sz.cqs());
  CHECK(sz.size_bytes() == 64 * 1024);
  REQUIRE(host.enable());
  REQUIRE(test_host::eventually([&] { return ctrl.dma().find(emu::controller::suggested_cmb_address, 4096).has_value(); }));

  // SQ 1 at the start of the CMB, a PRP list at 16 KiB; data in host memory.
  const std::uint64_t cmb = emu::controller::suggested_cmb_address;
  auto q = std::make_unique<queue_pair>(ctrl, 1, 16, ctrl.cmb(), cmb);
  REQUIRE(host.admin_status(spec::make_create_io_cq(1, 16, q->cq.bus)) == spec::status::successful_completion);
  REQUIRE(host.admin_status(spec::make_create_io_sq(1, 16, cmb, 1)) == spec::status::successful_completion);
  dma_buffer data(ctrl, 3 * 4096);
  std::vector<std::byte> expect(3 * 4096);
  fill_pattern(expect.data(), expect.size(), 11);
  ctrl.store(1).write(0, expect.data(), expect.size());
  auto* list = reinterpret_cast<std::uint64_t*>(ctrl.cmb() + 16384);
  list[0] = data.bus + 4096;
  list[1] = data.bus + 8192;
  CHECK(host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 24, data.bus, cmb + 16384)).status() == spec::status::successful_completion);
  CHECK(std::memcmp(data.data, expect.data(), expect.size()) == 0);

  // Data in the CMB and in host memory within one command: Invalid Use of CMB (CDPMLS = 0).
  CHECK(host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 16, data.bus, cmb + 32768)).status() ==
        spec::status::invalid_use_of_controller_memory_buffer);
  // A completion queue in the CMB is refused: CMBSZ.CQS is 0.
  CHECK(host.admin_status(spec::make_create_io_cq(2, 16, cmb + 49152)) == spec::status::invalid_use_of_controller_memory_buffer);
}

TEST_CASE("a CMB base address overlapping registered memory is flagged in CMBSTS.CBAI") {
  emu::controller_config config;
  config.cmb_bytes = 8192;
  emu::controller ctrl(config);
  test_host host(ctrl);
  dma_buffer taken(ctrl, 4096);
  host.set_reg64(spec::register_offset::cmbmsc,
                 spec::cmbmsc_register{}.set_cre(true).set_cmse(true).set_controller_base_address(taken.bus & ~0xfffull).raw);
  CHECK(test_host::eventually([&] { return host.reg(spec::register_offset::cmbsts) == 1; }));
}

TEST_CASE("a host that never consumes its completion queue cannot make the controller queue without bound") {
  emu::controller ctrl;
  test_host host(ctrl);
  REQUIRE(host.enable());
  auto [q, cq] = pair_with_small_cq(ctrl, host, 64, 4);
  dma_buffer buf(ctrl, 4096);
  for (int i = 0; i < 60; ++i) host.place(*q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, buf.bus));
  host.ring_sq(*q);
  REQUIRE(test_host::eventually([&] { return ctrl.stats().io_commands >= 4; }));
  std::this_thread::sleep_for(50ms);
  CHECK(ctrl.stats().io_commands <= 8);  // at most two CQs' worth fetched
  // Once the host consumes, every command completes, exactly once.
  std::uint32_t head = 0;
  bool phase = true;
  for (int seen = 0; seen < 60; ++seen) {
    auto* slot = cq->as<spec::completion_entry>() + head;
    REQUIRE(test_host::eventually([&] { return test_host::phase_of(slot) == phase; }));
    head = (head + 1) % 4;
    if (head == 0) phase = !phase;
    host.write32(spec::cq_head_doorbell_offset(1, 0), head);
  }
  CHECK(ctrl.stats().io_commands == 60);
  CHECK(ctrl.stats().doorbell_errors == 0);
}

// ---- without data movement (controller_config::move_data = false) ------------------------------

namespace {

emu::controller_config without_data_movement(emu::controller_config config = {}) {
  config.move_data = false;
  return config;
}

}  // namespace

TEST_CASE("without data movement a read completes, leaves the buffer as it was and counts its bytes") {
  io_fixture f(without_data_movement());
  CHECK_FALSE(f.ctrl.moves_data());
  std::vector<std::byte> stored(4096);
  fill_pattern(stored.data(), stored.size(), 5);
  f.ctrl.store(1).write(0, stored.data(), stored.size());
  dma_buffer in(f.ctrl, 4096);
  std::memset(in.data, 0xab, 4096);
  CHECK(f.io(spec::make_rw(spec::nvm_opcode::read, 1, 0, 8, in.bus)) == spec::status::successful_completion);
  CHECK(std::all_of(in.data, in.data + 4096, [](std::byte b) { return b == std::byte{0xab}; }));
  CHECK(f.ctrl.stats().bytes_read == 4096);
}

TEST_CASE("without data movement a write completes, leaves the namespace as it was and counts its bytes") {
  io_fixture f(without_data_movement());
  std::vector<std::byte> stored(4096);
  fill_pattern(stored.data(), stored.size(), 6);
  f.ctrl.store(1).write(100 * 512, stored.data(), stored.size());
  dma_buffer out(f.ctrl, 4096);
  std::memset(out.data, 0xcd, 4096);
  CHECK(f.io(spec::make_rw(spec::nvm_opcode::write, 1, 100, 8, out.bus)) == spec::status::successful_completion);
  std::vector<std::byte> after(4096);
  f.ctrl.store(1).read(100 * 512, after.data(), after.size());
  CHECK(after == stored);
  CHECK(f.ctrl.stats().bytes_written == 4096);
}

TEST_CASE("without data movement bad reads and writes fail with the statuses they fail with when data moves") {
  // The same commands against a controller that moves data and one that does not.
  const auto statuses = [](bool move_data) {
    emu::controller_config config;
    config.move_data = move_data;
    config.mdts = 2;  // 16 KiB
    config.namespaces = {emu::namespace_config::in_memory(512, 1000)};
    io_fixture f(config);
    dma_buffer list(f.ctrl, 4096), buf(f.ctrl, 8 * 4096);
    list.as<std::uint64_t>()[0] = buf.bus + 4096;
    list.as<std::uint64_t>()[1] = buf.bus + 2 * 4096 + 512;  // an entry with an offset
    return std::vector<spec::status>{
        f.io(spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, buf.bus + 2)),                  // PRP1 not dword aligned
        f.io(spec::make_rw(spec::nvm_opcode::write, 1, 0, 16, buf.bus, buf.bus + 4096 + 8)),  // PRP2 entry with an offset
        f.io(spec::make_rw(spec::nvm_opcode::read, 1, 0, 24, buf.bus, list.bus)),            // PRP list entry with an offset
        f.io(spec::make_rw(spec::nvm_opcode::read, 1, 0, 8, 0xdead0000)),                    // outside registered memory
        f.io(spec::make_rw(spec::nvm_opcode::write, 1, 999, 2, buf.bus)),                    // past the namespace's end
        f.io(spec::make_rw(spec::nvm_opcode::read, 2, 0, 1, buf.bus)),                       // no namespace 2
        f.io(spec::make_rw(spec::nvm_opcode::read, 1, 0, 33, buf.bus, list.bus)),            // above MDTS
    };
  };
  const auto moved = statuses(true);
  CHECK(moved == std::vector<spec::status>{spec::status::prp_offset_invalid, spec::status::prp_offset_invalid,
                                           spec::status::prp_offset_invalid, spec::status::data_transfer_error,
                                           spec::status::lba_out_of_range, spec::status::invalid_namespace_or_format,
                                           spec::status::invalid_field_in_command});
  CHECK(statuses(false) == moved);
}

namespace {
/// A controller whose `memory_kind::device` regions are reached through a fake copier that
/// counts its waits and can be told to fail them, with a 64 KiB "device" buffer mapped.
struct device_copy_fixture {
  static emu::controller_config config(std::atomic<int>& waits, std::atomic<bool>& fail_waits) {
    emu::controller_config c;
    c.workers = 1;
    c.memory.device_copy.copy = [](void* dst, const void* src, std::uint64_t n, bool, int) {
      std::memcpy(dst, src, n);
      return true;
    };
    c.memory.device_copy.wait = [&waits, &fail_waits] {
      waits.fetch_add(1);
      return !fail_waits.load();
    };
    return c;
  }
  device_copy_fixture() : f(config(waits, fail_waits)) {
    device = static_cast<std::byte*>(std::aligned_alloc(4096, 64 * 1024));
    std::memset(device, 0, 64 * 1024);
    bus = f.ctrl.dma().map(device, 64 * 1024, emu::memory_kind::device);
  }
  ~device_copy_fixture() {
    f.ctrl.dma().unmap(bus);
    std::free(device);
  }
  /// Places `n` 4 KiB reads into the device buffer and rings once; returns their statuses.
  std::vector<spec::status> burst_of_reads(std::uint32_t n) {
    for (std::uint32_t i = 0; i < n; ++i) f.host.place(*f.q, spec::make_rw(spec::nvm_opcode::read, 1, 8 * i, 8, bus + 4096 * i));
    f.host.ring_sq(*f.q);
    std::vector<spec::status> statuses;
    for (std::uint32_t i = 0; i < n; ++i) {
      const auto cqe = f.host.next_completion(*f.q);
      REQUIRE(cqe.has_value());
      statuses.push_back(cqe->status());
    }
    return statuses;
  }
  std::atomic<int> waits{0};
  std::atomic<bool> fail_waits{false};
  io_fixture f;
  std::byte* device = nullptr;
  std::uint64_t bus = 0;
};
}  // namespace

TEST_CASE("a burst of reads into device memory waits once for all its copies, not once per command") {
  device_copy_fixture d;
  std::vector<std::byte> expect(16 * 4096);
  fill_pattern(expect.data(), expect.size(), 9);
  d.f.ctrl.store(1).write(0, expect.data(), expect.size());
  const int before = d.waits.load();
  const auto statuses = d.burst_of_reads(16);
  CHECK(std::count(statuses.begin(), statuses.end(), spec::status::successful_completion) == 16);
  CHECK(std::memcmp(d.device, expect.data(), expect.size()) == 0);
  // One burst (or a few, if the worker looked before all 16 were placed), never 16 waits.
  CHECK(d.waits.load() - before >= 1);
  CHECK(d.waits.load() - before < 16);
}

TEST_CASE("reads whose copies into device memory fail at the burst's wait complete with Data Transfer Error") {
  device_copy_fixture d;
  d.fail_waits = true;
  const auto statuses = d.burst_of_reads(4);
  CHECK(std::count(statuses.begin(), statuses.end(), spec::status::data_transfer_error) == 4);
  d.fail_waits = false;
  CHECK(d.burst_of_reads(1).front() == spec::status::successful_completion);
}
