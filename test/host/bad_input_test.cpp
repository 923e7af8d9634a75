// The host API's bad-input contract: URI keys and sizes a caller gets wrong come back as a
// `host::error` naming what was wrong, never a truncated value, a wrapped size or an overflow.
#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/backend/emu_backend.cuh>
#include <cunvme/host/queue/io_queue.cuh>
#include <cunvme/detail/checked.cuh>
#include <cunvme/host/open.cuh>
#include <cunvme/host/memory/pagemap_memory.cuh>
#include <cunvme/io/reader.cuh>

#include <doctest/doctest.h>

#include "uri_refusal.hpp"

#include <chrono>
#include <cstdint>
#include <string>

namespace host = cunvme::host;
namespace emu = cunvme::emu;
namespace spec = cunvme::spec;

namespace {

using uri_test::emulator;
using uri_test::refused_naming;

}  // namespace

TEST_CASE("URI numbers beyond their key's range are refused, naming key and value, not truncated") {
  CHECK(refused_naming("emu:lba=4294967808", "lba", "4294967808"));
  CHECK(refused_naming("emu:lba=1024", "lba", "1024"));
  CHECK(refused_naming("emu:blocks=36028797018963969", "blocks", "36028797018963969"));  // 2^55 + 1 blocks of 512 B: 2^64 + 512 bytes
  CHECK(refused_naming("emu:blocks=18446744073709551616", "blocks", "18446744073709551616"));  // 2^64
  CHECK(refused_naming("emu:blocks=0", "blocks", "0"));
  CHECK(refused_naming("emu:workers=4294967297", "workers", "4294967297"));
  CHECK(refused_naming("emu:workers=0", "workers", "0"));
  CHECK(refused_naming("emu:cmb_mb=17592186044416", "cmb_mb", "17592186044416"));  // 2^44 MiB: << 20 wraps to 0
  CHECK(refused_naming("emu:cmb_mb=4096", "cmb_mb", "4096"));
  CHECK(refused_naming("emu:namespaces=4294967297", "namespaces", "4294967297"));
  CHECK(refused_naming("emu:namespaces=0", "namespaces"));
  CHECK(refused_naming("emu:mpsmin=16", "mpsmin", "16"));
}

TEST_CASE("the pinning keys set how namespaces are pinned; a granule that is not a power of two is refused") {
  auto c = host::open("emu:blocks=1000,pin_granule_mb=256,pin_ahead=0,pin_threads=3");
  const emu::pinning_config& pin = emulator(c).config().pinning;
  CHECK(pin.granule_bytes == std::uint64_t{256} << 20);
  CHECK(pin.ahead == 0);
  CHECK(pin.threads == 3);
  auto defaults = host::open("emu:blocks=1000");
  CHECK(emulator(defaults).config().pinning.granule_bytes == emu::pinning_config{}.granule_bytes);
  CHECK(refused_naming("emu:pin_granule_mb=48", "pin_granule_mb", "power of two"));
  CHECK(refused_naming("emu:pin_granule_mb=0", "pin_granule_mb", "0"));
  CHECK(refused_naming("emu:pin_threads=65", "pin_threads", "65"));
}

TEST_CASE("URI numbers that are not plain decimal numbers are refused") {
  CHECK(refused_naming("emu:blocks=-1", "blocks", "-1"));
  CHECK(refused_naming("emu:blocks=+8", "blocks", "+8"));
  CHECK(refused_naming("emu:blocks=8k", "blocks", "8k"));
  CHECK(refused_naming("emu:blocks= 8", "blocks"));
  CHECK(refused_naming("emu:workers=0x4", "workers", "0x4"));
}

TEST_CASE("valued flags honour their value; other values are refused") {
  auto on = host::open("emu:blocks=1000,nodata=1,spin=true");
  CHECK_FALSE(emulator(on).moves_data());
  CHECK(emulator(on).config().idle.spins == ~std::uint32_t{0});
  auto off = host::open("emu:blocks=1000,nodata=0,spin=false,pattern=0,readonly=0");
  CHECK(emulator(off).moves_data());
  CHECK(emulator(off).config().idle.spins == emu::idle_policy{}.spins);
  CHECK_FALSE(emulator(off).config().namespaces[0].read_only);
  CHECK(refused_naming("emu:readonly=2", "readonly", "2"));
  CHECK(refused_naming("emu:nodata=yes please", "nodata", "yes please"));
}

TEST_CASE("a key given twice, an empty value and an empty item are refused") {
  CHECK(refused_naming("emu:blocks=8,blocks=16", "blocks", "twice"));
  CHECK(refused_naming("emu:spin,spin", "spin", "twice"));
  CHECK(refused_naming("emu:blocks=", "blocks"));
  CHECK(refused_naming("emu:lba", "lba"));
  CHECK(refused_naming("emu:file=", "file"));
  CHECK(refused_naming("emu:timing=", "timing"));
  CHECK(refused_naming("emu:blocks=8,,spin", "empty"));
  CHECK(refused_naming("emu:blocks=8,", "empty"));
  CHECK(refused_naming("emu:=8", "empty"));
}

TEST_CASE("unknown keys and unknown values of known keys are refused, naming them") {
  CHECK(refused_naming("emu:blokcs=8", "blokcs"));
  CHECK(refused_naming("emu:timing=warp-speed", "timing", "warp-speed"));
}

TEST_CASE("a configuration the emulator refuses comes back as a host::error naming the URI") {
  // 2^54 blocks of 4 KiB is 2^66 bytes: every number is in range, the product is not.
  CHECK(refused_naming("emu:lba=4096,blocks=18014398509481984", "blocks"));
}

TEST_CASE("valid URIs still open with the values they name") {
  auto c = host::open("emu:lba=4096,blocks=4096,namespaces=2,workers=3,cmb_mb=4,timing=none");
  const auto& config = emulator(c).config();
  CHECK(config.namespaces.size() == 2);
  CHECK(config.namespaces[1].lba_size == 4096);
  CHECK(config.namespaces[1].lba_count == 4096);
  CHECK(config.workers == 3);
  CHECK(config.cmb_bytes == 4u << 20);
  auto plain = host::open("emu");
  CHECK(emulator(plain).config().namespaces.size() == 1);
  auto empty = host::open("emu:");
  CHECK(emulator(empty).config().namespaces.size() == 1);
}

TEST_CASE("malformed PCI addresses in sysfs:, vfio: and kmod: URIs are refused before any device is touched") {
  for (const std::string scheme : {"sysfs", "vfio", "kmod"}) {
    CAPTURE(scheme);
    CHECK(refused_naming(scheme + ":", "not a PCI address"));
    CHECK(refused_naming(scheme, "not a PCI address"));
    CHECK(refused_naming(scheme + ":0000:01:00.8", "0000:01:00.8", "not a PCI address"));
    CHECK(refused_naming(scheme + ":0000:01:00.0,lba=512", "0000:01:00.0,lba=512", "not a PCI address"));
    CHECK(refused_naming(scheme + ":01:00.0", "01:00.0", "not a PCI address"));
    CHECK(refused_naming(scheme + ":0000:01:0g.0", "0000:01:0g.0", "not a PCI address"));
    CHECK(refused_naming(scheme + ":0000:01:20.0", "0000:01:20.0", "not a PCI address"));  // the device number is 5 bits: 00..1f
  }
  CHECK(refused_naming("nvme:0000:01:00.0", "unknown"));
  CHECK(refused_naming("", "unknown"));
}

// ---- sizes ---------------------------------------------------------------------------------

TEST_CASE("checked size arithmetic reports what does not fit instead of wrapping") {
  using cunvme::detail::add_overflows;
  using cunvme::detail::mul_overflows;
  using cunvme::detail::range_within;
  using cunvme::detail::round_up_overflows;
  std::uint64_t r = 0;
  CHECK(mul_overflows<std::uint64_t>((std::uint64_t{1} << 55) + 8, 512, r));
  CHECK_FALSE(mul_overflows<std::uint64_t>(std::uint64_t{1} << 20, 4096, r));
  CHECK(r == std::uint64_t{1} << 32);
  CHECK_FALSE(mul_overflows<std::uint64_t>(0, ~std::uint64_t{0}, r));
  CHECK(r == 0);
  CHECK(add_overflows<std::uint64_t>(~std::uint64_t{0}, 1, r));
  CHECK_FALSE(add_overflows<std::uint64_t>(~std::uint64_t{0} - 1, 1, r));
  CHECK(round_up_overflows<std::uint64_t>(~std::uint64_t{0} - 1, 4096, r));
  CHECK_FALSE(round_up_overflows<std::uint64_t>(4097, 4096, r));
  CHECK(r == 8192);
  CHECK(range_within<std::uint64_t>(4096, 0, 4096));
  CHECK_FALSE(range_within<std::uint64_t>(1, ~std::uint64_t{0}, 4096));
  CHECK_FALSE(range_within<std::uint64_t>(4097, 0, 4096));
  CHECK(cunvme::detail::saturating_add<std::uint64_t>(~std::uint64_t{0} - 5, 10) == ~std::uint64_t{0});
  CHECK(cunvme::detail::saturating_add<std::uint64_t>(5, 10) == 15);
}

TEST_CASE("a block count whose byte size wraps 64 bits is refused before any DMA") {
  auto c = host::open("emu:blocks=1000");
  auto q = c->create_queue_pair(16);
  auto buf = c->memory().allocate(4096);
  // 2^55 + 8 blocks of 512 bytes: the product wraps to 4096, which would pass a multiplying check.
  CHECK_THROWS_AS((void)q->read(1, 0, (std::uint64_t{1} << 55) + 8, buf), host::error);
  CHECK_THROWS_AS((void)q->write(1, 0, (std::uint64_t{1} << 55) + 8, buf), host::error);
  CHECK_THROWS_AS((void)q->read(1, 0, 1, buf, ~std::size_t{0} - 100), host::error);
  CHECK(emulator(c).stats().io_commands == 0);
}

TEST_CASE("an LBA range that wraps 64 bits is refused before any command") {
  auto c = host::open("emu:blocks=1000");
  auto q = c->create_queue_pair(16);
  auto buf = c->memory().allocate(8192);
  CHECK_THROWS_AS((void)q->read(1, ~std::uint64_t{0}, 2, buf), host::error);
  CHECK(emulator(c).stats().io_commands == 0);
}

TEST_CASE("DMA allocations whose rounded size wraps are refused, on every allocator this machine can run") {
  auto c = host::open("emu");
  CHECK_THROWS_AS((void)c->memory().allocate(~std::size_t{0}), host::error);
  CHECK_THROWS_AS((void)c->memory().allocate(~std::size_t{0} - 4094), host::error);
  host::pagemap_allocator pagemap("test");
  CHECK_THROWS_AS((void)pagemap.allocate(~std::size_t{0}), host::error);
}

TEST_CASE("a log page size that does not fit the command or memory is refused before it is sent") {
  auto c = host::open("emu");
  CHECK_THROWS_AS((void)c->log_page(spec::log_page_id::error_information, ~std::size_t{0}), host::error);
  CHECK_THROWS_AS((void)c->log_page(spec::log_page_id::error_information, 0), host::error);
  CHECK_THROWS_AS((void)c->log_page(spec::log_page_id::error_information, 6), host::error);  // NUMD counts dwords
  CHECK(c->log_page(spec::log_page_id::error_information, 64).size() == 64);
}

TEST_CASE("a contiguity question about bytes outside a buffer is answered no, without wrapping") {
  auto c = host::open("emu");
  auto b = c->memory().allocate(8192);
  CHECK(b.contiguous(0, 8192));
  CHECK_FALSE(b.contiguous(4096, ~std::size_t{0}));
  CHECK_FALSE(b.contiguous(8193, 1));
  CHECK_FALSE(b.contiguous(~std::size_t{0}, 2));
}

TEST_CASE("an io_queue's timeout must be positive, and the largest one does not wrap every deadline into the past") {
  auto c = host::open("emu:blocks=1000");
  CHECK_THROWS_AS(host::io_queue(*c, 16, host::queue_placement::host, std::chrono::nanoseconds(0)), host::error);
  CHECK_THROWS_AS(host::io_queue(*c, 16, host::queue_placement::host, std::chrono::nanoseconds(-1)), host::error);
  host::io_queue q(*c, 16, host::queue_placement::host, std::chrono::nanoseconds::max());
  using queue = cunvme::queue_policies<cunvme::slots::multi_producer, cunvme::completion::cooperative>;
  cunvme::block_reader<queue, cunvme::prp::contiguous, cunvme::doorbell::mmio> reader(q.view(), q.namespace_view(1));
  auto buf = c->memory().allocate(4096);
  cunvme::single_thread self;
  const cunvme::io_result r = reader.read(self, 0, 8, cunvme::prp::contiguous{buf.bus()}, 0);
  CHECK(r.ok());
  CHECK(r.error != cunvme::io_error::timeout);
}

TEST_CASE("idle_spins and idle_us set how the emulator's workers wait for work; with spin they are refused") {
  auto sleepy = host::open("emu:blocks=1000,idle_spins=0,idle_us=200");
  CHECK(emulator(sleepy).config().idle.spins == 0);
  CHECK(emulator(sleepy).config().idle.sleep == std::chrono::microseconds(200));
  auto only_spins = host::open("emu:blocks=1000,idle_spins=10");
  CHECK(emulator(only_spins).config().idle.spins == 10);
  CHECK(emulator(only_spins).config().idle.sleep == emu::idle_policy{}.sleep);
  CHECK(refused_naming("emu:idle_us=0", "idle_us", "0"));
  CHECK(refused_naming("emu:idle_us=1000001", "idle_us", "1000001"));
  CHECK(refused_naming("emu:idle_spins=4294967296", "idle_spins", "4294967296"));
  CHECK(refused_naming("emu:spin,idle_spins=4", "spin", "idle_spins"));
  CHECK(refused_naming("emu:spin,idle_us=4", "spin", "idle_us"));
}
