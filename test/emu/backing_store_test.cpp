// A namespace's bytes in RAM or in a file.
#include <cunvme/emu/backing_store.cuh>

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <thread>
#include <unistd.h>
#include <vector>

namespace emu = cunvme::emu;

namespace {

struct temp_dir {
  temp_dir() : path(std::filesystem::temp_directory_path() / ("cunvme-store-" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path);
  }
  ~temp_dir() { std::filesystem::remove_all(path); }
  std::filesystem::path path;
};

}  // namespace

TEST_CASE("an in-memory store starts zeroed and returns what was written") {
  auto store = emu::backing_store::in_memory(1 << 20);
  CHECK(store.size() == 1 << 20);
  CHECK_FALSE(store.file_backed());
  std::vector<std::byte> block(4096, std::byte{0x11});
  store.read(8192, block.data(), block.size());
  CHECK(block == std::vector<std::byte>(4096, std::byte{0}));
  std::vector<std::byte> data(5000, std::byte{0x42});
  store.write(1000, data.data(), data.size());
  std::vector<std::byte> back(5000);
  store.read(1000, back.data(), back.size());
  CHECK(back == data);
}

TEST_CASE("accesses outside the store are refused, including ones whose end overflows") {
  auto store = emu::backing_store::in_memory(4096);
  std::byte b[16]{};
  CHECK_THROWS_AS(store.read(4090, b, 16), std::out_of_range);
  CHECK_THROWS_AS(store.write(4097, b, 0), std::out_of_range);
  CHECK_THROWS_AS(store.read(8, b, ~std::uint64_t{0} - 4), std::out_of_range);
  CHECK_THROWS_WITH_AS(store.zero(0, 4097), doctest::Contains("4096 bytes"), std::out_of_range);
  CHECK_NOTHROW(store.read(4080, b, 16));
  CHECK_THROWS_AS((void)emu::backing_store::in_memory(0), std::invalid_argument);
}

TEST_CASE("zero clears exactly the range, whole pages and partial ones") {
  auto store = emu::backing_store::in_memory(64 * 1024);
  std::vector<std::byte> junk(64 * 1024, std::byte{0xff});
  store.write(0, junk.data(), junk.size());
  store.zero(100, 3 * 4096 + 50);
  std::vector<std::byte> back(64 * 1024);
  store.read(0, back.data(), back.size());
  for (std::size_t i = 0; i < back.size(); ++i) {
    const bool zeroed = i >= 100 && i < 100 + 3 * 4096 + 50;
    if (back[i] != (zeroed ? std::byte{0} : std::byte{0xff})) FAIL("byte " << i);
  }
}

TEST_CASE("a file store reads the file, and its writes are in the file after flush") {
  temp_dir dir;
  const auto path = (dir.path / "a.img").string();
  { std::ofstream(path, std::ios::binary) << std::string(10000, 'a'); }
  {
    auto store = emu::backing_store::from_file(path);
    CHECK(store.file_backed());
    CHECK(store.size() == 10000);
    char c = 0;
    store.read(9999, &c, 1);
    CHECK(c == 'a');
    store.write(5, "hello", 5);
    store.zero(0, 2);
    store.flush();
  }
  std::ifstream in(path, std::ios::binary);
  std::string text(10, '\0');
  in.read(text.data(), 10);
  CHECK(text == std::string("\0\0aaahello", 10));
}

TEST_CASE("a file store larger than its file extends the file; a missing file is created only with a size") {
  temp_dir dir;
  const auto path = (dir.path / "grow.img").string();
  CHECK_THROWS_AS((void)emu::backing_store::from_file(path), std::system_error);
  {
    auto store = emu::backing_store::from_file(path, 1 << 16);
    CHECK(store.size() == 1 << 16);
  }
  CHECK(std::filesystem::file_size(path) == 1 << 16);
  CHECK_THROWS_AS((void)emu::backing_store::from_file(path, 1 << 17, /*read_only*/ true), std::invalid_argument);
}

TEST_CASE("a read-only file store refuses writes") {
  temp_dir dir;
  const auto path = (dir.path / "ro.img").string();
  { std::ofstream(path, std::ios::binary) << std::string(4096, 'r'); }
  auto store = emu::backing_store::from_file(path, 0, true);
  CHECK(store.read_only());
  char c = 0;
  store.read(0, &c, 1);
  CHECK(c == 'r');
  CHECK_THROWS_AS(store.write(0, "x", 1), std::logic_error);
  CHECK_NOTHROW(store.flush());
}

TEST_CASE("an empty file cannot back a store") {
  temp_dir dir;
  const auto path = (dir.path / "empty.img").string();
  { std::ofstream(path, std::ios::binary); }
  CHECK_THROWS_AS((void)emu::backing_store::from_file(path), std::invalid_argument);
}

TEST_CASE("concurrent overlapping writers and readers leave one writer's pattern in each block") {
  auto store = emu::backing_store::in_memory(1 << 20);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&store, t] {
      std::vector<std::byte> block(4096, static_cast<std::byte>(t + 1));
      std::vector<std::byte> back(4096);
      for (int i = 0; i < 2000; ++i) {
        const std::uint64_t at = static_cast<std::uint64_t>((i * 7 + t) % 256) * 4096;
        if (i % 3 == 0) {
          store.read(at, back.data(), back.size());
        } else {
          store.write(at, block.data(), block.size());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  std::vector<std::byte> back(4096);
  for (std::uint64_t b = 0; b < 256; ++b) {
    store.read(b * 4096, back.data(), back.size());
    const auto first = back[0];
    CHECK(std::all_of(back.begin(), back.end(), [&](std::byte x) { return x == first; }));
  }
}

TEST_CASE("a store moves with its contents") {
  auto a = emu::backing_store::in_memory(8192);
  a.write(0, "abc", 3);
  auto b = std::move(a);
  char text[3]{};
  b.read(0, text, 3);
  CHECK(std::string(text, 3) == "abc");
  a = emu::backing_store::in_memory(4096);
  CHECK(a.size() == 4096);
}
