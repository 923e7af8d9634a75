// Extent maps (loader/extent_map.cuh): SHA-256 against FIPS 180-4's vectors, the map format's
// round trip and every malformed map refused by name, FIEMAP records turned into extents (every
// refused flag), FIEMAP on real files in /tmp (a hole, preallocation past the end, an unwritten
// extent) checked against the raw device where one is
// readable, and reading by a map through the emulator.
#include <cunvme/loader/extent_map.cuh>
#include <cunvme/host/open.cuh>
#include <cunvme/host/queue/queue_pair.cuh>

#include <doctest/doctest.h>

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace host = cunvme::host;
namespace loader = cunvme::loader;
namespace spec = cunvme::spec;

namespace {

std::string sha_hex(const std::string& s) {
  loader::sha256 h;
  h.update(s.data(), s.size());
  return loader::sha256::hex(h.finish());
}

std::string sha_hex(const std::vector<std::byte>& s) {
  loader::sha256 h;
  h.update(s.data(), s.size());
  return loader::sha256::hex(h.finish());
}

loader::extent_map sample_map() {
  loader::extent_map m;
  m.file_size = 8396923;
  m.fs_block_bytes = 4096;
  m.device_block_bytes = 512;
  m.device = "loop0";
  m.partition = "-";
  m.partition_offset_bytes = 0;
  m.sha256 = std::string(64, 'a');
  m.extents = {{0, 5304, 2888}, {1478656, 9224, 3256}, {3153920, 12480, 10241}};
  return m;
}

/// The message `text` is refused with, "" when it parses.
std::string refusal(const std::string& text) {
  try {
    (void)loader::parse_extent_map(text, "test.map");
  } catch (const host::error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("SHA-256 matches FIPS 180-4's examples, fed whole and in odd pieces") {
  CHECK(sha_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  loader::sha256 h;
  const std::string a(1000, 'a');
  for (int i = 0; i < 1000; ++i) h.update(a.data(), a.size());
  CHECK(loader::sha256::hex(h.finish()) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // 1 000 000 'a' again, in pieces of 1..63 bytes across block boundaries.
  loader::sha256 odd;
  std::size_t left = 1000000, step = 1;
  while (left > 0) {
    const std::size_t n = std::min(left, step);
    odd.update(a.data(), n);
    left -= n;
    step = step % 63 + 1;
  }
  CHECK(loader::sha256::hex(odd.finish()) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("an extent map survives format and parse unchanged") {
  const loader::extent_map m = sample_map();
  const std::string text = loader::format_extent_map(m);
  CHECK(text.starts_with("cunvme-extent-map 1\nfile_size 8396923\nfs_block_bytes 4096\ndevice_block_bytes 512\ndevice loop0\npartition - 0\n"));
  CHECK(text.ends_with("extents 3\n0 5304 2888\n1478656 9224 3256\n3153920 12480 10241\nend\n"));
  CHECK(loader::parse_extent_map(text, "m") == m);
  loader::extent_map p = m;
  p.partition = "nvme0n1p2";
  p.partition_offset_bytes = 1048576;
  p.device = "nvme0n1";
  p.extents.clear();  // all holes: a file of zeros
  CHECK(loader::parse_extent_map(loader::format_extent_map(p), "m") == p);

  const auto path = std::string("/tmp/cunvme-extent-map-test-") + std::to_string(::getpid()) + ".map";
  loader::write_extent_map_file(path, m);
  CHECK(loader::read_extent_map_file(path) == m);
  std::remove(path.c_str());
  CHECK_THROWS_AS((void)loader::read_extent_map_file(path), host::error);
}

TEST_CASE("every malformed map is refused with the line and the reason") {
  const std::string good = loader::format_extent_map(sample_map());
  const auto with = [&](const std::string& from, const std::string& to) {
    const auto at = good.find(from);
    REQUIRE(at != std::string::npos);
    return good.substr(0, at) + to + good.substr(at + from.size());
  };
  CHECK(refusal(good).empty());
  struct bad_case {
    std::string text;
    const char* reason;
  };
  const bad_case cases[] = {
      {"", "line 1: the map ends early"},
      {"cunvme-extent-map 3\n", "not a cunvme extent map of version 1 or 2"},
      // Version 2 needs its identity line after sha256.
      {with("cunvme-extent-map 1\n", "cunvme-extent-map 2\n"), "line 8: expected 'identity'"},
      {with("cunvme-extent-map 1\n", "cunvme-extent-map 1\r\n"), "not a cunvme extent map"},
      {good.substr(0, good.size() - 1), "the last line has no newline"},
      {good + "x\n", "text after 'end'"},
      {good + "\n", "text after 'end'"},
      {with("file_size 8396923", "file_size  8396923"), "single spaces"},
      {with("file_size 8396923", "file_size 8396923 "), "single spaces"},
      {with("file_size 8396923", "file_size -8396923"), "not a decimal number"},
      {with("file_size 8396923", "file_size +8396923"), "not a decimal number"},
      {with("file_size 8396923", "file_size 08396923"), "leading zeros"},
      {with("file_size 8396923", "file_size 0x10"), "not a decimal number"},
      {with("file_size 8396923", "file_size 18446744073709551616"), "does not fit 64 bits"},
      {with("file_size 8396923", "file_size 99999999999999999999999"), "not a decimal number"},
      {with("file_size 8396923", "size 8396923"), "expected 'file_size'"},
      {with("file_size 8396923\nfs_block_bytes 4096\n", "fs_block_bytes 4096\nfile_size 8396923\n"), "expected 'file_size'"},
      {with("fs_block_bytes 4096", "fs_block_bytes 4095"), "fs_block_bytes 4095 is not a power of two"},
      {with("fs_block_bytes 4096", "fs_block_bytes 256"), "not a power of two from 512"},
      {with("fs_block_bytes 4096", "fs_block_bytes 4294967296"), "above 2^31"},
      {with("device_block_bytes 512", "device_block_bytes 0"), "device_block_bytes 0 is not a power of two"},
      {with("device loop0", "device loop 0"), "single spaces"},
      {with("device loop0", "device lo/op0"), "device name 'lo/op0'"},
      {with("device loop0", "device " + std::string(65, 'x')), "is not 1-64"},
      {with("partition - 0", "partition - 100"), "partition offset 100 is not a multiple"},
      {with("partition - 0", "partition -"), "expected 3 words"},
      {with("partition - 0", "partition a..b! 0"), "partition name"},
      {with("sha256 " + std::string(64, 'a'), "sha256 " + std::string(63, 'a')), "sha256 is not 64"},
      {with("sha256 " + std::string(64, 'a'), "sha256 " + std::string(64, 'A')), "sha256 is not 64"},
      {with("extents 3", "extents 4"), "'end' after 3 of 4 extents"},
      {with("extents 3", "extents 2"), "expected 'end' after 2 extents"},
      {with("extents 3", "extents 18446744073709551615"), "at most 262144"},
      {with("0 5304 2888", "0 5304"), "expected 3 words"},
      {with("0 5304 2888", "0 5304 2888 1"), "expected 3 words"},
      {with("0 5304 2888", "0 5304 0"), "has no blocks"},
      {with("0 5304 2888", "100 5304 2888"), "does not start on a device block"},
      {with("0 5304 2888", "0 5304 2889"), "overlaps the extent before it"},
      {with("1478656 9224 3256", "0 9224 3256"), "overlaps the extent before it or is out of file order"},
      {with("3153920 12480 10241", "3153920 12480 10242"), "runs past the device block holding the file's last byte"},
      {with("3153920 12480 10241", "8397312 12480 1"), "starts at or past file_size"},
      {with("3153920 12480 10241", "3153920 18446744073709551615 10241"), "runs past LBA 2^64 - 1"},
      {with("3153920 12480 10241", "3153920 9225 10241"), "overlap on the device"},
      {with("end\n", "End\n"), "expected 'end'"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    const std::string why = refusal(c.text);
    CHECK(why.find("Parse extent map on test.map") == 0);
    CHECK(why.find(c.reason) != std::string::npos);
  }
  // A map file larger than the bound is refused before it is parsed.
  CHECK(refusal(std::string(loader::extent_map_max_file_bytes + 1, 'x')).find("at most") != std::string::npos);
  // Random damage: never a crash, always a parse or a host::error.
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::string t = good;
    for (int k = 0; k < 1 + i % 3; ++k) t[rng() % t.size()] = static_cast<char>(rng() % 256);
    (void)refusal(t);
  }
}

TEST_CASE("FIEMAP records become extents: merged, cut at the end of the file, every refused flag named") {
  using loader::fiemap_record;
  const std::uint64_t size = 3 * 4096 + 100;
  // Two records continuing each other (ext4 splits at 32768 blocks), a hole, a tail past EOF.
  const std::vector<fiemap_record> r = {{0, 1 << 20, 4096, 0}, {4096, (1 << 20) + 4096, 4096, FIEMAP_EXTENT_MERGED},
                                        {3 * 4096, 8 << 20, 4096, FIEMAP_EXTENT_LAST}, {16 * 4096, 9 << 20, 4096, FIEMAP_EXTENT_UNWRITTEN}};
  auto e = loader::extents_from_fiemap(r, size, 512, 0, "f");
  REQUIRE(e.size() == 2);
  CHECK(e[0] == loader::extent{0, 2048, 16});
  CHECK(e[1] == loader::extent{3 * 4096, 16384, 1});  // 100 bytes: one 512-byte block
  // In 4096-byte blocks, on a partition that starts at 1 MiB.
  e = loader::extents_from_fiemap(r, size, 4096, 1 << 20, "f");
  REQUIRE(e.size() == 2);
  CHECK(e[0] == loader::extent{0, 512, 2});
  CHECK(e[1] == loader::extent{3 * 4096, 2304, 1});

  for (const auto& f : loader::refused_fiemap_flags) {
    CAPTURE(f.name);
    const std::vector<fiemap_record> one = {{0, 0, 4096, f.flag | FIEMAP_EXTENT_LAST}};
    try {
      (void)loader::extents_from_fiemap(one, 4096, 512, 0, "f");
      FAIL("accepted");
    } catch (const host::error& x) {
      CHECK(std::string(x.what()).find(std::string("is ") + f.name + ": ") != std::string::npos);
    }
  }
  const std::vector<fiemap_record> unknown = {{0, 0, 4096, 0x10000}};
  CHECK_THROWS_WITH_AS((void)loader::extents_from_fiemap(unknown, 4096, 512, 0, "f"), doctest::Contains("0x10000 this tool does not know"), host::error);
  const std::vector<fiemap_record> odd = {{0, 1000, 4096, 0}};
  CHECK_THROWS_WITH_AS((void)loader::extents_from_fiemap(odd, 4096, 512, 0, "f"), doctest::Contains("not on a 512-byte device block"), host::error);
  const std::vector<fiemap_record> small = {{0, 4096, 1024, 0}, {1024, 8192, 1024, 0}};
  CHECK_THROWS_WITH_AS((void)loader::extents_from_fiemap(small, 8192, 4096, 0, "f"), doctest::Contains("not whole 4096-byte device blocks"), host::error);
  const std::vector<fiemap_record> backwards = {{4096, 0, 4096, 0}, {0, 4096, 4096, 0}};
  CHECK_THROWS_WITH_AS((void)loader::extents_from_fiemap(backwards, 8192, 512, 0, "f"), doctest::Contains("out of order"), host::error);
}

TEST_CASE("take_extent_map on a file in /tmp: the hash is the content's, the extents hold it on the device") {
  const std::string path = "/tmp/cunvme-extent-map-take-" + std::to_string(::getpid());
  std::vector<std::byte> content(3 * 1024 * 1024 + 777);
  std::mt19937_64 rng(11);
  for (auto& b : content) b = static_cast<std::byte>(rng());
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(content.data()), static_cast<std::streamsize>(content.size()));
  }
  loader::extent_map m;
  try {
    m = loader::take_extent_map(path);
  } catch (const host::error& e) {
    std::remove(path.c_str());
    MESSAGE("skipped: /tmp gives no extent map here: " << e.what());
    return;
  }
  CHECK(m.file_size == content.size());
  CHECK(m.sha256 == sha_hex(content));
  REQUIRE(!m.extents.empty());
  std::uint64_t covered = 0;
  for (const auto& e : m.extents) covered += e.blocks * m.device_block_bytes;
  CHECK(covered >= content.size());
  CHECK(covered < content.size() + m.device_block_bytes);
  CHECK(loader::parse_extent_map(loader::format_extent_map(m), "m") == m);
  // The raw device (root only), read past the page cache: the extents hold the file.
  const std::string dev = "/dev/" + m.device;
  const int fd = ::open(dev.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) {
    MESSAGE("not checked on the device: cannot open " << dev << " with O_DIRECT");
  } else {
    const std::size_t align = 4096;
    for (const auto& e : m.extents) {
      const std::uint64_t bytes = e.blocks * m.device_block_bytes;
      const std::uint64_t at = e.lba * m.device_block_bytes;
      const std::uint64_t start = at / align * align, len = (at + bytes + align - 1) / align * align - start;
      void* buf = std::aligned_alloc(align, len);
      REQUIRE(::pread(fd, buf, len, static_cast<off_t>(start)) == static_cast<ssize_t>(len));
      const std::uint64_t n = std::min<std::uint64_t>(bytes, content.size() - e.file_offset);
      CHECK(std::memcmp(static_cast<std::byte*>(buf) + (at - start), content.data() + e.file_offset, n) == 0);
      std::free(buf);
    }
    ::close(fd);
  }
  // A hole (never written) and an unwritten extent (fallocate) on the real file system.
  const std::string sparse = path + ".sparse";
  {
    const int f = ::open(sparse.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    REQUIRE(f >= 0);
    REQUIRE(::pwrite(f, content.data(), 4096, 0) == 4096);
    REQUIRE(::pwrite(f, content.data() + 4096, 5000, 1 << 20) == 5000);
    ::close(f);
  }
  const loader::extent_map s = loader::take_extent_map(sparse);
  std::vector<std::byte> with_hole((1 << 20) + 5000);
  std::memcpy(with_hole.data(), content.data(), 4096);
  std::memcpy(with_hole.data() + (1 << 20), content.data() + 4096, 5000);
  CHECK(s.sha256 == sha_hex(with_hole));
  REQUIRE(s.extents.size() == 2);
  CHECK(s.extents[0].file_offset == 0);
  CHECK(s.extents[1].file_offset == 1 << 20);
  {
    const int f = ::open(sparse.c_str(), O_WRONLY);
    REQUIRE(f >= 0);
    // Preallocated past the end of the file: no byte of the file is there, so it is no extent.
    REQUIRE(::fallocate(f, FALLOC_FL_KEEP_SIZE, 2 << 20, 1 << 20) == 0);
    ::close(f);
  }
  CHECK(loader::take_extent_map(sparse).extents == s.extents);
  {
    const int f = ::open(sparse.c_str(), O_WRONLY);
    REQUIRE(f >= 0);
    REQUIRE(::fallocate(f, 0, 64 << 10, 64 << 10) == 0);  // inside the hole: allocated, unwritten
    ::close(f);
  }
  CHECK_THROWS_WITH_AS((void)loader::take_extent_map(sparse), doctest::Contains("is UNWRITTEN"), host::error);
  std::remove(sparse.c_str());

  // Not a regular file; a missing file.
  CHECK_THROWS_WITH_AS((void)loader::take_extent_map("/tmp"), doctest::Contains("not a regular file"), host::error);
  CHECK_THROWS_AS((void)loader::take_extent_map(path + ".missing"), host::error);
  std::remove(path.c_str());
}

TEST_CASE("read_by_extent_map reads a fragmented file with a hole through the emulator and checks its hash") {
  auto c = host::open("emu:blocks=65536");
  auto q = c->create_queue_pair(64);
  // A 1 MiB + 300 B file: 256 KiB at LBA 40000, a 64 KiB hole (zeros), the rest at LBA 1000.
  std::vector<std::byte> file(std::size_t{1} << 20 | 300);
  std::mt19937_64 rng(3);
  for (auto& b : file) b = static_cast<std::byte>(rng());
  std::fill(file.begin() + (256 << 10), file.begin() + (320 << 10), std::byte{0});
  const auto put = [&](std::uint64_t lba, std::size_t from, std::size_t bytes) {
    auto buf = c->memory().allocate((bytes + 511) / 512 * 512, c->page_bytes());
    std::memset(buf.data(), 0xee, buf.size());  // past the file's end: not part of the hash
    std::memcpy(buf.data(), file.data() + from, bytes);
    REQUIRE(q->write(1, lba, buf.size() / 512, buf) == spec::status::successful_completion);
  };
  put(40000, 0, 256 << 10);
  put(1000, 320 << 10, file.size() - (320 << 10));
  loader::extent_map m;
  m.file_size = file.size();
  m.fs_block_bytes = 4096;
  m.device_block_bytes = 512;
  m.sha256 = sha_hex(file);
  m.extents = {{0, 40000, 512}, {320 << 10, 1000, (file.size() - (320 << 10) + 511) / 512}};
  CHECK(loader::read_by_extent_map(*c, *q, 1, m) == file);
  // Small chunks: many reads per extent, and holes handed over in pieces.
  std::vector<std::byte> streamed;
  loader::read_by_extent_map(*c, *q, 1, m, [&](std::span<const std::byte> s) { streamed.insert(streamed.end(), s.begin(), s.end()); }, 4096);
  CHECK(streamed == file);

  loader::extent_map wrong = m;
  wrong.sha256[0] = wrong.sha256[0] == '0' ? '1' : '0';
  CHECK_THROWS_WITH_AS((void)loader::read_by_extent_map(*c, *q, 1, wrong), doctest::Contains("the file changed after the map was taken"), host::error);
  wrong = m;
  wrong.device_block_bytes = 4096;
  wrong.extents = {{0, 5000, 64}};
  CHECK_THROWS_WITH_AS((void)loader::read_by_extent_map(*c, *q, 1, wrong), doctest::Contains("take it with --device-block-bytes 512"), host::error);
  wrong = m;
  wrong.extents[1].lba = 65536 - 10;
  CHECK_THROWS_WITH_AS((void)loader::read_by_extent_map(*c, *q, 1, wrong), doctest::Contains("runs past namespace 1's 65536 blocks"), host::error);
  CHECK_THROWS_WITH_AS((void)loader::read_by_extent_map(*c, *q, 7, m), doctest::Contains("no such active namespace"), host::error);
}

namespace {

/// Writes `content` to `path` anew (a new inode where the old one was unlinked first).
void write_file(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
}

/// The map of `path`, or nothing (with a message) where /tmp gives no extent map.
std::optional<loader::extent_map> try_take(const std::string& path) {
  try {
    return loader::take_extent_map(path);
  } catch (const host::error& e) {
    MESSAGE("skipped: /tmp gives no extent map here: " << e.what());
    return std::nullopt;
  }
}

}  // namespace

TEST_CASE("a map records which version of the file it was taken of, and the check passes while the file is unchanged") {
  const std::string path = "/tmp/cunvme-extent-map-identity-" + std::to_string(::getpid());
  write_file(path, std::string(20000, 'a'));
  const auto m = try_take(path);
  if (!m) return std::remove(path.c_str()), void();
  REQUIRE(m->identity.has_value());
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK(m->identity->inode == st.st_ino);
  CHECK(m->identity->device == st.st_dev);
  CHECK(m->identity->size == 20000);
  CHECK_NOTHROW(loader::check_file_identity(*m, path));
  // Version 2 keeps the identity through format and parse.
  const std::string text = loader::format_extent_map(*m);
  CHECK(text.starts_with("cunvme-extent-map 2\n"));
  CHECK(loader::parse_extent_map(text, "m") == *m);
  std::remove(path.c_str());
}

TEST_CASE("a file deleted and written anew after its map was taken is caught while mounted, though its old blocks hash the same") {
  const std::string path = "/tmp/cunvme-extent-map-replaced-" + std::to_string(::getpid());
  const std::string old_content(3 << 20, 'o');
  write_file(path, old_content);
  const auto m = try_take(path);
  if (!m) return std::remove(path.c_str()), void();
  // Keep the old inode's blocks allocated (a hard link), so that the new file cannot reuse
  // them: the old blocks still hold the old bytes, which is why the hash cannot tell.
  const std::string keep = path + ".old";
  REQUIRE(::link(path.c_str(), keep.c_str()) == 0);
  REQUIRE(std::remove(path.c_str()) == 0);
  write_file(path, std::string(3 << 20, 'n'));
  CHECK(loader::take_extent_map(keep).sha256 == m->sha256);
  CHECK_THROWS_WITH_AS(loader::check_file_identity(*m, path), doctest::Contains("inode"), host::error);
  std::remove(keep.c_str());
  std::remove(path.c_str());
}

TEST_CASE("a file rewritten in place after its map was taken is caught while mounted") {
  const std::string path = "/tmp/cunvme-extent-map-rewritten-" + std::to_string(::getpid());
  write_file(path, std::string(8192, 'a'));
  const auto m = try_take(path);
  if (!m) return std::remove(path.c_str()), void();
  {
    const int fd = ::open(path.c_str(), O_WRONLY);
    REQUIRE(fd >= 0);
    REQUIRE(::pwrite(fd, "b", 1, 100) == 1);
    ::close(fd);
  }
  CHECK_THROWS_WITH_AS(loader::check_file_identity(*m, path), doctest::Contains("modification time"), host::error);
  write_file(path, std::string(4096, 'a'));  // truncated and shorter, same inode
  CHECK_THROWS_WITH_AS(loader::check_file_identity(*m, path), doctest::Contains("size"), host::error);
  std::remove(path.c_str());
  CHECK_THROWS_AS(loader::check_file_identity(*m, path), host::error);  // gone
}

TEST_CASE("a version 1 map (no identity) still parses, formats as version 1, and cannot be checked") {
  const loader::extent_map m = sample_map();
  REQUIRE_FALSE(m.identity.has_value());
  const std::string text = loader::format_extent_map(m);
  CHECK(text.starts_with("cunvme-extent-map 1\n"));
  CHECK(loader::parse_extent_map(text, "m") == m);
  CHECK_THROWS_WITH_AS(loader::check_file_identity(m, "/tmp"), doctest::Contains("version 1"), host::error);
}

TEST_CASE("a version 2 map with a malformed identity line is refused with the line and the reason") {
  loader::extent_map m = sample_map();
  m.identity = loader::file_identity{2049, 131, 77, true, 8396923, 1700000000123456789, 1700000000123456789};
  const std::string good = loader::format_extent_map(m);
  CHECK(good.find("\nidentity 2049 131 77 8396923 1700000000123456789 1700000000123456789\n") != std::string::npos);
  CHECK(loader::parse_extent_map(good, "m") == m);
  m.identity->has_generation = false;
  m.identity->generation = 0;
  CHECK(loader::format_extent_map(m).find("\nidentity 2049 131 - 8396923 ") != std::string::npos);
  CHECK(loader::parse_extent_map(loader::format_extent_map(m), "m") == m);
  const auto with = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    t.replace(t.find(from), from.size(), to);
    return refusal(t);
  };
  CHECK(with("identity 2049 131 77 8396923", "identity 2049 131 77 8396924").find("file_size") != std::string::npos);
  CHECK(with("identity 2049", "identity x2049").find("line 8") != std::string::npos);
  CHECK(with("identity 2049 131", "identity 2049").find("line 8") != std::string::npos);
  CHECK(with("\nidentity 2049 131 77 8396923 1700000000123456789 1700000000123456789\n", "\n").find("line 8") != std::string::npos);
}
