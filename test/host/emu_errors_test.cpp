// The emulator behind the host API fails like any other backend: what the emulator refuses
// (its dma_space, backing_store, register file and constructor throw std:: exceptions) comes
// back from the host's methods as a `host::error` naming the operation and the device or URI.
#include <cunvme/host/backend/emu_backend.cuh>
#include <cunvme/host/open.cuh>

#include <doctest/doctest.h>

#include "fake_gpu_address.hpp"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace host = cunvme::host;
namespace emu = cunvme::emu;

namespace {

emu::controller& emulator(host::controller& c) { return dynamic_cast<host::emu_backend&>(c.backend()).controller(); }


/// A file of `bytes` 'x' bytes under /tmp, removed when the guard goes.
struct image_file {
  std::string path;
  explicit image_file(const std::string& name, std::size_t bytes) : path("/tmp/cunvme-" + name + "-" + std::to_string(::getpid()) + ".bin") {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    const std::vector<char> data(bytes, 'x');
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
  }
  ~image_file() { std::remove(path.c_str()); }
};

}  // namespace

TEST_CASE("the emulator's map_gpu_range refuses a range larger than its bus as a host::error naming the operation and emu") {
  auto ctrl = host::open("emu:blocks=64");
  CHECK_THROWS_WITH_AS((void)ctrl->memory().map_gpu_range(fake_gpu_address(), std::numeric_limits<std::size_t>::max() - 4096),
                       doctest::Contains("Map GPU memory on emu"), host::error);
}

TEST_CASE("the emulator's map_gpu refuses a range larger than its bus as a host::error naming the operation and emu") {
  auto ctrl = host::open("emu:blocks=64");
  CHECK_THROWS_WITH_AS((void)ctrl->memory().map_gpu(fake_gpu_address(), std::numeric_limits<std::size_t>::max() - 4096),
                       doctest::Contains("Map GPU memory on emu"), host::error);
}

TEST_CASE("a buffer whose bus range was already taken out of the emulator's IOMMU is released without throwing") {
  auto ctrl = host::open("emu:blocks=64");
  {
    auto buffer = ctrl->memory().allocate(4096);
    auto gpu = ctrl->memory().map_gpu_range(fake_gpu_address(), 4096);
    emulator(*ctrl).dma().unmap(buffer.bus());
    emulator(*ctrl).dma().unmap(gpu.bus());
    // Both are released here, in dma_buffer's noexcept destructor: a throw there ends the process.
  }
  CHECK(emulator(*ctrl).dma().find(0, 1) == std::nullopt);  // still running, the controller still answers
}

TEST_CASE("the emulator backend's register access outside BAR0 is a host::error naming the operation and emu") {
  auto ctrl = host::open("emu:blocks=64");
  const auto& backend = ctrl->backend();
  const auto beyond = static_cast<std::uint32_t>(backend.bar_size());
  CHECK_THROWS_WITH_AS((void)backend.read32(beyond), doctest::Contains("Read register on emu"), host::error);
  CHECK_THROWS_WITH_AS(backend.write32(beyond, 0), doctest::Contains("Write register on emu"), host::error);
  CHECK_THROWS_WITH_AS((void)backend.read32(2), doctest::Contains("Read register on emu"), host::error);
}

TEST_CASE("emu:file naming a file that does not exist is a host::error naming the URI and the OS error") {
  const std::string uri = "emu:file=/tmp/cunvme-no-such-file-" + std::to_string(::getpid()) + ".bin";
  try {
    auto ctrl = host::open(uri);
    FAIL("opened a missing file");
  } catch (const host::error& e) {
    CHECK(std::string(e.what()).find(uri) != std::string::npos);
    CHECK(e.os_error() == std::errc::no_such_file_or_directory);
  }
}

TEST_CASE("emu:pattern on a readonly file is refused as a host::error naming both options, and the file keeps its bytes") {
  image_file file("pattern-readonly", 8 * 512);
  const std::string uri = "emu:file=" + file.path + ",readonly,pattern";
  CHECK_THROWS_WITH_AS((void)host::open(uri), doctest::Contains("pattern"), host::error);
  CHECK_THROWS_WITH_AS((void)host::open(uri), doctest::Contains("readonly"), host::error);
  std::ifstream in(file.path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(bytes == std::string(8 * 512, 'x'));
}
