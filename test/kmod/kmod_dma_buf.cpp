// The cunvme module's dma-buf import, inside the QEMU guest (test/kmod/kmod_test.sh
// guest-dma-buf): with no GPU and no udmabuf in Debian's kernel, the test exporter module
// (test/kmod/exporter/) provides dma-bufs of host pages. The controller reads and writes them
// through the addresses the module hands out; a revoke while mapped stops the controller's
// DMA; every way of letting go (unpin, close, SIGKILL) leaves nothing mapped, attached or
// referenced, which the exporter's rmmod at the end proves.
//
//   kmod_dma_buf BDF
//
// The exporter module travels inside this program, in the ELF section .cunvme_exporter_ko
// (kmod_test.sh adds it with objcopy), and is loaded with init_module: run_guest.sh copies
// programs into the guest, not other files. Needs root, cunvme loaded with the controller
// bound, nobody else holding /dev/cunvme/BDF. Prints "PASS name" / "FAIL name: why" per check
// and a summary; exits 0 when all passed.
#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/backend/kmod_abi.cuh>
#include <cunvme/host/backend/kmod_backend.cuh>
#include <cunvme/host/queue/queue_pair.cuh>
#include <cunvme/host/backend/uri_options.cuh>
#include <cunvme/kmod/cunvme_ioctl.h>

#include "../guest_checks.hpp"

#include "cunvme_test_exporter.h"

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <elf.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

namespace host = cunvme::host;
namespace kmod = cunvme::host::kmod;
namespace spec = cunvme::spec;

namespace {

constexpr std::size_t page = 4096;
constexpr std::byte poison{0xee};  // what the exporter's pages hold where no DMA may land
std::string bdf, node;
int exporter = -1;  // /dev/cunvme_test_exporter
test::tally results;

void check(bool ok, const std::string& name, const std::string& why = "") { results.check(ok, name, why); }
/// `rc` of a call that sets errno, against the errno wanted (0: success).
void expect_errno(long rc, int want, const std::string& name) { test::expect_errno(results, rc, want, name); }
using test::errno_name;
using test::read_number;
using test::write_text;
long dma_buf_pages() { return read_number("/sys/bus/pci/drivers/cunvme/dma_buf_pages"); }
long dma_buf_pages_device() { return read_number("/sys/class/cunvme/" + bdf + "/dma_buf_pages"); }
long pinned_pages() { return read_number("/sys/bus/pci/drivers/cunvme/pinned_pages"); }
long resets() { return read_number("/sys/class/cunvme/" + bdf + "/resets"); }

/// The physical address of the page at `p` (root: /proc/self/pagemap), 0 if unknown.
std::uint64_t physical(const void* p) {
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  std::uint64_t entry = 0;
  const auto index = reinterpret_cast<std::uintptr_t>(p) / page;
  const bool ok = ::pread(fd, &entry, 8, static_cast<off_t>(index * 8)) == 8;
  ::close(fd);
  if (!ok || !(entry >> 63)) return 0;
  return (entry & ((std::uint64_t{1} << 55) - 1)) * page;
}

/// How many kernel log records (/dev/kmsg) contain `text`.
int kernel_log_count(const std::string& text) {
  const int fd = ::open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return -1;
  int count = 0;
  char record[8192];
  for (;;) {
    const ssize_t n = ::read(fd, record, sizeof(record) - 1);
    if (n < 0 && errno == EPIPE) continue;  // records overwritten while reading
    if (n <= 0) break;
    record[n] = '\0';
    if (std::strstr(record, text.c_str()) != nullptr) ++count;
  }
  ::close(fd);
  return count;
}

bool bound() { return ::access(("/sys/bus/pci/drivers/cunvme/" + bdf).c_str(), F_OK) == 0; }

bool iommu_present() { return ::access("/sys/class/iommu/dmar0", F_OK) == 0; }

/// Bus mastering (PCI command register bit 2) of the controller.
bool bus_master_on() {
  const int fd = ::open(("/sys/bus/pci/devices/" + bdf + "/config").c_str(), O_RDONLY | O_CLOEXEC);
  std::uint16_t command = 0;
  const bool ok = fd >= 0 && ::pread(fd, &command, 2, 4) == 2;
  if (fd >= 0) ::close(fd);
  return ok && (command & 0x4) != 0;
}

// ---- The exporter --------------------------------------------------------------------------

/// The exporter module carried in this program's ELF section .cunvme_exporter_ko; empty if none.
std::vector<char> embedded_exporter() {
  std::ifstream in("/proc/self/exe", std::ios::binary);
  const std::vector<char> exe((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (exe.size() < sizeof(Elf64_Ehdr)) return {};
  Elf64_Ehdr eh;
  std::memcpy(&eh, exe.data(), sizeof(eh));
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_shentsize != sizeof(Elf64_Shdr) ||
      eh.e_shoff > exe.size() || eh.e_shnum > (exe.size() - eh.e_shoff) / sizeof(Elf64_Shdr) || eh.e_shstrndx >= eh.e_shnum) {
    return {};
  }
  auto section = [&](unsigned i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, exe.data() + eh.e_shoff + i * sizeof(Elf64_Shdr), sizeof(sh));
    return sh;
  };
  const Elf64_Shdr names = section(eh.e_shstrndx);
  const std::string wanted = ".cunvme_exporter_ko";
  for (unsigned i = 0; i < eh.e_shnum; ++i) {
    const Elf64_Shdr sh = section(i);
    if (names.sh_offset > exe.size() || sh.sh_name >= exe.size() - names.sh_offset) continue;
    const char* name = exe.data() + names.sh_offset + sh.sh_name;
    if (std::strncmp(name, wanted.c_str(), wanted.size() + 1) != 0) continue;
    if (sh.sh_offset > exe.size() || sh.sh_size > exe.size() - sh.sh_offset) return {};
    return std::vector<char>(exe.data() + sh.sh_offset, exe.data() + sh.sh_offset + sh.sh_size);
  }
  return {};
}

bool load_exporter() {
  const std::vector<char> ko = embedded_exporter();
  check(!ko.empty(), "the exporter module is embedded in this program (.cunvme_exporter_ko)", "run it through kmod_test.sh guest-dma-buf");
  if (ko.empty()) return false;
  const long rc = ::syscall(SYS_init_module, ko.data(), ko.size(), "");
  expect_errno(rc, 0, "init_module(cunvme_test_exporter)");
  for (int i = 0; i < 20 && exporter < 0; ++i) {
    exporter = ::open("/dev/cunvme_test_exporter", O_RDWR | O_CLOEXEC);
    if (exporter < 0) ::usleep(100 * 1000);
  }
  check(exporter >= 0, "/dev/cunvme_test_exporter opens", std::strerror(errno));
  return exporter >= 0;
}

/// A dma-buf of the exporter with its pages mapped here (zeroed, then set to `fill`).
struct exported {
  int fd = -1;
  std::byte* map = nullptr;
  std::size_t bytes = 0;

  explicit exported(std::size_t size, std::byte fill = poison) : bytes(size) {
    cunvme_test_export e{size, -1, 0};
    if (::ioctl(exporter, CUNVME_TEST_EXPORT, &e) != 0) return;
    fd = e.fd;
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      map = static_cast<std::byte*>(p);
      std::memset(map, static_cast<int>(fill), size);
    }
  }
  exported(const exported&) = delete;
  exported& operator=(const exported&) = delete;
  ~exported() {
    if (map != nullptr) ::munmap(map, bytes);
    if (fd >= 0) ::close(fd);
  }
  [[nodiscard]] bool ok() const { return fd >= 0 && map != nullptr; }
  [[nodiscard]] cunvme_test_status status(bool revoke = false) const {
    cunvme_test_status s{};
    s.fd = fd;
    if (::ioctl(exporter, revoke ? CUNVME_TEST_REVOKE : CUNVME_TEST_STATUS, &s) != 0) s.attachments = s.mappings = s.pins = 999;
    return s;
  }
  /// Whether bytes [from, to) still hold `value` (no DMA landed there).
  [[nodiscard]] bool holds(std::size_t from, std::size_t to, std::byte value) const {
    for (std::size_t i = from; i < to; ++i) {
      if (map[i] != value) return false;
    }
    return true;
  }
};

std::string status_text(const cunvme_test_status& s) {
  return "attachments " + std::to_string(s.attachments) + ", mappings " + std::to_string(s.mappings) + ", pins " + std::to_string(s.pins) +
         ", revoked " + std::to_string(s.revoked);
}

bool released(const cunvme_test_status& s) { return s.attachments == 0 && s.mappings == 0 && s.pins == 0; }

// ---- Raw ioctls ------------------------------------------------------------------------------

struct map_result {
  long rc;
  cunvme_dma_buf_request req;
  std::vector<std::uint64_t> addresses;
};

/// A MAP_DMA_BUF request, not sent.
cunvme_dma_buf_request request(int dma_buf, std::uint64_t offset, std::uint64_t bytes, std::vector<std::uint64_t>& out) {
  cunvme_dma_buf_request r{};
  r.fd = dma_buf;
  r.offset = offset;
  r.bytes = bytes;
  r.addresses = reinterpret_cast<std::uintptr_t>(out.data());
  r.max_addresses = static_cast<std::uint32_t>(out.size());
  return r;
}

map_result map(int fd, int dma_buf, std::uint64_t offset, std::uint64_t bytes, std::uint32_t max_addresses = 1u << 16,
               std::uint64_t* out = nullptr) {
  map_result r{};
  r.addresses.resize(out == nullptr ? std::min<std::uint64_t>(max_addresses, bytes / page + 1) : 0);
  r.req.fd = dma_buf;
  r.req.offset = offset;
  r.req.bytes = bytes;
  r.req.addresses = reinterpret_cast<std::uintptr_t>(out != nullptr ? out : r.addresses.data());
  r.req.max_addresses = max_addresses;
  errno = 0;
  r.rc = ::ioctl(fd, CUNVME_IOCTL_MAP_DMA_BUF, &r.req);
  return r;
}

long unpin(int fd, std::uint64_t handle) {
  cunvme_unpin_request u{handle};
  return ::ioctl(fd, CUNVME_IOCTL_UNPIN, &u);
}

std::uint32_t info_flags(int fd) {
  cunvme_device_info info{};
  return ::ioctl(fd, CUNVME_IOCTL_INFO, &info) == 0 ? info.flags : 0xffffffffu;
}

/// Whether a read of the first page of namespace 1 through `ctrl` succeeds and holds the
/// disk's pattern: the controller works after whatever came before.
bool reads_the_pattern(host::controller& ctrl) {
  auto qp = ctrl.create_queue_pair(16);
  host::dma_buffer b = ctrl.memory().allocate(page);
  const auto status = qp->read(ctrl.namespaces().at(0).nsid, 0, page / ctrl.namespaces().at(0).lba_size, b);
  std::uint64_t word = 0;
  std::memcpy(&word, b.data(), 8);
  return spec::is_success(status) && word == host::pattern_word(0);
}

int open_device() { return ::open(node.c_str(), O_RDWR | O_CLOEXEC); }

// ---- Cases -----------------------------------------------------------------------------------

void test_info(int fd) {
  const std::uint32_t flags = info_flags(fd);
  check(flags != 0xffffffffu && (flags & CUNVME_INFO_DMA_BUF) != 0, "INFO reports dma-buf import");
  check((flags & CUNVME_INFO_DMA_REVOKED) == 0, "INFO reports no revoked dma-buf on a fresh open");
  check((flags & ~(CUNVME_INFO_GPU_PINNING | CUNVME_INFO_DMA_BUF | CUNVME_INFO_DMA_REVOKED | CUNVME_INFO_GPU_MAPPING)) == 0, "INFO flags has no unknown bits");
}

void test_rejects(int fd) {
  exported buf(64 * 1024);
  check(buf.ok(), "the exporter exports 64 KiB");
  if (!buf.ok()) return;
  std::vector<std::uint64_t> out(16);
  cunvme_dma_buf_request req = request(buf.fd, 0, 16 * page, out);
  req.flags = 1;
  expect_errno(::ioctl(fd, CUNVME_IOCTL_MAP_DMA_BUF, &req), EINVAL, "MAP_DMA_BUF with an unknown flag");
  req.flags = 0;
  req.reserved = 1;
  expect_errno(::ioctl(fd, CUNVME_IOCTL_MAP_DMA_BUF, &req), EINVAL, "MAP_DMA_BUF with reserved set");
  expect_errno(map(fd, -1, 0, page).rc, EBADF, "MAP_DMA_BUF of fd -1");
  const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  expect_errno(map(fd, null, 0, page).rc, EINVAL, "MAP_DMA_BUF of a file that is no dma-buf");
  ::close(null);
  expect_errno(map(fd, buf.fd, 0, 0).rc, EINVAL, "MAP_DMA_BUF of 0 bytes");
  expect_errno(map(fd, buf.fd, 512, page).rc, EINVAL, "MAP_DMA_BUF at an unaligned offset");
  expect_errno(map(fd, buf.fd, 0, page + 512).rc, EINVAL, "MAP_DMA_BUF of a size that is not whole pages");
  expect_errno(map(fd, buf.fd, 0, 17 * page).rc, ERANGE, "MAP_DMA_BUF of more than the dma-buf");
  expect_errno(map(fd, buf.fd, 15 * page, 2 * page).rc, ERANGE, "MAP_DMA_BUF of a range running past its end");
  expect_errno(map(fd, buf.fd, 32 * page, page).rc, ERANGE, "MAP_DMA_BUF at an offset past its end");
  expect_errno(map(fd, buf.fd, 0xfffffffffffff000ull, 2 * page).rc, EOVERFLOW, "MAP_DMA_BUF of a range that wraps around");
  expect_errno(map(fd, buf.fd, 0, 4 * page, 3).rc, E2BIG, "MAP_DMA_BUF of more pages than max_addresses");
  expect_errno(map(fd, buf.fd, 0, 4 * page, 4, reinterpret_cast<std::uint64_t*>(0xffff888000000000ull)).rc, EFAULT,
               "MAP_DMA_BUF with the address array in kernel memory");
  // Attached and mapped before the array write fails: the failure path must undo all of it.
  expect_errno(map(fd, buf.fd, 0, 4 * page, 4, reinterpret_cast<std::uint64_t*>(8)).rc, EFAULT, "MAP_DMA_BUF with an unmapped address array");
  expect_errno(::ioctl(fd, CUNVME_IOCTL_MAP_DMA_BUF, nullptr), EFAULT, "MAP_DMA_BUF with a null request");

  const std::string param = "/sys/module/cunvme/parameters/max_pinned_mb";
  const long saved = read_number(param);
  exported big(2 << 20);
  if (big.ok() && write_text(param, "1")) {
    expect_errno(map(fd, big.fd, 0, 2 << 20, 1024).rc, ENOMEM, "MAP_DMA_BUF of 2 MiB over a 1 MiB max_pinned_mb");
    map_result one = map(fd, big.fd, 0, 1 << 20, 1024);
    expect_errno(one.rc, 0, "MAP_DMA_BUF of 1 MiB at a 1 MiB max_pinned_mb");
    map_result more = map(fd, big.fd, 1 << 20, page);
    expect_errno(more.rc, ENOMEM, "MAP_DMA_BUF of one page more");
    if (more.rc == 0) unpin(fd, more.req.handle);
    if (one.rc == 0) unpin(fd, one.req.handle);
    map_result room = map(fd, big.fd, 1 << 20, page);
    expect_errno(room.rc, 0, "MAP_DMA_BUF after UNPIN made room");
    if (room.rc == 0) unpin(fd, room.req.handle);
    write_text(param, std::to_string(saved));
  } else {
    check(false, "the limit case's 2 MiB dma-buf and max_pinned_mb");
  }
  check(dma_buf_pages() == 0, "rejected maps leave the dma_buf_pages counter at 0", std::to_string(dma_buf_pages()));
  check(released(buf.status()) && released(big.status()), "rejected maps leave nothing attached, mapped or pinned at the exporter",
        status_text(buf.status()));
}

void test_map_unmap(int fd) {
  exported buf(64 * 1024);
  if (!buf.ok()) return check(false, "the exporter exports 64 KiB");
  // Pages 4..11 of 16: the addresses must be those pages', no others.
  map_result r = map(fd, buf.fd, 4 * page, 8 * page);
  expect_errno(r.rc, 0, "MAP_DMA_BUF of pages 4..11 of a 16-page dma-buf");
  if (r.rc != 0) return;
  check(r.req.count == 8 && r.req.page_shift == 12 && r.req.handle != 0, "MAP_DMA_BUF reports 8 pages of 4 KiB and a handle");
  check(dma_buf_pages() == 8 && dma_buf_pages_device() == 8, "the dma_buf_pages counters count them",
        std::to_string(dma_buf_pages()) + " / " + std::to_string(dma_buf_pages_device()));
  check(pinned_pages() == 0, "a dma-buf mapping is not counted as pinned host memory");
  const cunvme_test_status s = buf.status();
  check(s.attachments == 1 && s.mappings == 1 && s.pins >= 1, "the exporter sees one attachment, mapped and pinned", status_text(s));
  bool aligned = true, exact = true;
  for (std::size_t i = 0; i < 8; ++i) {
    aligned = aligned && r.addresses[i] != 0 && r.addresses[i] % page == 0;
    exact = exact && r.addresses[i] == physical(buf.map + (4 + i) * page);
  }
  check(aligned, "DMA addresses are non-zero and page aligned");
  // The module has only DMA addresses of a dma-buf, no CPU physical ones: no CPU mapping.
  void* cpu = ::mmap(nullptr, 64 * 1024, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(CUNVME_GPU_MMAP_OFFSET(r.req.handle)));
  expect_errno(cpu == MAP_FAILED ? -1 : 0, EOPNOTSUPP, "mmap of a dma-buf map's handle (GPU mapping offset)");
  if (cpu != MAP_FAILED) ::munmap(cpu, 64 * 1024);
  if (iommu_present()) {
    std::printf("(IOMMU present: DMA addresses are IOVAs, e.g. %#llx)\n", static_cast<unsigned long long>(r.addresses[0]));
  } else {
    check(exact, "without an IOMMU they are the physical addresses of exactly pages 4..11");
  }

  map_result second = map(fd, buf.fd, 0, 16 * page);
  expect_errno(second.rc, 0, "MAP_DMA_BUF of the same dma-buf again, whole");
  check(second.req.handle != r.req.handle && buf.status().attachments == 2, "each map is its own attachment with its own handle");
  expect_errno(unpin(fd, r.req.handle), 0, "UNPIN the first map");
  expect_errno(unpin(fd, r.req.handle), ENOENT, "UNPIN it twice");
  check(dma_buf_pages() == 16 && buf.status().attachments == 1, "UNPIN releases that map only");
  // The module holds its own reference: closing the caller's fd changes nothing.
  const int fd_copy = ::dup(buf.fd);
  map_result third = map(fd, fd_copy, 0, 4 * page);
  ::close(fd_copy);
  expect_errno(third.rc, 0, "MAP_DMA_BUF, then close the fd it came through");
  check(third.rc == 0 && buf.status().mappings == 2, "the map outlives the fd");
  expect_errno(unpin(fd, second.req.handle), 0, "UNPIN the whole map");
  if (third.rc == 0) expect_errno(unpin(fd, third.req.handle), 0, "UNPIN the map whose fd was closed");
  check(dma_buf_pages() == 0 && dma_buf_pages_device() == 0, "counters back to 0 after UNPIN", std::to_string(dma_buf_pages()));
  check(released(buf.status()), "the exporter sees nothing attached, mapped or pinned after UNPIN", status_text(buf.status()));
}

/// Reads and writes through the controller, with the library's kmod backend: the dma-buf is
/// a `dma_buffer` like any other.
void test_io() {
  constexpr std::size_t size = 1 << 20, offset = 64 * 1024, length = 512 * 1024;
  exported buf(size);
  if (!buf.ok()) return check(false, "the exporter exports 1 MiB");
  const long resets_before = resets();
  try {
    host::controller ctrl(std::make_unique<host::kmod_backend>(bdf));
    auto& memory = dynamic_cast<host::kmod_backend&>(ctrl.backend()).kmod_memory();
    check(memory.imports_dma_bufs(), "kmod_allocator reports dma-buf import");
    const host::namespace_info& ns = ctrl.namespaces().at(0);
    auto qp = ctrl.create_queue_pair(64);
    host::dma_buffer mapped = memory.map_dma_buf(buf.fd, offset, length, nullptr);
    check(mapped.size() == length && mapped.location() == host::memory_location::gpu && mapped.data() == nullptr &&
              mapped.pages().size() == length / page,
          "map_dma_buf gives a 512 KiB buffer without a host pointer, located in \"GPU\" memory");

    // Read: 512 KiB from disk byte 1 MiB into the dma-buf's bytes [64 KiB, 576 KiB).
    const std::uint64_t disk_at = 1 << 20;
    const auto status = qp->read(ns.nsid, disk_at / ns.lba_size, length / ns.lba_size, mapped);
    check(spec::is_success(status), "Read 512 KiB into the dma-buf through the controller", spec::to_string(status));
    bool same = true;
    for (std::size_t i = 0; i < length; i += 8) {
      std::uint64_t word;
      std::memcpy(&word, buf.map + offset + i, 8);
      same = same && word == host::pattern_word(disk_at + i);
    }
    check(same, "the dma-buf's pages hold the disk's pattern (read through the exporter's mmap)");
    check(buf.holds(0, offset, poison) && buf.holds(offset + length, size, poison), "bytes of the dma-buf outside the mapped range are untouched");

    // Write: 64 KiB from the dma-buf (at 128 KiB into the range) to disk byte 8 MiB, read back
    // into host memory.
    for (std::size_t i = 0; i < 64 * 1024; i += 8) {
      const std::uint64_t word = 0xc0ffee0000000000ull | i;
      std::memcpy(buf.map + offset + 128 * 1024 + i, &word, 8);
    }
    const std::uint64_t write_at = 8 << 20;
    const auto written = qp->write(ns.nsid, write_at / ns.lba_size, 64 * 1024 / ns.lba_size, mapped, 128 * 1024);
    check(spec::is_success(written), "Write 64 KiB from the dma-buf through the controller", spec::to_string(written));
    host::dma_buffer back = ctrl.memory().allocate(64 * 1024);
    const auto read_back = qp->read(ns.nsid, write_at / ns.lba_size, 64 * 1024 / ns.lba_size, back);
    check(spec::is_success(read_back) && std::memcmp(back.data(), buf.map + offset + 128 * 1024, 64 * 1024) == 0,
          "the disk holds what the dma-buf held (read back into host memory)");
    check(dma_buf_pages() == static_cast<long>(length / page), "the counter shows the mapped range", std::to_string(dma_buf_pages()));
  } catch (const std::exception& e) {
    check(false, "I/O into the dma-buf", e.what());
  }
  check(dma_buf_pages() == 0 && pinned_pages() == 0, "counters back to 0 once the buffer and controller are gone");
  check(released(buf.status()), "the exporter sees nothing attached after the controller is gone", status_text(buf.status()));
  check(resets_before >= 0 && resets() == resets_before, "closing the device with no dma-buf revoked does not reset the controller",
        std::to_string(resets_before) + " -> " + std::to_string(resets()));
}

/// The exporter revokes a dma-buf the controller has mapped: the module stops the
/// controller's DMA and unmaps, later maps and pins are refused; the close resets the
/// controller (its commands in flight die with it, before any pin goes) and the device
/// recovers on the next open.
void test_revoke() {
  constexpr std::size_t size = 256 * 1024;
  exported buf(size);
  if (!buf.ok()) return check(false, "the exporter exports 256 KiB");
  {
    std::ifstream methods("/sys/bus/pci/devices/" + bdf + "/reset_method");
    std::string line;
    std::getline(methods, line);
    std::printf("(reset methods of %s: %s)\n", bdf.c_str(), line.empty() ? "none" : line.c_str());
  }
  const long resets_before = resets();
  check(resets_before >= 0, "the device reports how often the module reset it (/sys/class/cunvme/BDF/resets)");
  try {
    host::controller_options options;
    options.command_timeout = std::chrono::milliseconds(1000);
    host::controller ctrl(std::make_unique<host::kmod_backend>(bdf), options);
    auto& memory = dynamic_cast<host::kmod_backend&>(ctrl.backend()).kmod_memory();
    const host::namespace_info& ns = ctrl.namespaces().at(0);
    auto qp = ctrl.create_queue_pair(64);
    host::dma_buffer mapped = memory.map_dma_buf(buf.fd, 0, size, nullptr);
    check(spec::is_success(qp->read(ns.nsid, 0, 64 * 1024 / ns.lba_size, mapped)), "Read into the dma-buf before the revoke");
    std::memset(buf.map, static_cast<int>(poison), size);

    const cunvme_test_status s = buf.status(true);
    // Unpinning is the exporter's business outside move_notify: it happens at UNPIN/close.
    check(s.revoked == 1 && s.mappings == 0 && s.pins == 1 && s.attachments == 1,
          "after the exporter's revoke the module has unmapped (still pinned and attached until UNPIN/close)", status_text(s));
    check(!bus_master_on(), "the revoke turned the controller's bus mastering off");
    check(dma_buf_pages() == 0, "the counter drops the revoked pages", std::to_string(dma_buf_pages()));
    auto& backend = dynamic_cast<host::kmod_backend&>(ctrl.backend());
    check((backend.query_info().flags & CUNVME_INFO_DMA_REVOKED) != 0, "INFO reports the revoked dma-buf");
    int pin_errno = 0;
    try {
      (void)ctrl.memory().allocate(page);
    } catch (const host::error& e) {
      pin_errno = e.os_error().value();
    }
    check(pin_errno == ENOLINK, "PIN of host memory after a revoke -> ENOLINK", "got " + errno_name(pin_errno));
    int map_errno = 0;
    std::string map_error;
    try {
      (void)memory.map_dma_buf(buf.fd, 0, page, nullptr);
    } catch (const host::error& e) {
      map_errno = e.os_error().value();
      map_error = e.what();
    }
    check(map_errno == ENOLINK && map_error.find("revoked") != std::string::npos,
          "MAP_DMA_BUF after a revoke -> ENOLINK, and map_dma_buf's host::error says why", map_error);

    // A command aimed at the revoked addresses: no completion, and nothing lands.
    bool completed = true;
    try {
      completed = spec::is_success(qp->read(ns.nsid, 0, 64 * 1024 / ns.lba_size, mapped));
    } catch (const host::error& e) {
      completed = false;
      std::printf("(the read after the revoke: %s)\n", e.what());
    }
    check(!completed, "a read into the revoked buffer does not complete successfully");
    check(buf.holds(0, size, poison), "and none of its data reached the dma-buf's pages");
  } catch (const std::exception& e) {
    check(false, "the revoke case", e.what());
  }
  check(released(buf.status()), "UNPIN/close of the revoked map detaches it", status_text(buf.status()));
  check(dma_buf_pages() == 0 && pinned_pages() == 0, "counters 0 after the revoked device is closed");
  check(resets() == resets_before + 1, "closing the device after a revoke resets the controller once",
        std::to_string(resets_before) + " -> " + std::to_string(resets()));
  try {
    host::controller ctrl(std::make_unique<host::kmod_backend>(bdf));
    check(reads_the_pattern(ctrl) && bus_master_on() &&
              (dynamic_cast<host::kmod_backend&>(ctrl.backend()).info().flags & CUNVME_INFO_DMA_REVOKED) == 0,
          "the next open brings the controller up and reads again, with no revoke reported");
    check(resets() == resets_before + 1, "the next open needs no second reset", std::to_string(resets()));
  } catch (const std::exception& e) {
    check(false, "the next open brings the controller up and reads again", e.what());
  }
}

void test_close_releases() {
  exported buf(128 * 1024);
  int fd = open_device();
  expect_errno(map(fd, buf.fd, 0, 32 * page).rc, 0, "MAP_DMA_BUF of 128 KiB, then close without UNPIN");
  ::close(fd);
  check(dma_buf_pages() == 0 && released(buf.status()), "close releases every dma-buf map", status_text(buf.status()));
}

void test_killed_process_releases() {
  exported buf(1 << 20);
  int ready[2];
  if (::pipe(ready) != 0) return check(false, "pipe");
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(ready[0]);
    const int fd = open_device();
    char ok = fd >= 0 && map(fd, buf.fd, 0, 1 << 20, 256).rc == 0 ? 'y' : 'n';
    (void)!::write(ready[1], &ok, 1);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char ok = 'n';
  (void)!::read(ready[0], &ok, 1);
  ::close(ready[0]);
  check(ok == 'y' && dma_buf_pages() == 256, "a child process maps a 1 MiB dma-buf", std::to_string(dma_buf_pages()));
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  check(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "the child is killed with SIGKILL");
  check(dma_buf_pages() == 0 && released(buf.status()), "a killed process's dma-buf maps are released", status_text(buf.status()));
}

/// Unbinding while a revoked dma-buf is mapped: unbind holds the device lock while it waits
/// for the close, so the close cannot reset the controller itself and unbind does, before any
/// other driver can turn bus mastering on.
void test_unbind_after_revoke_resets() {
  exported buf(64 * 1024);
  const int fd = open_device();
  expect_errno(map(fd, buf.fd, 0, 16 * page).rc, 0, "MAP_DMA_BUF before a revoke and an unbind");
  check(buf.status(true).revoked == 1 && !bus_master_on(), "the exporter revokes it");
  const int resets_logged = kernel_log_count("function reset: ");
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fd);
    ::_exit(write_text("/sys/bus/pci/drivers/cunvme/unbind", bdf) ? 0 : 1);
  }
  // remove() deletes the node before it waits for the close.
  bool node_gone = false;
  for (int i = 0; i < 50 && !node_gone; ++i, ::usleep(100 * 1000)) node_gone = ::access(node.c_str(), F_OK) != 0;
  check(node_gone, "unbind has started (node gone) while the device is open");
  ::close(fd);
  int status = 0;
  check(::waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0 && !bound(), "unbind completes once the device is closed");
  check(kernel_log_count("function reset: ") == resets_logged + 1, "the unbind reset the controller the close could not (kernel log)",
        std::to_string(resets_logged) + " -> " + std::to_string(kernel_log_count("function reset: ")));
  check(dma_buf_pages() == 0 && released(buf.status()), "the revoked map was released", status_text(buf.status()));
  check(write_text("/sys/bus/pci/drivers/cunvme/bind", bdf) && bound(), "the controller binds again");
  bool node_back = false;
  for (int i = 0; i < 20 && !node_back; ++i, ::usleep(100 * 1000)) node_back = ::access(node.c_str(), F_OK) == 0;
  try {
    host::controller ctrl(std::make_unique<host::kmod_backend>(bdf));
    check(reads_the_pattern(ctrl) && node_back && resets() == 0,
          "after binding again the controller comes up and reads, with no reset pending");
  } catch (const std::exception& e) {
    check(false, "after binding again the controller comes up and reads", e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s BDF\n", argv[0]);
    return 2;
  }
  bdf = argv[1];
  node = "/dev/cunvme/" + bdf;
  std::printf("kmod_dma_buf on %s%s\n", node.c_str(), iommu_present() ? " (IOMMU on)" : "");
  if (!load_exporter()) {
    std::printf("kmod_dma_buf: %d passed, %d failed\n", results.passed, results.failed);
    return 1;
  }
  const int fd = open_device();
  if (fd < 0) {
    std::printf("FAIL open %s: %s\nkmod_dma_buf: %d passed, %d failed\n", node.c_str(), std::strerror(errno), results.passed, results.failed + 1);
    return 1;
  }
  test_info(fd);
  test_rejects(fd);
  test_map_unmap(fd);
  ::close(fd);
  test_io();
  test_revoke();
  test_close_releases();
  test_killed_process_releases();
  test_unbind_after_revoke_resets();

  ::close(exporter);
  // Every dma-buf holds a reference to the exporter module: it unloads only when no importer
  // holds any buffer any more.
  expect_errno(::syscall(SYS_delete_module, "cunvme_test_exporter", O_NONBLOCK), 0, "rmmod cunvme_test_exporter (no dma-buf left)");
  return results.summary("kmod_dma_buf");
}
