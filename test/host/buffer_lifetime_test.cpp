// A DMA buffer and the controller that handed it out may go in either order: a buffer released
// after its controller is gone frees its memory and touches nothing of the controller (the
// mappings went with it). Run under AddressSanitizer, these cases catch a release that reaches
// into a destroyed backend (build/asan: -Db_sanitize=address).
#include <cunvme/host/backend/emu_backend.cuh>
#include <cunvme/host/open.cuh>

#include <doctest/doctest.h>

#include "fake_gpu_address.hpp"

#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace host = cunvme::host;

TEST_CASE("an emulator's buffers released after their controller is destroyed free their memory and touch nothing else") {
  std::vector<host::dma_buffer> kept;
  std::vector<std::byte> foreign(8192 + 4096);
  auto* aligned = reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(foreign.data()) + 4095) / 4096 * 4096);
  {
    auto ctrl = host::open("emu:blocks=64");
    kept.push_back(ctrl->memory().allocate(1 << 20));
    kept.push_back(ctrl->memory().allocate(4096, 2u << 20));
    kept.push_back(ctrl->memory().map_gpu_range(fake_gpu_address(), 4096));
    kept.push_back(ctrl->memory().map_host(aligned, 8192));
    std::memset(kept[0].data(), 0x5a, kept[0].size());
  }
  // The host memory of an allocation stays the buffer's until the buffer goes.
  CHECK(kept[0].data()[(1 << 20) - 1] == std::byte{0x5a});
  kept.clear();
}

TEST_CASE("an emulator's buffers released before their controller is destroyed leave it working") {
  auto ctrl = host::open("emu:blocks=64");
  for (int i = 0; i < 4; ++i) {
    auto b = ctrl->memory().allocate(8192);
    CHECK(b.bus() != 0);
  }
  auto after = ctrl->memory().allocate(4096);
  CHECK(after.size() == 4096);
}

TEST_CASE("an emulator's buffers released on other threads while their controller is destroyed are safe") {
  for (int round = 0; round < 20; ++round) {
    std::vector<host::dma_buffer> buffers;
    auto ctrl = host::open("emu:blocks=64");
    for (int i = 0; i < 8; ++i) buffers.push_back(ctrl->memory().allocate(4096));
    std::vector<std::thread> releasers;
    for (auto& b : buffers) releasers.emplace_back([b = std::move(b)]() mutable { b = host::dma_buffer(); });
    ctrl.reset();
    for (auto& t : releasers) t.join();
  }
}
