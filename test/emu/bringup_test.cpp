// Conformance: registers and controller state transitions (NVMe 2.0 sections 3.1, 3.5, 3.6).
#include "test_host.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

using namespace test;

TEST_CASE("a controller constructed in one line shows its capabilities in CAP and VS") {
  emu::controller ctrl;
  test_host host(ctrl);
  const auto cap = host.cap();
  CHECK(cap.mqes() == 4095);
  CHECK(cap.cqr());
  CHECK(cap.to() == 20);
  CHECK(cap.dstrd() == 0);
  CHECK(cap.supports(spec::cap_css::nvm_command_set));
  CHECK(cap.mpsmin() == 0);
  CHECK(cap.mpsmax() == 4);
  CHECK_FALSE(cap.cmbs());
  const spec::version_register vs{host.reg(spec::register_offset::vs)};
  CHECK(vs.mjr() == 2);
  CHECK(vs.mnr() == 0);
  CHECK_FALSE(host.csts().rdy());
}

TEST_CASE("setting CC.EN brings CSTS.RDY up and clearing it brings RDY down") {
  emu::controller ctrl;
  test_host host(ctrl);
  REQUIRE(host.enable());
  CHECK(host.csts().rdy());
  CHECK_FALSE(host.csts().cfs());
  REQUIRE(host.disable());
  CHECK_FALSE(host.csts().rdy());
  // And again: a reset controller can be enabled anew.
  REQUIRE(host.enable());
}

TEST_CASE("CSTS.RDY follows CC.EN only after the configured ready delay") {
  emu::controller_config config;
  config.ready_delay = std::chrono::milliseconds(150);
  emu::controller ctrl(config);
  test_host host(ctrl);
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(host.enable());
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(150));
}

TEST_CASE("a ready delay longer than CAP.TO is refused at construction") {
  emu::controller_config config;
  config.timeout = 1;  // 500 ms
  config.ready_delay = std::chrono::milliseconds(501);
  CHECK_THROWS_AS(emu::controller{config}, std::invalid_argument);
}

TEST_CASE("invalid configurations are refused with a message naming the field") {
  emu::controller_config config;
  config.max_queue_entries = 1;
  CHECK_THROWS_WITH_AS(emu::controller{config}, doctest::Contains("max_queue_entries"), std::invalid_argument);
  config = {};
  config.namespaces[0].lba_size = 1024;
  CHECK_THROWS_WITH_AS(emu::controller{config}, doctest::Contains("lba_size"), std::invalid_argument);
  config = {};
  config.mpsmin = 5;
  config.mpsmax = 4;
  CHECK_THROWS_AS(emu::controller{config}, std::invalid_argument);
  config = {};
  config.cmb_bytes = 1000;
  CHECK_THROWS_WITH_AS(emu::controller{config}, doctest::Contains("cmb_bytes"), std::invalid_argument);
  config = {};
  config.workers = 0;
  CHECK_THROWS_AS(emu::controller{config}, std::invalid_argument);
}

TEST_CASE("a configuration whose doorbells need a BAR0 past 256 MiB is refused, not wrapped or allocated") {
  emu::controller_config config;
  config.doorbell_stride = 15;  // 128 KiB between doorbells
  config.max_io_queues = 65535;  // the last CQ doorbell 16 GiB in: past 32-bit offsets
  CHECK_THROWS_WITH_AS(emu::controller{config}, doctest::Contains("BAR0"), std::invalid_argument);
  config.max_io_queues = 1024;  // 256 MiB + 132 KiB
  CHECK_THROWS_WITH_AS(emu::controller{config}, doctest::Contains("doorbell_stride"), std::invalid_argument);
  config.max_io_queues = 64;  // 16.1 MiB: the last CQ head doorbell 129 strides past 0x1000
  emu::controller ctrl{config};
  CHECK(ctrl.bar_size() == 0x1000 + 129u * (128u << 10) + 4096u);
}

TEST_CASE("enabling with a memory page size outside MPSMIN..MPSMAX sets CSTS.CFS instead of RDY") {
  emu::controller ctrl;
  test_host host(ctrl);
  CHECK_FALSE(host.enable(32, /*mps*/ 5));
  CHECK(host.csts().cfs());
  CHECK_FALSE(host.csts().rdy());
  // A reset clears the fatal status.
  REQUIRE(host.disable());
  CHECK(host.eventually([&] { return !host.csts().cfs(); }));
  REQUIRE(host.enable());
}

TEST_CASE("enabling with admin queues in unregistered memory is a controller fatal status") {
  emu::controller ctrl;
  test_host host(ctrl);
  host.set_reg(spec::register_offset::aqa, spec::aqa_register{}.set_asqs(7).set_acqs(7).raw);
  host.set_reg64(spec::register_offset::asq, 0x1000);
  host.set_reg64(spec::register_offset::acq, 0x2000);
  host.set_reg(spec::register_offset::cc, spec::cc_register{}.set_iosqes(6).set_iocqes(4).set_en(true).raw);
  CHECK(host.eventually([&] { return host.csts().cfs(); }));
  CHECK_FALSE(host.csts().rdy());
}

TEST_CASE("writes to read-only registers are ignored") {
  emu::controller ctrl;
  test_host host(ctrl);
  const auto cap = host.reg64(spec::register_offset::cap);
  const auto vs = host.reg(spec::register_offset::vs);
  host.set_reg64(spec::register_offset::cap, 0);
  host.set_reg(spec::register_offset::vs, 0x12345678);
  host.set_reg(spec::register_offset::csts, 0x1);
  CHECK(host.eventually([&] {
    return host.reg64(spec::register_offset::cap) == cap && host.reg(spec::register_offset::vs) == vs &&
           host.reg(spec::register_offset::csts) == 0;
  }));
}

TEST_CASE("a normal shutdown notification ends in CSTS.SHST shutdown complete") {
  emu::controller ctrl;
  test_host host(ctrl);
  REQUIRE(host.enable());
  host.set_reg(spec::register_offset::cc,
               spec::cc_register{host.reg(spec::register_offset::cc)}.set_shn(spec::shutdown_notification::normal).raw);
  CHECK(host.eventually([&] { return host.csts().shst() == spec::shutdown_status::shutdown_complete; }));
  REQUIRE(host.disable());
  CHECK(host.csts().shst() == spec::shutdown_status::normal_operation);
}

TEST_CASE("a reset deletes every I/O queue") {
  emu::controller ctrl;
  test_host host(ctrl);
  REQUIRE(host.enable());
  auto q = host.create_pair(1, 16);
  REQUIRE(host.disable());
  REQUIRE(host.enable());
  // The queue is gone: deleting it again is Invalid Queue Identifier.
  CHECK(host.admin_status(spec::make_delete_io_sq(1)) == spec::status::invalid_queue_identifier);
  CHECK(host.admin_status(spec::make_delete_io_cq(1)) == spec::status::invalid_queue_identifier);
}

TEST_CASE("doorbells sit at the stride CAP.DSTRD announces") {
  emu::controller_config config;
  config.doorbell_stride = 2;  // 16 bytes
  emu::controller ctrl(config);
  test_host host(ctrl);
  CHECK(host.cap().dstrd() == 2);
  REQUIRE(host.enable());
  auto q = host.create_pair(3, 8);
  dma_buffer data(ctrl, 4096);
  const auto cqe = host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 8, data.bus));
  CHECK(cqe.status() == spec::status::successful_completion);
  CHECK(ctrl.bar_size() >= spec::bar_bytes_for_queues(config.max_io_queues, 2));
}

TEST_CASE("a command in flight at a reset never completes into the queues created afterwards") {
  emu::controller_config config;
  config.timing.read_latency_ns = 200'000'000;  // still in flight when the reset comes
  emu::controller ctrl(config);
  test_host host(ctrl);
  REQUIRE(host.enable());
  auto q = host.create_pair(1, 8);
  dma_buffer data(ctrl, 4096);
  host.place(*q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, data.bus));
  host.ring_sq(*q);
  REQUIRE(test_host::eventually([&] { return ctrl.stats().io_commands == 1; }));
  REQUIRE(host.disable());
  REQUIRE(host.enable());
  auto fresh = host.create_pair(1, 8);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK_FALSE(test_host::phase_of(fresh->cq.as<spec::completion_entry>()));
  CHECK(ctrl.stats().completions_posted == 2 + 2);  // the admin commands of the two queue pairs only
  // The fresh queue works.
  CHECK(host.run(*fresh, spec::make_rw(spec::nvm_opcode::write, 1, 0, 1, data.bus)).status() == spec::status::successful_completion);
}

TEST_CASE("the memory hooks' thread_start runs once on every controller thread before it serves queues") {
  std::atomic<int> started{0};
  std::mutex m;
  std::set<std::thread::id> threads;
  emu::controller_config config;
  config.workers = 3;
  config.memory.device_copy.thread_start = [&] {
    std::scoped_lock lock(m);
    threads.insert(std::this_thread::get_id());
    ++started;
  };
  {
    emu::controller ctrl(config);
    test_host host(ctrl);
    REQUIRE(host.enable());  // the admin thread served the enable: it had started
  }
  CHECK(started == 4);  // the admin thread and three workers
  CHECK(threads.size() == 4);
}

namespace {

/// Memory hooks that record every register_host and unregister_host call.
struct registration_log {
  struct call {
    void* pointer;
    std::size_t bytes;
    bool read_only;
    bool operator==(const call&) const = default;
  };
  std::mutex mutex;
  std::vector<call> registered;
  std::vector<call> unregistered;

  emu::memory_hooks hooks(bool accept = true) {
    emu::memory_hooks h;
    h.register_host = [this, accept](void* p, std::size_t n, bool read_only) {
      std::scoped_lock lock(mutex);
      registered.push_back(call{p, n, read_only});
      return accept;
    };
    h.unregister_host = [this](void* p, std::size_t n) {
      std::scoped_lock lock(mutex);
      unregistered.push_back(call{p, n, false});
    };
    return h;
  }
};

}  // namespace

TEST_CASE("register_host sees each namespace's mapping once at construction, unregister_host once at destruction") {
  registration_log log;
  emu::controller_config config;
  config.namespaces = {emu::namespace_config::in_memory(512, 1000), emu::namespace_config::in_memory(4096, 50)};
  config.memory = log.hooks();
  std::vector<registration_log::call> expected;
  {
    emu::controller ctrl(config);
    for (std::uint32_t nsid = 1; nsid <= 2; ++nsid) {
      expected.push_back(registration_log::call{ctrl.store(nsid).mapping(), ctrl.store(nsid).size(), false});
      CHECK(ctrl.namespace_memory_pinned(nsid));
    }
    std::scoped_lock lock(log.mutex);
    CHECK(log.registered == expected);
    CHECK(log.unregistered.empty());
  }
  std::sort(log.unregistered.begin(), log.unregistered.end(), [](auto& a, auto& b) { return a.pointer < b.pointer; });
  std::sort(expected.begin(), expected.end(), [](auto& a, auto& b) { return a.pointer < b.pointer; });
  CHECK(log.unregistered == expected);
  CHECK(log.registered.size() == 2);
}

TEST_CASE("a read-only file namespace is registered as read-only") {
  const auto dir = std::filesystem::temp_directory_path() / ("cunvme-emu-pin-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "ro.img";
  { std::ofstream(path, std::ios::binary) << std::string(8192, 'x'); }
  {
    registration_log log;
    emu::controller_config config;
    auto ns = emu::namespace_config::from_file(path.string());
    ns.read_only = true;
    config.namespaces = {ns};
    config.memory = log.hooks();
    emu::controller ctrl(config);
    std::scoped_lock lock(log.mutex);
    REQUIRE(log.registered.size() == 1);
    CHECK(log.registered[0].read_only);
    CHECK(log.registered[0].bytes == 8192);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("a namespace whose registration is declined works, reads as unpinned and is never unregistered") {
  registration_log log;
  emu::controller_config config;
  config.namespaces = {emu::namespace_config::in_memory(512, 1000)};
  config.memory = log.hooks(false);
  {
    emu::controller ctrl(config);
    CHECK_FALSE(ctrl.namespace_memory_pinned(1));
    CHECK_THROWS_AS((void)ctrl.namespace_memory_pinned(2), std::out_of_range);
    test_host host(ctrl);
    REQUIRE(host.enable());
    auto q = host.create_pair(1, 16);
    dma_buffer out(ctrl, 4096), in(ctrl, 4096);
    std::memset(out.data, 0x3c, 4096);
    CHECK(host.run(*q, spec::make_rw(spec::nvm_opcode::write, 1, 8, 8, out.bus)).status() == spec::status::successful_completion);
    CHECK(host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 8, 8, in.bus)).status() == spec::status::successful_completion);
    CHECK(std::memcmp(out.data, in.data, 4096) == 0);
  }
  CHECK(log.registered.size() == 1);
  CHECK(log.unregistered.empty());
}

TEST_CASE("Write Zeroes on a pinned namespace clears the range in place") {
  registration_log log;
  emu::controller_config config;
  config.namespaces = {emu::namespace_config::in_memory(512, 1000)};
  config.memory = log.hooks();
  emu::controller ctrl(config);
  test_host host(ctrl);
  REQUIRE(host.enable());
  auto q = host.create_pair(1, 16);
  auto& store = ctrl.store(1);
  std::vector<std::byte> junk(64 * 1024, std::byte{0xa5});
  store.write(0, junk.data(), junk.size());
  REQUIRE(host.run(*q, spec::make_rw(spec::nvm_opcode::write_zeroes, 1, 0, 128)).status() == spec::status::successful_completion);
  // Pinned pages stay in the mapping (whatever a device reads through them is what the host sees).
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident(64 * 1024 / page);
  REQUIRE(::mincore(store.mapping(), 64 * 1024, resident.data()) == 0);
  CHECK(std::all_of(resident.begin(), resident.end(), [](unsigned char r) { return (r & 1u) != 0; }));
  std::vector<std::byte> back(64 * 1024);
  store.read(0, back.data(), back.size());
  CHECK(std::all_of(back.begin(), back.end(), [](std::byte b) { return b == std::byte{0}; }));
}
