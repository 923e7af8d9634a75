// Where the host puts controller-visible memory: every queue, PRP list and admin buffer on a
// controller page (CC.MPS, larger than 4 KiB when CAP.MPSMIN > 0), and PRP lists that need
// only each list page to be contiguous, not the whole block of a queue's lists.
#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/backend/emu_backend.cuh>
#include <cunvme/host/memory/gpu_window.cuh>
#include <cunvme/host/queue/io_queue.cuh>
#include <cunvme/host/open.cuh>
#include <cunvme/io/reader.cuh>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace host = cunvme::host;
namespace emu = cunvme::emu;
namespace spec = cunvme::spec;

namespace {

std::uint64_t pattern(std::uint64_t i) { return 0x9e3779b97f4a7c15ull * (i + 1); }

void fill(host::dma_buffer& b, std::uint64_t seed) {
  auto* w = reinterpret_cast<std::uint64_t*>(b.data());
  for (std::size_t i = 0; i < b.size() / 8; ++i) w[i] = pattern(i + seed);
}

}  // namespace

TEST_CASE("on a controller whose smallest page is 8, 16 or 64 KiB (CAP.MPSMIN) bring-up, queues, PRP lists and log pages work") {
  for (const std::uint8_t mpsmin : {1, 2, 4}) {
    CAPTURE(int{mpsmin});
    const std::size_t page = std::size_t{4096} << mpsmin;
    emu::controller_config config;
    config.mpsmin = mpsmin;
    config.mpsmax = 4;
    config.mdts = 5;
    config.namespaces = {emu::namespace_config::in_memory(512, 1 << 14)};
    host::controller_options options;
    options.shadow_doorbells = true;
    options.command_timeout = std::chrono::milliseconds(2000);
    // The emulator, as QEMU, fails CC.EN = 1 with CSTS.CFS when ASQ or ACQ is not on a CC.MPS page.
    std::unique_ptr<host::controller> ctrl;
    REQUIRE_NOTHROW(ctrl = std::make_unique<host::controller>(std::make_unique<host::emu_backend>(config), options));
    CHECK(ctrl->page_shift() == 12u + mpsmin);
    REQUIRE(ctrl->shadow_doorbells());
    // Create I/O CQ/SQ refuse a base that is not on a CC.MPS page (Invalid PRP Offset).
    auto q = ctrl->create_queue_pair(64);
    CHECK(q->sq_bus() % page == 0);
    CHECK(q->cq_bus() % page == 0);
    // A transfer over more than two controller pages needs a PRP list, itself on a page.
    const std::size_t bytes = 5 * page + 4096;
    auto out = ctrl->memory().allocate(bytes, page);
    auto in = ctrl->memory().allocate(bytes, page);
    CHECK(out.bus() % page == 0);
    fill(out, mpsmin);
    REQUIRE(q->write(1, 8, bytes / 512, out) == spec::status::successful_completion);
    REQUIRE(q->read(1, 8, bytes / 512, in) == spec::status::successful_completion);
    CHECK(std::memcmp(in.data(), out.data(), bytes) == 0);
    CHECK(ctrl->log_page(spec::log_page_id::error_information, 3 * page).size() == 3 * page);
    host::io_queue iq(*ctrl, 64);
    CHECK(iq.view().prp_lists_bus % page == 0);
    CHECK(iq.view().page_shift == 12u + mpsmin);
  }
}

TEST_CASE("the allocator aligns a buffer's bus address to the controller page asked for") {
  auto c = host::open("emu");
  for (std::size_t alignment = 4096; alignment <= (std::size_t{2} << 20); alignment *= 2) {
    CAPTURE(alignment);
    for (std::size_t bytes : {std::size_t{64}, std::size_t{4096}, alignment + 1}) {
      auto b = c->memory().allocate(bytes, alignment);
      CHECK(b.bus() % alignment == 0);
      CHECK(b.size() == bytes);
      CHECK(b.contiguous(0, bytes));
    }
  }
  CHECK_THROWS_AS((void)c->memory().allocate(64, 8192 + 4096), host::error);  // not a power of two
  CHECK_THROWS_AS((void)c->memory().allocate(64, 2048), host::error);         // below 4 KiB
}

TEST_CASE("queues in provided memory that is not on a controller page are refused before they are created") {
  emu::controller_config config;
  config.mpsmin = 1;
  host::controller ctrl(std::make_unique<host::emu_backend>(config));
  auto sq = ctrl.memory().allocate(3 * 4096, 8192);
  auto cq = ctrl.memory().allocate(3 * 4096, 8192);
  // Memory one 4 KiB page into an 8 KiB-aligned buffer, described as its own buffer.
  auto shifted = [&](host::dma_buffer& b) {
    std::vector<std::uint64_t> pages(b.pages().begin() + 1, b.pages().end());
    return host::dma_buffer(b.data() + 4096, nullptr, 2 * 4096, 4096, std::move(pages), host::memory_location::pinned_host, [] {});
  };
  CHECK_THROWS_AS((void)ctrl.create_queue_pair(64, shifted(sq), ctrl.memory().allocate(4096, 8192)), host::error);
  CHECK_THROWS_AS((void)ctrl.create_queue_pair(64, ctrl.memory().allocate(4096, 8192), shifted(cq)), host::error);
}

// ---- PRP lists contiguous page by page ------------------------------------------------------

namespace {

/// The emulator's memory as `sysfs:` gives it without huge pages: a buffer of up to 64 KiB is
/// one bus range (as one huge page would be), a larger one is 4 KiB pages each mapped at its
/// own bus address, so no two pages of it are adjacent in bus space.
class scattered_memory final : public host::dma_allocator {
 public:
  scattered_memory(emu::controller& c, host::dma_allocator& whole) : ctrl_(c), whole_(whole) {}
  [[nodiscard]] host::dma_buffer map_gpu(void* gpu, std::size_t bytes) override { return whole_.map_gpu(gpu, bytes); }
  [[nodiscard]] host::dma_buffer map_host(void* p, std::size_t bytes) override { return whole_.map_host(p, bytes); }
  std::size_t scattered = 0;  // buffers handed out page by page

 protected:
  [[nodiscard]] std::string name() const override { return "scattered"; }
  [[nodiscard]] host::dma_buffer allocate_aligned(std::size_t bytes, std::size_t alignment) override {
    if (bytes <= 64 * 1024) return whole_.allocate(bytes, alignment);
    const std::size_t rounded = (bytes + 4095) / 4096 * 4096;
    auto* p = static_cast<std::byte*>(std::aligned_alloc(4096, rounded));
    std::memset(p, 0, rounded);
    std::vector<std::uint64_t> pages;
    for (std::size_t at = 0; at < rounded; at += 4096) pages.push_back(ctrl_.dma().map(p + at, 4096));
    ++scattered;
    emu::controller* ctrl = &ctrl_;
    std::vector<std::uint64_t> mapped = pages;
    return host::dma_buffer(p, nullptr, bytes, 4096, std::move(pages), host::memory_location::pinned_host, [ctrl, p, mapped] {
      for (const auto bus : mapped) ctrl->dma().unmap(bus);
      std::free(p);
    });
  }

 private:
  emu::controller& ctrl_;
  host::dma_allocator& whole_;
};

/// The emulator behind `scattered_memory`.
class scattered_backend final : public host::register_backend {
 public:
  explicit scattered_backend(emu::controller_config config) : inner_(std::move(config)), memory_(inner_.controller(), inner_.memory()) {}
  [[nodiscard]] std::string name() const override { return "emu (scattered memory)"; }
  [[nodiscard]] std::byte* bar() const override { return inner_.bar(); }
  [[nodiscard]] std::size_t bar_size() const override { return inner_.bar_size(); }
  [[nodiscard]] std::uint32_t read32(std::uint32_t offset) const override { return inner_.read32(offset); }
  void write32(std::uint32_t offset, std::uint32_t value) const override { inner_.write32(offset, value); }
  void map_cmb(unsigned bar_index, std::uint64_t offset, std::uint64_t bytes) override { inner_.map_cmb(bar_index, offset, bytes); }
  [[nodiscard]] host::dma_allocator& memory() override { return memory_; }
  [[nodiscard]] scattered_memory& scattered() { return memory_; }
  [[nodiscard]] emu::controller& emulator() { return inner_.controller(); }

 private:
  host::emu_backend inner_;
  scattered_memory memory_;
};

}  // namespace

TEST_CASE("a 1024-entry io_queue works when DMA memory is contiguous only page by page, its PRP lists chaining across pages") {
  emu::controller_config config;
  config.mdts = 10;  // 4 MiB: a command's PRP list takes three 4 KiB list pages, chained
  config.namespaces = {emu::namespace_config::in_memory(512, 1 << 15)};  // 16 MiB
  auto backend = std::make_unique<scattered_backend>(config);
  auto* b = backend.get();
  host::controller ctrl(std::move(backend));
  host::io_queue q(ctrl, 1024);  // 1023 CIDs × 12 KiB of PRP lists: far more than one bus range holds here
  CHECK(b->scattered().scattered >= 1);
  CHECK(q.view().prp_list_pages != nullptr);
  using queue = cunvme::queue_policies<cunvme::slots::multi_producer, cunvme::completion::cooperative>;
  cunvme::block_reader<queue, cunvme::prp::page_list, cunvme::doorbell::mmio> reader(q.view(), q.namespace_view(1));
  cunvme::block_writer<queue, cunvme::prp::page_list, cunvme::doorbell::mmio> writer(q.view(), q.namespace_view(1));
  const std::size_t bytes = (std::size_t{4} << 20) + 4096;
  auto out = ctrl.memory().allocate(bytes);
  auto in = ctrl.memory().allocate(bytes);
  REQUIRE_FALSE(out.contiguous(0, bytes));
  cunvme::single_thread self;
  const cunvme::prp::page_list out_pages{out.pages().data(), 12}, in_pages{in.pages().data(), 12};
  for (std::uint64_t round = 0; round < 3; ++round) {
    CAPTURE(round);
    fill(out, round);
    // 4 MiB from 512 bytes into the buffer's first page: PRP1's 3.5 KiB, then 1024 list entries.
    const std::uint64_t blocks = (std::uint64_t{4} << 20) / 512, lba = round * 1024;
    REQUIRE(writer.write(self, lba, blocks, out_pages, 512).ok());
    std::memset(in.data(), 0xee, bytes);
    REQUIRE(reader.read(self, lba, blocks, in_pages, 512).ok());
    CHECK(std::memcmp(in.data() + 512, out.data() + 512, std::size_t{4} << 20) == 0);
  }
  CHECK(b->emulator().stats().dma_faults == 0);
}

TEST_CASE("a host PRP list in memory contiguous only page by page chains to the next page's own bus address") {
  auto ctrl = host::open("emu:blocks=100000");
  // List memory of two 4 KiB pages far apart in bus space, and a contiguous 4 MiB data buffer.
  auto a = ctrl->memory().allocate(4096), b = ctrl->memory().allocate(4096);
  std::vector<std::uint64_t> table(1024);
  host::dma_buffer lists(reinterpret_cast<std::byte*>(table.data()), nullptr, 8192, 4096, {b.bus(), a.bus()},
                         host::memory_location::pinned_host, [] {});
  auto data = ctrl->memory().allocate(std::size_t{3} << 20);
  spec::submission_entry sqe{};
  ctrl->fill_prps(sqe, data, 0, std::size_t{3} << 20, lists);
  CHECK(sqe.prp2 == b.bus());
  // 767 data entries after PRP1: 511 on the first list page, its last slot the chain.
  CHECK(table[511] == a.bus());
  CHECK(table[510] == data.bus(511 * 4096));
  CHECK(table[512] == data.bus(512 * 4096));
}

TEST_CASE("emu:mpsmin=N opens an emulator whose smallest page is 2^(12+N) bytes, and the host brings it up on that page") {
  auto ctrl = host::open("emu:mpsmin=1,blocks=4096");
  CHECK(ctrl->cap().mpsmin() == 1);
  CHECK(ctrl->page_shift() == 13);
  auto q = ctrl->create_queue_pair(32);
  auto buf = ctrl->memory().allocate(8 * 8192, ctrl->page_bytes());
  fill(buf, 7);
  REQUIRE(q->write(1, 0, buf.size() / 512, buf) == spec::status::successful_completion);
  auto back = ctrl->memory().allocate(8 * 8192, ctrl->page_bytes());
  REQUIRE(q->read(1, 0, back.size() / 512, back) == spec::status::successful_completion);
  CHECK(std::memcmp(buf.data(), back.data(), buf.size()) == 0);
}

TEST_CASE("emu:mpsmin=10 (4 MiB controller pages) brings up and moves data") {
  // Bus addresses kept a buffer's offset only within 2 MiB: a 4 MiB-aligned buffer landed on
  // a bus address 2 MiB off a 4 MiB boundary, depending on what was mapped before it.
  auto ctrl = host::open("emu:mpsmin=10,blocks=16384");
  CHECK(ctrl->page_shift() == 22);
  auto q = ctrl->create_queue_pair(8);
  auto buf = ctrl->memory().allocate(4u << 20, ctrl->page_bytes());
  fill(buf, 11);
  REQUIRE(q->write(1, 0, buf.size() / 512, buf) == spec::status::successful_completion);
  auto back = ctrl->memory().allocate(4u << 20, ctrl->page_bytes());
  REQUIRE(q->read(1, 0, back.size() / 512, back) == spec::status::successful_completion);
  CHECK(std::memcmp(buf.data(), back.data(), buf.size()) == 0);
}

TEST_CASE("an emulator buffer aligned to 4 MiB or more gets a bus address aligned as much, whatever was allocated before") {
  auto ctrl = host::open("emu:mpsmin=10,blocks=4096");
  auto odd = ctrl->memory().allocate(3u << 20, 4096);
  auto aligned = ctrl->memory().allocate(4096, std::size_t{4} << 20);
  CHECK(aligned.bus() % (std::size_t{4} << 20) == 0);
  auto more = ctrl->memory().allocate(4096, 4096);
  auto big = ctrl->memory().allocate(4096, std::size_t{128} << 20);
  CHECK(big.bus() % (std::size_t{128} << 20) == 0);
}

// ---- GPU memory: map only the allocation's pages --------------------------------------------

TEST_CASE("a GPU transfer maps from its 64 KiB page, or from the allocation's start where that page begins before it") {
  constexpr std::size_t gpu_page = 64 * 1024;
  const std::uintptr_t base = 0x7f0000010000 + 0x2400;  // not on a GPU page, as small cudaMallocs are not
  const std::size_t size = 300 * 1024;
  // Inside the allocation's first GPU page: the window starts at the allocation, not below it.
  auto w = host::gpu_window::of(base + 0x100, 4096, base, size, gpu_page, "gpu");
  CHECK(w.start == base);
  CHECK(w.bytes == 0x100 + 4096);
  // Further in: from the GPU page holding the first byte.
  w = host::gpu_window::of(base + 200 * 1024, 8192, base, size, gpu_page, "gpu");
  CHECK(w.start % gpu_page == 0);
  CHECK(w.start >= base);
  CHECK(w.start + w.bytes == base + 200 * 1024 + 8192);
  // Exactly to the end is fine.
  w = host::gpu_window::of(base + size - 512, 512, base, size, gpu_page, "gpu");
  CHECK(w.start + w.bytes == base + size);
}

TEST_CASE("a GPU transfer that leaves its allocation is refused, naming the allocation") {
  const std::uintptr_t base = 0x7f0000000000;
  const std::size_t size = 64 * 1024;
  auto refused = [&](std::uintptr_t address, std::size_t bytes) {
    try {
      (void)host::gpu_window::of(address, bytes, base, size, 64 * 1024, "gpu");
    } catch (const host::error& e) {
      return std::string(e.what()).find("outside their allocation") != std::string::npos;
    }
    return false;
  };
  CHECK(refused(base + size - 512, 1024));           // past the end
  CHECK(refused(base - 512, 1024));                  // before the start
  CHECK(refused(base + 8, ~std::size_t{0} - 4));      // the end wraps
  CHECK(refused(base + size, 1));
}

TEST_CASE("the page table of a GPU window at an allocation's unaligned start names whole pages and the transfer's offset") {
  auto ctrl = host::open("emu");
  // Host memory standing in for GPU memory: the emulator maps either the same way.
  std::vector<std::byte> memory(256 * 1024);
  const auto aligned = (reinterpret_cast<std::uintptr_t>(memory.data()) + 65535) / 65536 * 65536;
  const std::uintptr_t base = aligned + 0x1a00;  // an allocation starting 6.5 KiB into a GPU page
  const std::size_t size = 128 * 1024;
  const std::uintptr_t address = base + 0x208;
  const std::size_t bytes = 20 * 1024;
  const auto w = host::gpu_window::of(address, bytes, base, size, 64 * 1024, "emu");
  REQUIRE(w.start == base);
  // map_gpu wants a page-aligned start; the window starts where the allocation does.
  CHECK_THROWS_AS((void)ctrl->memory().map_gpu(reinterpret_cast<void*>(w.start), w.bytes), host::error);
  const host::dma_buffer mapped = ctrl->memory().map_gpu_range(reinterpret_cast<void*>(w.start), w.bytes);
  // Exactly the window is reachable: not the bytes of the page before the allocation.
  CHECK(dynamic_cast<host::emu_backend&>(ctrl->backend()).controller().dma().find(mapped.bus(0) - 1, 1) == std::nullopt);
  const auto t = host::gpu_page_table::of(mapped, w, address, "emu");
  CHECK(t.page_shift == 12);
  CHECK(t.offset == address - base / 4096 * 4096);
  REQUIRE(t.pages.size() == (t.offset + bytes + 4095) / 4096);
  bool aligned_pages = true, right_pages = true;
  for (std::size_t k = 0; k < t.pages.size(); ++k) {
    aligned_pages = aligned_pages && t.pages[k] % 4096 == 0;
    right_pages = right_pages && t.pages[k] == mapped.bus(0) - (base % 4096) + k * 4096;
  }
  CHECK(aligned_pages);
  CHECK(right_pages);
  // A PRP builder over the table puts PRP1 exactly at the transfer's first byte.
  cunvme::prp::prp_entries e;
  std::vector<std::uint64_t> list(512);
  const cunvme::prp::list_memory lm{list.data(), 0x100000, 512};
  REQUIRE(cunvme::prp::build(cunvme::prp::page_list{t.pages.data(), t.page_shift}, t.offset, bytes, 12, lm, e) == cunvme::prp::build_result::ok);
  CHECK(e.prp1 == mapped.bus(address - w.start));
}
