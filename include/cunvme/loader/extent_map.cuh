// Extent maps: a file found by path while its file system is mounted, then read from the raw
// namespace after the controller was handed to cunvme (no file system is mounted then).
//
// `take_extent_map` (extent_map_take.cuh) asks the file system where the file's bytes lie
// (FIEMAP), hashes its content and records which version of the file it was (`file_identity`);
// `read_by_extent_map` reads those blocks through a host queue pair and checks the hash. The
// one rule: the file must not change between the two — not written, truncated, deleted and
// written anew, defragmented, deduplicated or moved — or the map names blocks that hold
// something else now, or still hold the old version.
//
// What the SHA-256 catches and what it does not: it compares the bytes the mapped blocks hold
// now with the bytes the file held when the map was taken. It catches mapped blocks whose
// content changed — the file rewritten in place with other bytes, its blocks reused by another
// file, the wrong device, namespace or partition, a wrong map. It does not catch a file that
// changed while its old blocks kept their old bytes: a file deleted (or truncated) and written
// anew, or a new version written elsewhere and renamed over it, reads back by the old map as
// its OLD content with a matching hash, for as long as nothing has reused those blocks. Only
// the file system knows the file changed: `check_file_identity` compares the identity recorded
// in the map (device, inode, inode generation where the file system reports one, size,
// modification and status-change times in ns) with the file at its path, which needs the file
// system mounted — the `extent_map` tool's `check`, and `read`/`verify` with `--file`. Once
// it is unmounted nothing can tell a stale map whose old blocks are intact: the rule stands.
//
// The map file is a small strict text format, one item per line, LF endings. Version 2 (what
// `take_extent_map` writes):
//
//   cunvme-extent-map 2
//   file_size 8396923                      bytes of the file
//   fs_block_bytes 4096                    the file system's block size (FIGETBSZ)
//   device_block_bytes 512                 the block size the LBAs count in: the namespace's
//   device loop0                           the whole device the LBAs are relative to ('-': unknown)
//   partition - 0                          the partition holding the file system and its start in
//                                          bytes, added to FIEMAP's offsets ('-' and 0: none)
//   sha256 9f86d0…                         SHA-256 of the file's file_size bytes, lower-case hex
//   identity 2049 131 77 8396923 T1 T2     st_dev, inode, generation ('-': not reported), size
//                                          (= file_size), mtime and ctime in ns since the epoch
//   extents 3
//   0 5304 2888                            file offset (bytes), LBA, blocks: one line per extent
//   1478656 9224 3256
//   3153920 12480 10248
//   end
//
// Version 1 is the same without the identity line; such maps are still read (and written back
// as version 1), but cannot be checked against the file.
//
// Bytes of [0, file_size) no extent covers are a hole and read as zeros (ext4's `mke2fs -d`
// makes holes of all-zero blocks, so a model file with zero tensors has them). The last
// extent may run past file_size to the end of its device block; those bytes are dropped.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/loader/sha256.cuh>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace loader {

/// Bytes [file_offset, file_offset + blocks · device_block_bytes) of the file are the blocks
/// [lba, lba + blocks) of the device.
struct extent {
  std::uint64_t file_offset = 0;
  std::uint64_t lba = 0;
  std::uint64_t blocks = 0;
  friend bool operator==(const extent&, const extent&) = default;
};

/// Which version of a file a map was taken of, as the mounted file system tells it: a file
/// deleted and written anew gets another inode (or, where the number is reused, another
/// generation), one written in place another modification time, one chmod'ed, renamed or
/// linked another status-change time. See the top of this file for why the hash alone cannot.
struct file_identity {
  std::uint64_t device = 0;      ///< st_dev of the file system
  std::uint64_t inode = 0;       ///< st_ino
  std::uint64_t generation = 0;  ///< FS_IOC_GETVERSION, where `has_generation`
  bool has_generation = false;   ///< false where the file system reports none (XFS)
  std::uint64_t size = 0;        ///< st_size: the map's file_size
  std::int64_t mtime_ns = 0;     ///< st_mtim in ns since the epoch
  std::int64_t ctime_ns = 0;     ///< st_ctim in ns since the epoch
  friend bool operator==(const file_identity&, const file_identity&) = default;
};

/// Where a file's bytes lie on a raw device, and what they hash to. See the top of this file.
struct extent_map {
  std::uint64_t file_size = 0;
  std::uint32_t fs_block_bytes = 0;
  std::uint32_t device_block_bytes = 0;
  std::string device = "-";                ///< e.g. nvme0n1, loop0; "-" where not known
  std::string partition = "-";             ///< e.g. nvme0n1p2; "-" for none or not known
  std::uint64_t partition_offset_bytes = 0;  ///< added to FIEMAP's offsets to make the LBAs device-relative
  std::string sha256;                      ///< 64 lower-case hex digits
  std::vector<extent> extents;             ///< by file offset, disjoint
  std::optional<file_identity> identity;   ///< none in a version 1 map
  friend bool operator==(const extent_map&, const extent_map&) = default;
};

/// Bounds a map must keep, so that a hostile map costs bounded memory and time to parse.
inline constexpr std::size_t extent_map_max_extents = std::size_t{1} << 18;
inline constexpr std::size_t extent_map_max_file_bytes = std::size_t{32} << 20;
inline constexpr std::size_t extent_map_max_name = 64;

namespace detail {

[[nodiscard]] inline bool valid_map_name(std::string_view s) {
  if (s.empty() || s.size() > extent_map_max_name) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
  });
}

[[nodiscard]] inline bool valid_sha256_hex(std::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

/// `v` rounded up to a multiple of `to`; wraps (a result below `v`) where that is past 2^64 - 1.
[[nodiscard]] inline std::uint64_t round_up(std::uint64_t v, std::uint64_t to) noexcept {
  const std::uint64_t r = v % to;
  return r == 0 ? v : v + (to - r);
}

}  // namespace detail

/// Throws `host::error` (operation `operation`, naming `source`) unless `map` is one a reader
/// can follow: block sizes powers of two (512 B..2 GiB, as LBADS allows), a partition offset
/// on a device block, extents of at least one block, on device blocks, in file order, disjoint
/// in the file and on the device, starting inside the file and ending by the device block
/// holding its last byte, with no LBA past 2^64 - 1.
inline void validate_extent_map(const extent_map& map, const std::string& operation, const std::string& source) {
  const auto fail = [&](const std::string& why) { throw host::error(operation, source, why); };
  const auto block_size_ok = [](std::uint64_t b) { return std::has_single_bit(b) && b >= 512 && b <= (std::uint64_t{1} << 31); };
  if (!block_size_ok(map.fs_block_bytes)) fail("fs_block_bytes " + std::to_string(map.fs_block_bytes) + " is not a power of two from 512 to 2^31");
  if (!block_size_ok(map.device_block_bytes)) {
    fail("device_block_bytes " + std::to_string(map.device_block_bytes) + " is not a power of two from 512 to 2^31");
  }
  if (!detail::valid_map_name(map.device)) fail("device name '" + map.device + "' is not 1-64 of [A-Za-z0-9._-]");
  if (!detail::valid_map_name(map.partition)) fail("partition name '" + map.partition + "' is not 1-64 of [A-Za-z0-9._-]");
  if (!detail::valid_sha256_hex(map.sha256)) fail("sha256 is not 64 lower-case hex digits");
  if (map.identity && map.identity->size != map.file_size) {
    fail("the identity's size " + std::to_string(map.identity->size) + " differs from file_size " + std::to_string(map.file_size));
  }
  if (map.identity && !map.identity->has_generation && map.identity->generation != 0) fail("an identity without a generation has generation 0");
  const std::uint64_t dbs = map.device_block_bytes;
  if (map.partition_offset_bytes % dbs != 0) {
    fail("partition offset " + std::to_string(map.partition_offset_bytes) + " is not a multiple of the " + std::to_string(dbs) + "-byte device block");
  }
  if (map.extents.size() > extent_map_max_extents) fail(std::to_string(map.extents.size()) + " extents (at most " + std::to_string(extent_map_max_extents) + ")");
  const std::uint64_t file_end = detail::round_up(map.file_size, dbs);
  if (file_end < map.file_size) fail("file_size " + std::to_string(map.file_size) + " does not round up to a device block below 2^64");
  std::uint64_t next = 0;  // the first file byte the next extent may cover
  for (std::size_t i = 0; i < map.extents.size(); ++i) {
    const extent& e = map.extents[i];
    const std::string which = "extent " + std::to_string(i) + " (file offset " + std::to_string(e.file_offset) + ", LBA " + std::to_string(e.lba) +
                              ", " + std::to_string(e.blocks) + " blocks)";
    if (e.blocks == 0) fail(which + " has no blocks");
    if (e.file_offset % dbs != 0) fail(which + " does not start on a device block of the file");
    if (e.file_offset < next) fail(which + " overlaps the extent before it or is out of file order");
    if (e.file_offset >= map.file_size) fail(which + " starts at or past file_size " + std::to_string(map.file_size));
    if (e.blocks > (file_end - e.file_offset) / dbs) fail(which + " runs past the device block holding the file's last byte");
    if (e.lba > ~std::uint64_t{0} - (e.blocks - 1)) fail(which + " runs past LBA 2^64 - 1");
    next = e.file_offset + e.blocks * dbs;
  }
  // Two file ranges on one device range would be a shared extent, which takes refuse.
  std::vector<extent> by_lba = map.extents;
  std::sort(by_lba.begin(), by_lba.end(), [](const extent& a, const extent& b) { return a.lba < b.lba; });
  for (std::size_t i = 1; i < by_lba.size(); ++i) {
    if (by_lba[i].lba - by_lba[i - 1].lba < by_lba[i - 1].blocks) {
      fail("the extents at file offsets " + std::to_string(by_lba[i - 1].file_offset) + " and " + std::to_string(by_lba[i].file_offset) +
           " overlap on the device (LBA " + std::to_string(by_lba[i].lba) + ")");
    }
  }
}

/// The map as its file holds it (see the top of this file). Throws `host::error` for a map
/// `validate_extent_map` refuses.
[[nodiscard]] inline std::string format_extent_map(const extent_map& map) {
  validate_extent_map(map, "Write extent map", "(map)");
  std::string s = map.identity ? "cunvme-extent-map 2\n" : "cunvme-extent-map 1\n";
  s += "file_size " + std::to_string(map.file_size) + "\n";
  s += "fs_block_bytes " + std::to_string(map.fs_block_bytes) + "\n";
  s += "device_block_bytes " + std::to_string(map.device_block_bytes) + "\n";
  s += "device " + map.device + "\n";
  s += "partition " + map.partition + " " + std::to_string(map.partition_offset_bytes) + "\n";
  s += "sha256 " + map.sha256 + "\n";
  if (const auto& id = map.identity) {
    s += "identity " + std::to_string(id->device) + " " + std::to_string(id->inode) + " " + (id->has_generation ? std::to_string(id->generation) : "-") +
         " " + std::to_string(id->size) + " " + std::to_string(id->mtime_ns) + " " + std::to_string(id->ctime_ns) + "\n";
  }
  s += "extents " + std::to_string(map.extents.size()) + "\n";
  for (const extent& e : map.extents) s += std::to_string(e.file_offset) + " " + std::to_string(e.lba) + " " + std::to_string(e.blocks) + "\n";
  s += "end\n";
  return s;
}

/// Parses a map file's text, version 1 or 2; `source` names it in errors. Strict: every line
/// exactly as `format_extent_map` writes it (decimal without sign or leading zeros — times may
/// be negative — single spaces, LF, nothing after `end`), then `validate_extent_map`. Throws
/// `host::error` naming the line.
[[nodiscard]] inline extent_map parse_extent_map(std::string_view text, const std::string& source) {
  const std::string operation = "Parse extent map";
  if (text.size() > extent_map_max_file_bytes) {
    throw host::error(operation, source, std::to_string(text.size()) + " bytes (a map file has at most " + std::to_string(extent_map_max_file_bytes) + ")");
  }
  std::size_t pos = 0, line_number = 0;
  std::string_view line;
  const auto fail = [&](const std::string& why) -> void { throw host::error(operation, source, "line " + std::to_string(line_number) + ": " + why); };
  const auto next_line = [&]() {
    ++line_number;
    if (pos >= text.size()) fail("the map ends early (no 'end' line)");
    const std::size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) fail("the last line has no newline");
    line = text.substr(pos, nl - pos);
    pos = nl + 1;
  };
  const auto words = [&](std::size_t want) {
    std::vector<std::string_view> w;
    std::size_t at = 0;
    for (;;) {
      const std::size_t sp = line.find(' ', at);
      w.push_back(line.substr(at, sp == std::string_view::npos ? std::string_view::npos : sp - at));
      if (sp == std::string_view::npos || w.size() > want) break;
      at = sp + 1;
    }
    if (w.size() != want || std::any_of(w.begin(), w.end(), [](std::string_view x) { return x.empty(); })) {
      fail("expected " + std::to_string(want) + " words separated by single spaces");
    }
    return w;
  };
  const auto number = [&](std::string_view w, const char* what) {
    std::uint64_t v = 0;
    const bool digits = std::all_of(w.begin(), w.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits || w.size() > 20 || (w.size() > 1 && w[0] == '0')) fail(std::string(what) + " is not a decimal number without sign or leading zeros");
    const auto [end, ec] = std::from_chars(w.data(), w.data() + w.size(), v);
    if (ec != std::errc{} || end != w.data() + w.size()) fail(std::string(what) + " does not fit 64 bits");
    return v;
  };
  const auto keyed = [&](std::string_view key, std::size_t values) {
    next_line();
    // The key first: a missing line is named as such, not as a count of words.
    if (line.substr(0, line.find(' ')) != key) fail("expected '" + std::string(key) + "'");
    return words(values + 1);
  };
  const auto block_size = [&](std::string_view w, const char* what) {
    const std::uint64_t v = number(w, what);
    if (v > (std::uint64_t{1} << 31)) fail(std::string(what) + " is above 2^31");
    return static_cast<std::uint32_t>(v);
  };

  const auto time_ns = [&](std::string_view w, const char* what) {
    const bool negative = !w.empty() && w[0] == '-';
    const std::uint64_t magnitude = number(negative ? w.substr(1) : w, what);
    if (negative && magnitude == 0) fail(std::string(what) + " is '-0'");
    if (magnitude > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) fail(std::string(what) + " does not fit 64 bits");
    return negative ? -static_cast<std::int64_t>(magnitude) : static_cast<std::int64_t>(magnitude);
  };

  next_line();
  if (line != "cunvme-extent-map 1" && line != "cunvme-extent-map 2") {
    fail("not a cunvme extent map of version 1 or 2 (the first line is 'cunvme-extent-map 1' or 'cunvme-extent-map 2')");
  }
  const bool with_identity = line.back() == '2';
  extent_map map;
  map.file_size = number(keyed("file_size", 1)[1], "file_size");
  map.fs_block_bytes = block_size(keyed("fs_block_bytes", 1)[1], "fs_block_bytes");
  map.device_block_bytes = block_size(keyed("device_block_bytes", 1)[1], "device_block_bytes");
  map.device = std::string(keyed("device", 1)[1]);
  auto p = keyed("partition", 2);
  map.partition = std::string(p[1]);
  map.partition_offset_bytes = number(p[2], "partition offset");
  map.sha256 = std::string(keyed("sha256", 1)[1]);
  if (with_identity) {
    const auto w = keyed("identity", 6);
    file_identity id;
    id.device = number(w[1], "identity device");
    id.inode = number(w[2], "identity inode");
    id.has_generation = w[3] != "-";
    id.generation = id.has_generation ? number(w[3], "identity generation") : 0;
    id.size = number(w[4], "identity size");
    id.mtime_ns = time_ns(w[5], "identity mtime");
    id.ctime_ns = time_ns(w[6], "identity ctime");
    map.identity = id;
  }
  const std::uint64_t count = number(keyed("extents", 1)[1], "extents");
  if (count > extent_map_max_extents) fail(std::to_string(count) + " extents (at most " + std::to_string(extent_map_max_extents) + ")");
  map.extents.reserve(static_cast<std::size_t>(count));
  for (std::uint64_t i = 0; i < count; ++i) {
    next_line();
    if (line == "end") fail("'end' after " + std::to_string(i) + " of " + std::to_string(count) + " extents");
    auto e = words(3);
    map.extents.push_back({number(e[0], "file offset"), number(e[1], "LBA"), number(e[2], "blocks")});
  }
  next_line();
  if (line != "end") fail("expected 'end' after " + std::to_string(count) + " extents");
  if (pos != text.size()) fail("text after 'end'");
  validate_extent_map(map, operation, source);
  return map;
}

/// Reads and parses the map file at `path` (at most `extent_map_max_file_bytes`).
[[nodiscard]] inline extent_map read_extent_map_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw host::os_error("Read extent map", path);
  // In pieces, so that a small map costs little and a huge file stops one piece past the bound.
  std::string text;
  char piece[65536];
  while (text.size() <= extent_map_max_file_bytes && in.read(piece, sizeof piece).gcount() > 0) text.append(piece, static_cast<std::size_t>(in.gcount()));
  if (in.bad()) throw host::os_error("Read extent map", path);
  return parse_extent_map(text, path);
}

/// Writes `map` to `path` through a temporary file renamed into place, so that a reader never
/// sees half a map.
inline void write_extent_map_file(const std::string& path, const extent_map& map) {
  const std::string text = format_extent_map(map);
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) throw host::os_error("Write extent map", partial);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
    if (!out) throw host::os_error("Write extent map", partial);
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) throw host::os_error("Write extent map", path);
}

/// Reads the file `map` describes from namespace `nsid` through `qp` (host I/O, synchronous)
/// and hands its bytes to `sink(std::span<const std::byte>)` in file order, `file_size` in
/// all (holes as zeros), through a DMA buffer of `chunk_bytes`; then checks the SHA-256.
/// Memory stays bounded by `chunk_bytes` whatever the map says. Throws `host::error` for a
/// map that does not fit the namespace (another block size, LBAs past its end, metadata or
/// protection information), a failed read (its NVMe status), or a hash that differs: the file
/// changed after the map was taken, or the map is for another device. The sink has then seen
/// the bytes already: keep them only once this returns.
template <class Sink>
void read_by_extent_map(host::controller& ctrl, host::queue_pair& qp, std::uint32_t nsid, const extent_map& map, Sink&& sink,
                        std::size_t chunk_bytes = std::size_t{4} << 20) {
  const std::string operation = "Read by extent map";
  validate_extent_map(map, operation, ctrl.name());
  const host::namespace_info& ns = ctrl.namespace_by_id(nsid);
  const std::string what = "namespace " + std::to_string(nsid);
  if (ns.lba_size != map.device_block_bytes) {
    throw host::error(operation, ctrl.name(), what + " has " + std::to_string(ns.lba_size) + "-byte blocks, the map counts " +
                                            std::to_string(map.device_block_bytes) + "-byte blocks (take it with --device-block-bytes " +
                                            std::to_string(ns.lba_size) + ")");
  }
  if (ns.metadata_size != 0 || ns.protection_type != 0) {
    throw host::error(operation, ctrl.name(), what + " has metadata or protection information; a file system's blocks are plain data");
  }
  for (const extent& e : map.extents) {
    if (e.lba >= ns.lba_count || e.blocks > ns.lba_count - e.lba) {
      throw host::error(operation, ctrl.name(), "the extent at LBA " + std::to_string(e.lba) + " (" + std::to_string(e.blocks) + " blocks) runs past " + what +
                                              "'s " + std::to_string(ns.lba_count) + " blocks");
    }
  }
  const std::uint64_t dbs = map.device_block_bytes;
  const std::uint64_t chunk_blocks = std::max<std::uint64_t>(chunk_bytes / dbs, 1);
  host::dma_buffer buffer = ctrl.memory().allocate(static_cast<std::size_t>(chunk_blocks * dbs), ctrl.page_bytes());
  const std::vector<std::byte> zeros(static_cast<std::size_t>(std::min<std::uint64_t>(chunk_blocks * dbs, map.file_size)));
  sha256 hash;
  std::uint64_t at = 0;  // file bytes handed to the sink
  const auto emit = [&](const std::byte* p, std::uint64_t n) {
    hash.update(p, static_cast<std::size_t>(n));
    sink(std::span<const std::byte>(p, static_cast<std::size_t>(n)));
    at += n;
  };
  const auto holes_until = [&](std::uint64_t offset) {
    while (at < offset) emit(zeros.data(), std::min<std::uint64_t>(offset - at, zeros.size()));
  };
  for (const extent& e : map.extents) {
    holes_until(e.file_offset);
    for (std::uint64_t done = 0; done < e.blocks;) {
      const std::uint64_t n = std::min(e.blocks - done, chunk_blocks);
      const spec::status s = qp.read(nsid, e.lba + done, n, buffer);
      if (s != spec::status::successful_completion) throw host::error(operation + ": Read LBA " + std::to_string(e.lba + done), ctrl.name(), s);
      emit(buffer.data(), std::min(n * dbs, map.file_size - at));  // the last block may hold bytes past file_size
      done += n;
    }
  }
  holes_until(map.file_size);
  const std::string got = sha256::hex(hash.finish());
  if (got != map.sha256) {
    throw host::error(operation, ctrl.name(), "SHA-256 of the " + std::to_string(map.file_size) + " bytes read is " + got + ", the map says " + map.sha256 +
                                            ": the file changed after the map was taken, or the map is for another device or namespace");
  }
}

/// `read_by_extent_map` into memory: the file's bytes, once their hash matched.
[[nodiscard]] inline std::vector<std::byte> read_by_extent_map(host::controller& ctrl, host::queue_pair& qp, std::uint32_t nsid, const extent_map& map) {
  if (map.file_size > std::vector<std::byte>().max_size()) throw host::error("Read by extent map", ctrl.name(), "the file does not fit in memory");
  std::vector<std::byte> out;
  out.reserve(static_cast<std::size_t>(map.file_size));
  read_by_extent_map(ctrl, qp, nsid, map, [&](std::span<const std::byte> s) { out.insert(out.end(), s.begin(), s.end()); });
  return out;
}

}  // namespace loader
CUNVME_NAMESPACE_END

#include <cunvme/loader/extent_map_take.cuh>
