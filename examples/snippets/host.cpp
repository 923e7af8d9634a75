// Usage snippets of the host path, the io and policy layers on CPU threads, the page cache and
// volumes (include/cunvme/host/, io/, policy/, cache/, volume/), compiled and run on the
// emulator by `meson test` (suite `snippets`) so they cannot drift from the headers. Each
// function is the snippet a header's comment points to by name; main runs them and checks what
// their comments promise. The real backends' snippets (sysfs, VFIO, kmod, pagemap) compile
// here and run only when given a BDF: `snippets_host sysfs|vfio|kmod|pagemap 0000:01:00.0`.
#include "snippet_check.hpp"

#include <cunvme/cunvme.cuh>
#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/memory/dma_memory.cuh>
#include <cunvme/host/backend/emu_backend.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/queue/io_queue.cuh>
#include <cunvme/host/backend/kmod_backend.cuh>
#include <cunvme/host/open.cuh>
#include <cunvme/host/owners/page_cache_memory.cuh>
#include <cunvme/host/memory/pagemap_memory.cuh>
#include <cunvme/host/queue/queue_pair.cuh>
#include <cunvme/host/sharing/controller_owner.cuh>
#include <cunvme/loader/sha256.cuh>
#include <cunvme/host/backend/sysfs_backend.cuh>
#include <cunvme/host/backend/uri_options.cuh>
#include <cunvme/host/backend/vfio_backend.cuh>
#include <cunvme/host/owners/volume_members.cuh>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace host = cunvme::host;
namespace loader = cunvme::loader;
namespace spec = cunvme::spec;

namespace {

using snippet::expect;

using queue = cunvme::queue_policies<cunvme::slots::multi_producer, cunvme::completion::cooperative>;

// ---- host/open.cuh, host/controller/controller.cuh, host/queue/queue_pair.cuh, host/memory/dma_memory.cuh --------------

/// `open`: a controller by URI, brought up and ready for queue pairs.
std::unique_ptr<host::controller> open_emulator() {
  auto ctrl = cunvme::host::open("emu:lba=4096,blocks=262144,pattern");  // or "sysfs:0000:01:00.0", "vfio:…", "kmod:…"
  return ctrl;
}

/// `controller`: its namespaces, and a queue pair.
std::uint64_t list_namespaces() {
  host::controller ctrl(std::make_unique<host::emu_backend>());
  std::uint64_t blocks = 0;
  for (const auto& ns : ctrl.namespaces()) {
    std::printf("ns %u: %llu blocks\n", ns.nsid, static_cast<unsigned long long>(ns.lba_count));
    blocks += ns.lba_count;
  }
  auto qp = ctrl.create_queue_pair(1024);
  return qp ? blocks : 0;
}

/// `dma_buffer`: memory the controller reaches, with its bus addresses.
std::uint64_t first_prp(host::controller& ctrl, const void* src) {
  host::dma_buffer buf = ctrl.memory().allocate(1 << 20);
  const std::uint64_t prp1 = buf.bus(0);  // bus address of byte 0
  std::memcpy(buf.data(), src, 4096);     // host pointer (nullptr for GPU memory)
  return prp1;
}

/// `queue_pair`: synchronous I/O on the calling thread (split at MDTS, PRP lists built).
bool read_a_megabyte(host::controller& ctrl) {
  auto qp = ctrl.create_queue_pair(256);
  host::dma_buffer buf = ctrl.memory().allocate(1 << 20);
  if (qp->read(1, 0, 256, buf) != spec::status::successful_completion) return false;
  std::uint64_t word = 0;
  std::memcpy(&word, buf.data() + 8, 8);
  return word == host::pattern_word(8);
}

/// `error`: setup failures are host::errors with the NVMe status where there is one.
bool refused_queue_size(host::controller& ctrl) {
  try {
    (void)ctrl.create_queue_pair(70000);
  } catch (const cunvme::host::error& e) {
    std::printf("%s\n", e.what());
    return !e.status() || *e.status() == spec::status::invalid_queue_size;
  }
  return false;
}

// ---- host/queue/io_queue.cuh, io/reader.cuh, io/io_result.cuh ----------------------------------------

/// `io_queue` and `block_reader`: the device-side reader run by a CPU thread.
bool read_with_a_reader() {
  auto ctrl = cunvme::host::open("emu:pattern");
  cunvme::host::io_queue q(*ctrl, 256);
  cunvme::block_reader<queue, cunvme::prp::contiguous, cunvme::doorbell::mmio> reader(q.view(), q.namespace_view(1));
  host::dma_buffer dst = ctrl->memory().allocate(64 * 512);
  // `io_result`: success, or the failing command's status and LBA range, or why nothing ran.
  cunvme::io_result r = reader.read(/*lba*/ 0, /*blocks*/ 64, cunvme::prp::contiguous{dst.bus()}, /*byte offset*/ 0);
  if (!r) std::printf("%s\n", cunvme::to_string(r).c_str());  // r.error, r.status, r.lba, r.blocks say what and where
  const cunvme::io_result past = reader.read(q.namespace_view(1).lba_count, 1, cunvme::prp::contiguous{dst.bus()}, 0);
  return r.ok() && !past.ok() && past.status == spec::status::lba_out_of_range;
}

/// `host_group`: CPU threads acting as one group, as a warp does on the GPU.
bool read_as_a_group() {
  auto ctrl = cunvme::host::open("emu:pattern");
  cunvme::host::io_queue q(*ctrl, 256);
  const cunvme::block_reader<queue, cunvme::prp::contiguous, cunvme::doorbell::mmio> reader(q.view(), q.namespace_view(1));
  host::dma_buffer dst = ctrl->memory().allocate(4096 * 512);
  const cunvme::prp::contiguous buffer{dst.bus()};
  cunvme::host_group group(4);
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (unsigned r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      auto member = group.member_at(r);
      ok += reader.read(member, /*lba*/ 0, /*blocks*/ 4096, buffer, 0).ok();
    });
  }
  for (auto& t : threads) t.join();
  return ok == 4;
}

/// `completion::poller`: a dedicated poller drains for everybody until told to stop.
bool read_with_a_dedicated_poller() {
  auto ctrl = cunvme::host::open("emu:pattern");
  cunvme::host::io_queue q(*ctrl, 256);
  using polled = cunvme::queue_policies<cunvme::slots::multi_producer, cunvme::completion::dedicated_poller>;
  const cunvme::block_reader<polled, cunvme::prp::contiguous, cunvme::doorbell::mmio> reader(q.view(), q.namespace_view(1));
  const cunvme::queue_view view = q.view();
  std::uint32_t stop = 0;  // read and written through atomic references
  std::thread poller([&] { (void)cunvme::completion::poller<cunvme::doorbell::mmio>::run(view, stop); });
  host::dma_buffer dst = ctrl->memory().allocate(8 * 512);
  const bool ok = reader.read(0, 8, cunvme::prp::contiguous{dst.bus()}, 0).ok();
  std::atomic_ref<std::uint32_t>(stop).store(1, std::memory_order_release);
  poller.join();
  return ok;
}

/// `prp::build`: PRP entries for a buffer given page by page.
bool build_prps(const host::dma_buffer& buf, const cunvme::prp::list_memory& slot_list) {
  spec::submission_entry sqe{};
  cunvme::prp::prp_entries e;
  if (cunvme::prp::build(cunvme::prp::page_list{buf.pages().data(), 12}, 0, 64 * 1024, 12, slot_list, e) != cunvme::prp::build_result::ok) {
    return false;
  }
  sqe.prp1 = e.prp1;
  sqe.prp2 = e.prp2;
  return sqe.prp1 == buf.bus(0);
}

// ---- host/owners/page_cache_memory.cuh, cache/page_cache.cuh ------------------------------------------

/// `page_cache_memory` and `page_cache`: a value within one page, and a page held.
bool page_cache_reads() {
  auto ctrl = cunvme::host::open("emu:pattern");
  cunvme::host::io_queue q(*ctrl, 256);
  cunvme::host::page_cache_memory memory(*ctrl, q.namespace_view(1), 4096, 1024);  // 4 MiB of slots
  cunvme::page_cache<queue, cunvme::doorbell::mmio> cache(memory.view(), q.view(), q.namespace_view(1));
  std::uint64_t x = 0;
  const cunvme::io_result r = cache.read(8 * 1000, 8, &x);  // CPU threads; kernels take device_view()
  // `page_ref`: a page held is never evicted.
  cunvme::page_ref ref(cache, 7, cunvme::page_access::read);
  if (!ref.ok()) return false;  // ref.result() says why
  std::uint64_t y = 0;
  std::memcpy(&y, ref.data() + 16, 8);
  return r.ok() && x == host::pattern_word(8 * 1000) && y == host::pattern_word(7 * 4096 + 16);
}

// ---- host/owners/volume_members.cuh, volume/volume.cuh --------------------------------------------------------

/// `volume`: two controllers striped, read by CPU threads through `volume_io`.
bool striped_volume() {
  auto a = cunvme::host::open("emu:pattern"), b = cunvme::host::open("emu:pattern");
  cunvme::host::io_queue qa(*a, 256), qb(*b, 256);
  auto vol = cunvme::host::volume::striped({{{&qa}, 1}, {{&qb}, 1}}, 64 * 1024);
  using io = cunvme::volume_io<queue, cunvme::doorbell::mmio>;
  cunvme::host::volume_memory buffers(vol, 8 * 512);  // mapped for every member
  const cunvme::io_result r = io(vol.view()).read(/*lba*/ 128, 8, buffers.buffers(), 0);  // CPU threads; kernels take vol.device_view()
  std::uint64_t word = 0;
  std::memcpy(&word, buffers.data(), 8);
  // Volume block 128 is stripe 1 (128 blocks of 512 B each), member 1's first stripe: its LBA 0.
  return r.ok() && word == host::pattern_word(0);
}

// ---- loader/sha256.cuh ---------------------------------------------------------------------------

/// `sha256`: the hash extent maps check files with.
std::string sha256_of(const void* data, std::size_t n) {
  loader::sha256 h;
  h.update(data, n);
  return loader::sha256::hex(h.finish());
}

/// `sharing::controller_owner` and `attach:` (host/sharing/): one process owns the controller's
/// admin queue and serves it; another (here the same one, for the snippet) attaches and gets
/// queue pairs of its own.
bool share_controller() {
  auto ctrl = host::open("emu:shared,pattern");  // or vfio:BDF, sysfs:BDF, kmod:BDF
  const std::string path = "/tmp/cunvme-snippet-" + std::to_string(::getpid()) + ".sock";
  host::sharing::controller_owner owner(*ctrl, path);
  auto attached = host::open("attach:" + path);  // in another process, typically one per GPU
  auto qp = attached->create_queue_pair(64);
  host::dma_buffer buf = attached->memory().allocate(4096);
  const bool read = qp->read(1, 0, 8, buf) == spec::status::successful_completion;
  std::uint64_t first = 0;
  std::memcpy(&first, buf.data(), 8);
  return read && first == host::pattern_word(0) && owner.processes() == 1;
}

// ---- the real backends: compiled here, run only where a controller is handed over ----------------

/// `sysfs_backend`: echo 0000:01:00.0 > /sys/bus/pci/devices/0000:01:00.0/driver/unbind (as root).
void sysfs(const std::string& bdf) {
  host::controller ctrl(std::make_unique<host::sysfs_backend>(bdf));
  std::printf("%s: %zu namespaces\n", bdf.c_str(), ctrl.namespaces().size());
}

/// `vfio_backend`: the device bound to vfio-pci.
///   echo 0000:01:00.0 > /sys/bus/pci/devices/0000:01:00.0/driver/unbind
///   echo vfio-pci > /sys/bus/pci/devices/0000:01:00.0/driver_override
///   echo 0000:01:00.0 > /sys/bus/pci/drivers_probe
void vfio(const std::string& bdf) {
  host::controller ctrl(std::make_unique<host::vfio_backend>(bdf));
  std::printf("%s: %zu namespaces\n", bdf.c_str(), ctrl.namespaces().size());
}

/// `kmod_backend`: insmod cunvme.ko; echo cunvme > /sys/bus/pci/devices/<BDF>/driver_override; … (kmod/README.md).
void kmod(const std::string& bdf) {
  host::controller ctrl(std::make_unique<host::kmod_backend>(bdf));
  std::printf("%s: %zu namespaces\n", bdf.c_str(), ctrl.namespaces().size());
}

/// `gpu_mapping`: a GPU pin mapped for the CPU (`kmod_allocator::map_gpu_for_cpu`, nvidia_p2p).
void gpu_flag(host::kmod_backend& backend, void* d_flags) {
  host::gpu_for_cpu_mapping m = backend.kmod_memory().map_gpu_for_cpu(d_flags, 65536);
  const std::uint32_t flag = 1;
  m.copy_to(0, &flag, sizeof flag);  // visible to the GPU before any later store
  std::uint64_t result = 0;
  m.copy_from(64, &result, sizeof result);
}

/// `pagemap_allocator`: sysfs's DMA memory, physical addresses from /proc/self/pagemap.
void pagemap(const std::string& bdf) {
  host::pagemap_allocator memory(bdf);
  host::dma_buffer queue_memory = memory.allocate(64 * 1024);  // one huge page when there is one
  const std::uint64_t base = queue_memory.bus(0);
  std::printf("64 KiB at bus 0x%llx\n", static_cast<unsigned long long>(base));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3) {
    const std::string which = argv[1], bdf = argv[2];
    try {
      if (which == "sysfs") sysfs(bdf);
      if (which == "vfio") vfio(bdf);
      if (which == "kmod") kmod(bdf);
      if (which == "pagemap") pagemap(bdf);
    } catch (const host::error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 1;
    }
    return 0;
  }
  (void)&gpu_flag;
  auto ctrl = open_emulator();
  expect(ctrl->namespaces().front().lba_size == 4096, "open");
  expect(list_namespaces() > 0, "controller");
  const std::vector<std::byte> page(4096);
  expect(first_prp(*ctrl, page.data()) != 0, "dma_buffer");
  expect(read_a_megabyte(*ctrl), "queue_pair");
  expect(refused_queue_size(*ctrl), "error");
  expect(read_with_a_reader(), "block_reader");
  expect(read_as_a_group(), "host_group");
  expect(read_with_a_dedicated_poller(), "completion::poller");
  {
    host::dma_buffer buf = ctrl->memory().allocate(64 * 1024, 4096);
    host::dma_buffer list = ctrl->memory().allocate(4096, 4096);
    expect(build_prps(buf, cunvme::prp::list_memory{reinterpret_cast<std::uint64_t*>(list.data()), list.bus(), 512}), "prp::build");
  }
  expect(page_cache_reads(), "page_cache");
  expect(striped_volume(), "volume");
  expect(share_controller(), "controller_owner");
  expect(sha256_of("abc", 3) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "sha256");
  return snippet::finish("host");
}
