// Readers and writers on namespaces formatted with metadata: extended LBAs move
// namespace_view::block_bytes() per block, split at MDTS counting the metadata; separate
// metadata (which needs MPTR, which readers do not supply) and protection information are
// refused with io_error::metadata_unsupported before anything is submitted.
#include "policy_fixture.hpp"

#include <algorithm>
#include <random>
#include <vector>

using namespace test;

namespace {
using mp_reader = reader_of<slots::multi_producer, completion::cooperative, doorbell::mmio>;
using mp_writer = writer_of<slots::multi_producer, completion::cooperative, doorbell::mmio>;

emu::controller_config metadata_config(bool extended, std::uint64_t blocks = 4096) {
  emu::controller_config c;
  c.namespaces = {emu::namespace_config::in_memory(512, blocks).with_metadata(8, extended)};
  return c;
}
}  // namespace

TEST_CASE("a reader on an extended-LBA namespace reads 520 bytes per block, split at MDTS counting the metadata") {
  rig r(metadata_config(true));
  auto& store = r.emulator->store(1);
  std::vector<std::byte> bytes(store.size());
  std::mt19937 rng(5);
  for (auto& b : bytes) b = static_cast<std::byte>(rng());
  store.write(0, bytes.data(), bytes.size());
  host::io_queue q(*r.ctrl, 16);
  mp_reader reader(q.view(), q.namespace_view(1));
  const std::uint64_t blocks = 2 * r.ctrl->max_transfer_bytes() / 512 + 3;
  auto buf = r.ctrl->memory().allocate(blocks * 520 + 4096);
  std::memset(buf.data(), 0xa5, buf.size());
  const io_result got = reader.read(7, blocks, contiguous_of(buf), 0);
  CHECK(got.ok());
  CHECK(std::memcmp(buf.data(), bytes.data() + 7 * 520, blocks * 520) == 0);
  CHECK(std::all_of(buf.data() + blocks * 520, buf.data() + buf.size(), [](std::byte b) { return b == std::byte{0xa5}; }));
}

TEST_CASE("a writer on an extended-LBA namespace stores data and metadata interleaved, 520 bytes per block") {
  rig r(metadata_config(true));
  host::io_queue q(*r.ctrl, 16);
  const auto ns = q.namespace_view(1);
  CHECK(ns.metadata == cunvme::metadata_layout::extended);
  CHECK(ns.metadata_size == 8);
  CHECK(ns.block_bytes() == 520);
  CHECK(ns.max_blocks == r.ctrl->max_transfer_bytes() / 520);
  mp_writer writer(q.view(), ns);
  const std::uint64_t blocks = r.ctrl->max_transfer_bytes() / 512 + 1;
  auto buf = r.ctrl->memory().allocate(blocks * 520);
  std::mt19937 rng(6);
  for (std::size_t i = 0; i < buf.size(); ++i) buf.data()[i] = static_cast<std::byte>(rng());
  REQUIRE(writer.write(11, blocks, contiguous_of(buf), 0).ok());
  std::vector<std::byte> stored(blocks * 520);
  r.emulator->store(1).read(11 * 520, stored.data(), stored.size());
  CHECK(std::memcmp(buf.data(), stored.data(), stored.size()) == 0);
}

TEST_CASE("readers and writers refuse a separate-metadata namespace with metadata_unsupported before submitting") {
  rig r(metadata_config(false));
  host::io_queue q(*r.ctrl, 8);
  const auto ns = q.namespace_view(1);
  CHECK(ns.metadata == cunvme::metadata_layout::separate);
  CHECK_FALSE(ns.transferable());
  mp_reader reader(q.view(), ns);
  mp_writer writer(q.view(), ns);
  auto buf = r.ctrl->memory().allocate(4096);
  std::memset(buf.data(), 0xa5, buf.size());
  CHECK(reader.read(0, 7, contiguous_of(buf), 0).error == io_error::metadata_unsupported);
  CHECK(writer.write(0, 7, contiguous_of(buf), 0).error == io_error::metadata_unsupported);
  const auto h = reader.submit_read(0, 1, contiguous_of(buf), 0);
  CHECK(h.state == cunvme::io_handle::phase::finished);
  CHECK(h.result.error == io_error::metadata_unsupported);
  CHECK(r.emulator->stats().io_commands == 0);
  CHECK(std::all_of(buf.data(), buf.data() + buf.size(), [](std::byte b) { return b == std::byte{0xa5}; }));
  CHECK(std::string(cunvme::to_string(io_error::metadata_unsupported)).find("metadata") != std::string::npos);
}

TEST_CASE("a namespace view with protection information is refused like separate metadata") {
  rig r;
  host::io_queue q(*r.ctrl, 8);
  auto ns = q.namespace_view(1);
  CHECK(ns.transferable());
  ns.protection = true;
  mp_reader reader(q.view(), ns);
  auto buf = r.ctrl->memory().allocate(4096);
  CHECK(reader.read(0, 1, contiguous_of(buf), 0).error == io_error::metadata_unsupported);
}

TEST_CASE("a block count whose bytes with metadata would exceed 2^64 is an invalid request") {
  rig r(metadata_config(true));
  host::io_queue q(*r.ctrl, 8);
  mp_reader reader(q.view(), q.namespace_view(1));
  auto buf = r.ctrl->memory().allocate(4096);
  CHECK(reader.read(0, ~std::uint64_t{0} / 520 + 1, contiguous_of(buf), 0).error == io_error::invalid_request);
}

TEST_CASE("a reader on extended LBAs of 513 bytes splits a request longer than MDTS with every command dword aligned") {
  emu::controller_config c;
  c.namespaces = {emu::namespace_config::in_memory(512, 4096).with_metadata(1, true)};
  rig r(c);
  auto& store = r.emulator->store(1);
  std::vector<std::byte> bytes(store.size());
  std::mt19937 rng(7);
  for (auto& b : bytes) b = static_cast<std::byte>(rng());
  store.write(0, bytes.data(), bytes.size());
  host::io_queue q(*r.ctrl, 16);
  mp_reader reader(q.view(), q.namespace_view(1));
  const std::uint64_t blocks = 2 * r.ctrl->max_transfer_bytes() / 513 + 3;
  auto buf = r.ctrl->memory().allocate(blocks * 513);
  const io_result got = reader.read(5, blocks, contiguous_of(buf), 0);
  CHECK(got.ok());
  CHECK(std::memcmp(buf.data(), bytes.data() + 5 * 513, blocks * 513) == 0);
}

TEST_CASE("a writer refuses with invalid_request before submitting a request whose split commands could not start dword aligned") {
  emu::controller_config c;
  c.mdts = 1;  // 8 KiB: at most 3 blocks of 2561 bytes per command
  c.namespaces = {emu::namespace_config::in_memory(512, 64).with_metadata(2049, true)};
  rig r(c);
  host::io_queue q(*r.ctrl, 8);
  const auto ns = q.namespace_view(1);
  mp_writer writer(q.view(), ns);
  auto buf = r.ctrl->memory().allocate(8 * 2561);
  CHECK(writer.write(0, 8, contiguous_of(buf), 0).error == io_error::invalid_request);
  CHECK(r.emulator->stats().io_commands == 0);
  CHECK(writer.write(0, ns.max_blocks, contiguous_of(buf), 0).ok());
}
