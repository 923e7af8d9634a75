// Conformance: registers and controller state transitions (NVMe 2.0 sections 3.1, 3.5, 3.6).
#include "test_host.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
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

/// Memory hooks that record every register_host and unregister_host call, and reach a fake
/// "GPU" (host memory mapped as device memory) by memcpy, recording each copy's host side.
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
  std::vector<std::pair<const std::byte*, std::uint64_t>> host_sides;  ///< of device copies

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
    h.device_copy.copy = [this](void* dst, const void* src, std::uint64_t bytes, bool to_device, int) {
      std::memcpy(dst, src, bytes);
      std::scoped_lock lock(mutex);
      host_sides.emplace_back(static_cast<const std::byte*>(to_device ? src : dst), bytes);
      return true;
    };
    h.device_copy.wait = [] { return true; };
    return h;
  }
  [[nodiscard]] std::vector<call> registrations() {
    std::scoped_lock lock(mutex);
    return registered;
  }
};

/// Page-aligned host memory the controller takes for GPU memory (`memory_kind::device`).
struct fake_gpu_buffer : dma_buffer {
  fake_gpu_buffer(emu::controller& c, std::size_t bytes) : dma_buffer(c, bytes, 4096, emu::memory_kind::device) {}
};

constexpr std::uint64_t test_granule = 64 * 1024;

/// One 512-byte-block namespace of 1000 blocks (512 000 bytes: 7 granules of 64 KiB and one
/// of 53 248 bytes), pinned through `log`, nothing pinned ahead unless asked.
emu::controller_config pinning_config(registration_log& log, bool accept = true, unsigned ahead = 0) {
  emu::controller_config config;
  config.namespaces = {emu::namespace_config::in_memory(512, 1000)};
  config.memory = log.hooks(accept);
  config.pinning.granule_bytes = test_granule;
  config.pinning.ahead = ahead;
  return config;
}

}  // namespace

TEST_CASE("nothing is pinned until a command moves data to or from device memory, then each granule it touches once") {
  registration_log log;
  std::vector<registration_log::call> expected;
  {
    emu::controller ctrl(pinning_config(log));
    std::byte* const mapping = ctrl.store(1).mapping();
    std::vector<std::byte> pattern(512 * 1000);
    for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<std::byte>(i * 7 + i / 4096);
    ctrl.store(1).write(0, pattern.data(), pattern.size());
    test_host host(ctrl);
    REQUIRE(host.enable());
    auto q = host.create_pair(1, 16);
    CHECK(log.registrations().empty());
    CHECK(ctrl.namespace_pinned_bytes(1) == 0);

    // Into host memory: no device copy, nothing to pin.
    dma_buffer host_page(ctrl, 4096);
    REQUIRE(host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 8, host_page.bus)).status() == spec::status::successful_completion);
    CHECK(log.registrations().empty());

    // Into device memory across the boundary of granules 0 and 1 (bytes 61 440 .. 69 631).
    fake_gpu_buffer gpu(ctrl, 8192);
    REQUIRE(host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 120, 16, gpu.bus, gpu.bus + 4096)).status() == spec::status::successful_completion);
    CHECK(std::memcmp(gpu.data, pattern.data() + 61440, 8192) == 0);
    expected = {{mapping, test_granule, false}, {mapping + test_granule, test_granule, false}};
    CHECK(log.registrations() == expected);
    CHECK(ctrl.namespace_pinned_bytes(1) == 2 * test_granule);
    {
      // No copy's host side spans two granules (CUDA refuses a copy across two registrations).
      std::scoped_lock lock(log.mutex);
      REQUIRE_FALSE(log.host_sides.empty());
      for (const auto& [p, bytes] : log.host_sides) {
        CHECK((p - mapping) / test_granule == (p + bytes - 1 - mapping) / test_granule);
      }
    }

    // Again, and a write from device memory into granule 1: pinned already, not again.
    REQUIRE(host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 120, 16, gpu.bus, gpu.bus + 4096)).status() == spec::status::successful_completion);
    REQUIRE(host.run(*q, spec::make_rw(spec::nvm_opcode::write, 1, 200, 8, gpu.bus)).status() == spec::status::successful_completion);
    CHECK(log.registrations() == expected);
    std::vector<std::byte> back(4096);
    ctrl.store(1).read(200 * 512, back.data(), back.size());
    CHECK(std::memcmp(back.data(), gpu.data, 4096) == 0);

    // The last granule, shorter than the others, is registered to its end (the rounding to a
    // whole last page is the read-only file case's).
    REQUIRE(host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 992, 8, gpu.bus)).status() == spec::status::successful_completion);
    expected.push_back({mapping + 7 * test_granule, 512 * 1000 - 7 * test_granule, false});
    CHECK(log.registrations() == expected);
    std::scoped_lock lock(log.mutex);
    CHECK(log.unregistered.empty());
  }
  std::sort(log.unregistered.begin(), log.unregistered.end(), [](auto& a, auto& b) { return a.pointer < b.pointer; });
  std::sort(expected.begin(), expected.end(), [](auto& a, auto& b) { return a.pointer < b.pointer; });
  CHECK(log.unregistered == expected);  // each once, when the controller goes
}

TEST_CASE("granules after the furthest one a command used are pinned ahead, each still once") {
  registration_log log;
  {
    emu::controller ctrl(pinning_config(log, true, 2));
    std::byte* const mapping = ctrl.store(1).mapping();
    test_host host(ctrl);
    REQUIRE(host.enable());
    auto q = host.create_pair(1, 16);
    fake_gpu_buffer gpu(ctrl, 4096);
    REQUIRE(host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 8, gpu.bus)).status() == spec::status::successful_completion);
    // Granule 0 by the command; 1 and 2 by the pin-ahead threads.
    REQUIRE(test_host::eventually([&] { return ctrl.namespace_pinned_bytes(1) == 3 * test_granule; }));
    // A command in granule 2 finds it pinned and asks for 3 and 4; one in 7 pins it itself.
    REQUIRE(host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 2 * 128, 8, gpu.bus)).status() == spec::status::successful_completion);
    REQUIRE(test_host::eventually([&] { return ctrl.namespace_pinned_bytes(1) == 5 * test_granule; }));
    REQUIRE(host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 999, 1, gpu.bus)).status() == spec::status::successful_completion);
    CHECK(ctrl.namespace_pinned_bytes(1) == 5 * test_granule + (512 * 1000 - 7 * test_granule));
    auto calls = log.registrations();
    std::set<void*> pointers;
    for (const auto& c : calls) pointers.insert(c.pointer);
    CHECK(pointers.size() == calls.size());
    CHECK(pointers == std::set<void*>{mapping, mapping + test_granule, mapping + 2 * test_granule, mapping + 3 * test_granule,
                                      mapping + 4 * test_granule, mapping + 7 * test_granule});
  }
  CHECK(log.unregistered.size() == log.registered.size());
}

TEST_CASE("past the pinning budget granules stay pageable, and reads from them are still right") {
  registration_log log;
  auto config = pinning_config(log);
  config.pinning.budget_bytes = test_granule;  // one granule
  {
    emu::controller ctrl(config);
    std::vector<std::byte> pattern(512 * 1000);
    for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<std::byte>(i % 251);
    ctrl.store(1).write(0, pattern.data(), pattern.size());
    test_host host(ctrl);
    REQUIRE(host.enable());
    auto q = host.create_pair(1, 16);
    fake_gpu_buffer gpu(ctrl, 8192);
    REQUIRE(host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 120, 16, gpu.bus, gpu.bus + 4096)).status() == spec::status::successful_completion);
    CHECK(std::memcmp(gpu.data, pattern.data() + 61440, 8192) == 0);
    CHECK(ctrl.namespace_pinned_bytes(1) == test_granule);
    CHECK(log.registrations().size() == 1);  // granule 1 was not offered to the hook
  }
  CHECK(log.unregistered.size() == 1);
}

TEST_CASE("a namespace whose registrations are declined works, pins nothing and is never unregistered") {
  registration_log log;
  {
    emu::controller ctrl(pinning_config(log, false));
    CHECK(ctrl.namespace_pinned_bytes(1) == 0);
    CHECK_THROWS_AS((void)ctrl.namespace_pinned_bytes(2), std::out_of_range);
    test_host host(ctrl);
    REQUIRE(host.enable());
    auto q = host.create_pair(1, 16);
    fake_gpu_buffer out(ctrl, 4096), in(ctrl, 4096);
    std::memset(out.data, 0x3c, 4096);
    CHECK(host.run(*q, spec::make_rw(spec::nvm_opcode::write, 1, 8, 8, out.bus)).status() == spec::status::successful_completion);
    CHECK(host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 8, 8, in.bus)).status() == spec::status::successful_completion);
    CHECK(std::memcmp(out.data, in.data, 4096) == 0);
    CHECK(ctrl.namespace_pinned_bytes(1) == 0);
    // Declined once, never offered again.
    CHECK(host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 8, 8, in.bus)).status() == spec::status::successful_completion);
  }
  CHECK(log.registered.size() == 1);
  CHECK(log.unregistered.empty());
}

TEST_CASE("a read-only file namespace is registered as read-only, to the end of its last page") {
  const auto dir = std::filesystem::temp_directory_path() / ("cunvme-emu-pin-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "ro.img";
  { std::ofstream(path, std::ios::binary) << std::string(6000, 'x'); }
  {
    registration_log log;
    emu::controller_config config;
    auto ns = emu::namespace_config::from_file(path.string());
    ns.read_only = true;
    config.namespaces = {ns};
    config.memory = log.hooks();
    emu::controller ctrl(config);
    test_host host(ctrl);
    REQUIRE(host.enable());
    auto q = host.create_pair(1, 16);
    fake_gpu_buffer gpu(ctrl, 4096);
    REQUIRE(host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 8, 4, gpu.bus)).status() == spec::status::successful_completion);
    CHECK(std::all_of(gpu.data, gpu.data + 6000 - 4096, [](std::byte b) { return b == std::byte{'x'}; }));
    const auto calls = log.registrations();
    REQUIRE(calls.size() == 1);
    CHECK(calls[0].read_only);
    CHECK(calls[0].bytes == 8192);  // 12 blocks of 512 bytes, the last page whole
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("a pinning granule that is not a power of two of at least a page is refused when the controller is built") {
  registration_log log;
  auto config = pinning_config(log);
  config.pinning.granule_bytes = 3 * 4096;
  CHECK_THROWS_WITH_AS(emu::controller{config}, doctest::Contains("granule of 12288 bytes"), std::invalid_argument);
  config.pinning.granule_bytes = 512;
  CHECK_THROWS_WITH_AS(emu::controller{config}, doctest::Contains("granule of 512 bytes"), std::invalid_argument);
  config.memory = {};  // no hook, nothing to pin: still refused
  CHECK_THROWS_WITH_AS(emu::controller{config}, doctest::Contains("power of two of at least a page"), std::invalid_argument);
}

TEST_CASE("the pinning budget counts every controller's pinned granules in the process together") {
  registration_log log_a, log_b;
  auto config_a = pinning_config(log_a);
  auto config_b = pinning_config(log_b);
  config_a.pinning.budget_bytes = config_b.pinning.budget_bytes = emu::detail::process_pinned_bytes().load() + test_granule;
  emu::controller a(config_a), b(config_b);
  test_host host_a(a), host_b(b);
  REQUIRE(host_a.enable());
  REQUIRE(host_b.enable());
  auto qa = host_a.create_pair(1, 16);
  auto qb = host_b.create_pair(1, 16);
  fake_gpu_buffer gpu_a(a, 4096), gpu_b(b, 4096);
  REQUIRE(host_a.run(*qa, spec::make_rw(spec::nvm_opcode::read, 1, 0, 8, gpu_a.bus)).status() == spec::status::successful_completion);
  REQUIRE(host_b.run(*qb, spec::make_rw(spec::nvm_opcode::read, 1, 0, 8, gpu_b.bus)).status() == spec::status::successful_completion);
  CHECK(a.namespace_pinned_bytes(1) == test_granule);
  CHECK(b.namespace_pinned_bytes(1) == 0);  // the process had reached the budget
  CHECK(log_b.registrations().empty());
}

TEST_CASE("threads pinning the same granules at once register each exactly once") {
  // Eight threads use random ranges while two pin-ahead threads pin what follows them: every
  // granule is registered once, each `use` returns with its granules pinned, and all are
  // unregistered once at the end (ThreadSanitizer runs this too).
  registration_log log;
  std::atomic<int> in_register{0}, overlapped{0};
  auto hooks = log.hooks();
  auto record = hooks.register_host;
  hooks.register_host = [&](void* p, std::size_t n, bool ro) {
    if (in_register.fetch_add(1) > 0) overlapped.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // widen the window for a second claim
    in_register.fetch_sub(1);
    return record(p, n, ro);
  };
  std::vector<std::byte> memory(64 * test_granule);
  auto* mapping = reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(memory.data()) + 4095) / 4096 * 4096);
  const std::uint64_t bytes = 60 * test_granule;
  emu::pinning_config pin;
  pin.granule_bytes = test_granule;
  pin.threads = 2;
  {
    emu::detail::pinned_granules granules(mapping, bytes, false, pin, hooks.register_host, hooks.unregister_host);
    emu::detail::pin_ahead_pool pool(pin.threads);
    std::vector<std::thread> threads;
    std::atomic<int> unpinned_after_use{0};
    for (unsigned t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        std::uint64_t x = 0x9e3779b97f4a7c15ull * (t + 1);
        for (int i = 0; i < 200; ++i) {
          x ^= x << 13, x ^= x >> 7, x ^= x << 17;
          const std::uint64_t offset = x % bytes;
          const std::uint64_t len = 1 + (x >> 40) % std::min<std::uint64_t>(3 * test_granule, bytes - offset);
          granules.use(offset, len);
          for (std::uint64_t g = granules.granule_of(offset); g <= granules.granule_of(offset + len - 1); ++g) {
            if (!granules.is_pinned(g)) unpinned_after_use.fetch_add(1);
          }
          pool.request(granules, granules.granule_of(offset + len - 1) + 1, 3);
        }
      });
    }
    for (auto& t : threads) t.join();
    pool.stop();
    CHECK(unpinned_after_use == 0);
    const auto calls = log.registrations();
    std::set<void*> pointers;
    for (const auto& c : calls) pointers.insert(c.pointer);
    CHECK(pointers.size() == calls.size());  // never twice
    CHECK(granules.pinned_bytes() == calls.size() * test_granule);
    MESSAGE(calls.size() << " granules registered, " << overlapped.load() << " registrations overlapped another");
  }
  CHECK(log.unregistered.size() == log.registered.size());
}

TEST_CASE("Write Zeroes clears a pinned granule in place and hands an unpinned granule's pages back") {
  registration_log log;
  emu::controller ctrl(pinning_config(log));  // granules of 64 KiB, nothing pinned ahead
  test_host host(ctrl);
  REQUIRE(host.enable());
  auto q = host.create_pair(1, 16);
  auto& store = ctrl.store(1);
  std::vector<std::byte> junk(2 * test_granule, std::byte{0xa5});
  store.write(0, junk.data(), junk.size());
  // A read into device memory pins granule 0; granule 1 stays unpinned.
  fake_gpu_buffer gpu(ctrl, 4096);
  REQUIRE(host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 8, gpu.bus)).status() == spec::status::successful_completion);
  REQUIRE(ctrl.namespace_pinned_bytes(1) == test_granule);
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const auto resident_pages = [&](std::uint64_t offset) {
    std::vector<unsigned char> resident(test_granule / page);
    REQUIRE(::mincore(store.mapping() + offset, test_granule, resident.data()) == 0);
    return std::count_if(resident.begin(), resident.end(), [](unsigned char r) { return (r & 1u) != 0; });
  };
  // Both granules whole: 256 blocks of 512 bytes.
  REQUIRE(host.run(*q, spec::make_rw(spec::nvm_opcode::write_zeroes, 1, 0, 256)).status() == spec::status::successful_completion);
  // Pinned pages stay in the mapping (whatever a device reads through them is what the host
  // sees); the unpinned granule's are handed back.
  CHECK(resident_pages(0) == static_cast<std::ptrdiff_t>(test_granule / page));
  CHECK(resident_pages(test_granule) == 0);
  std::vector<std::byte> back(2 * test_granule);
  store.read(0, back.data(), back.size());
  CHECK(std::all_of(back.begin(), back.end(), [](std::byte b) { return b == std::byte{0}; }));
  // The granule held while its pages went is pinned by the next read that needs it.
  REQUIRE(host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 128, 8, gpu.bus)).status() == spec::status::successful_completion);
  CHECK(ctrl.namespace_pinned_bytes(1) == 2 * test_granule);
}

TEST_CASE("zeroing and pinning the same granules from many threads never pins a granule whose pages are being handed back") {
  // The hook checks that no zeroing of its granule is in progress when it is called (the
  // granule is held while its pages go), with threads zeroing and pinning at random.
  registration_log log;
  auto hooks = log.hooks();
  std::atomic<int> zeroing_now[8] = {};
  std::atomic<int> overlaps{0};
  std::byte* base = nullptr;
  auto record = hooks.register_host;
  hooks.register_host = [&](void* p, std::size_t n, bool ro) {
    const auto g = static_cast<std::size_t>((static_cast<std::byte*>(p) - base) / test_granule);
    if (zeroing_now[g].load() != 0) overlaps.fetch_add(1);
    return record(p, n, ro);
  };
  std::vector<std::byte> memory(9 * test_granule);
  base = reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(memory.data()) + 4095) / 4096 * 4096);
  emu::pinning_config pin;
  pin.granule_bytes = test_granule;
  for (int round = 0; round < 20; ++round) {
    emu::detail::pinned_granules granules(base, 8 * test_granule, false, pin, hooks.register_host, hooks.unregister_host);
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (std::uint64_t i = 0; i < 64; ++i) {
          const std::uint64_t g = (i * 5 + t * 3 + static_cast<std::uint64_t>(round)) % 8;
          if (i % 3 != 0) {  // two uses in three, over every granule
            granules.use(g * test_granule, 1);
            continue;
          }
          std::uint8_t before = 0;
          if (!granules.hold_unpinned(g, before)) continue;
          zeroing_now[g].fetch_add(1);
          std::this_thread::sleep_for(std::chrono::microseconds(50));
          zeroing_now[g].fetch_sub(1);
          granules.end_hold(g, before);
        }
      });
    }
    for (auto& th : threads) th.join();
    for (std::uint64_t g = 0; g < 8; ++g) CHECK(granules.is_pinned(g));  // every granule was used at least once
  }
  CHECK(overlaps == 0);
  std::scoped_lock lock(log.mutex);
  CHECK(log.unregistered.size() == log.registered.size());
}
