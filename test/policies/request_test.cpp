// What a reader does with each kind of request: asynchronous commands, splitting at MDTS,
// buffers described page by page, PRP lists that chain, and bad input refused with a reason.
#include "policy_fixture.hpp"

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
}  // namespace

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
