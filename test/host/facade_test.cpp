// The façade's host-side contracts, without a GPU: `host::open`'s reach option (the emulator's
// memory hooks behind a host-level type), `to_string(io_result)`, and the registration cache's
// policy (what stays mapped, what is unmapped, what a freed buffer does).
#include <cunvme/facade/registration_cache.cuh>
#if defined(__CUDACC__)
#include <cunvme/emu/cuda_memory.cuh>      // CUDA host code: the nvcc build of this file
#include <cunvme/facade/pending_copy.cuh>
#include <cunvme/host/cuda_error.cuh>
#endif
#include <cunvme/host/backend/emu_backend.cuh>
#include <cunvme/host/open.cuh>
#include <cunvme/io/io_result.cuh>

#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace host = cunvme::host;
namespace emu = cunvme::emu;
namespace spec = cunvme::spec;
using cunvme::gpu_allocation;
using cunvme::io_error;
using cunvme::io_result;
#if defined(__CUDACC__)
using cunvme::pending_copy;
#endif

namespace {

TEST_CASE("to_string(io_result) names the error, the NVMe status and the failing range") {
  CHECK(to_string(io_result{}) == "success");
  const io_result lba = io_result::failure(io_error::nvme_status, 65530, 64, spec::status::lba_out_of_range);
  CHECK(to_string(lba) == "NVMe error status: " + spec::to_string(spec::status::lba_out_of_range) + " at LBA 65530 (64 blocks)");
  CHECK(to_string(io_result::failure(io_error::timeout, 7, 8)) == "completion timeout at LBA 7 (8 blocks)");
  CHECK(to_string(io_result::failure(io_error::invalid_request, 0, 0)) == "invalid request at LBA 0 (0 blocks)");
}

TEST_CASE("host::open installs the memory hooks of the reach it is given, and by default none") {
  CHECK_FALSE(host::memory_reach{}.beyond_cpu());
  auto allocations = std::make_shared<std::atomic<int>>(0);
  const host::memory_reach counting = host::memory_reach::for_gpu([allocations] {
    emu::memory_hooks h;
    h.allocate = [allocations](std::size_t bytes) {
      ++*allocations;
      return std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    };
    h.release = [](void* p, std::size_t) { std::free(p); };
    return h;
  }, {});
  CHECK(counting.beyond_cpu());
  {
    auto plain = host::open("emu:blocks=1000");
    CHECK(*allocations == 0);
  }
  auto reached = host::open("emu:blocks=1000", {}, counting);
  CHECK(*allocations > 0);  // BAR0 and the admin queues came from the hooks
  CHECK(static_cast<bool>(dynamic_cast<host::emu_backend&>(reached->backend()).controller().config().memory.allocate));
  // Other schemes take the same option and still refuse a bad address before touching anything.
  CHECK_THROWS_AS((void)host::open("kmod:zz", {}, counting), host::error);
}

/// A mapping that counts how many of its kind are alive.
struct fake_mapping {
  explicit fake_mapping(host::gpu_window w, int& alive) : window(w), alive_(alive) { ++alive_; }
  fake_mapping(const fake_mapping&) = delete;
  ~fake_mapping() { --alive_; }
  host::gpu_window window;
  int& alive_;
};

struct fake_rig {
  int alive = 0, made = 0;
  cunvme::registration_cache<fake_mapping> cache;
  explicit fake_rig(std::size_t capacity) : cache(capacity, 65536, "gpu") {}
  auto maker() {
    return [this](const host::gpu_window& w) {
      ++made;
      return std::make_shared<const fake_mapping>(w, alive);
    };
  }
  auto find(const gpu_allocation& a, std::uintptr_t at, std::size_t bytes) { return cache.find(a, at, bytes, maker()); }
};

constexpr std::uintptr_t mib = 1 << 20;

TEST_CASE("the registration cache maps a buffer once and keeps it mapped for later transfers inside it") {
  fake_rig r(4);
  const gpu_allocation a{16 * mib, 4 * mib, 1};
  const auto first = r.find(a, 16 * mib, mib);
  CHECK(r.find(a, 16 * mib + 4096, 4096) == first);
  CHECK(r.find(a, 16 * mib, mib) == first);
  CHECK(r.made == 1);
  CHECK(r.cache.cached_count() == 1);
  // Past the cached window: one mapping of both ranges replaces it (no second one beside it).
  const auto grown = r.find(a, 18 * mib, mib);
  CHECK(grown != first);
  CHECK(grown->window.start == 16 * mib);
  CHECK(grown->window.bytes == 3 * mib);
  CHECK(r.cache.cached_count() == 1);
  CHECK(r.find(a, 16 * mib + 8, 4096) == grown);
  // A transfer still holding the old mapping keeps it; dropping it unmaps it.
  CHECK(r.alive == 2);
  CHECK(first.use_count() == 1);
}

TEST_CASE("the registration cache holds at most its capacity, dropping the least recently used") {
  fake_rig r(2);
  const gpu_allocation a{16 * mib, mib, 1}, b{32 * mib, mib, 2}, c{48 * mib, mib, 3};
  (void)r.find(a, a.base, 4096);
  (void)r.find(b, b.base, 4096);
  (void)r.find(a, a.base, 4096);  // a is now the more recent
  auto held = r.find(c, c.base, 4096);
  CHECK(r.cache.cached_count() == 2);
  CHECK(r.alive == 2);  // b was unmapped
  CHECK(r.made == 3);
  (void)r.find(a, a.base, 4096);
  CHECK(r.made == 3);  // a stayed
  (void)r.find(b, b.base, 4096);
  CHECK(r.made == 4);  // b was mapped again, c dropped from the cache …
  CHECK(r.alive == 3);  // … but kept alive by the transfer that holds it
  held.reset();
  CHECK(r.alive == 2);
  r.cache.clear();
  CHECK(r.alive == 0);
}

TEST_CASE("the registration cache with capacity 0 maps for each transfer and keeps nothing") {
  fake_rig r(0);
  const gpu_allocation a{16 * mib, mib, 1};
  {
    const auto m = r.find(a, a.base, 4096);
    CHECK(r.alive == 1);
    CHECK(r.cache.cached_count() == 0);
  }
  CHECK(r.alive == 0);
  (void)r.find(a, a.base, 4096);
  CHECK(r.made == 2);
}

TEST_CASE("a cached buffer freed and allocated again at the same address is mapped afresh") {
  fake_rig r(4);
  const gpu_allocation old_one{16 * mib, mib, 1};
  const auto m = r.find(old_one, old_one.base, 4096);
  const gpu_allocation new_one{16 * mib, 2 * mib, 2};  // the same start, a new buffer ID
  const auto n = r.find(new_one, new_one.base, 4096);
  CHECK(n != m);
  CHECK(r.made == 2);
  CHECK(r.cache.cached_count() == 1);
}

TEST_CASE("registered buffers stay mapped until deregistered, beside a cache of capacity 1") {
  fake_rig r(1);
  const gpu_allocation a{16 * mib, 4 * mib, 1}, b{32 * mib, mib, 2}, c{48 * mib, mib, 3};
  r.cache.register_buffer(a, a.base + 4096, 2 * mib, r.maker());
  CHECK(r.cache.registered_count() == 1);
  CHECK_THROWS_AS(r.cache.register_buffer(a, a.base + 4096, 4096, r.maker()), host::error);
  const auto inside = r.find(a, a.base + 8192, mib);
  CHECK(r.made == 1);  // the registration covers it
  (void)r.find(b, b.base, 4096);
  (void)r.find(c, c.base, 4096);  // evicts b, never the registration
  CHECK(r.cache.registered_count() == 1);
  CHECK(r.find(a, a.base + 4096, 4096) == inside);
  // Outside the registered range: a cached mapping of its own.
  CHECK(r.find(a, a.base + 3 * mib, 4096) != inside);
  CHECK_FALSE(r.cache.deregister_buffer(a.base));  // not where it was registered
  CHECK(r.cache.deregister_buffer(a.base + 4096));
  CHECK(r.cache.registered_count() == 0);
  CHECK_FALSE(r.cache.deregister_buffer(a.base + 4096));
}

TEST_CASE("a registered buffer freed without deregistering is dropped and the transfer refused") {
  fake_rig r(4);
  const gpu_allocation a{16 * mib, mib, 1};
  r.cache.register_buffer(a, a.base, mib, r.maker());
  const gpu_allocation reused{16 * mib, mib, 7};  // cudaFree, then cudaMalloc returned the same range
  try {
    (void)r.find(reused, reused.base, 4096);
    FAIL("a freed registered buffer was used");
  } catch (const host::error& e) {
    CHECK(std::string(e.what()).find("deregister_buffer before freeing") != std::string::npos);
  }
  CHECK(r.cache.registered_count() == 0);
  CHECK(r.alive == 0);
  (void)r.find(reused, reused.base, 4096);  // the new buffer works
  CHECK(r.alive == 1);
}

TEST_CASE("the registration cache refuses a transfer outside its allocation before mapping anything") {
  fake_rig r(4);
  const gpu_allocation a{16 * mib, mib, 1};
  CHECK_THROWS_AS((void)r.find(a, a.base + mib - 512, 1024), host::error);
  CHECK_THROWS_AS((void)r.find(a, a.base - 8, 16), host::error);
  CHECK_THROWS_AS(r.cache.register_buffer(a, a.base, 2 * mib, r.maker()), host::error);
  CHECK(r.made == 0);
}

#if defined(__CUDACC__)
TEST_CASE("a pending_copy is move-only, and a moved-from one refuses wait() instead of reporting success") {
  static_assert(!std::is_copy_constructible_v<pending_copy> && !std::is_copy_assignable_v<pending_copy>);
  pending_copy first(io_result::failure(io_error::nvme_status, 7, 1, spec::status::lba_out_of_range));
  pending_copy second(std::move(first));
  CHECK(second.ready());
  CHECK(second.wait().status == spec::status::lba_out_of_range);
  CHECK(first.ready());
  CHECK(first.wait().error == io_error::invalid_request);
  pending_copy third;
  third = std::move(second);
  CHECK(third.wait().lba == 7);
  CHECK(second.wait().error == io_error::invalid_request);
}

TEST_CASE("a failed CUDA runtime call is a host::error naming the operation, the device, the call and the error by name and text") {
  CHECK(host::cuda_error_text(cudaErrorInvalidValue) == "cudaErrorInvalidValue (invalid argument)");
  CHECK_NOTHROW(host::cuda_check(cudaSuccess, "Allocate", "emu"));
  try {
    host::cuda_check(cudaErrorMemoryAllocation, "Allocate pinned memory", "0000:01:00.0", "4096 bytes");
    FAIL("cuda_check did not throw");
  } catch (const host::error& e) {
    CHECK(std::string(e.what()) == "Allocate pinned memory on 0000:01:00.0: 4096 bytes: cudaErrorMemoryAllocation (out of memory)");
    CHECK(e.operation() == "Allocate pinned memory");
    CHECK(e.device() == "0000:01:00.0");
  }
  const host::error hinted = host::cuda_error(cudaErrorInvalidValue, "Register a BAR for GPU threads", "emu", "cudaHostRegister", "a hint");
  CHECK(std::string(hinted.what()) == "Register a BAR for GPU threads on emu: cudaHostRegister: cudaErrorInvalidValue (invalid argument); a hint");
  // The emulator's CUDA failures are the same error, worded the same way, with the code kept.
  const emu::cuda_error emulated(cudaErrorInvalidValue, "Pin and map 4096 bytes of host memory");
  CHECK(std::string(emulated.what()) == "Pin and map 4096 bytes of host memory on emu: cudaErrorInvalidValue (invalid argument)");
  CHECK(emulated.code() == cudaErrorInvalidValue);
}

TEST_CASE("a failed driver call is a host::error naming the CUresult by name where the driver can, else by number") {
  const host::error e = host::driver_error(CUDA_ERROR_INVALID_VALUE, "Find the GPU allocation", "emu", "cuMemGetAddressRange");
  if (host::driver_entry_point("cuGetErrorName") != nullptr) {
    CHECK(std::string(e.what()) == "Find the GPU allocation on emu: cuMemGetAddressRange: CUDA_ERROR_INVALID_VALUE (invalid argument)");
  } else {
    MESSAGE("no CUDA driver here: a CUresult is named by its number");
    CHECK(std::string(e.what()) == "Find the GPU allocation on emu: cuMemGetAddressRange: CUresult 1");
  }
  CHECK_NOTHROW(host::driver_check(CUDA_SUCCESS, "Find the GPU allocation", "emu"));
  CHECK_THROWS_AS(host::driver_check(CUDA_ERROR_NOT_SUPPORTED, "Export GPU memory as a dma-buf", "emu"), host::error);
}
#endif

}  // namespace
