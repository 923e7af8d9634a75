// Errors surface as statuses: injected NVMe errors with the failing LBA range, lost
// completions as bounded timeouts, and the queue keeps working afterwards.
#include "policy_fixture.hpp"

#include <cunvme/emu/fault_injection.cuh>

#include <chrono>
#include <thread>
#include <vector>

using namespace test;
using namespace std::chrono_literals;

namespace {

using mp_reader = reader_of<slots::multi_producer, completion::cooperative, doorbell::mmio>;

}  // namespace

TEST_CASE("an injected read error comes back as the NVMe status with the failing command's LBA range") {
  rig r(with_rule(read_error_at(5000, 5000)));
  host::io_queue q(*r.ctrl, 16);
  mp_reader reader(q.view(), q.namespace_view(1));
  auto buf = r.ctrl->memory().allocate(4 << 20);
  // Blocks 2000..6095 in commands of 1024: the third (4048..5071) holds LBA 5000.
  const io_result res = reader.read(2000, 4096, contiguous_of(buf), 0);
  CHECK(res.error == io_error::nvme_status);
  CHECK(res.status == spec::status::unrecovered_read_error);
  CHECK(res.lba == 4048);
  CHECK(res.blocks == 1024);
  CHECK(reader.read(0, 8, contiguous_of(buf), 0).ok());  // the queue goes on
}

TEST_CASE("in a group the failing command with the lowest LBA is reported to every member") {
  auto config = small_config();
  config.faults = {read_error_at(300, 300), read_error_at(100, 100)};
  rig r(config);
  host::io_queue q(*r.ctrl, 16);
  auto ns = q.namespace_view(1);
  ns.max_blocks = 64;
  auto buf = r.ctrl->memory().allocate(1 << 20);
  std::vector<io_result> results(4);
  cunvme::host_group group(4);
  std::vector<std::thread> threads;
  for (std::uint32_t m = 0; m < 4; ++m) threads.emplace_back([&, m] {
    auto member = group.member_at(m);
    results[m] = mp_reader(q.view(), ns).read(member, 0, 1024, contiguous_of(buf), 0);
  });
  for (auto& t : threads) t.join();
  for (const auto& res : results) {
    CHECK(res.error == io_error::nvme_status);
    CHECK(res.status == spec::status::unrecovered_read_error);
    CHECK(res.lba == 64);
    CHECK(res.blocks == 64);
  }
}

TEST_CASE("a read past the namespace's end is refused by the controller with LBA Out of Range") {
  rig r;
  host::io_queue q(*r.ctrl, 8);
  mp_reader reader(q.view(), q.namespace_view(1));
  auto buf = r.ctrl->memory().allocate(64 * 1024);
  const std::uint64_t last = q.namespace_view(1).lba_count;
  const io_result res = reader.read(last - 4, 8, contiguous_of(buf), 0);
  CHECK(res.error == io_error::nvme_status);
  CHECK(res.status == spec::status::lba_out_of_range);
  CHECK(res.lba == last - 4);
  CHECK(res.blocks == 8);
}

TEST_CASE_TEMPLATE("a lost completion becomes a timeout within the queue's bound, and the CID stays reserved", Completion,
                   completion::cooperative, completion::dedicated_poller) {
  emu::fault_rule lose;
  lose.action = emu::fault_action::lose_completion;
  lose.nth = 2;
  rig r(with_rule(lose));
  // 1 s: long enough that no ordinary command times out on a loaded 2-core machine.
  host::io_queue q(*r.ctrl, 4, host::queue_placement::host, 1s);
  poller_thread<Completion, doorbell::mmio> poller(q.view());
  reader_of<slots::multi_producer, Completion, doorbell::mmio> reader(q.view(), q.namespace_view(1));
  auto buf = r.ctrl->memory().allocate(64 * 1024);
  CHECK(reader.read(0, 8, contiguous_of(buf), 0).ok());
  const auto start = std::chrono::steady_clock::now();
  const io_result lost = reader.read(8, 8, contiguous_of(buf), 0);
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(lost.error == io_error::timeout);
  CHECK(lost.lba == 8);
  CHECK(lost.blocks == 8);
  CHECK(waited >= 1s);
  CHECK(waited < 10s);
  // The abandoned command keeps its CID (a late completion must not meet a new command).
  CHECK(cunvme::cid_pool::in_use(q.view()) == 1);
  for (int i = 0; i < 20; ++i) CHECK(reader.read(16 + 8 * i, 8, contiguous_of(buf), 0).ok());
}

TEST_CASE("a late completion of an abandoned command frees its CID and is not taken for another command") {
  emu::fault_rule slow;
  slow.action = emu::fault_action::add_delay;
  slow.delay_ns = 3'000'000'000;  // 3 s, past the 1 s timeout
  slow.nth = 1;
  rig r(with_rule(slow));
  host::io_queue q(*r.ctrl, 4, host::queue_placement::host, 1s);
  mp_reader reader(q.view(), q.namespace_view(1));
  auto buf = r.ctrl->memory().allocate(64 * 1024);
  CHECK(reader.read(0, 8, contiguous_of(buf), 0).error == io_error::timeout);
  CHECK(cunvme::cid_pool::in_use(q.view()) == 1);
  // Keep reading until the late completion has been drained (and its CID freed). These reads
  // are not meant to time out: a reader on the same queue with a 10 s bound, so a loaded
  // machine (a clean-clone CI on 2 cores) cannot turn a slow round trip into a failure.
  cunvme::queue_view patient = q.view();
  patient.timeout_ns = 10'000'000'000ull;
  mp_reader later(patient, q.namespace_view(1));
  const auto until = std::chrono::steady_clock::now() + 10s;
  std::uint64_t reads = 0;
  while (cunvme::cid_pool::in_use(q.view()) != 0 && std::chrono::steady_clock::now() < until) {
    const io_result r = later.read(8, 8, contiguous_of(buf), 0);
    CHECK_MESSAGE(r.ok(), cunvme::to_string(r));
    ++reads;
  }
  CHECK(cunvme::cid_pool::in_use(q.view()) == 0);
  CHECK(reads > 0);
  CHECK(q.counters().unexpected_completions == 0);
}

TEST_CASE("injected write and flush errors surface from the writer") {
  emu::fault_rule write_fault;
  write_fault.status = spec::status::write_fault;
  write_fault.opcode = static_cast<std::uint8_t>(spec::nvm_opcode::write);
  write_fault.nth = 1;
  emu::fault_rule flush_fault;
  flush_fault.status = spec::status::internal_error;
  flush_fault.opcode = static_cast<std::uint8_t>(spec::nvm_opcode::flush);
  flush_fault.nth = 1;
  auto config = small_config();
  config.faults = {write_fault, flush_fault};
  rig r(config);
  host::io_queue q(*r.ctrl, 8);
  writer_of<slots::exclusive, completion::cooperative, doorbell::mmio> writer(q.view(), q.namespace_view(1));
  auto buf = r.ctrl->memory().allocate(64 * 1024);
  const io_result w = writer.write(40, 16, contiguous_of(buf), 0);
  CHECK(w.error == io_error::nvme_status);
  CHECK(w.status == spec::status::write_fault);
  CHECK(w.lba == 40);
  const io_result f = writer.flush();
  CHECK(f.error == io_error::nvme_status);
  CHECK(f.status == spec::status::internal_error);
  CHECK(writer.write(40, 16, contiguous_of(buf), 0).ok());
  CHECK(writer.flush().ok());
}

TEST_CASE("random injected errors under four threads: every failure is reported, every success verified") {
  emu::fault_rule errors = read_error_at(0, ~0ull);
  errors.fraction = 0.05;
  errors.max_fires = ~0ull;
  rig r(with_rule(errors));
  r.fill();
  host::io_queue q(*r.ctrl, 32);
  const auto ns = q.namespace_view(1);
  std::vector<host::dma_buffer> buffers;
  for (int t = 0; t < 4; ++t) buffers.push_back(r.ctrl->memory().allocate(64 * 1024));
  std::vector<std::uint64_t> failed(4), mismatches(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&, t] {
    reader_of<slots::warp_aggregated, completion::cooperative, doorbell::coalescing<doorbell::mmio>> reader(q.view(), ns);
    auto* words = reinterpret_cast<std::uint64_t*>(buffers[t].data());
    for (std::uint64_t i = 0; i < 500; ++i) {
      const std::uint64_t lba = (i * 7919 + t * 104729) % (ns.lba_count - 16);
      const io_result res = reader.read(lba, 16, contiguous_of(buffers[t]), 0);
      if (!res.ok()) {
        failed[t] += res.error == io_error::nvme_status && res.status == spec::status::unrecovered_read_error && res.lba == lba;
        continue;
      }
      for (std::size_t w = 0; w < 16 * 512 / 8; ++w) mismatches[t] += words[w] != word_at(lba * 512 + w * 8);
    }
  });
  for (auto& t : threads) t.join();
  std::uint64_t total_failed = 0;
  for (int t = 0; t < 4; ++t) {
    total_failed += failed[t];
    CHECK(mismatches[t] == 0);
  }
  CHECK(total_failed == r.emulator->injected_faults().statuses);
  CHECK(total_failed > 0);
}

namespace {
/// One read in flight whose completion the controller loses: its record is the test's to play with.
struct read_without_completion {
  explicit read_without_completion(std::chrono::nanoseconds timeout)
      : r(with_rule(lose_first())), q(*r.ctrl, 4, host::queue_placement::host, timeout), reader(q.view(), q.namespace_view(1)),
        buf(r.ctrl->memory().allocate(64 * 1024)), h(reader.submit_read(0, 8, contiguous_of(buf), 0)) {
    REQUIRE(h.state == cunvme::io_handle::phase::in_flight);
  }
  static emu::fault_rule lose_first() {
    emu::fault_rule lose;
    lose.action = emu::fault_action::lose_completion;
    lose.nth = 1;
    return lose;
  }
  rig r;
  host::io_queue q;
  mp_reader reader;
  host::dma_buffer buf;
  cunvme::io_handle h;
};
}  // namespace

TEST_CASE("a wait whose completion record was freed under it ends at the queue's timeout instead of waiting forever") {
  read_without_completion t(1s);
  // Break the invariant the wait relies on, as a stray give_back would: the record is free.
  cunvme::bookkeeping_word<std::uint32_t>(t.q.view().records[t.h.cid].state).store(static_cast<std::uint32_t>(cunvme::record_state::free));
  const auto start = std::chrono::steady_clock::now();
  const io_result res = t.reader.wait(t.h);
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(res.error == io_error::timeout);
  CHECK(waited >= 1s);
  CHECK(waited < 10s);
  CHECK(t.h.state == cunvme::io_handle::phase::finished);
}

TEST_CASE("a wait whose deadline passes while a drainer is writing its record takes the completion, not a timeout") {
  read_without_completion t(200ms);
  // A drainer claimed the record (deliveries run after the drain lock) and finishes it only
  // after the waiter's deadline has passed.
  cunvme::completion_record& record = t.q.view().records[t.h.cid];
  cunvme::bookkeeping_word<std::uint32_t>(record.state).store(static_cast<std::uint32_t>(cunvme::record_state::delivering));
  std::thread drainer([&] {
    std::this_thread::sleep_for(400ms);
    record.status = static_cast<std::uint16_t>(cunvme::spec::status::successful_completion);
    record.status_field = 0;
    cunvme::bookkeeping_word<std::uint32_t>(record.state).store(static_cast<std::uint32_t>(cunvme::record_state::done), cuda::std::memory_order_release);
  });
  const auto start = std::chrono::steady_clock::now();
  const io_result res = t.reader.wait(t.h);
  const auto waited = std::chrono::steady_clock::now() - start;
  drainer.join();
  CHECK(res.ok());
  CHECK(waited >= 300ms);
  CHECK(t.h.state == cunvme::io_handle::phase::finished);
}

// DESIGN.md rule 4. A 2-entry queue has one CID; a command the reader did not submit (CID 0
// too, its completion late) fills the SQ, so the reader holds CID 0 while it waits for a slot
// and drains that foreign completion itself. Taken for its own, the read would "succeed"
// before its command was even submitted.
TEST_CASE("a completion drained while a reader waits for a slot is not its, though it names the CID it holds") {
  auto config = small_config();
  emu::fault_rule late;
  late.action = emu::fault_action::add_delay;
  late.delay_ns = 200'000'000;
  late.opcode = static_cast<std::uint8_t>(spec::nvm_opcode::flush);
  late.nth = 1;
  config.faults = {late};
  config.timing.read_latency_ns = 50'000'000;
  rig r(config);
  r.fill();
  host::io_queue q(*r.ctrl, 2, host::queue_placement::host, 5s);
  const cunvme::queue_view v = q.view();
  REQUIRE(v.cids() == 1);
  cunvme::single_thread self;
  std::uint64_t ticket = 0;
  REQUIRE(slots::multi_producer::reserve(v, self, 1, cunvme::access::now_ns() + 1'000'000'000, [] {}, ticket));
  auto foreign = spec::make_flush(1);
  foreign.set_cid(0);
  v.sq[v.slot(ticket)] = foreign;
  slots::multi_producer::commit<doorbell::mmio>(v, self, ticket, 1);

  mp_reader reader(v, q.namespace_view(1));
  auto buf = r.ctrl->memory().allocate(4096);
  std::memset(buf.data(), 0xee, buf.size());
  const io_result res = reader.read(8, 8, contiguous_of(buf), 0);
  CHECK(res.ok());
  std::uint64_t bad = 0;
  const auto* words = reinterpret_cast<const std::uint64_t*>(buf.data());
  for (std::uint64_t i = 0; i < 512; ++i) bad += words[i] != word_at(8 * 512 + i * 8);
  CHECK(bad == 0);
  CHECK(q.counters().unexpected_completions == 1);
  CHECK(q.cids_in_use() == 0);
}
