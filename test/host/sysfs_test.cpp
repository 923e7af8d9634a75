// The sysfs, VFIO and kernel-module backends as far as they go without hardware: a fake sysfs
// tree (regular files stand in for config space and BARs; mmap of a regular file works), and
// the errors that say what is missing.
#include <cunvme/host/backend/kmod_backend.cuh>
#include <cunvme/host/backend/sysfs_backend.cuh>
#include <cunvme/host/backend/vfio_backend.cuh>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

namespace host = cunvme::host;
namespace fs = std::filesystem;

namespace {

constexpr const char* bdf = "0000:00:04.0";

/// devices/0000:00:04.0/{class, config, resource0, resource2, resource} in a fresh temp dir.
struct fake_sysfs {
  explicit fake_sysfs(const std::string& pci_class = "0x010802", std::size_t bar0_bytes = 16384) {
    std::string pattern = (fs::temp_directory_path() / "cunvme-sysfs-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    root = pattern;
    dev = root / bdf;
    fs::create_directories(dev);
    std::ofstream(dev / "class") << pci_class << "\n";
    {
      // Command register (offset 4) starts with SERR# Enable (bit 8) set, which must survive.
      std::string config(64, '\0');
      config[5] = 0x01;
      std::ofstream(dev / "config", std::ios::binary) << config;
    }
    {
      std::string bar(bar0_bytes, '\0');
      const std::uint32_t cap_low = 0x0f0307ffu;  // a plausible CAP.MQES/CQR/TO at offset 0
      std::memcpy(bar.data(), &cap_low, 4);
      std::ofstream(dev / "resource0", std::ios::binary) << bar;
    }
    std::ofstream(dev / "resource2", std::ios::binary) << std::string(65536, '\0');
    std::ofstream(dev / "resource") << "0x00000000febf0000 0x00000000febf3fff 0x0000000000140204\n"
                                       "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
                                       "0x00000000fc000000 0x00000000fc00ffff 0x000000000014220c\n";
  }
  fake_sysfs(const fake_sysfs&) = delete;
  fake_sysfs& operator=(const fake_sysfs&) = delete;
  ~fake_sysfs() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  fs::path root, dev;
};

std::uint16_t command_register(const fs::path& dev) {
  std::ifstream in(dev / "config", std::ios::binary);
  in.seekg(4);
  std::uint16_t v = 0;
  in.read(reinterpret_cast<char*>(&v), 2);
  return v;
}

std::uint32_t file_word(const fs::path& file, std::size_t offset) {
  std::ifstream in(file, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(offset));
  std::uint32_t v = 0;
  in.read(reinterpret_cast<char*>(&v), 4);
  return v;
}

}  // namespace

TEST_CASE("opening maps resource0 and turns on memory space, bus mastering and INTx disable") {
  fake_sysfs sys;
  host::sysfs_backend backend(bdf, sys.root.string());
  CHECK(backend.name() == bdf);
  CHECK(backend.bar_size() == 16384);
  CHECK(backend.read32(0) == 0x0f0307ffu);  // bar() shows the file's bytes
  backend.write32(0x14, 0x00460001);
  CHECK(file_word(sys.dev / "resource0", 0x14) == 0x00460001u);  // and stores reach the file
  backend.write64(0x28, 0x1122334455667788ull);
  CHECK(file_word(sys.dev / "resource0", 0x28) == 0x55667788u);
  CHECK(file_word(sys.dev / "resource0", 0x2c) == 0x11223344u);
  CHECK(command_register(sys.dev) == ((1u << 1) | (1u << 2) | (1u << 8) | (1u << 10)));
  CHECK(backend.cmb() == nullptr);
  CHECK(backend.cmb_size() == 0);
  CHECK(dynamic_cast<host::pagemap_allocator*>(&backend.memory()) != nullptr);
}

TEST_CASE("a second sysfs backend of a controller in use in the same process is refused, naming the device and this process") {
  fake_sysfs sys;
  host::sysfs_backend first(bdf, sys.root.string());
  first.write32(0x14, 0x00460001);
  const std::string refusal = std::string(bdf) + ": in use by another owner (process " + std::to_string(::getpid());
  CHECK_THROWS_WITH_AS(host::sysfs_backend(bdf, sys.root.string()), doctest::Contains(refusal.c_str()), host::error);
  // The refused opener left the first's registers and command bits alone.
  CHECK(first.read32(0x14) == 0x00460001u);
  CHECK(file_word(sys.dev / "resource0", 0x14) == 0x00460001u);
}

TEST_CASE("a second process opening a sysfs controller in use is refused until the first closes it or dies") {
  fake_sysfs sys;
  // The child's verdict on opening: 0 opened, 1 refused naming the device, 2 anything else.
  const auto try_in_child = [&] {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      int verdict = 2;
      try {
        host::sysfs_backend second(bdf, sys.root.string());
        verdict = 0;
      } catch (const host::error& e) {
        verdict = std::string(e.what()).find("in use by another owner") != std::string::npos ? 1 : 2;
      } catch (...) {
      }
      ::_exit(verdict);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFEXITED(status));
    return WEXITSTATUS(status);
  };
  {
    host::sysfs_backend first(bdf, sys.root.string());
    CHECK(try_in_child() == 1);
  }
  CHECK(try_in_child() == 0);  // released on close

  // Released on process death: a holder killed without closing anything.
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t holder = ::fork();
  REQUIRE(holder >= 0);
  if (holder == 0) {
    try {
      static host::sysfs_backend held(bdf, sys.root.string());
      if (::write(ready[1], "x", 1) != 1) ::_exit(4);  // the parent then sees no byte and fails
    } catch (...) {
      ::_exit(3);
    }
    for (;;) ::pause();
  }
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  const std::string holder_named = "(process " + std::to_string(holder);
  CHECK_THROWS_WITH_AS(host::sysfs_backend(bdf, sys.root.string()), doctest::Contains(holder_named.c_str()), host::error);
  ::kill(holder, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(holder, &status, 0) == holder);
  ::close(ready[0]);
  ::close(ready[1]);
  host::sysfs_backend after(bdf, sys.root.string());
  CHECK(after.bar_size() == 16384);
}

TEST_CASE("a device of another class is refused, naming the class") {
  fake_sysfs sys("0x020000");
  CHECK_THROWS_WITH_AS(host::sysfs_backend(bdf, sys.root.string()), doctest::Contains("PCI class 0x020000"), host::error);
  CHECK(command_register(sys.dev) == (1u << 8));  // refused before touching the device
}

TEST_CASE("a malformed address is refused") {
  fake_sysfs sys;
  for (const char* bad : {"00:04.0", "0000:00:04.8", "0000:0g:04.0", "0000-00:04.0", "", "0000:00:04.00"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(host::sysfs_backend(bad, sys.root.string()), doctest::Contains("PCI address"), host::error);
  }
  CHECK(host::valid_bdf("abcd:ef:1f.7"));
}

TEST_CASE("a missing device is refused, naming the path") {
  fake_sysfs sys;
  const std::string path = (sys.root / "0000:00:05.0").string();
  CHECK_THROWS_WITH_AS(host::sysfs_backend("0000:00:05.0", sys.root.string()), doctest::Contains((path + " is missing").c_str()), host::error);
}

TEST_CASE("a device a kernel driver owns is refused with how to unbind it") {
  fake_sysfs sys;
  fs::create_directories(sys.root / "drivers" / "nvme");
  fs::create_directory_symlink(sys.root / "drivers" / "nvme", sys.dev / "driver");
  try {
    host::sysfs_backend backend(bdf, sys.root.string());
    FAIL("opened a device the nvme driver owns");
  } catch (const host::error& e) {
    const std::string what = e.what();
    CHECK(what.find("driver nvme") != std::string::npos);
    CHECK(what.find("unbind it: echo 0000:00:04.0 > " + (sys.dev / "driver" / "unbind").string()) != std::string::npos);
    CHECK(e.operation() == "Open");
    CHECK(e.device() == bdf);
  }
  CHECK(command_register(sys.dev) == (1u << 8));
}

TEST_CASE("a BAR0 too small for the registers and doorbells is refused") {
  fake_sysfs sys("0x010802", 4096);
  CHECK_THROWS_WITH_AS(host::sysfs_backend(bdf, sys.root.string()), doctest::Contains("too small"), host::error);
}

TEST_CASE("the CMB's bus address is its BAR's start plus the CMBLOC offset") {
  fake_sysfs sys;
  host::sysfs_backend backend(bdf, sys.root.string());
  backend.map_cmb(2, 0x1000, 0x8000);
  CHECK(backend.cmb_bus_address() == 0xfc001000u);
  CHECK(backend.cmb_size() == 0x8000);
  REQUIRE(backend.cmb() != nullptr);
  const std::uint32_t word = 0xa5a5f00du;
  std::memcpy(backend.cmb() + 8, &word, 4);
  CHECK(file_word(sys.dev / "resource2", 0x1008) == word);  // cmb() is the BAR mapping + offset

  CHECK_THROWS_WITH_AS(backend.map_cmb(2, 0x1000, 0x10000), doctest::Contains("beyond BAR 2"), host::error);
  CHECK_THROWS_WITH_AS(backend.map_cmb(7, 0, 4096), doctest::Contains("names no BAR"), host::error);
  CHECK_THROWS_WITH_AS(backend.map_cmb(1, 0, 4096), doctest::Contains("has no address"), host::error);
  CHECK_THROWS_WITH_AS(backend.map_cmb(3, 0, 4096), doctest::Contains("no line for BAR 3"), host::error);
  CHECK_THROWS_AS(backend.map_cmb(2, 0, 0), host::error);
  // A failed remap leaves the earlier window in place.
  CHECK(backend.cmb_bus_address() == 0xfc001000u);
  CHECK(backend.cmb_size() == 0x8000);

  std::ofstream(sys.dev / "resource", std::ios::app) << "0x00000000fd000000 0x00000000fd000fff 0x000000000014220c\n";
  CHECK_THROWS_WITH_AS(backend.map_cmb(3, 0, 4096), doctest::Contains((sys.dev / "resource3").string().c_str()), host::error);
}

TEST_CASE("VFIO refuses a malformed address, a missing device, and a device without an IOMMU group") {
  fake_sysfs sys;
  CHECK_THROWS_WITH_AS(host::vfio_backend("bogus", sys.root.string()), doctest::Contains("PCI address"), host::error);
  CHECK_THROWS_WITH_AS(host::vfio_backend("0000:00:05.0", sys.root.string()), doctest::Contains("is missing"), host::error);
  CHECK_THROWS_WITH_AS(host::vfio_backend(bdf, sys.root.string()), doctest::Contains("no IOMMU group"), host::error);
  CHECK_THROWS_WITH_AS(host::vfio_backend(bdf, sys.root.string()), doctest::Contains("intel_iommu=on"), host::error);
}

TEST_CASE("VFIO refuses a device that vfio-pci does not own, saying how to bind it") {
  fake_sysfs sys;
  fs::create_directories(sys.root / "iommu_groups" / "424242");
  fs::create_directory_symlink(sys.root / "iommu_groups" / "424242", sys.dev / "iommu_group");
  CHECK_THROWS_WITH_AS(host::vfio_backend(bdf, sys.root.string()), doctest::Contains("not bound to vfio-pci (no driver)"), host::error);
  fs::create_directories(sys.root / "drivers" / "nvme");
  fs::create_directory_symlink(sys.root / "drivers" / "nvme", sys.dev / "driver");
  CHECK_THROWS_WITH_AS(host::vfio_backend(bdf, sys.root.string()), doctest::Contains("(driver nvme)"), host::error);
  CHECK_THROWS_WITH_AS(host::vfio_backend(bdf, sys.root.string()), doctest::Contains("driver_override"), host::error);

  // Bound to vfio-pci, but group 424242 has no /dev/vfio node (nor, here, is there VFIO at all).
  fs::remove(sys.dev / "driver");
  fs::create_directories(sys.root / "drivers" / "vfio-pci");
  fs::create_directory_symlink(sys.root / "drivers" / "vfio-pci", sys.dev / "driver");
  CHECK_THROWS_WITH_AS(host::vfio_backend(bdf, sys.root.string()), doctest::Contains("/dev/vfio/"), host::error);
}

TEST_CASE("IOVAs go upwards from 1 MiB, one guard page apart, around the IOMMU's holes") {
  host::iova_space everything;
  CHECK(everything.take(8192) == std::optional<std::uint64_t>(1u << 20));
  CHECK(everything.take(4096) == std::optional<std::uint64_t>((1u << 20) + 8192 + 4096));
  CHECK(everything.take(0) == std::nullopt);
  CHECK(everything.take(100) == std::nullopt);  // callers round to pages

  // x86: the MSI window 0xfee00000..0xfeefffff is not translatable.
  host::iova_space x86({{0xfef00000u, 0xffffffffffffull}, {0, 0xfedfffffu}}, 0xfed00000u);
  CHECK(x86.take(0x80000) == std::optional<std::uint64_t>(0xfed00000u));
  CHECK(x86.take(0x100000) == std::optional<std::uint64_t>(0xfef00000u));  // does not fit below the hole
  CHECK(x86.take(0x1000) == std::optional<std::uint64_t>(0xff001000u));

  host::iova_space small({{0, 0x3fffff}});
  CHECK(small.take(0x200000) == std::optional<std::uint64_t>(0x100000u));
  CHECK(small.take(0x200000) == std::nullopt);  // 0x301000 + 2 MiB is past the end
  CHECK(small.take(0xfe000) == std::optional<std::uint64_t>(0x301000u));
  CHECK(small.take(0x1000) == std::nullopt);

  host::iova_space top({{0, std::numeric_limits<std::uint64_t>::max()}}, std::numeric_limits<std::uint64_t>::max() - 0x1fff);
  CHECK(top.take(0x1000) == std::optional<std::uint64_t>(std::numeric_limits<std::uint64_t>::max() - 0x1fff));
  CHECK(top.take(0x1000) == std::nullopt);  // no room for the guard page and another
}

TEST_CASE("a reserved IOVA range (a CMB's bus addresses) is never handed out, and only a range not handed out can be reserved") {
  host::iova_space space({{0, 0xffffffffu}});
  REQUIRE(space.reserve(0x200000, 0x2fffff));
  CHECK(space.take(0x80000) == std::optional<std::uint64_t>(0x100000u));
  CHECK(space.take(0x80000) == std::optional<std::uint64_t>(0x300000u));  // 0x181000 + 512 KiB would reach into the reserved range
  CHECK(space.take(0x1000) == std::optional<std::uint64_t>(0x381000u));
  CHECK_FALSE(space.reserve(0x300000, 0x3fffff));  // handed out already
  CHECK_FALSE(space.reserve(0x500000, 0x4fffff));  // empty
  REQUIRE(space.reserve(0x400000, 0xffffffffu));   // the top of the space
  CHECK(space.take(0x1000) == std::optional<std::uint64_t>(0x383000u));  // below it there is still room
  CHECK(space.take(0x100000) == std::nullopt);
}

TEST_CASE("the kernel-module backend without the module says to load it") {
  fake_sysfs sys;
  CHECK_THROWS_WITH_AS(host::kmod_backend(bdf, (sys.root / "dev").string()), doctest::Contains("load the cunvme kernel module"), host::error);
  CHECK_THROWS_WITH_AS(host::kmod_backend("0000:0:04.0"), doctest::Contains("PCI address"), host::error);
}

TEST_CASE("the kernel module's ioctl numbers follow Linux's _IOC encoding") {
  namespace kmod = cunvme::host::kmod;
  // _IOR('C', 1, 112 bytes), _IOWR('C', 2, 48 bytes), _IOW('C', 3, 8 bytes)
  static_assert(kmod::ioctl_info == 0x80704301ul);
  static_assert(kmod::ioctl_pin == 0xc0304302ul);
  static_assert(kmod::ioctl_unpin == 0x40084303ul);
  static_assert(kmod::ioctl_map_dma_buf == 0xc0384304ul);  // _IOWR('C', 4, 56 bytes)
  CHECK(kmod::bar_mmap_offset(2) == (2ull << 40));
}

namespace {
alignas(4096) std::byte fake_gpu[2 * 4096];  // stands for GPU memory: only its address is used
}

TEST_CASE("kmod map_gpu without nvidia_p2p or dma-buf import says the module can do neither") {
  host::kmod_allocator memory(-1, bdf, 0);
  CHECK_THROWS_WITH_AS((void)memory.map_gpu(fake_gpu, 4096), doctest::Contains("does not import dma-bufs"), host::error);
  CHECK_THROWS_WITH_AS((void)memory.map_dma_buf(0, 0, 4096, nullptr), doctest::Contains("does not import dma-bufs"), host::error);
}

TEST_CASE("kmod map_gpu with dma-buf import but no exporter names the function that installs CUDA's") {
  host::kmod_allocator memory(-1, bdf, cunvme::host::kmod::info_dma_buf);
  CHECK(memory.imports_dma_bufs());
  CHECK_THROWS_WITH_AS((void)memory.map_gpu(fake_gpu, 4096), doctest::Contains("host::use_gpu_dma_buf"), host::error);
}

TEST_CASE("kmod map_dma_buf refuses an empty range or one starting inside a page before asking the module") {
  host::kmod_allocator memory(-1, bdf, cunvme::host::kmod::info_dma_buf);
  CHECK_THROWS_WITH_AS((void)memory.map_dma_buf(0, 512, 4096, nullptr), doctest::Contains("4 KiB page"), host::error);
  CHECK_THROWS_WITH_AS((void)memory.map_dma_buf(0, 0, 0, nullptr), doctest::Contains("not be empty"), host::error);
}

TEST_CASE("kmod map_gpu exports whole pages and closes the dma-buf when the module refuses it") {
  // fd -1 stands for the device: every ioctl on it fails (EBADF), as a refusal would.
  host::kmod_allocator memory(-1, bdf, cunvme::host::kmod::info_dma_buf);
  int exported = -1;
  void* asked_gpu = nullptr;
  std::size_t asked_bytes = 0;
  memory.use_dma_buf_exporter([&](void* gpu, std::size_t bytes) {
    asked_gpu = gpu;
    asked_bytes = bytes;
    exported = ::eventfd(0, EFD_CLOEXEC);
    return exported;
  });
  CHECK_THROWS_WITH_AS((void)memory.map_gpu(fake_gpu, 5000), doctest::Contains("Map a dma-buf"), host::error);
  CHECK(asked_gpu == fake_gpu);
  CHECK(asked_bytes == 8192);
  REQUIRE(exported >= 0);
  CHECK(::fcntl(exported, F_GETFD) == -1);  // closed again
  CHECK_THROWS_WITH_AS((void)memory.map_gpu(fake_gpu + 16, 4096), doctest::Contains("4 KiB page"), host::error);
}

namespace {
alignas(4096) std::byte other_memory[3 * 4096];  // stands for another controller's buffer
}

TEST_CASE("VFIO map_host refuses a null pointer, a start inside a page and zero bytes before asking the IOMMU") {
  host::vfio_allocator memory(std::make_shared<const cunvme::detail::file_descriptor>(-1), bdf);
  CHECK_THROWS_WITH_AS((void)memory.map_host(nullptr, 4096), doctest::Contains("empty range"), host::error);
  CHECK_THROWS_WITH_AS((void)memory.map_host(other_memory + 8, 4096), doctest::Contains("4 KiB boundary"), host::error);
  CHECK_THROWS_WITH_AS((void)memory.map_host(other_memory, 0), doctest::Contains("empty range"), host::error);
  CHECK_THROWS_WITH_AS((void)memory.map_host(other_memory, std::numeric_limits<std::size_t>::max()), doctest::Contains("do not fit"), host::error);
}

TEST_CASE("VFIO map_host reports the IOMMU's refusal as a host::error naming the operation and the device") {
  // Container fd -1: VFIO_IOMMU_MAP_DMA fails (EBADF), as a refusal by the kernel would.
  host::vfio_allocator memory(std::make_shared<const cunvme::detail::file_descriptor>(-1), bdf);
  CHECK_THROWS_WITH_AS((void)memory.map_host(other_memory, 5000), doctest::Contains("Map host memory into the IOMMU on 0000:00:04.0"), host::error);
}

TEST_CASE("kmod map_host refuses a null pointer, a start inside a page and zero bytes before asking the module") {
  host::kmod_allocator memory(-1, bdf, 0);
  CHECK_THROWS_WITH_AS((void)memory.map_host(nullptr, 4096), doctest::Contains("empty range"), host::error);
  CHECK_THROWS_WITH_AS((void)memory.map_host(other_memory + 8, 4096), doctest::Contains("4 KiB boundary"), host::error);
  CHECK_THROWS_WITH_AS((void)memory.map_host(other_memory, 0), doctest::Contains("empty range"), host::error);
  CHECK_THROWS_WITH_AS((void)memory.map_host(other_memory, std::numeric_limits<std::size_t>::max()), doctest::Contains("do not fit"), host::error);
}

TEST_CASE("kmod map_host reports the module's refusal as a host::error naming the operation and the device") {
  host::kmod_allocator memory(-1, bdf, 0);  // fd -1: the pin ioctl fails (EBADF), as a refusal would
  CHECK_THROWS_WITH_AS((void)memory.map_host(other_memory, 5000), doctest::Contains("Map host memory on 0000:00:04.0"), host::error);
}
