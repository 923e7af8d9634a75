// Recovery as a driver does it, against the emulator's fault injection: a command that times
// out is aborted (Abort), and `controller::reset` brings back a controller in fatal status or
// one holding commands that never complete, with its queue pairs on their identifiers.
#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/backend/emu_backend.cuh>
#include <cunvme/host/queue/io_queue.cuh>
#include <cunvme/io/reader.cuh>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

namespace host = cunvme::host;
namespace emu = cunvme::emu;
namespace spec = cunvme::spec;

namespace {

/// An emulator whose `nth` command of `opcode` meets `action` (`delay_ns` for add_delay).
emu::controller_config faulty(emu::fault_action action, spec::nvm_opcode opcode, std::uint64_t nth = 1, std::uint64_t delay_ns = 0) {
  emu::controller_config config;
  config.namespaces = {emu::namespace_config::in_memory(512, 4096)};
  emu::fault_rule rule;
  rule.action = action;
  rule.opcode = static_cast<std::uint8_t>(opcode);
  rule.nth = nth;
  rule.delay_ns = delay_ns;
  config.faults = {rule};
  return config;
}

host::controller_options short_timeout(int ms = 1000) {
  host::controller_options options;
  options.command_timeout = std::chrono::milliseconds(ms);
  return options;
}

/// Fills `buf` with words derived from `seed`.
void fill_words(host::dma_buffer& buf, std::uint64_t seed) {
  for (std::size_t i = 0; i < buf.size() / 8; ++i) reinterpret_cast<std::uint64_t*>(buf.data())[i] = seed * 0x9e3779b97f4a7c15ull + i;
}

/// Writes 8 blocks at `lba` through `q` and reads them back into fresh memory: true when the
/// data came back.
bool round_trip(host::controller& ctrl, host::queue_pair& q, std::uint64_t lba, std::uint64_t seed) {
  auto out = ctrl.memory().allocate(4096);
  auto in = ctrl.memory().allocate(4096);
  fill_words(out, seed);
  if (q.write(1, lba, 8, out) != spec::status::successful_completion) return false;
  if (q.read(1, lba, 8, in) != spec::status::successful_completion) return false;
  return std::memcmp(in.data(), out.data(), 4096) == 0;
}

}  // namespace

TEST_CASE("a command that times out is aborted: its aborted completion frees the CID at once and is not counted unexpected") {
  auto b = std::make_unique<host::emu_backend>(faulty(emu::fault_action::add_delay, spec::nvm_opcode::read, 1, 30'000'000'000ull));
  // The emulator aborts a command it holds, not one still unfetched in the SQ: 2 s lets it
  // fetch the read however loaded the machine (200 ms once did not).
  host::controller ctrl(std::move(b), short_timeout(2000));
  auto q = ctrl.create_queue_pair(2);  // one CID: the next command needs the timed-out one's
  auto buf = ctrl.memory().allocate(4096);
  CHECK_THROWS_WITH_AS((void)q->read(1, 0, 8, buf), doctest::Contains("no completion within 2000 ms; Abort brought its completion"), host::error);
  CHECK(round_trip(ctrl, *q, 16, 1));
  CHECK(ctrl.unexpected_completions() == 0);
}

TEST_CASE("a command whose completion was lost cannot be aborted: the controller is stopped before the caller gets its buffer back") {
  host::controller ctrl(std::make_unique<host::emu_backend>(faulty(emu::fault_action::lose_completion, spec::nvm_opcode::read)), short_timeout());
  auto q = ctrl.create_queue_pair(8);
  auto buf = ctrl.memory().allocate(4096);
  CHECK_THROWS_WITH_AS((void)q->read(1, 0, 8, buf), doctest::Contains("did not abort 1 command(s) (Abort), so it was stopped (CC.EN = 0)"), host::error);
  CHECK_FALSE(spec::cc_register{ctrl.backend().read32(spec::to_underlying(spec::register_offset::cc))}.en());
  CHECK_FALSE(ctrl.csts().rdy());
  ctrl.reset();
  CHECK(round_trip(ctrl, *q, 16, 7));
}

TEST_CASE("I/O on a controller the library stopped fails at once, saying reset() brings it back") {
  // 2 s per command: a submission that still waited would show against the 1 s bound below
  // (which leaves a loaded CI machine room to schedule the failing call).
  host::controller ctrl(std::make_unique<host::emu_backend>(faulty(emu::fault_action::lose_completion, spec::nvm_opcode::read)), short_timeout(2000));
  auto q = ctrl.create_queue_pair(8);
  auto buf = ctrl.memory().allocate(4096);
  CHECK_THROWS_WITH_AS((void)q->read(1, 0, 8, buf), doctest::Contains("so it was stopped (CC.EN = 0)"), host::error);
  const auto fails_at_once = [](const char* what, auto&& io) {
    CAPTURE(what);
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS(io(), doctest::Contains("controller not ready — reset() brings it back"), host::error);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(1000));
  };
  fails_at_once("read", [&] { (void)q->read(1, 16, 8, buf); });
  fails_at_once("write", [&] { (void)q->write(1, 16, 8, buf); });
  fails_at_once("flush", [&] { (void)q->flush(1); });
  fails_at_once("a raw command", [&] { (void)q->execute(spec::make_flush(1), "Flush"); });
  fails_at_once("a new queue pair", [&] { (void)ctrl.create_queue_pair(8); });
  fails_at_once("a new io_queue", [&] { host::io_queue another(ctrl, 8); });
  fails_at_once("an admin command", [&] { (void)ctrl.log_page(spec::log_page_id::smart_health_information, 512); });
  ctrl.reset();
  CHECK(round_trip(ctrl, *q, 16, 9));
}

TEST_CASE("an admin command without a completion stops the controller before its buffers go") {
  emu::controller_config config = faulty(emu::fault_action::lose_completion, spec::nvm_opcode::read);
  config.faults.front().opcode = static_cast<std::uint8_t>(spec::admin_opcode::get_log_page);
  config.faults.front().admin = true;
  host::controller ctrl(std::make_unique<host::emu_backend>(config), short_timeout());
  CHECK_THROWS_WITH_AS((void)ctrl.log_page(spec::log_page_id::smart_health_information, 512), doctest::Contains("the controller was stopped (CC.EN = 0)"), host::error);
  CHECK_FALSE(ctrl.csts().rdy());
  ctrl.reset();
  CHECK(ctrl.log_page(spec::log_page_id::smart_health_information, 512).size() == 512);
}

TEST_CASE("reset refuses, before stopping anything, a queue pair in memory it could not re-create") {
  host::controller ctrl(std::make_unique<host::emu_backend>());
  // Stand-in for GPU memory the host cannot address: the emulator maps it as device memory.
  std::unique_ptr<std::byte, void (*)(void*)> fake_gpu(static_cast<std::byte*>(std::aligned_alloc(4096, 8192)), std::free);
  auto q = ctrl.create_queue_pair(64, ctrl.memory().map_gpu(fake_gpu.get(), 64 * 64), ctrl.memory().map_gpu(fake_gpu.get() + 4096, 64 * 16));
  CHECK_THROWS_WITH_AS(ctrl.reset(), doctest::Contains("nothing was reset"), host::error);
  CHECK(ctrl.csts().rdy());
  CHECK(ctrl.resets() == 0);
}

TEST_CASE("reset brings back a controller in fatal status, its queue pairs on the same identifiers") {
  host::controller ctrl(std::make_unique<host::emu_backend>(faulty(emu::fault_action::controller_fatal, spec::nvm_opcode::read)), short_timeout());
  auto q = ctrl.create_queue_pair(16);
  const std::uint16_t qid = q->id();
  auto buf = ctrl.memory().allocate(4096);
  CHECK_THROWS_WITH_AS((void)q->read(1, 0, 8, buf), doctest::Contains("controller fatal status"), host::error);
  REQUIRE(ctrl.csts().cfs());
  ctrl.reset();
  CHECK(ctrl.resets() == 1);
  CHECK(ctrl.csts().rdy());
  CHECK_FALSE(ctrl.csts().cfs());
  CHECK(q->id() == qid);
  CHECK(round_trip(ctrl, *q, 64, 2));
  auto another = ctrl.create_queue_pair(16);  // identifiers in use stay taken
  CHECK(another->id() != qid);
  CHECK(round_trip(ctrl, *another, 128, 3));
}

TEST_CASE("reset gives back the CIDs that lost completions held") {
  // Without Abort the controller is not stopped: the next command meets the held CID.
  host::controller_options options = short_timeout();
  options.abort_on_timeout = false;
  host::controller ctrl(std::make_unique<host::emu_backend>(faulty(emu::fault_action::lose_completion, spec::nvm_opcode::read)), options);
  auto q = ctrl.create_queue_pair(2);  // one CID
  auto buf = ctrl.memory().allocate(4096);
  CHECK_THROWS_AS((void)q->read(1, 0, 8, buf), host::error);
  CHECK_THROWS_WITH_AS((void)q->read(1, 0, 8, buf), doctest::Contains("still hold their CIDs"), host::error);
  ctrl.reset();
  CHECK(round_trip(ctrl, *q, 8, 4));
}

TEST_CASE("reset re-creates queues that use shadow doorbells, whose first doorbell after it is an MMIO write") {
  host::controller_options options = short_timeout();
  options.shadow_doorbells = true;
  host::controller ctrl(std::make_unique<host::emu_backend>(faulty(emu::fault_action::controller_fatal, spec::nvm_opcode::flush)), options);
  REQUIRE(ctrl.shadow_doorbells());
  auto q = ctrl.create_queue_pair(16);
  for (int i = 0; i < 5; ++i) REQUIRE(round_trip(ctrl, *q, static_cast<std::uint64_t>(i) * 8, 10 + static_cast<std::uint64_t>(i)));
  CHECK_THROWS_AS((void)q->flush(1), host::error);
  ctrl.reset();
  const std::uint64_t mmio_before = ctrl.mmio_doorbell_writes();
  CHECK(round_trip(ctrl, *q, 256, 20));
  CHECK(ctrl.mmio_doorbell_writes() > mmio_before);
  CHECK(*q->view().sq_shadow == 2);  // the two commands since the reset, counted from the new queue's 0
}

TEST_CASE("reset completes a command still outstanding with Command Aborted By Host for its waiter") {
  auto b = std::make_unique<host::emu_backend>(faulty(emu::fault_action::add_delay, spec::nvm_opcode::read, 1, 30'000'000'000ull));
  const emu::controller& emulated = b->controller();
  host::controller ctrl(std::move(b), short_timeout(10'000));
  host::io_queue q(ctrl, 16, host::queue_placement::host, std::chrono::seconds(10));
  using queue = cunvme::queue_policies<cunvme::slots::multi_producer, cunvme::completion::cooperative>;
  cunvme::block_reader<queue, cunvme::prp::contiguous, cunvme::doorbell::mmio> reader(q.view(), q.namespace_view(1));
  auto buf = ctrl.memory().allocate(4096);
  cunvme::io_handle h = reader.submit_read(0, 8, cunvme::prp::contiguous{buf.bus()}, 0);
  REQUIRE(h.state == cunvme::io_handle::phase::in_flight);
  // The controller has the read (its completion parked) before the reset, not just its doorbell.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (emulated.stats().io_commands == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(emulated.stats().io_commands == 1);
  ctrl.reset();  // the read's completion is 30 s away: the reset takes it
  const cunvme::io_result r = reader.wait(h);
  CHECK(r.error == cunvme::io_error::nvme_status);
  CHECK(r.status == spec::status::command_aborted_by_host);
  CHECK(q.cids_in_use() == 0);
  CHECK(round_trip(ctrl, q.pair(), 32, 5));
}

TEST_CASE("a queue pair whose queues cannot be deleted stops the controller before its memory is released") {
  host::controller ctrl(std::make_unique<host::emu_backend>(faulty(emu::fault_action::controller_fatal, spec::nvm_opcode::read)), short_timeout());
  auto q = ctrl.create_queue_pair(16);
  auto buf = ctrl.memory().allocate(4096);
  CHECK_THROWS_AS((void)q->read(1, 0, 8, buf), host::error);
  q.reset();  // Delete I/O SQ cannot run on a fatal controller: CC.EN = 0 instead
  const spec::cc_register cc{ctrl.backend().read32(spec::to_underlying(spec::register_offset::cc))};
  CHECK_FALSE(cc.en());
  CHECK_FALSE(ctrl.csts().rdy());
  ctrl.reset();
  auto fresh = ctrl.create_queue_pair(16);
  CHECK(round_trip(ctrl, *fresh, 0, 6));
}

TEST_CASE("reset of a controller that was shut down is refused") {
  host::controller ctrl(std::make_unique<host::emu_backend>());
  ctrl.shutdown();
  CHECK_THROWS_WITH_AS(ctrl.reset(), doctest::Contains("shut down"), host::error);
}

TEST_CASE("after a kernel, the commands its threads gave up on are aborted and their CIDs come back at the next drain") {
  auto b = std::make_unique<host::emu_backend>(faulty(emu::fault_action::add_delay, spec::nvm_opcode::read, 1, 30'000'000'000ull));
  host::controller ctrl(std::move(b));
  host::io_queue q(ctrl, 16, host::queue_placement::host, std::chrono::milliseconds(2000));  // fetched before Abort, as above
  using queue = cunvme::queue_policies<cunvme::slots::multi_producer, cunvme::completion::cooperative>;
  cunvme::block_reader<queue, cunvme::prp::contiguous, cunvme::doorbell::mmio> reader(q.view(), q.namespace_view(1));
  auto buf = ctrl.memory().allocate(4096);
  // A CPU thread stands in for the kernel: its read times out and is abandoned.
  CHECK(reader.read(0, 8, cunvme::prp::contiguous{buf.bus()}, 0).error == cunvme::io_error::timeout);
  CHECK(q.cids_in_use() == 1);
  const auto outcome = q.abort_timed_out();
  CHECK(outcome.aborted == 1);
  CHECK(outcome.not_aborted == 0);
  // The next command's wait drains the aborted completion with its own.
  REQUIRE(reader.read(8, 8, cunvme::prp::contiguous{buf.bus()}, 0).ok());
  CHECK(q.cids_in_use() == 0);
  CHECK(q.counters().unexpected_completions == 0);
}

TEST_CASE("a timed-out command whose completion was lost is counted not aborted") {
  host::controller ctrl(std::make_unique<host::emu_backend>(faulty(emu::fault_action::lose_completion, spec::nvm_opcode::read)));
  host::io_queue q(ctrl, 16, host::queue_placement::host, std::chrono::milliseconds(200));
  using queue = cunvme::queue_policies<cunvme::slots::multi_producer, cunvme::completion::cooperative>;
  cunvme::block_reader<queue, cunvme::prp::contiguous, cunvme::doorbell::mmio> reader(q.view(), q.namespace_view(1));
  auto buf = ctrl.memory().allocate(4096);
  CHECK(reader.read(0, 8, cunvme::prp::contiguous{buf.bus()}, 0).error == cunvme::io_error::timeout);
  const auto outcome = q.abort_timed_out();
  CHECK(outcome.aborted == 0);
  CHECK(outcome.not_aborted == 1);
  CHECK(q.cids_in_use() == 1);
}

// ---- one policy for every caller -------------------------------------------------------------
// The host's own I/O (queue_pair), readers and kernels on an io_queue (abort_timed_out), and
// cunvme::device (its recovery runs io_queue::abort_timed_out on each of its queue pairs, then
// resets the controller it owns where the outcome needs_reset(); gpu_test.cu runs it on a GPU)
// end a lost completion the same way.

namespace {
using reader_t = cunvme::block_reader<cunvme::queue_policies<cunvme::slots::multi_producer, cunvme::completion::cooperative>, cunvme::prp::contiguous,
                                      cunvme::doorbell::mmio>;

bool stopped(host::controller& ctrl) {
  return !spec::cc_register{ctrl.backend().read32(spec::to_underlying(spec::register_offset::cc))}.en() && !ctrl.csts().rdy();
}

/// A reader on an io_queue (as a kernel's threads use one) whose first read meets `action` and
/// has timed out: what abort_timed_out then finds.
struct timed_out_reader {
  explicit timed_out_reader(emu::fault_action action, const host::controller_options& options = {})
      : ctrl(std::make_unique<host::emu_backend>(faulty(action, spec::nvm_opcode::read)), options),
        // 1 s: the reads after reset() share this bound, and a loaded 2-core CI machine (tests
        // side by side) once took longer than 200 ms to complete one.
        q(ctrl, 16, host::queue_placement::host, std::chrono::milliseconds(1000)),
        reader(q.view(), q.namespace_view(1)),
        buf(ctrl.memory().allocate(4096)) {
    REQUIRE(reader.read(0, 8, cunvme::prp::contiguous{buf.bus()}, 0).error == cunvme::io_error::timeout);
  }
  host::controller ctrl;
  host::io_queue q;
  reader_t reader;
  host::dma_buffer buf;
};
}  // namespace

TEST_CASE("a reader's command whose completion was lost ends as the host's own I/O does: not aborted, the controller stopped until reset()") {
  timed_out_reader t(emu::fault_action::lose_completion);
  auto& [ctrl, q, reader, buf] = t;
  const host::timeout_outcome outcome = q.abort_timed_out();
  CHECK(outcome.not_aborted == 1);
  CHECK(outcome.stopped);
  CHECK(outcome.needs_reset());
  CHECK(stopped(ctrl));
  CHECK(outcome.describe() == "; the controller did not abort 1 command(s) (Abort), so it was stopped (CC.EN = 0) and moves no more data: reset() brings it back");
  CHECK(q.abort_timed_out().not_aborted == 0);  // handled once
  ctrl.reset();
  CHECK(q.cids_in_use() == 0);
  const cunvme::io_result after = reader.read(8, 8, cunvme::prp::contiguous{buf.bus()}, 0);
  CAPTURE(cunvme::to_string(after));
  CHECK(after.ok());
  CHECK(round_trip(ctrl, q.pair(), 16, 11));
}

TEST_CASE("the host's own I/O and an io_queue's readers report a lost completion in the same words") {
  host::controller own(std::make_unique<host::emu_backend>(faulty(emu::fault_action::lose_completion, spec::nvm_opcode::read)), short_timeout(200));
  auto qp = own.create_queue_pair(8);
  auto a = own.memory().allocate(4096);
  std::string host_error;
  try {
    (void)qp->read(1, 0, 8, a);
  } catch (const host::error& e) {
    host_error = e.what();
  }
  timed_out_reader kernels(emu::fault_action::lose_completion);
  const std::string tail = kernels.q.abort_timed_out().describe();
  REQUIRE_FALSE(tail.empty());
  CHECK(host_error.ends_with(tail));
  CHECK(stopped(own));
  CHECK(stopped(kernels.ctrl));
}

TEST_CASE("an io_queue's aborted command has its completion in once abort_timed_out returns, its CID free, the controller running") {
  auto b = std::make_unique<host::emu_backend>(faulty(emu::fault_action::add_delay, spec::nvm_opcode::read, 1, 30'000'000'000ull));
  host::controller ctrl(std::move(b));
  host::io_queue q(ctrl, 16, host::queue_placement::host, std::chrono::milliseconds(2000));  // fetched before Abort, as above
  reader_t reader(q.view(), q.namespace_view(1));
  auto buf = ctrl.memory().allocate(4096);
  REQUIRE(reader.read(0, 8, cunvme::prp::contiguous{buf.bus()}, 0).error == cunvme::io_error::timeout);
  const host::timeout_outcome outcome = q.abort_timed_out();
  CHECK(outcome.aborted == 1);
  CHECK_FALSE(outcome.needs_reset());
  CHECK(q.cids_in_use() == 0);
  CHECK(q.abandoned_commands() == 0);
  CHECK(ctrl.csts().rdy());
}

TEST_CASE("a reader's timeout on a controller in fatal status is left to reset(), with CSTS.CFS still there to see") {
  timed_out_reader t(emu::fault_action::controller_fatal);
  const host::timeout_outcome outcome = t.q.abort_timed_out();
  CHECK(outcome.fatal);
  CHECK(outcome.needs_reset());
  CHECK(t.ctrl.csts().cfs());
  t.ctrl.reset();
  CHECK(round_trip(t.ctrl, t.q.pair(), 16, 12));
}

TEST_CASE("with abort_on_timeout off no caller aborts or stops anything: the command stays abandoned") {
  host::controller_options options;
  options.abort_on_timeout = false;
  timed_out_reader t(emu::fault_action::lose_completion, options);
  const host::timeout_outcome outcome = t.q.abort_timed_out();
  CHECK(outcome.abort_disabled);
  CHECK_FALSE(outcome.needs_reset());
  CHECK(t.ctrl.csts().rdy());
  CHECK(t.q.abandoned_commands() == 1);
}
