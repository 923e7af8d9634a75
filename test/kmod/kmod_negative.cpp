// The cunvme kernel module's interface, case by case, inside the QEMU guest (run_guest.sh
// --module): what it accepts, what it rejects with which errno, and that the pinned-page
// counter returns to 0 however a process lets go (unpin, close, SIGKILL, a map_host buffer gone).
//
//   kmod_negative BDF
//
// Needs root, the module loaded and the controller bound to it, nobody else holding
// /dev/cunvme/BDF open. Prints "PASS name" / "FAIL name: why" per check and a summary; exits 0
// when all passed.
#include <cunvme/host/backend/kmod_backend.cuh>
#include <cunvme/kmod/cunvme_ioctl.h>

#include "../guest_checks.hpp"

#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <fstream>
#include <functional>
#include <string>
#include <memory>
#include <vector>

#include <fcntl.h>
#include <linux/capability.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

constexpr std::size_t page = 4096;
std::string bdf, node;
test::tally results;

void check(bool ok, const std::string& name, const std::string& why = "") { results.check(ok, name, why); }
/// `rc` of a call that sets errno, against the errno wanted (0: success).
void expect_errno(long rc, int want, const std::string& name) { test::expect_errno(results, rc, want, name); }
using test::errno_name;
using test::read_number;
using test::write_text;
long pinned_total() { return read_number("/sys/bus/pci/drivers/cunvme/pinned_pages"); }
long pinned_device() { return read_number("/sys/class/cunvme/" + bdf + "/pinned_pages"); }
long resets() { return read_number("/sys/class/cunvme/" + bdf + "/resets"); }

/// The errno of mapping `len` bytes of the device at `offset` (0: it mapped, and was unmapped).
int mmap_errno(int fd, std::size_t len, int flags, std::uint64_t offset) {
  void* q = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, flags, fd, static_cast<off_t>(offset));
  if (q != MAP_FAILED) {
    ::munmap(q, len);
    return 0;
  }
  return errno;
}

int open_device(int flags = O_RDWR) { return ::open(node.c_str(), flags | O_CLOEXEC); }

void* map_anonymous(std::size_t bytes, int prot = PROT_READ | PROT_WRITE) {
  void* p = ::mmap(nullptr, bytes, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

struct pin_result {
  long rc;
  int error;
  cunvme_pin_request req;
  std::vector<std::uint64_t> addresses;
};

pin_result pin(int fd, std::uint64_t address, std::uint64_t bytes, std::uint32_t flags = 0, std::uint32_t max_addresses = 1u << 20,
               std::uint64_t* out = nullptr) {
  pin_result r{};
  r.addresses.resize(out == nullptr ? std::min<std::uint64_t>(max_addresses, bytes / page + 1) : 0);
  r.req.address = address;
  r.req.bytes = bytes;
  r.req.addresses = reinterpret_cast<std::uintptr_t>(out != nullptr ? out : r.addresses.data());
  r.req.max_addresses = max_addresses;
  r.req.flags = flags;
  errno = 0;
  r.rc = ::ioctl(fd, CUNVME_IOCTL_PIN, &r.req);
  r.error = r.rc == 0 ? 0 : errno;
  return r;
}

long unpin(int fd, std::uint64_t handle) {
  cunvme_unpin_request u{handle};
  return ::ioctl(fd, CUNVME_IOCTL_UNPIN, &u);
}

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

bool iommu_present() {
  // /sys/class/iommu/ has an entry per IOMMU (dmar0 for Intel's).
  const int fd = ::open("/sys/class/iommu/dmar0", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

/// Runs `body` in a child process; true when it exited 0.
bool in_child(const std::function<int()>& body) {
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int status = 0;
  return pid > 0 && ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

void test_open() {
  int fd = open_device(O_RDONLY);
  expect_errno(fd >= 0 ? 0 : -1, EACCES, "open read-only");
  if (fd >= 0) ::close(fd);
  fd = open_device();
  expect_errno(fd >= 0 ? 0 : -1, 0, "open read-write");
  const int second = open_device();
  expect_errno(second >= 0 ? 0 : -1, EBUSY, "a second open while the first is held");
  if (second >= 0) ::close(second);
  if (fd >= 0) ::close(fd);
  fd = open_device();
  expect_errno(fd >= 0 ? 0 : -1, 0, "open again after close");
  if (fd >= 0) ::close(fd);
}

void test_info(int fd, cunvme_device_info& info) {
  expect_errno(::ioctl(fd, CUNVME_IOCTL_INFO, &info), 0, "INFO");
  check(info.abi_version == CUNVME_ABI_VERSION, "INFO abi_version is " + std::to_string(CUNVME_ABI_VERSION),
        "got " + std::to_string(info.abi_version));
  check((info.flags & ~(CUNVME_INFO_GPU_PINNING | CUNVME_INFO_DMA_BUF | CUNVME_INFO_GPU_MAPPING)) == 0,
        "INFO flags has no unknown bits (nor a revoked dma-buf)");
  check(((info.flags & CUNVME_INFO_GPU_MAPPING) != 0) == ((info.flags & CUNVME_INFO_GPU_PINNING) != 0),
        "INFO offers CPU mappings of GPU memory exactly where it pins GPU memory (nvidia_p2p)");
  check(info.bar_size[0] >= 0x1000 && (info.bar_size[0] & (info.bar_size[0] - 1)) == 0, "INFO BAR0 size is a power of two >= 4 KiB",
        "got " + std::to_string(info.bar_size[0]));
  // The guest has no address translation between CPU and PCI: resource's start is the bus address.
  std::ifstream resource("/sys/bus/pci/devices/" + bdf + "/resource");
  unsigned long long start = 0, end = 0;
  resource >> std::hex >> start >> end;
  check(resource && info.bar_bus_address[0] == start, "INFO BAR0 bus address matches sysfs resource",
        "got " + std::to_string(info.bar_bus_address[0]) + ", sysfs " + std::to_string(start));
  const long limit_mb = read_number("/sys/module/cunvme/parameters/max_pinned_mb");
  check(info.max_pinned_bytes == static_cast<std::uint64_t>(limit_mb) << 20, "INFO max_pinned_bytes is max_pinned_mb (root)");

  errno = 0;
  expect_errno(::ioctl(fd, CUNVME_IOCTL_INFO, nullptr), EFAULT, "INFO into a null pointer");
  expect_errno(::ioctl(fd, CUNVME_IOCTL_INFO, reinterpret_cast<void*>(0xffff888000000000ull)), EFAULT, "INFO into a kernel address");
  expect_errno(::ioctl(fd, _IO('C', 9), nullptr), ENOTTY, "unknown request number");
  expect_errno(::ioctl(fd, _IOR('C', 1, std::uint64_t), &info), ENOTTY, "INFO number with the wrong size");
}

void test_mmap(int fd, const cunvme_device_info& info) {
  const std::size_t bar = info.bar_size[0];
  void* p = ::mmap(nullptr, bar, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  check(p != MAP_FAILED, "mmap BAR0", std::strerror(errno));
  if (p != MAP_FAILED) {
    const auto vs = static_cast<volatile std::uint32_t*>(p)[2];  // VS, offset 08h
    check((vs >> 16) == 1, "BAR0 mapping reads VS 1.x", "VS " + std::to_string(vs));
    ::munmap(p, bar);
  }
  check(mmap_errno(fd, page, MAP_SHARED, page) == 0, "mmap the second page of BAR0");
  check(mmap_errno(fd, bar, MAP_PRIVATE, 0) == EINVAL, "mmap BAR0 private -> EINVAL");
  check(mmap_errno(fd, bar + page, MAP_SHARED, 0) == EINVAL, "mmap beyond BAR0 -> EINVAL");
  check(mmap_errno(fd, page, MAP_SHARED, bar) == EINVAL, "mmap at an offset past BAR0 -> EINVAL");
  if (info.bar_size[1] == 0) check(mmap_errno(fd, page, MAP_SHARED, 1ull << CUNVME_BAR_MMAP_SHIFT) == EINVAL, "mmap an absent BAR -> EINVAL");
  check(mmap_errno(fd, page, MAP_SHARED, 6ull << 40) == EINVAL, "mmap BAR 6 -> EINVAL");
  check(mmap_errno(fd, page, MAP_SHARED, 0xfffull << 40) == EINVAL, "mmap a huge offset -> EINVAL");
}

/// mmap at a GPU pin's offset (CUNVME_GPU_MMAP_OFFSET): what is refused without a GPU pin.
void test_gpu_mmap_rejects(int fd) {
  const long before = pinned_total();
  auto* buf = static_cast<std::byte*>(map_anonymous(16 * page));
  auto r = pin(fd, reinterpret_cast<std::uintptr_t>(buf), 16 * page);
  expect_errno(r.rc, 0, "PIN 64 KiB of host memory for the GPU-mapping cases");
  if (r.rc != 0) return;
  const std::uint64_t at = CUNVME_GPU_MMAP_OFFSET(r.req.handle);
  check(mmap_errno(fd, 16 * page, MAP_SHARED, at) == EINVAL, "mmap of a host pin's handle -> EINVAL (the process has that memory)");
  check(mmap_errno(fd, 16 * page, MAP_PRIVATE, at) == EINVAL, "mmap private at a pin's GPU offset -> EINVAL");
  check(mmap_errno(fd, page, MAP_SHARED, at + page) == EINVAL, "mmap inside a pin's GPU range, not at its start -> EINVAL");
  check(mmap_errno(fd, 16 * page, MAP_SHARED, CUNVME_GPU_MMAP_OFFSET(r.req.handle + 1000)) == ENOENT,
        "mmap of a handle never given out -> ENOENT");
  check(mmap_errno(fd, 16 * page, MAP_SHARED, CUNVME_GPU_MMAP_OFFSET(0)) == ENOENT, "mmap of handle 0 -> ENOENT");
  expect_errno(unpin(fd, r.req.handle), 0, "UNPIN the host pin");
  check(mmap_errno(fd, 16 * page, MAP_SHARED, at) == ENOENT, "mmap of an unpinned handle -> ENOENT");
  check(pinned_total() == before, "the GPU-mapping cases leave the pinned-page counter alone", std::to_string(pinned_total()));
  ::munmap(buf, 16 * page);
}

void test_pin_rejects(int fd, const cunvme_device_info& info) {
  const long before = pinned_total();
  auto* buf = static_cast<std::byte*>(map_anonymous(16 * page));
  const auto a = reinterpret_cast<std::uintptr_t>(buf);

  expect_errno(pin(fd, a, 4 * page, 2).rc, EINVAL, "PIN with an unknown flag");
  if (!(info.flags & CUNVME_INFO_GPU_PINNING)) {
    expect_errno(pin(fd, a, 16 * page, CUNVME_PIN_GPU_MEMORY).rc, EOPNOTSUPP, "PIN GPU memory without nvidia_p2p");
  }
  expect_errno(pin(fd, a, 0).rc, EINVAL, "PIN 0 bytes");
  expect_errno(pin(fd, a + 8, page).rc, EINVAL, "PIN at an unaligned address");
  expect_errno(pin(fd, a, page + 512).rc, EINVAL, "PIN a size that is not whole pages");
  expect_errno(pin(fd, 0xfffffffffffff000ull, 2 * page).rc, EOVERFLOW, "PIN a range that wraps around");
  expect_errno(pin(fd, 0xffff888000000000ull, page).rc, EFAULT, "PIN kernel memory");
  expect_errno(pin(fd, a, 4 * page, 0, 3).rc, E2BIG, "PIN more pages than max_addresses");
  expect_errno(pin(fd, a, 4 * page, 0, 4, reinterpret_cast<std::uint64_t*>(0xffff888000000000ull)).rc, EFAULT,
               "PIN with the address array in kernel memory");
  // Pinned and mapped before the array write fails: the failure path must undo all of it.
  expect_errno(pin(fd, a, 4 * page, 0, 4, reinterpret_cast<std::uint64_t*>(8)).rc, EFAULT,
               "PIN with an unmapped address array");
  auto* readonly = static_cast<std::uint64_t*>(map_anonymous(page, PROT_READ));
  expect_errno(pin(fd, a, 4 * page, 0, 4, readonly).rc, EFAULT, "PIN with a read-only address array");
  expect_errno(pin(fd, reinterpret_cast<std::uintptr_t>(readonly), page).rc, EFAULT, "PIN read-only memory (the device writes)");
  void* hole = map_anonymous(4 * page);
  ::munmap(hole, 4 * page);
  expect_errno(pin(fd, reinterpret_cast<std::uintptr_t>(hole), 4 * page).rc, EFAULT, "PIN unmapped memory");
  auto* end = static_cast<std::byte*>(map_anonymous(8 * page));
  ::munmap(end + 4 * page, 4 * page);
  expect_errno(pin(fd, reinterpret_cast<std::uintptr_t>(end), 8 * page).rc, EFAULT, "PIN a range running past its mapping");
  ::munmap(end, 4 * page);
  expect_errno(::ioctl(fd, CUNVME_IOCTL_PIN, nullptr), EFAULT, "PIN with a null request");
  check(pinned_total() == before, "rejected PINs leave the pinned-page counter alone",
        std::to_string(before) + " before, " + std::to_string(pinned_total()) + " after");
  ::munmap(readonly, page);
  ::munmap(buf, 16 * page);
}

void test_pin_unpin(int fd) {
  const std::size_t pages = 16;
  auto* buf = static_cast<std::byte*>(map_anonymous(pages * page));
  auto r = pin(fd, reinterpret_cast<std::uintptr_t>(buf), pages * page);
  expect_errno(r.rc, 0, "PIN 64 KiB");
  if (r.rc != 0) return;
  check(r.req.count == pages && r.req.page_shift == 12 && r.req.handle != 0, "PIN reports 16 pages of 4 KiB and a handle");
  check(pinned_total() == static_cast<long>(pages) && pinned_device() == static_cast<long>(pages),
        "the pinned-page counters count them", std::to_string(pinned_total()) + " / " + std::to_string(pinned_device()));
  bool aligned = true, physical_match = true;
  for (std::size_t i = 0; i < pages; ++i) {
    aligned = aligned && r.addresses[i] != 0 && r.addresses[i] % page == 0;
    physical_match = physical_match && r.addresses[i] == physical(buf + i * page);
  }
  check(aligned, "DMA addresses are non-zero and page aligned");
  if (iommu_present()) {
    std::printf("(IOMMU present: DMA addresses are IOVAs, e.g. %#llx for physical %#llx)\n", static_cast<unsigned long long>(r.addresses[0]),
                static_cast<unsigned long long>(physical(buf)));
  } else {
    check(physical_match, "without an IOMMU the DMA addresses are the pages' physical addresses");
  }

  // The pin holds the pages, not the mapping: unmapping the range leaves them pinned.
  auto* other = static_cast<std::byte*>(map_anonymous(pages * page));
  auto r2 = pin(fd, reinterpret_cast<std::uintptr_t>(other), pages * page);
  expect_errno(r2.rc, 0, "PIN a second range");
  check(r2.req.handle != r.req.handle, "each PIN gets its own handle");
  ::munmap(other, pages * page);
  check(pinned_total() == static_cast<long>(2 * pages), "munmap of a pinned range keeps it pinned");

  expect_errno(unpin(fd, r.req.handle), 0, "UNPIN");
  expect_errno(unpin(fd, r.req.handle), ENOENT, "UNPIN the same handle twice");
  expect_errno(unpin(fd, 0), ENOENT, "UNPIN handle 0");
  expect_errno(unpin(fd, r2.req.handle + 1000), ENOENT, "UNPIN a handle never given out");
  expect_errno(::ioctl(fd, CUNVME_IOCTL_UNPIN, nullptr), EFAULT, "UNPIN with a null request");
  expect_errno(unpin(fd, r2.req.handle), 0, "UNPIN the munmapped range");
  check(pinned_total() == 0, "counter back to 0 after UNPIN", std::to_string(pinned_total()));
  ::munmap(buf, pages * page);
}

/// kmod_allocator::map_host through this fd: memory a second allocator of the module pinned
/// and plain memory of the process are pinned again for the controller and unpinned with their
/// buffers, never unmapped; memory the process may not write is refused.
void test_map_host(int fd, const cunvme_device_info& info) {
  namespace host = cunvme::host;
  host::kmod_allocator owner(fd, bdf, info.flags), other(fd, bdf, info.flags);
  try {
    auto slots = owner.allocate(3 * page);  // a 2 MiB huge page where the pool has one, else 4 KiB pages
    const long held = pinned_total();
    {
      auto mapped = other.map_host(slots.data(), slots.size());
      check(mapped.data() == slots.data() && mapped.pages().size() == 3 && mapped.page_size() == page,
            "map_host of another allocator's buffer lists its 3 pages of 4 KiB at its address");
      check(pinned_total() == held + 3, "map_host pins the 3 pages again", std::to_string(pinned_total()));
      if (!iommu_present()) {
        check(std::equal(mapped.pages().begin(), mapped.pages().end(), slots.pages().begin()), "without an IOMMU map_host gives the owner's DMA addresses");
      }
    }
    check(pinned_total() == held, "the map_host buffer unpins with it, the owner's pin stays", std::to_string(pinned_total()));
    slots.data()[10] = std::byte{1};  // the memory is still the owner's, mapped
  } catch (const host::error& e) {
    check(false, "map_host of another allocator's buffer", e.what());
  }

  auto* plain = static_cast<std::byte*>(map_anonymous(2 * page));
  try {
    {
      auto mapped = other.map_host(plain, 2 * page);
      bool physical_match = true;
      for (std::size_t i = 0; i < 2; ++i) physical_match = physical_match && mapped.pages()[i] == physical(plain + i * page);
      if (!iommu_present()) check(physical_match, "map_host of plain memory: without an IOMMU its physical addresses");
      check(pinned_total() == 2, "map_host of plain memory pins its 2 pages", std::to_string(pinned_total()));
    }
    plain[0] = std::byte{1};  // released: unpinned, still mapped
    check(pinned_total() == 0, "counter back to 0 after the map_host buffers are gone", std::to_string(pinned_total()));
  } catch (const host::error& e) {
    check(false, "map_host of plain memory", e.what());
  }
  ::munmap(plain, 2 * page);

  auto* read_only = map_anonymous(page, PROT_READ);
  try {
    (void)other.map_host(read_only, page);
    check(false, "map_host of read-only memory is refused", "it was mapped");
  } catch (const host::error& e) {
    const std::string what = e.what();
    check(what.find("Map host memory on " + bdf) != std::string::npos && what.find("may write") != std::string::npos,
          "map_host of read-only memory is refused, naming the operation, the device and why", what);
  }
  ::munmap(read_only, page);
  check(pinned_total() == 0, "a refused map_host pins nothing", std::to_string(pinned_total()));
}

void test_limits(int fd) {
  const std::string param = "/sys/module/cunvme/parameters/max_pinned_mb";
  const long saved = read_number(param);
  check(write_text(param, "1"), "max_pinned_mb can be lowered at run time");
  auto* buf = static_cast<std::byte*>(map_anonymous(2 << 20));
  const auto a = reinterpret_cast<std::uintptr_t>(buf);
  expect_errno(pin(fd, a, 2 << 20).rc, ENOMEM, "PIN 2 MiB over a 1 MiB max_pinned_mb");
  auto r = pin(fd, a, 1 << 20);
  expect_errno(r.rc, 0, "PIN 1 MiB at a 1 MiB max_pinned_mb");
  expect_errno(pin(fd, a + (1 << 20), page).rc, ENOMEM, "PIN one page more");
  if (r.rc == 0) unpin(fd, r.req.handle);
  auto room = pin(fd, a + (1 << 20), page);
  expect_errno(room.rc, 0, "PIN after UNPIN made room");
  if (room.rc == 0) unpin(fd, room.req.handle);
  write_text(param, std::to_string(saved));

  // Without CAP_IPC_LOCK, RLIMIT_MEMLOCK holds too (pins count as locked memory).
  const bool limited = in_child([&] {
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct caps[2]{};
    if (::syscall(SYS_capget, &header, caps) != 0) return 10;
    caps[0].effective &= ~(1u << CAP_IPC_LOCK);
    caps[0].permitted &= ~(1u << CAP_IPC_LOCK);
    if (::syscall(SYS_capset, &header, caps) != 0) return 11;
    const rlimit lim{64 * 1024, 64 * 1024};
    if (::setrlimit(RLIMIT_MEMLOCK, &lim) != 0) return 12;
    cunvme_device_info info{};
    if (::ioctl(fd, CUNVME_IOCTL_INFO, &info) != 0 || info.max_pinned_bytes != 64 * 1024) return 13;
    auto* mem = static_cast<std::byte*>(map_anonymous(32 * page));
    if (pin(fd, reinterpret_cast<std::uintptr_t>(mem), 32 * page).error != ENOMEM) return 14;
    auto ok = pin(fd, reinterpret_cast<std::uintptr_t>(mem), 16 * page);
    if (ok.rc != 0) return 15;
    if (pin(fd, reinterpret_cast<std::uintptr_t>(mem + 16 * page), page).error != ENOMEM) return 16;
    return unpin(fd, ok.req.handle) == 0 ? 0 : 17;
  });
  check(limited, "without CAP_IPC_LOCK: INFO reports RLIMIT_MEMLOCK and PIN beyond it -> ENOMEM");
  check(pinned_total() == 0, "counter back to 0 after the limit cases", std::to_string(pinned_total()));
  ::munmap(buf, 2 << 20);
}

// Buffers may outlive their backend: closing the device released their pins, and released
// later they must not reach a descriptor number reused since (whose pins share their handle
// numbers).
void test_buffers_outlive_backend() {
  namespace host = cunvme::host;
  std::vector<host::dma_buffer> kept;
  try {
    auto backend = std::make_unique<host::kmod_backend>(bdf);
    for (int i = 0; i < 2; ++i) kept.push_back(backend->memory().allocate(16 * page));
  } catch (const host::error& e) {
    return check(false, "buffers from a kmod backend", e.what());
  }
  check(pinned_total() == 0, "closing the backend releases the pins of buffers that outlive it", std::to_string(pinned_total()));
  const int fd = open_device();
  auto* buf = static_cast<std::byte*>(map_anonymous(4 * page));
  auto r = pin(fd, reinterpret_cast<std::uintptr_t>(buf), 4 * page);
  expect_errno(r.rc, 0, "PIN on a descriptor opened after the backend closed");
  kept.clear();
  check(pinned_total() == 4, "buffers released after their backend leave the pins of a descriptor opened since alone",
        std::to_string(pinned_total()));
  ::close(fd);
  ::munmap(buf, 4 * page);
  check(pinned_total() == 0, "counter back to 0 after the outliving buffers", std::to_string(pinned_total()));
}

void test_close_releases() {
  int fd = open_device();
  auto* buf = static_cast<std::byte*>(map_anonymous(64 * page));
  auto r = pin(fd, reinterpret_cast<std::uintptr_t>(buf), 64 * page);
  expect_errno(r.rc, 0, "PIN 256 KiB, then close without UNPIN");
  ::close(fd);
  check(pinned_total() == 0, "close releases every pin", std::to_string(pinned_total()));
  ::munmap(buf, 64 * page);
}

void test_killed_process_releases() {
  int ready[2];
  if (::pipe(ready) != 0) return check(false, "pipe");
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(ready[0]);
    const int fd = open_device();
    auto* buf = static_cast<std::byte*>(map_anonymous(1 << 20));
    char ok = fd >= 0 && pin(fd, reinterpret_cast<std::uintptr_t>(buf), 1 << 20).rc == 0 &&
                      ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) != MAP_FAILED
                  ? 'y'
                  : 'n';
    (void)!::write(ready[1], &ok, 1);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char ok = 'n';
  (void)!::read(ready[0], &ok, 1);
  ::close(ready[0]);
  check(ok == 'y', "a child process pins 1 MiB and maps BAR0");
  check(pinned_total() == 256, "the counter shows its 256 pages", std::to_string(pinned_total()));
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  check(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "the child is killed with SIGKILL");
  check(pinned_total() == 0, "a killed process's pins are released (counter 0)", std::to_string(pinned_total()));
  const int fd = open_device();
  expect_errno(fd >= 0 ? 0 : -1, 0, "the device opens again after the killed process");
  if (fd >= 0) ::close(fd);
}

/// Only a revoked dma-buf or a controller that would not stop makes the module reset it:
/// everything before (opens, pins, closes, a killed process, the conformance run) did not.
void test_no_reset_without_cause() {
  check(resets() == 0, "closing a controller that stopped and had nothing revoked never resets it (resets 0)", std::to_string(resets()));
}

bool bound() { return ::access(("/sys/bus/pci/drivers/cunvme/" + bdf).c_str(), F_OK) == 0; }

/// Unbinding waits while a process holds the device (its BAR mapping and pins stay valid),
/// completes when it closes, and the controller binds again.
void test_unbind_waits_for_close() {
  const int fd = open_device();
  auto* buf = static_cast<std::byte*>(map_anonymous(8 * page));
  expect_errno(pin(fd, reinterpret_cast<std::uintptr_t>(buf), 8 * page).rc, 0, "PIN before unbinding");
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fd);  // else this child's copy keeps the device open and the unbind waits forever
    ::_exit(write_text("/sys/bus/pci/drivers/cunvme/unbind", bdf) ? 0 : 1);
  }
  ::usleep(500 * 1000);
  int status = 0;
  // (The driver's sysfs link goes before remove() runs, so "bound" says nothing here.)
  check(::waitpid(child, &status, WNOHANG) == 0, "unbind waits while the device is open");
  const int again = open_device();
  expect_errno(again >= 0 ? 0 : -1, ENOENT, "no new open while unbinding (node gone)");
  if (again >= 0) ::close(again);
  ::close(fd);
  check(::waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0 && !bound(),
        "unbind completes once the device is closed");
  check(pinned_total() == 0, "counter 0 after unbinding", std::to_string(pinned_total()));
  ::munmap(buf, 8 * page);
  check(write_text("/sys/bus/pci/drivers/cunvme/bind", bdf) && bound(), "the controller binds again");
  bool node_back = false;
  for (int i = 0; i < 20 && !node_back; ++i, ::usleep(100 * 1000)) node_back = ::access(node.c_str(), F_OK) == 0;
  check(node_back, "its node comes back");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s BDF\n", argv[0]);
    return 2;
  }
  bdf = argv[1];
  node = "/dev/cunvme/" + bdf;
  std::printf("kmod_negative on %s%s\n", node.c_str(), iommu_present() ? " (IOMMU on)" : "");

  test_open();
  const int fd = open_device();
  if (fd < 0) {
    std::printf("FAIL open %s: %s\nkmod_negative: %d passed, %d failed\n", node.c_str(), std::strerror(errno), results.passed, results.failed + 1);
    return 1;
  }
  cunvme_device_info info{};
  test_info(fd, info);
  test_mmap(fd, info);
  test_pin_rejects(fd, info);
  test_gpu_mmap_rejects(fd);
  test_pin_unpin(fd);
  test_map_host(fd, info);
  test_limits(fd);
  ::close(fd);
  test_buffers_outlive_backend();
  test_close_releases();
  test_killed_process_releases();
  test_no_reset_without_cause();
  test_unbind_waits_for_close();

  return results.summary("kmod_negative");
}
