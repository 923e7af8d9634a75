// A namespace's bytes in RAM or in a file: contents, errors, zeroing, files, concurrency.
#include <cunvme/emu/backing_store.cuh>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <unistd.h>

namespace emu = cunvme::emu;

namespace {

/// A fresh directory under the system's temporary directory, removed with its contents.
struct temp_dir {
  temp_dir() {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("cunvme-backing-store-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  [[nodiscard]] std::string file(const char* name) const { return (path / name).string(); }

  std::filesystem::path path;
};

void write_file(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<std::byte> bytes(std::size_t n, unsigned value) { return std::vector<std::byte>(n, std::byte(value)); }

std::vector<std::byte> read_back(const emu::backing_store& store, std::uint64_t offset, std::size_t n) {
  std::vector<std::byte> out(n);
  store.read(offset, out.data(), n);
  return out;
}

constexpr std::uint64_t ones = ~std::uint64_t{0};

}  // namespace

// ---- RAM stores ----------------------------------------------------------------------------

TEST_CASE("an in-memory store has the asked size, reads as zeros and is writable RAM") {
  auto store = emu::backing_store::in_memory(1 << 20);
  CHECK(store.size() == 1 << 20);
  CHECK_FALSE(store.file_backed());
  CHECK_FALSE(store.read_only());
  CHECK(read_back(store, 8192, 4096) == bytes(4096, 0));
}

TEST_CASE("an in-memory store returns what was written, at unaligned offsets") {
  auto store = emu::backing_store::in_memory(1 << 20);
  std::vector<std::byte> data(5000);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = std::byte(i * 7);
  store.write(1001, data.data(), data.size());
  CHECK(read_back(store, 1001, data.size()) == data);
  CHECK(read_back(store, 1000, 1) == bytes(1, 0));
  CHECK(read_back(store, 6001, 1) == bytes(1, 0));
}

TEST_CASE("a huge in-memory store costs only what is written") {
  const std::uint64_t size = 64ull << 30;  // 64 GiB: far beyond this machine's spare RAM
  auto store = emu::backing_store::in_memory(size);
  store.write(size - 3, "end", 3);
  char text[3]{};
  store.read(size - 3, text, 3);
  CHECK(std::string(text, 3) == "end");
}

TEST_CASE("an in-memory store of 0 bytes is refused") {
  CHECK_THROWS_AS((void)emu::backing_store::in_memory(0), std::invalid_argument);
}

TEST_CASE("an in-memory store the system cannot map reports the failed mmap") {
  CHECK_THROWS_WITH_AS((void)emu::backing_store::in_memory(ones / 2), doctest::Contains("backing_store: mmap"),
                       std::system_error);
}

TEST_CASE("reads and writes longer than one lock piece round-trip") {
  // 5 MiB at an odd offset spans many 64 KiB chunks and is copied in several pieces.
  auto store = emu::backing_store::in_memory(8 << 20);
  std::vector<std::byte> data((5 << 20) + 123);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = std::byte(i ^ (i >> 8));
  store.write(777, data.data(), data.size());
  CHECK(read_back(store, 777, data.size()) == data);
}

// ---- range checks ------------------------------------------------------------------------------

TEST_CASE("an access past the end is refused with its offset, length and the store's size") {
  auto store = emu::backing_store::in_memory(4096);
  std::byte b[16]{};
  CHECK_THROWS_WITH_AS(store.read(4090, b, 16), doctest::Contains("read of 16 bytes at offset 4090"), std::out_of_range);
  CHECK_THROWS_WITH_AS(store.read(4090, b, 16), doctest::Contains("4096 bytes"), std::out_of_range);
  CHECK_THROWS_WITH_AS(store.write(4097, b, 0), doctest::Contains("write of 0 bytes at offset 4097"), std::out_of_range);
  CHECK_THROWS_WITH_AS(store.zero(0, 4097), doctest::Contains("zero of 4097 bytes"), std::out_of_range);
  CHECK_THROWS_AS(store.with_read_access(4096, 1, [](const std::byte*) {}), std::out_of_range);
  CHECK_THROWS_AS(store.with_write_access(1, 4096, [](std::byte*) {}), std::out_of_range);
}

TEST_CASE("an access whose end overflows 64 bits is refused, not wrapped") {
  auto store = emu::backing_store::in_memory(4096);
  std::byte b[16]{};
  CHECK_THROWS_AS(store.read(8, b, ones - 4), std::out_of_range);
  CHECK_THROWS_AS(store.write(ones, b, 2), std::out_of_range);
  CHECK_THROWS_AS(store.zero(16, ones), std::out_of_range);
  CHECK_THROWS_AS(store.with_read_access(ones - 1, 2, [](const std::byte*) {}), std::out_of_range);
  CHECK_THROWS_AS(store.with_write_access(4095, ones, [](std::byte*) {}), std::out_of_range);
}

TEST_CASE("accesses that end exactly at the end, and empty ones there, are allowed") {
  auto store = emu::backing_store::in_memory(4096);
  std::byte b[16]{};
  CHECK_NOTHROW(store.read(4080, b, 16));
  CHECK_NOTHROW(store.write(4080, b, 16));
  CHECK_NOTHROW(store.read(4096, b, 0));
  CHECK_NOTHROW(store.zero(4096, 0));
  int calls = 0;
  store.with_read_access(4096, 0, [&](const std::byte*) { ++calls; });
  CHECK(calls == 1);
}

// ---- zero ----------------------------------------------------------------------------------------

namespace {

/// Fills a store with 0xff, zeroes [offset, offset + len), and checks every byte.
void check_zero_exactly(emu::backing_store& store, std::uint64_t offset, std::uint64_t len) {
  const auto size = static_cast<std::size_t>(store.size());
  const auto junk = bytes(size, 0xff);
  store.write(0, junk.data(), size);
  store.zero(offset, len);
  const auto back = read_back(store, 0, size);
  for (std::size_t i = 0; i < size; ++i) {
    const bool zeroed = i >= offset && i < offset + len;
    if (back[i] != (zeroed ? std::byte{0} : std::byte{0xff})) {
      FAIL("byte " << i << " after zeroing [" << offset << ", " << offset + len << ")");
    }
  }
}

}  // namespace

TEST_CASE("zero clears exactly its range: partial pages at both ends and whole pages between") {
  auto store = emu::backing_store::in_memory(256 * 1024);
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  check_zero_exactly(store, 100, 3 * page + 50);
}

TEST_CASE("zero clears exactly its range inside one page") {
  auto store = emu::backing_store::in_memory(64 * 1024);
  check_zero_exactly(store, 4100, 300);
}

TEST_CASE("zero clears exactly its range when it is whole pages") {
  auto store = emu::backing_store::in_memory(256 * 1024);
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  check_zero_exactly(store, page, 2 * page);
}

TEST_CASE("zero of a range longer than one lock piece clears all of it") {
  auto store = emu::backing_store::in_memory(6 << 20);
  check_zero_exactly(store, 12345, (5 << 20) + 999);
}

TEST_CASE("zeroed pages can be written again") {
  auto store = emu::backing_store::in_memory(64 * 1024);
  const auto data = bytes(16 * 1024, 0x5a);
  store.write(0, data.data(), data.size());
  store.zero(0, data.size());
  store.write(4096, data.data(), 4096);
  CHECK(read_back(store, 0, 4096) == bytes(4096, 0));
  CHECK(read_back(store, 4096, 4096) == bytes(4096, 0x5a));
}

// ---- file stores ----------------------------------------------------------------------------------

TEST_CASE("a file store is the file's bytes, sized as the file") {
  temp_dir dir;
  const auto path = dir.file("a.img");
  std::string contents(10000, 'a');
  contents[9999] = 'z';
  write_file(path, contents);
  auto store = emu::backing_store::from_file(path);
  CHECK(store.file_backed());
  CHECK_FALSE(store.read_only());
  CHECK(store.size() == 10000);
  char c = 0;
  store.read(9999, &c, 1);
  CHECK(c == 'z');
}

TEST_CASE("a file store's writes are in the file after flush") {
  temp_dir dir;
  const auto path = dir.file("w.img");
  write_file(path, std::string(10000, 'a'));
  auto store = emu::backing_store::from_file(path);
  store.write(5, "hello", 5);
  store.write(9995, "tail!", 5);
  store.flush();
  const auto text = read_file(path);  // the store is still mapped
  REQUIRE(text.size() == 10000);
  CHECK(text.substr(0, 10) == "aaaaahello");
  CHECK(text.substr(9990) == "aaaaatail!");
}

TEST_CASE("zero in a file store reads back as zeros and leaves zeros in the file") {
  temp_dir dir;
  const auto path = dir.file("z.img");
  write_file(path, std::string(64 * 1024, 'x'));
  auto store = emu::backing_store::from_file(path);
  // Partial pages at both ends and whole pages between: memset and a punched hole.
  store.zero(100, 3 * 4096 + 50);
  store.flush();
  const auto back = read_back(store, 0, 64 * 1024);
  const auto text = read_file(path);
  REQUIRE(text.size() == 64 * 1024);
  for (std::size_t i = 0; i < back.size(); ++i) {
    const bool zeroed = i >= 100 && i < 100 + 3 * 4096 + 50;
    const char expected = zeroed ? '\0' : 'x';
    if (static_cast<char>(back[i]) != expected || text[i] != expected) FAIL("byte " << i);
  }
}

TEST_CASE("opening a missing file without a size fails with the path and creates nothing") {
  temp_dir dir;
  const auto path = dir.file("missing.img");
  try {
    (void)emu::backing_store::from_file(path);
    FAIL("no exception");
  } catch (const std::system_error& e) {
    CHECK(e.code() == std::errc::no_such_file_or_directory);
    CHECK(std::string(e.what()).find("backing_store: open '" + path + "'") != std::string::npos);
  }
  CHECK_FALSE(std::filesystem::exists(path));
}

TEST_CASE("opening a missing file read-only fails even with a size") {
  temp_dir dir;
  const auto path = dir.file("missing.img");
  CHECK_THROWS_AS((void)emu::backing_store::from_file(path, 4096, /*read_only=*/true), std::system_error);
  CHECK_FALSE(std::filesystem::exists(path));
}

TEST_CASE("a missing file is created, zero-filled, when a size is given") {
  temp_dir dir;
  const auto path = dir.file("new.img");
  {
    auto store = emu::backing_store::from_file(path, 1 << 16);
    CHECK(store.size() == 1 << 16);
    CHECK(read_back(store, 0, 1 << 16) == bytes(1 << 16, 0));
  }
  CHECK(std::filesystem::file_size(path) == 1 << 16);
}

TEST_CASE("a size above the file's extends the file with zeros and keeps its contents") {
  temp_dir dir;
  const auto path = dir.file("grow.img");
  write_file(path, "abc");
  {
    auto store = emu::backing_store::from_file(path, 8192);
    CHECK(store.size() == 8192);
    char text[3]{};
    store.read(0, text, 3);
    CHECK(std::string(text, 3) == "abc");
    CHECK(read_back(store, 3, 8189) == bytes(8189, 0));
    store.write(8191, "!", 1);
    store.flush();
  }
  const auto text = read_file(path);
  REQUIRE(text.size() == 8192);
  CHECK(text.substr(0, 3) == "abc");
  CHECK(text[8191] == '!');
}

TEST_CASE("a size below the file's maps a prefix and leaves the file's size alone") {
  temp_dir dir;
  const auto path = dir.file("prefix.img");
  write_file(path, std::string(10000, 'p'));
  {
    auto store = emu::backing_store::from_file(path, 4096);
    CHECK(store.size() == 4096);
    std::byte b{};
    CHECK_THROWS_AS(store.read(4096, &b, 1), std::out_of_range);
  }
  CHECK(std::filesystem::file_size(path) == 10000);
}

TEST_CASE("a read-only store cannot extend its file") {
  temp_dir dir;
  const auto path = dir.file("short.img");
  write_file(path, std::string(4096, 's'));
  CHECK_THROWS_WITH_AS((void)emu::backing_store::from_file(path, 8192, /*read_only=*/true),
                       doctest::Contains("read-only"), std::invalid_argument);
  CHECK(std::filesystem::file_size(path) == 4096);
}

TEST_CASE("an empty file without a size cannot back a store") {
  temp_dir dir;
  const auto path = dir.file("empty.img");
  write_file(path, "");
  CHECK_THROWS_WITH_AS((void)emu::backing_store::from_file(path), doctest::Contains("empty"), std::invalid_argument);
}

TEST_CASE("a directory cannot back a store") {
  temp_dir dir;
  CHECK_THROWS_WITH_AS((void)emu::backing_store::from_file(dir.path.string(), 0, /*read_only=*/true),
                       doctest::Contains("not a regular file"), std::invalid_argument);
}

TEST_CASE("a file store rounded up to whole blocks covers the file's partial last block, the bytes past its end reading as zeros") {
  temp_dir dir;
  const auto path = dir.file("partial.img");
  write_file(path, std::string(3 * 4096 + 100, 'p'));
  for (const bool read_only : {true, false}) {
    CAPTURE(read_only);
    auto store = emu::backing_store::from_file(path, 0, read_only, 4096);
    CHECK(store.size() == 4 * 4096);
    CHECK(store.file_bytes() == 3 * 4096 + 100);
    std::string last(4096, 'x');
    store.read(3 * 4096, last.data(), last.size());
    CHECK(last == std::string(100, 'p') + std::string(4096 - 100, '\0'));
  }
  CHECK(read_file(path) == std::string(3 * 4096 + 100, 'p'));
}

TEST_CASE("a file store's padding past the file's last page reads as zeros (the file is not mapped there)") {
  temp_dir dir;
  const auto path = dir.file("padded.img");
  write_file(path, std::string(100, 'p'));
  auto store = emu::backing_store::from_file(path, 0, /*read_only=*/true, 3 * 4096);
  CHECK(store.size() == 3 * 4096);
  std::string all(3 * 4096, 'x');
  store.read(0, all.data(), all.size());
  CHECK(all == std::string(100, 'p') + std::string(3 * 4096 - 100, '\0'));
}

TEST_CASE("a file store refuses writes past the file's end, and zero leaves them be, so the file keeps its size and bytes") {
  temp_dir dir;
  const auto path = dir.file("refuse.img");
  write_file(path, std::string(4096 + 100, 'p'));
  auto store = emu::backing_store::from_file(path, 0, /*read_only=*/false, 4096);
  CHECK_THROWS_WITH_AS(store.write(4096 + 99, "ab", 2), doctest::Contains("reaches past the end"), std::out_of_range);
  CHECK_THROWS_AS(store.with_write_access(4096, 4096, [](std::byte*) {}), std::out_of_range);
  store.zero(0, 10);
  store.zero(4096, 4096);
  store.write(4096 + 98, "ab", 2);  // the file's last two bytes
  store.flush();
  const std::string expected = std::string(10, '\0') + std::string(4096 - 10, 'p') + std::string(98, '\0') + "ab";
  CHECK(read_file(path) == expected);
}

// ---- read-only stores --------------------------------------------------------------------------

TEST_CASE("a read-only store reads its file and refuses every kind of write") {
  temp_dir dir;
  const auto path = dir.file("ro.img");
  write_file(path, std::string(4096, 'r'));
  auto store = emu::backing_store::from_file(path, 0, /*read_only=*/true);
  CHECK(store.read_only());
  char c = 0;
  store.read(0, &c, 1);
  CHECK(c == 'r');
  CHECK_THROWS_WITH_AS(store.write(0, "x", 1), doctest::Contains("read-only"), std::logic_error);
  CHECK_THROWS_AS(store.zero(0, 1), std::logic_error);
  bool called = false;
  CHECK_THROWS_AS(store.with_write_access(0, 1, [&](std::byte*) { called = true; }), std::logic_error);
  CHECK_FALSE(called);
  CHECK_NOTHROW(store.flush());
  CHECK(read_file(path) == std::string(4096, 'r'));
}

TEST_CASE("flush of an in-memory store does nothing") {
  auto store = emu::backing_store::in_memory(4096);
  CHECK_NOTHROW(store.flush());
}

// ---- direct access --------------------------------------------------------------------------------

TEST_CASE("direct access hands out the store's own bytes at the offset") {
  auto store = emu::backing_store::in_memory(1 << 20);
  store.with_write_access(70000, 3, [](std::byte* p) {
    p[0] = std::byte{'a'};
    p[1] = std::byte{'b'};
    p[2] = std::byte{'c'};
  });
  char text[3]{};
  store.read(70000, text, 3);
  CHECK(std::string(text, 3) == "abc");
  const auto& view = store;
  std::string seen;
  view.with_read_access(70001, 2, [&](const std::byte* p) { seen.assign(reinterpret_cast<const char*>(p), 2); });
  CHECK(seen == "bc");
}

TEST_CASE("a callback that throws releases the range's locks") {
  auto store = emu::backing_store::in_memory(8 << 20);
  CHECK_THROWS_AS(store.with_write_access(0, 4096, [](std::byte*) { throw std::runtime_error("copy failed"); }),
                  std::runtime_error);
  // 4 MiB: more chunks than an access stripes, so this one locks the whole store.
  CHECK_THROWS_AS(store.with_write_access(0, 4 << 20, [](std::byte*) { throw std::runtime_error("copy failed"); }),
                  std::runtime_error);
  // Exclusive locks left behind would make these block forever.
  CHECK_NOTHROW(store.write(0, "ok", 2));
  CHECK_NOTHROW(store.with_write_access(0, store.size(), [](std::byte* p) { p[0] = std::byte{1}; }));
}

TEST_CASE("direct access to a range of more chunks than an access stripes covers the whole range") {
  auto store = emu::backing_store::in_memory(8 << 20);
  std::uint64_t sum = 0;
  store.with_read_access(0, store.size(), [&](const std::byte* p) {
    for (std::uint64_t i = 0; i < 8 << 20; i += 4096) sum += std::to_integer<unsigned>(p[i]);
  });
  CHECK(sum == 0);
}

// ---- concurrency ------------------------------------------------------------------------------------

namespace {

/// After a race of whole-block writes, every 4 KiB block must hold a single pattern.
void check_blocks_uniform(const emu::backing_store& store, std::uint64_t blocks) {
  for (std::uint64_t b = 0; b < blocks; ++b) {
    const auto back = read_back(store, b * 4096, 4096);
    const auto first = back[0];
    if (!std::all_of(back.begin(), back.end(), [&](std::byte x) { return x == first; })) FAIL("block " << b << " is mixed");
  }
}

}  // namespace

TEST_CASE("concurrent readers and writers of overlapping ranges leave one written pattern per block") {
  constexpr std::uint64_t blocks = 64;  // 256 KiB: every thread keeps hitting the others' blocks
  auto store = emu::backing_store::in_memory(blocks * 4096);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&store, t] {
      const auto pattern = bytes(4 * 4096, static_cast<unsigned>(t + 1));
      std::vector<std::byte> back(4 * 4096);
      for (int i = 0; i < 3000; ++i) {
        // 1 to 4 whole blocks, crossing chunk (and so stripe) boundaries now and then.
        const std::uint64_t n = 1 + static_cast<std::uint64_t>(i + t) % 4;
        const std::uint64_t at = static_cast<std::uint64_t>(i * 7 + t * 13) % (blocks - n + 1) * 4096;
        switch ((i + t) % 4) {
          case 0: store.read(at, back.data(), n * 4096); break;
          case 1: store.with_read_access(at, n * 4096, [&](const std::byte* p) { back.assign(p, p + n * 4096); }); break;
          case 2: store.write(at, pattern.data(), n * 4096); break;
          default: store.with_write_access(at, n * 4096, [&](std::byte* p) { std::copy_n(pattern.begin(), n * 4096, p); });
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  check_blocks_uniform(store, blocks);
}

TEST_CASE("concurrent whole-store accesses, zeroing and small accesses neither race nor deadlock") {
  constexpr std::uint64_t size = 4 << 20;  // 64 chunks: a whole-store access locks the store
  auto store = emu::backing_store::in_memory(size);
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&store, t] {
      const auto pattern = bytes(4096, static_cast<unsigned>(t + 1));
      std::vector<std::byte> back(4096);
      for (int i = 0; i < 2000; ++i) {
        // Spread over the whole store, so chunks at both ends of the stripe array are used.
        const std::uint64_t at = (static_cast<std::uint64_t>(i) * 97 + static_cast<std::uint64_t>(t) * 31) % (size / 4096) * 4096;
        if (i % 2 == 0) {
          store.write(at, pattern.data(), 4096);
        } else {
          store.read(at, back.data(), 4096);
        }
      }
    });
  }
  threads.emplace_back([&store] {
    for (int i = 0; i < 20; ++i) {
      if (i % 2 == 0) {
        store.with_write_access(0, size, [&](std::byte* p) { std::fill_n(p, size, std::byte{9}); });
      } else {
        store.zero(4096 * static_cast<std::uint64_t>(i), 3 << 20);
      }
    }
  });
  for (auto& th : threads) th.join();
  check_blocks_uniform(store, size / 4096);
}

// ---- moves ------------------------------------------------------------------------------------------

TEST_CASE("a store moves with its contents, and move assignment replaces the old store") {
  auto a = emu::backing_store::in_memory(8192);
  a.write(0, "abc", 3);
  auto b = std::move(a);
  CHECK(b.size() == 8192);
  char text[3]{};
  b.read(0, text, 3);
  CHECK(std::string(text, 3) == "abc");
  a = emu::backing_store::in_memory(4096);
  CHECK(a.size() == 4096);
  CHECK(read_back(a, 0, 3) == bytes(3, 0));
  b = std::move(a);
  CHECK(b.size() == 4096);
}

TEST_CASE("a moved file store keeps its file") {
  temp_dir dir;
  const auto path = dir.file("moved.img");
  write_file(path, std::string(4096, 'm'));
  auto a = emu::backing_store::from_file(path);
  auto b = std::move(a);
  CHECK(b.file_backed());
  b.write(0, "M", 1);
  b.flush();
  CHECK(read_file(path)[0] == 'M');
}

TEST_CASE("a two-range access locks ranges sharing a stripe once, and more than 32 chunks in all as the whole store") {
  constexpr std::uint64_t chunk = 64 * 1024;
  auto store = emu::backing_store::in_memory(300 * chunk);
  // Chunks 0 and 256 share stripe 0: locking it twice would deadlock a shared_mutex.
  store.with_write_access(10, 100, 256 * chunk + 10, 100, [](std::byte* p, std::byte* p2) {
    p[0] = std::byte{1};
    p2[0] = std::byte{2};
  });
  std::byte a{}, b{};
  store.read(10, &a, 1);
  store.read(256 * chunk + 10, &b, 1);
  CHECK(a == std::byte{1});
  CHECK(b == std::byte{2});
  // 20 + 20 chunks: one whole-store lock, then a plain access runs again.
  store.with_read_access(0, 20 * chunk, 100 * chunk, 20 * chunk, [](const std::byte* p, const std::byte* p2) {
    CHECK(p[10] == std::byte{1});
    CHECK(p2[10] == std::byte{0});
  });
  auto hold = store.try_hold_for_read(0, 20 * chunk, 100 * chunk, 20 * chunk);
  CHECK_FALSE(hold.has_value());
  auto small = store.try_hold_for_read(10, 100, 256 * chunk + 10, 100);
  REQUIRE(small.has_value());
  CHECK(small->locks_held() == 1);
  CHECK(small->data2()[0] == std::byte{2});
}
