// The emulated IOMMU: only registered memory is reachable.
#include <cunvme/emu/dma_space.cuh>

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace emu = cunvme::emu;

TEST_CASE("a mapped buffer is reachable at its bus address and keeps its offset in the page") {
  emu::dma_space dma;
  std::vector<std::byte> buf(10000);
  const auto bus = dma.map(buf.data() + 3, 100);
  CHECK(bus % emu::dma_space::bus_granule == reinterpret_cast<std::uintptr_t>(buf.data() + 3) % emu::dma_space::bus_granule);
  const auto r = dma.find(bus + 10, 90);
  REQUIRE(r.has_value());
  CHECK(r->pointer == buf.data() + 3);
  CHECK(r->kind == emu::memory_kind::host);
  const char text[] = "hello";
  REQUIRE(dma.write(bus + 4, text, sizeof text));
  char back[sizeof text];
  REQUIRE(dma.read(bus + 4, back, sizeof back));
  CHECK(std::string(back) == "hello");
  CHECK(std::memcmp(buf.data() + 7, text, sizeof text) == 0);
}

TEST_CASE("accesses outside every region, or running past one, fault and are counted") {
  emu::dma_space dma;
  std::vector<std::byte> buf(4096);
  const auto bus = dma.map(buf.data(), buf.size());
  char byte = 0;
  CHECK_FALSE(dma.read(bus - 1, &byte, 1));
  CHECK_FALSE(dma.read(bus + 4096, &byte, 1));
  std::vector<std::byte> big(4097);
  CHECK_FALSE(dma.read(bus, big.data(), big.size()));
  CHECK_FALSE(dma.find(~0ull - 1, 8).has_value());  // no wrap-around
  CHECK(dma.faults() == 4);
}

TEST_CASE("regions are separated by unmapped guard space") {
  emu::dma_space dma;
  std::vector<std::byte> a(4096), b(4096);
  const auto bus_a = dma.map(a.data(), a.size());
  const auto bus_b = dma.map(b.data(), b.size());
  // A whole empty granule between the granule a ends in and the one b starts in. (Not
  // `bus_b - bus_a >= 2 granules`: bus addresses keep the pointers' offsets in their granule,
  // so that failed whenever a's offset exceeded b's.)
  constexpr std::uint64_t g = emu::dma_space::bus_granule;
  CHECK(bus_b / g * g >= (bus_a + a.size() + g - 1) / g * g + g);
  CHECK_FALSE(dma.find(bus_a + 4096, 1).has_value());
}

TEST_CASE("an unmapped region is no longer reachable, and unmapping twice is an error") {
  emu::dma_space dma;
  std::vector<std::byte> buf(4096);
  const auto bus = dma.map(buf.data(), buf.size());
  dma.unmap(bus);
  CHECK_FALSE(dma.find(bus, 1).has_value());
  CHECK_THROWS_AS(dma.unmap(bus), std::invalid_argument);
}

TEST_CASE("mapping an empty region is refused") {
  emu::dma_space dma;
  std::vector<std::byte> buf(1);
  CHECK_THROWS_AS((void)dma.map(nullptr, 4096), std::invalid_argument);
  CHECK_THROWS_AS((void)dma.map(buf.data(), 0), std::invalid_argument);
}

TEST_CASE("a region at a chosen address may not overlap another") {
  emu::dma_space dma;
  std::vector<std::byte> a(8192), cmb(8192);
  CHECK(dma.map_at(0x100000, cmb.data(), cmb.size(), emu::memory_kind::cmb));
  CHECK_FALSE(dma.map_at(0x101000, a.data(), 4096, emu::memory_kind::host));
  CHECK_FALSE(dma.map_at(0xff000, a.data(), 8192, emu::memory_kind::host));
  CHECK(dma.map_at(0x102000, a.data(), 4096, emu::memory_kind::host));
  CHECK(dma.find(0x100000, 8192)->kind == emu::memory_kind::cmb);
}

TEST_CASE("device regions move through the installed copier, and fault without one") {
  emu::dma_space dma;
  std::vector<std::byte> fake_gpu(4096);
  const auto bus = dma.map(fake_gpu.data(), fake_gpu.size(), emu::memory_kind::device);
  int value = 42;
  CHECK_FALSE(dma.write(bus, &value, sizeof value));
  int copies = 0;
  int waits = 0;
  dma.set_device_copier(emu::device_copier{[&](void* dst, const void* src, std::uint64_t n, bool, int) {
                                             ++copies;
                                             std::memcpy(dst, src, n);
                                             return true;
                                           },
                                           [&] {
                                             ++waits;
                                             return true;
                                           },
                                           {},
                                           {},
                                           {}});
  CHECK(dma.write(bus, &value, sizeof value));
  int back = 0;
  CHECK(dma.read(bus, &back, sizeof back));
  CHECK(back == 42);
  CHECK(copies == 2);
  CHECK(dma.pin().store32(bus, 7));
  CHECK(waits == 2);  // a 32-bit store completes the copies before it, then its own
  CHECK(dma.pin().finish_device_writes());
}

TEST_CASE("each device region's copies name the GPU its memory belongs to, asked once when it is mapped") {
  // Several GPUs: the copier moves each GPU's bytes on that GPU's streams, so it must be told
  // whose memory a region is; memory no GPU owns is refused as an IOMMU refuses an unbacked address.
  emu::dma_space dma;
  std::vector<std::byte> gpu0(4096), gpu3(4096), nobody(4096);
  int asked = 0;
  std::vector<int> copied_for;
  emu::device_copier copier;
  copier.copy = [&](void* dst, const void* src, std::uint64_t n, bool, int gpu) {
    copied_for.push_back(gpu);
    std::memcpy(dst, src, n);
    return true;
  };
  copier.wait = [] { return true; };
  copier.gpu_of = [&](const void* p) {
    ++asked;
    return p == gpu0.data() ? 0 : p == gpu3.data() ? 3 : -1;
  };
  dma.set_device_copier(copier);
  const auto on0 = dma.map(gpu0.data(), gpu0.size(), emu::memory_kind::device);
  const auto on3 = dma.map(gpu3.data(), gpu3.size(), emu::memory_kind::device);
  CHECK_THROWS_WITH_AS((void)dma.map(nobody.data(), nobody.size(), emu::memory_kind::device), doctest::Contains("not GPU memory"), std::invalid_argument);
  CHECK(asked == 3);
  CHECK(dma.find(on3, 8)->gpu == 3);
  const int value = 9;
  CHECK(dma.write(on3, &value, sizeof value));
  CHECK(dma.write(on0, &value, sizeof value));
  int back = 0;
  CHECK(dma.read(on3 + 8, &back, sizeof back));
  CHECK(copied_for == std::vector<int>{3, 0, 3});
  CHECK(asked == 3);  // never on the I/O path
  // Host regions never ask.
  std::vector<std::byte> host(4096);
  (void)dma.map(host.data(), host.size());
  CHECK(asked == 3);
}

TEST_CASE("dma_space::map with an alignment above 2 MiB returns a bus address congruent to the pointer modulo it") {
  emu::dma_space dma;
  alignas(4096) static std::byte page[4096];
  (void)dma.map(page, 3u << 20);  // leaves the next free bus address 2 MiB off a 4 MiB boundary
  for (const std::uint64_t alignment : {std::uint64_t{4} << 20, std::uint64_t{128} << 20, std::uint64_t{1} << 40}) {
    CAPTURE(alignment);
    const std::uint64_t bus = dma.map(page, 4096, emu::memory_kind::host, alignment);
    CHECK(bus % alignment == reinterpret_cast<std::uintptr_t>(page) % alignment);
  }
  CHECK_THROWS_AS((void)dma.map(page, 4096, emu::memory_kind::host, 3u << 20), std::invalid_argument);
}

TEST_CASE("a 32-bit store to device memory lands after the thread's earlier device writes, whatever order a copier keeps") {
  // A copier may run the copies it holds in any order until `wait` (a CUDA batch does): the
  // store, which publishes (a CQE's phase dword), must not be one of them.
  emu::dma_space dma;
  std::vector<std::byte> fake_gpu(4096);
  const auto bus = dma.map(fake_gpu.data(), fake_gpu.size(), emu::memory_kind::device);
  std::vector<std::string> events;
  dma.set_device_copier(emu::device_copier{[&](void* dst, const void* src, std::uint64_t n, bool, int) {
                                             events.push_back("copy " + std::to_string(n));
                                             std::memcpy(dst, src, n);
                                             return true;
                                           },
                                           [&] {
                                             events.push_back("wait");
                                             return true;
                                           },
                                           {},
                                           {},
                                           {}});
  const std::uint32_t entry[3] = {1, 2, 3};
  const auto view = dma.pin();
  CHECK(view.write(bus, entry, sizeof entry));
  CHECK(view.store32(bus + 12, 4));
  CHECK(events == std::vector<std::string>{"copy 12", "wait", "copy 4", "wait"});
}
