// Host bring-up over the emulator backend: the failure cases come back as clear errors.
#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/backend/emu_backend.cuh>
#include <cunvme/host/queue/io_queue.cuh>
#include <cunvme/host/open.cuh>
#include <cunvme/io/reader.cuh>

#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace host = cunvme::host;
namespace emu = cunvme::emu;
namespace spec = cunvme::spec;

namespace {

std::unique_ptr<host::emu_backend> backend(emu::controller_config config = {}) { return std::make_unique<host::emu_backend>(std::move(config)); }

}  // namespace

TEST_CASE("bring-up identifies the controller and its namespaces and grants queues") {
  emu::controller_config config;
  config.namespaces = {emu::namespace_config::in_memory(512, 1000), emu::namespace_config::in_memory(4096, 50)};
  host::controller ctrl(backend(config));
  CHECK(ctrl.csts().rdy());
  REQUIRE(ctrl.namespaces().size() == 2);
  CHECK(ctrl.namespaces()[0].lba_count == 1000);
  CHECK(ctrl.namespaces()[1].lba_size == 4096);
  CHECK(ctrl.max_transfer_bytes() == 512 * 1024);
  CHECK(ctrl.io_queue_pairs_granted() == 16);
  CHECK(spec::trimmed(ctrl.identify().mn) == "cunvme emulated NVMe controller");
}

TEST_CASE("controller options outside their valid ranges are refused at construction, naming the option and the value") {
  const auto refused = [](host::controller_options o, const std::string& text) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(host::controller(backend(), o), doctest::Contains(text.c_str()), host::error);
  };
  host::controller_options o;
  o.io_queue_pairs = 0;  // would go out as NSQR = FFFFh
  refused(o, "io_queue_pairs = 0");
  o = {};
  o.admin_queue_entries = 1;
  refused(o, "admin_queue_entries = 1");
  o = {};
  o.admin_queue_entries = 4097;
  refused(o, "admin_queue_entries = 4097");
  o = {};
  o.command_timeout = std::chrono::milliseconds(0);
  refused(o, "command_timeout = 0 ms");
  o = {};
  o.command_timeout = std::chrono::milliseconds(-5);
  refused(o, "command_timeout = -5 ms");
  o = {};
  o.command_timeout = std::chrono::milliseconds::max();  // now() + timeout would overflow
  refused(o, "command_timeout = " + std::to_string(std::chrono::milliseconds::max().count()) + " ms");
  o = {};
  o.admin_timeout = std::chrono::milliseconds(-1);
  refused(o, "admin_timeout = -1 ms");
  o = {};
  o.admin_timeout = std::chrono::hours(25);
  refused(o, "admin_timeout = " + std::to_string(std::chrono::milliseconds(std::chrono::hours(25)).count()) + " ms");
  o = {};
  o.ready_timeout = std::chrono::milliseconds(-1);
  refused(o, "ready_timeout = -1 ms");
  o = {};
  o.ready_timeout = std::chrono::hours(24 * 365);
  refused(o, "ready_timeout = " + std::to_string(std::chrono::milliseconds(std::chrono::hours(24 * 365)).count()) + " ms");
  o = {};
  o.io_queue_pairs = 65535;  // the largest NSQR (FFFEh) is valid; the controller grants what it has
  CHECK_NOTHROW(host::controller(backend(), o));
}

TEST_CASE("a controller that does not become ready in time is reported, not waited on forever") {
  emu::controller_config config;
  config.ready_delay = std::chrono::milliseconds(2000);
  host::controller_options options;
  options.ready_timeout = std::chrono::milliseconds(100);
  CHECK_THROWS_WITH_AS(host::controller(backend(config), options), doctest::Contains("controller not ready"), host::error);
}

TEST_CASE("a controller fatal status during bring-up is reported at once") {
  emu::controller_config config;
  config.mpsmin = 1;  // 8 KiB pages: the admin queues of a 4 KiB-aligned allocator do not qualify
  config.mpsmax = 1;
  // The host picks MPS = MPSMIN; 4 KiB-aligned admin queues are not 8 KiB aligned, so the
  // emulator refuses the configuration with CSTS.CFS — unless the allocator happened to
  // return 8 KiB-aligned memory, in which case bring-up succeeds. Either way: no hang.
  try {
    host::controller ctrl(backend(config));
    CHECK(ctrl.csts().rdy());
  } catch (const host::error& e) {
    CHECK(std::string(e.what()).find("CSTS.CFS") != std::string::npos);
  }
}

TEST_CASE("a queue above MQES comes back as Invalid Queue Size with the queue named") {
  emu::controller_config config;
  config.max_queue_entries = 64;
  host::controller ctrl(backend(config));
  try {
    auto q = ctrl.create_queue_pair(65);
    FAIL("accepted");
  } catch (const host::error& e) {
    CHECK(e.status() == spec::status::invalid_queue_size);
    CHECK(std::string(e.what()) == "Create I/O CQ 1 on emu: Invalid Queue Size (1/0x02)");
  }
  // The queue identifier was given back.
  auto q = ctrl.create_queue_pair(64);
  CHECK(q->id() == 1);
}

TEST_CASE("queue pairs beyond those granted are refused") {
  host::controller_options options;
  options.io_queue_pairs = 2;
  host::controller ctrl(backend(), options);
  auto a = ctrl.create_queue_pair(8);
  auto b = ctrl.create_queue_pair(8);
  CHECK_THROWS_WITH_AS((void)ctrl.create_queue_pair(8), doctest::Contains("granted"), host::error);
  a.reset();
  CHECK_NOTHROW((void)ctrl.create_queue_pair(8));
}

TEST_CASE("queue sizes outside 2..65536 are refused before anything is sent") {
  host::controller ctrl(backend());
  CHECK_THROWS_AS((void)ctrl.create_queue_pair(1), host::error);
  CHECK_THROWS_AS((void)ctrl.create_queue_pair(65537), host::error);
}

TEST_CASE("a read past the end of the namespace returns LBA Out of Range") {
  emu::controller_config config;
  config.namespaces = {emu::namespace_config::in_memory(512, 100)};
  host::controller ctrl(backend(config));
  auto q = ctrl.create_queue_pair(8);
  auto buf = ctrl.memory().allocate(4096);
  CHECK(q->read(1, 99, 1, buf) == spec::status::successful_completion);
  CHECK(q->read(1, 99, 2, buf) == spec::status::lba_out_of_range);
}

TEST_CASE("a buffer too small for the transfer is refused before anything is sent") {
  host::controller ctrl(backend());
  auto q = ctrl.create_queue_pair(8);
  auto buf = ctrl.memory().allocate(1024);
  CHECK_THROWS_WITH_AS((void)q->read(1, 0, 3, buf), doctest::Contains("do not fit"), host::error);
}

/// A controller whose first Read's completion is never posted, with a 200 ms command timeout.
host::controller controller_losing_first_read(bool abort_on_timeout = true) {
  emu::controller_config config;
  emu::fault_rule lose;
  lose.action = emu::fault_action::lose_completion;
  lose.opcode = static_cast<std::uint8_t>(spec::nvm_opcode::read);
  lose.nth = 1;
  config.faults = {lose};
  host::controller_options options;
  options.command_timeout = std::chrono::milliseconds(200);
  options.admin_timeout = std::chrono::seconds(10);  // queue creation is not what these tests time out
  options.abort_on_timeout = abort_on_timeout;
  return host::controller(backend(config), options);
}

TEST_CASE("lost completions become timeouts that name the operation") {
  host::controller ctrl = controller_losing_first_read();
  auto q = ctrl.create_queue_pair(8);
  auto buf = ctrl.memory().allocate(4096);
  CHECK_THROWS_WITH_AS((void)q->read(1, 0, 1, buf), doctest::Contains("no completion within 200 ms"), host::error);
}

TEST_CASE("without abort on timeout, a lost completion holds its CID: on a one-CID queue the next command fails naming the timed-out command") {
  host::controller ctrl = controller_losing_first_read(/*abort_on_timeout=*/false);
  auto q = ctrl.create_queue_pair(2);  // one CID (entries - 1)
  auto buf = ctrl.memory().allocate(4096);
  CHECK_THROWS_WITH_AS((void)q->read(1, 0, 1, buf), doctest::Contains("no completion within 200 ms"), host::error);
  CHECK_THROWS_WITH_AS((void)q->read(1, 0, 1, buf), doctest::Contains("1 command(s) timed out earlier and still hold their CIDs"), host::error);
  // Another queue pair is unaffected.
  auto other = ctrl.create_queue_pair(2);
  CHECK(other->read(1, 0, 1, buf) == spec::status::successful_completion);
}

TEST_CASE("a Create I/O SQ without completion fails naming itself, not the cleanup of its CQ, and reset() brings the controller back") {
  emu::controller_config config;
  emu::fault_rule lose;
  lose.action = emu::fault_action::lose_completion;
  lose.admin = true;
  lose.opcode = static_cast<std::uint8_t>(spec::admin_opcode::create_io_submission_queue);
  lose.nth = 1;
  config.faults = {lose};
  host::controller_options options;
  options.admin_timeout = std::chrono::milliseconds(200);  // admin commands' own bound; I/O keeps 10 s
  host::controller ctrl(backend(config), options);
  try {
    (void)ctrl.create_queue_pair(8);
    FAIL("Create I/O SQ without completion did not throw");
  } catch (const host::error& e) {
    const std::string what = e.what();
    CHECK(what.find("Create I/O SQ") != std::string::npos);
    CHECK(what.find("no completion within 200 ms") != std::string::npos);
    CHECK(what.find("Delete I/O CQ") == std::string::npos);
  }
  CHECK_FALSE(ctrl.csts().rdy());  // stopped: the controller might still write the new queues' memory
  ctrl.reset();
  auto q = ctrl.create_queue_pair(8);
  auto buf = ctrl.memory().allocate(4096);
  CHECK(q->read(1, 0, 1, buf) == spec::status::successful_completion);
}

namespace {

/// The emulator behind a BAR0 that says it ends at `bar_bytes`, as a device whose BAR is
/// smaller than its CAP.DSTRD and queue count imply.
class short_bar_backend final : public host::register_backend {
 public:
  short_bar_backend(emu::controller_config config, std::size_t bar_bytes) : inner_(std::move(config)), bar_bytes_(bar_bytes) {}
  [[nodiscard]] std::string name() const override { return "emu (short BAR)"; }
  [[nodiscard]] std::byte* bar() const override { return inner_.bar(); }
  [[nodiscard]] std::size_t bar_size() const override { return bar_bytes_; }
  [[nodiscard]] std::uint32_t read32(std::uint32_t offset) const override { return inner_.read32(offset); }
  void write32(std::uint32_t offset, std::uint32_t value) const override { inner_.write32(offset, value); }
  void map_cmb(unsigned bar_index, std::uint64_t offset, std::uint64_t bytes) override { inner_.map_cmb(bar_index, offset, bytes); }
  [[nodiscard]] host::dma_allocator& memory() override { return inner_.memory(); }

 private:
  host::emu_backend inner_;
  std::size_t bar_bytes_;
};

/// A BAR that is plain memory, for the base class's own register accessors.
class memory_bar_backend final : public host::register_backend {
 public:
  [[nodiscard]] std::string name() const override { return "memory BAR"; }
  [[nodiscard]] std::byte* bar() const override { return reinterpret_cast<std::byte*>(words_.data()); }
  [[nodiscard]] std::size_t bar_size() const override { return words_.size() * sizeof(std::uint32_t); }
  void map_cmb(unsigned, std::uint64_t, std::uint64_t) override { throw host::error("Map CMB", name(), "none"); }
  [[nodiscard]] host::dma_allocator& memory() override { throw host::error("Allocate", name(), "none"); }

 private:
  mutable std::vector<std::uint32_t> words_ = std::vector<std::uint32_t>(1024);  // 4 KiB: registers, no doorbells
};

}  // namespace

TEST_CASE("a BAR that ends before some granted queues' doorbells limits the queue pairs to those whose doorbells it holds") {
  emu::controller_config config;
  config.doorbell_stride = 10;  // 4 KiB between doorbells
  const std::size_t stride = 4096;
  // Registers, then the doorbells of queues 0 to 4 (SQ and CQ each): four I/O queue pairs.
  host::controller ctrl(std::make_unique<short_bar_backend>(config, 0x1000 + 5 * 2 * stride));
  CHECK(ctrl.io_queue_pairs_granted() == 4);
  std::vector<std::unique_ptr<host::queue_pair>> queues;
  auto buf = ctrl.memory().allocate(4096);
  for (int i = 0; i < 4; ++i) {
    queues.push_back(ctrl.create_queue_pair(8));
    CHECK(queues.back()->read(1, 0, 1, buf) == spec::status::successful_completion);
  }
  CHECK_THROWS_WITH_AS((void)ctrl.create_queue_pair(8), doctest::Contains("in use"), host::error);
}

TEST_CASE("a BAR too small for the admin queue's doorbells is refused at bring-up, naming its size and CAP.DSTRD") {
  emu::controller_config config;
  config.doorbell_stride = 10;
  CHECK_THROWS_WITH_AS(host::controller(std::make_unique<short_bar_backend>(config, 0x1000 + 4096)), doctest::Contains("CAP.DSTRD = 10"),
                       host::error);
  CHECK_THROWS_WITH_AS(host::controller(std::make_unique<short_bar_backend>(config, 0x1000)), doctest::Contains("4096-byte BAR0"), host::error);
}

TEST_CASE("register reads and writes outside the BAR or off a 4-byte boundary are refused, not performed") {
  memory_bar_backend b;
  b.write32(0x14, 0x1234);
  CHECK(b.read32(0x14) == 0x1234);
  CHECK(b.read64(0x14) == 0x1234);
  CHECK_THROWS_WITH_AS((void)b.read32(4096), doctest::Contains("outside"), host::error);
  CHECK_THROWS_WITH_AS(b.write32(4096, 1), doctest::Contains("outside"), host::error);
  CHECK_THROWS_WITH_AS(b.write32(4094, 1), doctest::Contains("4-byte"), host::error);
  CHECK_THROWS_WITH_AS((void)b.read32(2), doctest::Contains("4-byte"), host::error);
  CHECK_THROWS_WITH_AS((void)b.read64(4092), doctest::Contains("outside"), host::error);
  CHECK_THROWS_AS((void)b.read32(0xffffffffu), host::error);
}

TEST_CASE("execute returns the completion's Status field as posted: DNR with the status") {
  host::controller ctrl(backend());
  auto q = ctrl.create_queue_pair(8);
  auto buf = ctrl.memory().allocate(4096);
  const spec::completion_entry bad = q->execute(spec::make_rw(spec::nvm_opcode::read, 1, 1ull << 40, 1, buf.bus()), "Read past the end");
  CHECK(bad.status() == spec::status::lba_out_of_range);
  CHECK(bad.dnr());  // the emulator posts LBA Out of Range with Do Not Retry, as a retry cannot succeed
  CHECK(bad.sqid == q->id());
  const spec::completion_entry good = q->execute(spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, buf.bus()), "Read");
  CHECK(good.status() == spec::status::successful_completion);
  CHECK_FALSE(good.dnr());
}

TEST_CASE("shutdown reports shutdown complete and leaves the controller disabled") {
  auto b = backend();
  auto* raw = b.get();
  host::controller ctrl(std::move(b));
  ctrl.shutdown();
  const spec::csts_register csts{raw->read32(spec::to_underlying(spec::register_offset::csts))};
  CHECK_FALSE(csts.rdy());
  CHECK_THROWS_WITH_AS((void)ctrl.admin(spec::make_get_features(spec::feature_id::number_of_queues), "Get Features"),
                       doctest::Contains("not ready"), host::error);
}

TEST_CASE("shadow doorbells skip MMIO writes the controller did not ask for") {
  host::controller_options options;
  options.shadow_doorbells = true;
  host::controller ctrl(backend(), options);
  REQUIRE(ctrl.shadow_doorbells());
  auto q = ctrl.create_queue_pair(16);
  auto buf = ctrl.memory().allocate(4096);
  for (int i = 0; i < 40; ++i) REQUIRE(q->read(1, static_cast<std::uint64_t>(i), 8, buf) == spec::status::successful_completion);
}

TEST_CASE("the CMB holds a submission queue when asked") {
  emu::controller_config config;
  config.cmb_bytes = 1 << 20;
  host::controller_options options;
  options.use_cmb = true;
  host::controller ctrl(backend(config), options);
  REQUIRE(ctrl.backend().cmb() != nullptr);
  auto q = ctrl.create_queue_pair(64, host::queue_placement::cmb_submission);
  CHECK(q->sq_bus() == ctrl.backend().cmb_bus_address());
  auto buf = ctrl.memory().allocate(65536);
  std::memset(buf.data(), 0x77, buf.size());
  REQUIRE(q->write(1, 0, 128, buf) == spec::status::successful_completion);
  std::memset(buf.data(), 0, buf.size());
  REQUIRE(q->read(1, 0, 128, buf) == spec::status::successful_completion);
  CHECK(buf.data()[65535] == std::byte{0x77});
}

TEST_CASE("a CMB queue without a CMB is refused with the reason") {
  host::controller ctrl(backend());
  CHECK_THROWS_WITH_AS((void)ctrl.create_queue_pair(8, host::queue_placement::cmb_submission), doctest::Contains("no CMB"), host::error);
}

TEST_CASE("a queue pair in provided memory (GPU memory on the emulator) is created, viewed and refused for host I/O") {
  host::controller ctrl(backend());
  // Stand-in for GPU memory: the emulator registers it as a device region.
  std::unique_ptr<std::byte, void (*)(void*)> fake_gpu(static_cast<std::byte*>(std::aligned_alloc(4096, 8192)), std::free);
  CHECK_THROWS_WITH_AS((void)ctrl.memory().map_gpu(fake_gpu.get() + 16, 1024), doctest::Contains("4 KiB"), host::error);
  auto sq = ctrl.memory().map_gpu(fake_gpu.get(), 64 * 64);
  auto cq = ctrl.memory().map_gpu(fake_gpu.get() + 4096, 64 * 16);
  auto q = ctrl.create_queue_pair(64, std::move(sq), std::move(cq));
  CHECK(q->placement() == host::queue_placement::provided);
  const auto v = q->view();
  CHECK(reinterpret_cast<std::byte*>(v.sq) == fake_gpu.get());
  CHECK(reinterpret_cast<std::byte*>(v.cq) == fake_gpu.get() + 4096);
  CHECK(reinterpret_cast<std::byte*>(v.sq_doorbell) == ctrl.backend().bar() + spec::sq_tail_doorbell_offset(q->id(), 0));
  CHECK(v.entries == 64);
  CHECK(v.sq_shadow == nullptr);
  auto buf = ctrl.memory().allocate(512);
  CHECK_THROWS_WITH_AS((void)q->read(1, 0, 1, buf), doctest::Contains("device side"), host::error);
}

TEST_CASE("provided memory smaller than the queues is refused") {
  host::controller ctrl(backend());
  auto sq = ctrl.memory().allocate(4096);
  auto cq = ctrl.memory().allocate(256);
  CHECK_THROWS_WITH_AS((void)ctrl.create_queue_pair(64, std::move(sq), std::move(cq)), doctest::Contains("smaller"), host::error);
}

TEST_CASE("a queue pair's view carries the shadow doorbell slots when they are in use") {
  host::controller_options options;
  options.shadow_doorbells = true;
  host::controller ctrl(backend(), options);
  auto q = ctrl.create_queue_pair(16);
  const auto v = q->view();
  REQUIRE(v.sq_shadow != nullptr);
  CHECK(v.cq_shadow == v.sq_shadow + 1);
  CHECK(v.sq_event_index != nullptr);
  auto buf = ctrl.memory().allocate(512);
  REQUIRE(q->read(1, 0, 1, buf) == spec::status::successful_completion);
  CHECK(*v.sq_shadow == 1);
}

TEST_CASE("a queue pair re-created on a deleted queue's identifier with shadow doorbells reads the right data") {
  emu::controller_config config;
  config.namespaces = {emu::namespace_config::in_memory(512, 1024)};
  auto b = backend(config);
  auto* emulated = &b->controller();
  host::controller_options options;
  options.shadow_doorbells = true;
  options.command_timeout = std::chrono::milliseconds(2000);
  host::controller ctrl(std::move(b), options);
  REQUIRE(ctrl.shadow_doorbells());
  auto buf = ctrl.memory().allocate(4096);
  for (std::size_t i = 0; i < 512; ++i) reinterpret_cast<std::uint64_t*>(buf.data())[i] = 0x5eed000000000000ull + i;
  std::uint16_t first_id = 0;
  {
    auto q = ctrl.create_queue_pair(16);
    first_id = q->id();
    // Moves the old queue's shadow tail/head and EventIdx well away from a new queue's 0.
    for (int i = 0; i < 5; ++i) REQUIRE(q->write(1, static_cast<std::uint64_t>(i) * 8, 8, buf) == spec::status::successful_completion);
  }
  auto q = ctrl.create_queue_pair(16);
  REQUIRE(q->id() == first_id);
  // The controller polls the new queue meanwhile: whatever the old queue left in the shadow
  // slots must not make it fetch anything.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (int i = 0; i < 5; ++i) {
    auto in = ctrl.memory().allocate(4096);
    std::memset(in.data(), 0xee, in.size());
    REQUIRE(q->read(1, static_cast<std::uint64_t>(i) * 8, 8, in) == spec::status::successful_completion);
    CHECK(std::memcmp(in.data(), buf.data(), 4096) == 0);
  }
  CHECK(emulated->stats().doorbell_errors == 0);
  CHECK(emulated->stats().io_commands == 10);
}

TEST_CASE("a late completion of a timed-out command is counted and dropped; the next command gets its own") {
  emu::controller_config config;
  config.namespaces = {emu::namespace_config::in_memory(512, 1024)};
  emu::fault_rule late;
  late.action = emu::fault_action::add_delay;
  late.delay_ns = 600'000'000;
  late.opcode = static_cast<std::uint8_t>(spec::nvm_opcode::flush);
  late.nth = 1;
  config.faults = {late};
  host::controller_options options;
  options.command_timeout = std::chrono::milliseconds(300);
  options.abort_on_timeout = false;  // an Abort would bring the completion at once, as aborted
  auto b = backend(config);
  auto* emulated = &b->controller();
  host::controller ctrl(std::move(b), options);
  auto q = ctrl.create_queue_pair(8);
  const std::uint64_t posted_before = emulated->stats().completions_posted;
  CHECK_THROWS_WITH_AS((void)q->flush(1), doctest::Contains("no completion within 300 ms"), host::error);
  // The flush's CQE must be in the CQ before the next command, however loaded the machine is:
  // wait for the emulator to post it (bounded) rather than for a fixed time.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (emulated->stats().completions_posted == posted_before && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(emulated->stats().completions_posted == posted_before + 1);
  auto out = ctrl.memory().allocate(4096);
  for (std::size_t i = 0; i < 512; ++i) reinterpret_cast<std::uint64_t*>(out.data())[i] = 0xabcd000000000000ull + i;
  REQUIRE(q->write(1, 16, 8, out) == spec::status::successful_completion);
  auto in = ctrl.memory().allocate(4096);
  REQUIRE(q->read(1, 16, 8, in) == spec::status::successful_completion);
  CHECK(std::memcmp(in.data(), out.data(), 4096) == 0);
  CHECK(ctrl.unexpected_completions() == 1);
}

TEST_CASE("with shadow doorbells, a queue whose slots lie beyond the one-page buffers has none and rings by MMIO") {
  emu::controller_config config;
  config.doorbell_stride = 10;  // 4 KiB between doorbells: no I/O queue's slots fit in a 4 KiB page
  host::controller_options options;
  options.shadow_doorbells = true;
  host::controller ctrl(backend(config), options);
  REQUIRE(ctrl.shadow_doorbells());
  auto q = ctrl.create_queue_pair(8);
  const auto v = q->view();
  CHECK(v.sq_shadow == nullptr);
  CHECK(v.cq_shadow == nullptr);
  CHECK(v.sq_event_index == nullptr);
  auto buf = ctrl.memory().allocate(4096);
  for (int i = 0; i < 10; ++i) REQUIRE(q->read(1, static_cast<std::uint64_t>(i), 8, buf) == spec::status::successful_completion);
  CHECK(ctrl.skipped_doorbell_writes() == 0);
}

TEST_CASE("queue pairs on different host threads work at once") {
  host::controller_options options;
  options.shadow_doorbells = true;
  host::controller ctrl(backend(), options);
  std::vector<std::unique_ptr<host::queue_pair>> pairs;
  for (int i = 0; i < 4; ++i) pairs.push_back(ctrl.create_queue_pair(32));
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto buf = ctrl.memory().allocate(8192);
      std::memset(buf.data(), t + 1, buf.size());
      for (int i = 0; i < 200; ++i) {
        const std::uint64_t lba = static_cast<std::uint64_t>(t) * 1000 + static_cast<std::uint64_t>(i % 50) * 16;
        if (pairs[t]->write(1, lba, 16, buf) != spec::status::successful_completion) ++failures;
        if (pairs[t]->read(1, lba, 16, buf) != spec::status::successful_completion) ++failures;
        if (buf.data()[100] != static_cast<std::byte>(t + 1)) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures == 0);
  CHECK(ctrl.mmio_doorbell_writes() + ctrl.skipped_doorbell_writes() >= 4 * 200 * 2 * 2);
}

TEST_CASE("emu:nodata opens an emulator that moves no data; without it data moves") {
  auto emulator = [](std::unique_ptr<host::controller>& c) -> emu::controller& {
    return dynamic_cast<host::emu_backend&>(c->backend()).controller();
  };
  auto nodata = host::open("emu:blocks=1000,nodata,workers=1");
  CHECK_FALSE(emulator(nodata).moves_data());
  CHECK(emulator(nodata).config().namespaces[0].lba_count == 1000);  // the keys around it still apply
  CHECK(emulator(nodata).config().workers == 1);
  auto moving = host::open("emu:blocks=1000");
  CHECK(emulator(moving).moves_data());
}

TEST_CASE("emu:readonly opens a file namespace read-only") {
  const std::string path = "/tmp/cunvme-readonly-" + std::to_string(::getpid()) + ".bin";
  {
    std::ofstream f(path, std::ios::binary);
    const std::vector<char> bytes(64 * 512, 'x');
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  auto ctrl = host::open("emu:file=" + path + ",readonly");
  auto& emulator = dynamic_cast<host::emu_backend&>(ctrl->backend()).controller();
  CHECK(emulator.config().namespaces[0].read_only);
  CHECK(emulator.store(1).read_only());
  CHECK(emulator.store(1).size() == 64 * 512);
  ctrl.reset();
  std::remove(path.c_str());
}

TEST_CASE("emu:spin makes the emulator's workers poll without sleeping") {
  auto spinning = host::open("emu:blocks=1000,spin");
  auto& emulator = dynamic_cast<host::emu_backend&>(spinning->backend()).controller();
  CHECK(emulator.config().idle.spins == ~std::uint32_t{0});
  auto plain = host::open("emu:blocks=1000");
  CHECK(dynamic_cast<host::emu_backend&>(plain->backend()).controller().config().idle.spins == emu::idle_policy{}.spins);
}

TEST_CASE("fill_prps refuses a range outside its buffer and names why prp::build refused") {
  host::controller ctrl(backend());
  host::dma_buffer buf = ctrl.memory().allocate(8192);
  host::dma_buffer lists = ctrl.memory().allocate(4096);
  spec::submission_entry sqe{};
  CHECK_THROWS_WITH_AS(ctrl.fill_prps(sqe, buf, 4096, 8192, lists), doctest::Contains("do not fit the 8192-byte buffer"), host::error);
  CHECK_THROWS_WITH_AS(ctrl.fill_prps(sqe, buf, 8, ~std::uint64_t{0}, lists), doctest::Contains("do not fit"), host::error);
  CHECK_THROWS_WITH_AS(ctrl.fill_prps(sqe, buf, 2, 16, lists), doctest::Contains("not dword aligned"), host::error);
  CHECK_NOTHROW(ctrl.fill_prps(sqe, buf, 0, 8192, lists));
}

TEST_CASE("the host's own I/O and a CPU reader on the same queue pair share its one view and bookkeeping") {
  host::controller_options options;
  options.shadow_doorbells = true;
  host::controller ctrl(backend(), options);
  auto q = ctrl.create_queue_pair(16);
  const cunvme::queue_view& v = q->view();
  REQUIRE(v.counters != nullptr);
  REQUIRE(v.records != nullptr);
  CHECK(v.prp_lists != nullptr);
  CHECK(v.prp_lists_bus % ctrl.page_bytes() == 0);
  CHECK(v.timeout_ns == static_cast<std::uint64_t>(std::chrono::nanoseconds(options.command_timeout).count()));
  auto out = ctrl.memory().allocate(64 * 1024);
  for (std::size_t i = 0; i < out.size() / 8; ++i) reinterpret_cast<std::uint64_t*>(out.data())[i] = 0x0ddba11000000000ull + i;
  // 128 blocks: more than two pages, so the write goes through a CID's PRP list.
  REQUIRE(q->write(1, 40, 128, out) == spec::status::successful_completion);
  const std::uint64_t rung = v.counters->doorbell_mmio_writes + v.counters->doorbell_skipped;
  CHECK(rung >= 2);  // an SQ tail and a CQ head update per command
  CHECK(ctrl.mmio_doorbell_writes() + ctrl.skipped_doorbell_writes() == rung);
  using queue = cunvme::queue_policies<cunvme::slots::exclusive, cunvme::completion::cooperative>;
  cunvme::block_reader<queue, cunvme::prp::contiguous, cunvme::doorbell::shadow> reader(v, host::make_namespace_view(ctrl, 1));
  auto in = ctrl.memory().allocate(64 * 1024);
  REQUIRE(reader.read(40, 128, cunvme::prp::contiguous{in.bus()}, 0).ok());
  CHECK(std::memcmp(in.data(), out.data(), out.size()) == 0);
  CHECK(cunvme::cid_pool::in_use(v) == 0);
  // The reader went on from where the host's I/O left the queue: the host's next command too.
  REQUIRE(q->read(1, 40, 128, in) == spec::status::successful_completion);
  CHECK(std::memcmp(in.data(), out.data(), out.size()) == 0);
  CHECK(ctrl.unexpected_completions() == 0);
}

TEST_CASE("the emulator backend gives copies held up in the CUDA driver as the likely cause of timeouts, while they are held up too") {
  // What an error about a timed-out copy appends (`device::describe`, the Python IoError): a
  // copier call held up, as CUDA's are while another thread's cudaFree waits for a kernel that
  // waits for the emulator. The kernel times out, and its error is written, before the call
  // comes back: a call still running counts.
  std::atomic<bool> released{false};
  emu::controller_config config;
  config.memory.device_copy.copy = [&](void* dst, const void* src, std::uint64_t bytes, bool, int) {
    for (int i = 0; i < 1000 && !released.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::memcpy(dst, src, bytes);
    return true;
  };
  const std::unique_ptr<host::emu_backend> b = backend(config);
  const host::register_backend& any = *b;
  constexpr std::chrono::seconds window(20);
  CHECK(any.timeout_cause(window) == "");
  std::vector<std::byte> gpu_stand_in(4096);
  const std::uint64_t bus = b->controller().dma().map(gpu_stand_in.data(), gpu_stand_in.size(), emu::memory_kind::device);
  const std::vector<std::byte> bytes(4096, std::byte{7});
  bool written = false;
  std::thread copier([&] { written = b->controller().dma().write(bus, bytes.data(), bytes.size()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(any.timeout_cause(window) == "");  // under a second: no stall yet
  std::string cause;
  for (int i = 0; i < 150 && cause.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    cause = any.timeout_cause(window);
  }
  CHECK_MESSAGE(cause.find("the emulator's data copies were held up in the CUDA driver (a call has been waiting 1.") == 0, cause);
  CHECK(cause.find("emu::cuda_memory") != std::string::npos);
  released = true;
  copier.join();
  CHECK(written);
  CHECK(gpu_stand_in == bytes);
  // Ended, it is counted once, not once running and once ended, and still named.
  CHECK(b->controller().stats().copies.stalls == 1);
  CHECK_MESSAGE(any.timeout_cause(window).find("(a call waited ") != std::string::npos, any.timeout_cause(window));
  b->controller().dma().unmap(bus);
}
