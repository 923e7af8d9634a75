// The path by which a real controller's BAR and DMA memory become usable by GPU threads, with a
// registrar that stands in for CUDA's (cudaHostRegister) and records what it is asked: the
// emulator without CUDA memory hooks is plain memory, as a real backend's mappings are.
#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/backend/emu_backend.cuh>
#include <cunvme/host/memory/host_registration.cuh>
#include <cunvme/host/open.cuh>
#include <cunvme/spec/registers.cuh>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace host = cunvme::host;
namespace emu = cunvme::emu;
namespace spec = cunvme::spec;

namespace {

/// What the fake registrar was asked, and what is registered now.
struct registry {
  struct entry {
    std::byte* host;
    std::size_t bytes;
    bool io_memory;
    std::string what;
  };
  std::vector<entry> live;
  std::size_t registered = 0, unregistered = 0;

  /// GPU addresses are the host's moved by this much: distinct, never dereferenced here.
  static constexpr std::uintptr_t gpu_offset = std::uintptr_t{1} << 44;

  [[nodiscard]] bool covers(const void* p) const {
    const auto* b = static_cast<const std::byte*>(p);
    return std::any_of(live.begin(), live.end(), [&](const entry& e) { return b >= e.host && b < e.host + e.bytes; });
  }
  [[nodiscard]] static const void* gpu_of(const void* host) { return reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(host) + gpu_offset); }
};

host::host_registrar fake_registrar(const std::shared_ptr<registry>& r, std::string refuse_what = "") {
  return [r, refuse_what](void* p, std::size_t bytes, bool io_memory, const std::string& what, const std::string& device) {
    if (!refuse_what.empty() && what.find(refuse_what) != std::string::npos) throw host::error("Register " + what, device, "refused by the test");
    auto* b = static_cast<std::byte*>(p);
    r->live.push_back({b, bytes, io_memory, what});
    ++r->registered;
    return host::host_registration(const_cast<void*>(registry::gpu_of(p)), [r, b] {
      std::erase_if(r->live, [b](const registry::entry& e) { return e.host == b; });
      ++r->unregistered;
    });
  };
}

}  // namespace

TEST_CASE("a controller brought up for GPU threads registers its BAR, as RAM for the emulator, before anything else") {
  auto r = std::make_shared<registry>();
  host::controller ctrl(std::make_unique<host::emu_backend>(), {}, fake_registrar(r));
  REQUIRE(!r->live.empty());
  CHECK(r->live.front().host == ctrl.backend().bar());
  CHECK(r->live.front().bytes == ctrl.backend().bar_size());
  CHECK_FALSE(r->live.front().io_memory);  // the emulator's BAR is RAM; a real BAR is I/O memory
  CHECK(r->live.front().what.find("BAR") != std::string::npos);
  CHECK(ctrl.device_bar() == registry::gpu_of(ctrl.backend().bar()));
}

TEST_CASE("every DMA buffer of a GPU-reached controller comes back registered, its device address the registration's") {
  auto r = std::make_shared<registry>();
  host::controller ctrl(std::make_unique<host::emu_backend>(), {}, fake_registrar(r));
  const std::size_t before = r->live.size();
  {
    host::dma_buffer b = ctrl.memory().allocate(3 * 4096 + 100);
    CHECK(r->live.size() == before + 1);
    CHECK(r->covers(b.data()));
    CHECK(b.device_data() == registry::gpu_of(b.data()));
    CHECK(b.bus() % 4096 == 0);  // the backend's bus addresses, untouched
  }
  CHECK(r->live.size() == before);  // unregistered with the buffer
}

TEST_CASE("a queue pair's view for kernels holds the registered addresses; the host's own I/O keeps its own and works") {
  auto r = std::make_shared<registry>();
  host::controller_options options;
  options.shadow_doorbells = true;
  host::controller ctrl(std::make_unique<host::emu_backend>(), options, fake_registrar(r));
  REQUIRE(ctrl.shadow_doorbells());
  auto q = ctrl.create_queue_pair(16);
  const auto& v = q->view();
  const unsigned dstrd = ctrl.cap().dstrd();
  CHECK(reinterpret_cast<std::byte*>(v.sq_doorbell) == ctrl.device_bar() + spec::sq_tail_doorbell_offset(q->id(), dstrd));
  CHECK(reinterpret_cast<std::byte*>(v.cq_doorbell) == ctrl.device_bar() + spec::cq_head_doorbell_offset(q->id(), dstrd));
  CHECK(static_cast<const void*>(v.sq) == registry::gpu_of(q->sq()));
  CHECK(static_cast<const void*>(v.cq) == registry::gpu_of(q->cq()));
  const auto [sq_shadow, sq_event] = ctrl.shadow_slots(q->id(), false);
  CHECK(static_cast<const void*>(v.sq_shadow) == registry::gpu_of(sq_shadow));
  CHECK(static_cast<const void*>(v.sq_event_index) == registry::gpu_of(sq_event));
  CHECK(static_cast<const void*>(v.prp_lists) != nullptr);
  CHECK_FALSE(r->covers(v.prp_lists));  // a GPU address, not the host's
  // The host's own I/O uses the host's addresses throughout: data moves.
  auto out = ctrl.memory().allocate(64 * 1024);
  auto in = ctrl.memory().allocate(64 * 1024);
  for (std::size_t i = 0; i < out.size() / 8; ++i) reinterpret_cast<std::uint64_t*>(out.data())[i] = 0x600d000000000000ull + i;
  REQUIRE(q->write(1, 0, 128, out) == spec::status::successful_completion);
  REQUIRE(q->read(1, 0, 128, in) == spec::status::successful_completion);
  CHECK(std::memcmp(in.data(), out.data(), out.size()) == 0);
}

TEST_CASE("an SQ in the CMB is written by kernels through the registered CMB") {
  auto r = std::make_shared<registry>();
  emu::controller_config config;
  config.cmb_bytes = 1 << 20;
  host::controller_options options;
  options.use_cmb = true;
  host::controller ctrl(std::make_unique<host::emu_backend>(config), options, fake_registrar(r));
  REQUIRE(ctrl.backend().cmb() != nullptr);
  CHECK(r->covers(ctrl.backend().cmb()));
  auto q = ctrl.create_queue_pair(64, host::queue_placement::cmb_submission);
  CHECK(static_cast<const void*>(q->view().sq) == registry::gpu_of(q->sq()));
}

TEST_CASE("everything registered is unregistered when the controller goes") {
  auto r = std::make_shared<registry>();
  {
    host::controller ctrl(std::make_unique<host::emu_backend>(), {}, fake_registrar(r));
    auto q = ctrl.create_queue_pair(8);
    auto b = ctrl.memory().allocate(4096);
    CHECK(r->registered >= 5);  // the BAR; the queue pair's SQ, CQ, bookkeeping and PRP lists; `b`
  }
  CHECK(r->live.empty());
  CHECK(r->unregistered == r->registered);
}

TEST_CASE("a registrar that refuses the BAR stops bring-up with its error, before any DMA memory exists") {
  auto r = std::make_shared<registry>();
  CHECK_THROWS_WITH_AS(host::controller(std::make_unique<host::emu_backend>(), {}, fake_registrar(r, "BAR")), doctest::Contains("refused by the test"),
                       host::error);
  CHECK(r->registered == 0);
}

TEST_CASE("a registrar that refuses DMA memory fails bring-up with its error and leaves nothing registered") {
  auto r = std::make_shared<registry>();
  host::controller_options options;
  options.shadow_doorbells = true;  // the shadow buffers are the DMA memory bring-up registers: kernels read them
  CHECK_THROWS_WITH_AS(host::controller(std::make_unique<host::emu_backend>(), options, fake_registrar(r, "DMA memory")),
                       doctest::Contains("refused by the test"), host::error);
  CHECK(r->live.empty());
}

TEST_CASE("memory only the host uses (admin queues, identify and log pages) is not registered for GPU threads") {
  auto r = std::make_shared<registry>();
  host::controller ctrl(std::make_unique<host::emu_backend>(), {}, fake_registrar(r));
  CHECK(r->registered == 1);  // the BAR alone
  CHECK(ctrl.log_page(spec::log_page_id::smart_health_information, 512).size() == 512);
  CHECK(r->registered == 1);
}

TEST_CASE("an emulator built with CUDA memory hooks is not registered again: its memory is GPU-usable from the start") {
  auto r = std::make_shared<registry>();
  emu::controller_config config;
  config.memory.allocate = [](std::size_t bytes) { return std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096); };
  config.memory.release = [](void* p, std::size_t) { std::free(p); };
  host::controller ctrl(std::make_unique<host::emu_backend>(config), {}, fake_registrar(r));
  CHECK(r->registered == 0);
  CHECK(ctrl.device_bar() == ctrl.backend().bar());
}

TEST_CASE("host::open hands the reach's registrar to the controller it brings up") {
  auto r = std::make_shared<registry>();
  const host::memory_reach reach = host::memory_reach::for_gpu({}, fake_registrar(r));
  CHECK(reach.beyond_cpu());
  auto ctrl = host::open("emu:blocks=1000", {}, reach);
  CHECK(ctrl->device_bar() == registry::gpu_of(ctrl->backend().bar()));
  CHECK(r->registered > 0);
}
