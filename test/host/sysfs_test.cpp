// The sysfs backend against a fake sysfs tree (regular files stand in for config and BARs).
#include <cunvme/host/sysfs_backend.cuh>
#include <cunvme/host/kmod_backend.cuh>
#include <cunvme/host/vfio_backend.cuh>

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>

namespace host = cunvme::host;
namespace fs = std::filesystem;

namespace {

struct fake_sysfs {
  explicit fake_sysfs(const std::string& pci_class = "0x010802") {
    root = fs::temp_directory_path() / ("cunvme-sysfs-" + std::to_string(::getpid()));
    dev = root / "0000:00:04.0";
    fs::create_directories(dev);
    std::ofstream(dev / "class") << pci_class << "\n";
    { std::ofstream config(dev / "config", std::ios::binary); config << std::string(64, '\0'); }
    { std::ofstream bar(dev / "resource0", std::ios::binary); bar << std::string(16384, '\0'); }
    { std::ofstream bar(dev / "resource2", std::ios::binary); bar << std::string(65536, '\0'); }
    std::ofstream(dev / "resource") << "0x00000000febf0000 0x00000000febf3fff 0x0000000000140204\n"
                                       "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
                                       "0x00000000fc000000 0x00000000fc00ffff 0x000000000014220c\n";
  }
  ~fake_sysfs() { fs::remove_all(root); }
  fs::path root, dev;
};

std::uint16_t command_register(const fs::path& dev) {
  std::ifstream in(dev / "config", std::ios::binary);
  in.seekg(4);
  std::uint16_t v = 0;
  in.read(reinterpret_cast<char*>(&v), 2);
  return v;
}

}  // namespace

TEST_CASE("opening maps resource0 and turns on memory space, bus mastering and INTx disable") {
  fake_sysfs sys;
  host::sysfs_backend backend("0000:00:04.0", sys.root.string());
  CHECK(backend.name() == "0000:00:04.0");
  CHECK(backend.bar_size() == 16384);
  backend.write32(0x14, 0x00460001);
  std::ifstream bar(sys.dev / "resource0", std::ios::binary);
  bar.seekg(0x14);
  std::uint32_t cc = 0;
  bar.read(reinterpret_cast<char*>(&cc), 4);
  CHECK(cc == 0x00460001);
  CHECK(command_register(sys.dev) == ((1u << 1) | (1u << 2) | (1u << 10)));
}

TEST_CASE("a device of another class is refused, naming the class") {
  fake_sysfs sys("0x020000");
  CHECK_THROWS_WITH_AS(host::sysfs_backend("0000:00:04.0", sys.root.string()), doctest::Contains("0x020000"), host::error);
}

TEST_CASE("a malformed address or a missing device is refused with the path") {
  fake_sysfs sys;
  CHECK_THROWS_WITH_AS(host::sysfs_backend("00:04.0", sys.root.string()), doctest::Contains("PCI address"), host::error);
  CHECK_THROWS_WITH_AS(host::sysfs_backend("0000:00:05.0", sys.root.string()), doctest::Contains("0000:00:05.0 is missing"), host::error);
}

TEST_CASE("a device a kernel driver owns is refused with how to unbind it") {
  fake_sysfs sys;
  fs::create_directories(sys.dev / "driver");
  CHECK_THROWS_WITH_AS(host::sysfs_backend("0000:00:04.0", sys.root.string()), doctest::Contains("unbind"), host::error);
}

TEST_CASE("the CMB's bus address is its BAR's start plus the CMBLOC offset") {
  fake_sysfs sys;
  host::sysfs_backend backend("0000:00:04.0", sys.root.string());
  backend.map_cmb(2, 0x1000, 0x8000);
  CHECK(backend.cmb_bus_address() == 0xfc001000u);
  CHECK(backend.cmb_size() == 0x8000);
  backend.cmb()[0] = std::byte{1};
  CHECK_THROWS_AS(backend.map_cmb(2, 0x1000, 0x10000), host::error);
  CHECK_THROWS_AS(backend.map_cmb(7, 0, 4096), host::error);
}

TEST_CASE("VFIO without an IOMMU group says what is missing") {
  fake_sysfs sys;
  CHECK_THROWS_WITH_AS(host::vfio_backend("0000:00:04.0", sys.root.string()), doctest::Contains("IOMMU group"), host::error);
  CHECK_THROWS_WITH_AS(host::vfio_backend("bogus", sys.root.string()), doctest::Contains("PCI address"), host::error);
}

TEST_CASE("the kernel-module backend without the module says to load it") {
  fake_sysfs sys;
  CHECK_THROWS_WITH_AS(cunvme::host::kmod_backend("0000:00:04.0", (sys.root / "dev").string()), doctest::Contains("load the cunvme kernel module"),
                       host::error);
  CHECK_THROWS_WITH_AS(cunvme::host::kmod_backend("0000:0:04.0"), doctest::Contains("PCI address"), host::error);
}

TEST_CASE("the kernel module's ioctl numbers follow Linux's _IOC encoding") {
  namespace kmod = cunvme::host::kmod;
  // _IOR('C', 1, 112 bytes), _IOWR('C', 2, 48 bytes), _IOW('C', 3, 8 bytes)
  static_assert(kmod::ioctl_info == 0x80704301ul);
  static_assert(kmod::ioctl_pin == 0xc0304302ul);
  static_assert(kmod::ioctl_unpin == 0x40084303ul);
  CHECK(kmod::bar_mmap_offset(2) == (2ull << 40));
}
