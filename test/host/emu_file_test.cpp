// `emu:file=PATH` whose size is not a whole number of blocks: the namespace covers every byte
// of the file (⌈size / block⌉ blocks), the bytes of the last block past the file's end read as
// zeros, and a Write that would store bytes there fails with Write Fault, writing nothing —
// the file is never extended or changed behind the caller's back.
#include <cunvme/host/backend/emu_backend.cuh>
#include <cunvme/host/queue/io_queue.cuh>
#include <cunvme/host/open.cuh>

#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

namespace host = cunvme::host;
namespace spec = cunvme::spec;

namespace {

/// Byte i of the test files: never 0, so a zero read back is a byte the file does not have.
char file_byte(std::size_t i) { return static_cast<char>(1 + i % 251); }

/// A file of `bytes` bytes under /tmp holding file_byte(i) at i, removed when the guard goes.
struct temp_file {
  std::string path;
  std::size_t bytes;
  temp_file(const std::string& name, std::size_t size) : path("/tmp/cunvme-emu-file-" + name + "-" + std::to_string(::getpid()) + ".bin"), bytes(size) {
    std::vector<char> data(size);
    for (std::size_t i = 0; i < size; ++i) data[i] = file_byte(i);
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
  }
  ~temp_file() { std::remove(path.c_str()); }
  temp_file(const temp_file&) = delete;
  temp_file& operator=(const temp_file&) = delete;

  [[nodiscard]] std::string contents() const {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  [[nodiscard]] std::string original() const {
    std::string s(bytes, '\0');
    for (std::size_t i = 0; i < bytes; ++i) s[i] = file_byte(i);
    return s;
  }
};

constexpr std::size_t three_blocks_and_100 = 4096 * 3 + 100;

/// Whether `p[from, to)` are all zero.
bool zeros(const std::byte* p, std::size_t from, std::size_t to) {
  for (std::size_t i = from; i < to; ++i) {
    if (p[i] != std::byte{0}) return false;
  }
  return true;
}

/// Whether `p[0, n)` are the file's bytes from `offset`.
bool file_bytes(const std::byte* p, std::size_t offset, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != static_cast<std::byte>(file_byte(offset + i))) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("an emu:file of 3 blocks and 100 bytes is a namespace of 4 blocks, and of 25 with 512-byte blocks") {
  temp_file file("count", three_blocks_and_100);
  auto big = host::open("emu:lba=4096,readonly,file=" + file.path);
  CHECK(big->namespace_by_id(1).lba_count == 4);
  auto small = host::open("emu:lba=512,readonly,file=" + file.path);
  CHECK(small->namespace_by_id(1).lba_count == 25);
}

TEST_CASE("a file shorter than one block is a namespace of one block") {
  temp_file file("tiny", 100);
  auto ctrl = host::open("emu:lba=4096,readonly,file=" + file.path);
  CHECK(ctrl->namespace_by_id(1).lba_count == 1);
}

TEST_CASE("the partial last block of an emu:file reads as the file's last bytes followed by zeros") {
  temp_file file("read", three_blocks_and_100);
  for (const bool read_only : {true, false}) {
    CAPTURE(read_only);
    auto ctrl = host::open(std::string("emu:lba=4096,") + (read_only ? "readonly," : "") + "file=" + file.path);
    auto q = ctrl->create_queue_pair(8);
    auto buf = ctrl->memory().allocate(4 * 4096);
    REQUIRE(q->read(1, 0, 4, buf) == spec::status::successful_completion);
    CHECK(file_bytes(buf.data(), 0, three_blocks_and_100));
    CHECK(zeros(buf.data(), three_blocks_and_100, 4 * 4096));
  }
  CHECK(file.contents() == file.original());  // opening and reading changed nothing
}

TEST_CASE("with extended-LBA metadata the last block of an emu:file, past the file's last page, reads as its bytes then zeros") {
  // 4104-byte blocks: the third block ends 24 bytes past the file's last 4 KiB page.
  const std::size_t bytes = 4104 * 2 + 10;
  temp_file file("extended", bytes);
  auto ctrl = host::open("emu:lba=4096,ms=8,mset=1,readonly,file=" + file.path);
  REQUIRE(ctrl->namespace_by_id(1).lba_count == 3);
  auto q = ctrl->create_queue_pair(8);
  auto buf = ctrl->memory().allocate(3 * 4104);
  REQUIRE(q->read(1, 0, 3, buf) == spec::status::successful_completion);
  CHECK(file_bytes(buf.data(), 0, bytes));
  CHECK(zeros(buf.data(), bytes, 3 * 4104));
}

TEST_CASE("a Write that reaches past the end of an emu:file fails with Write Fault and leaves the file as it was") {
  temp_file file("write-past", three_blocks_and_100);
  {
    auto ctrl = host::open("emu:lba=4096,file=" + file.path);
    auto q = ctrl->create_queue_pair(8);
    auto buf = ctrl->memory().allocate(2 * 4096);
    std::memset(buf.data(), 0x5a, buf.size());
    CHECK(q->write(1, 3, 1, buf) == spec::status::write_fault);
    CHECK(q->write(1, 2, 2, buf) == spec::status::write_fault);  // its first block fits: nothing is written either
    REQUIRE(q->read(1, 2, 2, buf) == spec::status::successful_completion);
    CHECK(file_bytes(buf.data(), 2 * 4096, 4096 + 100));
    CHECK(zeros(buf.data(), 4096 + 100, 2 * 4096));
  }
  CHECK(file.contents() == file.original());
}

TEST_CASE("Writes inside an emu:file with a partial last block still reach the file") {
  temp_file file("write-inside", three_blocks_and_100);
  {
    auto ctrl = host::open("emu:lba=4096,file=" + file.path);
    auto q = ctrl->create_queue_pair(8);
    auto buf = ctrl->memory().allocate(4096);
    std::memset(buf.data(), 0x5a, buf.size());
    REQUIRE(q->write(1, 2, 1, buf) == spec::status::successful_completion);
  }
  std::string expected = file.original();
  std::fill(expected.begin() + 2 * 4096, expected.begin() + 3 * 4096, '\x5a');
  CHECK(file.contents() == expected);
}

TEST_CASE("Write Zeroes over the partial last block of an emu:file zeroes the file's bytes there and keeps its size") {
  temp_file file("write-zeroes", three_blocks_and_100);
  {
    auto ctrl = host::open("emu:lba=4096,file=" + file.path);
    auto q = ctrl->create_queue_pair(8);
    REQUIRE(q->execute(spec::make_rw(spec::nvm_opcode::write_zeroes, 1, 2, 2), "Write Zeroes").status() == spec::status::successful_completion);
    auto buf = ctrl->memory().allocate(2 * 4096);
    REQUIRE(q->read(1, 2, 2, buf) == spec::status::successful_completion);
    CHECK(zeros(buf.data(), 0, 2 * 4096));
  }
  std::string expected = file.original();
  std::fill(expected.begin() + 2 * 4096, expected.end(), '\0');
  CHECK(file.contents() == expected);
}

// One owner per file: two emulators writing one file would each take the namespace for theirs
// (a `pattern` fill at open overwrites the other's data), as two hosts resetting one controller.

TEST_CASE("a file backs the namespaces of one emulator at a time: a second emulator is refused, naming the file and the holder") {
  temp_file f("owner", 8192);
  {
    auto first = host::open("emu:file=" + f.path);
    std::string why;
    try {
      auto second = host::open("emu:file=" + f.path + ",pattern");
    } catch (const host::error& e) {
      why = e.what();
    }
    CHECK(why.find("emu:file=" + f.path) != std::string::npos);
    CHECK(why.find("in use by another emulator") != std::string::npos);
    CHECK(why.find("process " + std::to_string(::getpid())) != std::string::npos);
    CHECK_THROWS_AS((void)host::open("emu:file=" + f.path + ",readonly"), host::error);  // nor beside a writer
    CHECK(f.contents() == temp_file("expected", 8192).contents());  // the refused pattern wrote nothing
  }
  CHECK_NOTHROW((void)host::open("emu:file=" + f.path));  // released with the first
}

TEST_CASE("the namespaces of one emulator share its file, and readonly emulators share a file") {
  temp_file f("shared", 8192);
  auto both = host::open("emu:file=" + f.path + ",namespaces=2");
  CHECK(both->namespaces().size() == 2);
  both.reset();
  auto a = host::open("emu:file=" + f.path + ",readonly");
  auto b = host::open("emu:file=" + f.path + ",readonly");
  CHECK_THROWS_WITH_AS((void)host::open("emu:file=" + f.path), doctest::Contains("in use by another emulator"), host::error);
}
