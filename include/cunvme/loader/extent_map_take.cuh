// Taking an extent map (extent_map.cuh) of a file on a mounted file system: FIEMAP for where
// its blocks are, sysfs for the device and partition they are on, SHA-256 of its content.
// Linux only. Included at the end of extent_map.cuh, whose types it uses: include that.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/loader/sha256.cuh>

#include <fcntl.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace loader {

/// One extent as FIEMAP reports it (`struct fiemap_extent`): bytes of the file and of the
/// block device holding the file system (the partition, where there is one).
struct fiemap_record {
  std::uint64_t logical = 0;
  std::uint64_t physical = 0;
  std::uint64_t length = 0;
  std::uint32_t flags = 0;
  friend bool operator==(const fiemap_record&, const fiemap_record&) = default;
};

/// FIEMAP flags that make an extent unreadable from the raw device by its address, each with
/// the reason. `take_extent_map` refuses a file with any of them, and any flag it does not
/// know: only LAST and MERGED (bookkeeping, not about the data) pass.
struct refused_fiemap_flag {
  std::uint32_t flag;
  const char* name;
  const char* why;
};
inline constexpr refused_fiemap_flag refused_fiemap_flags[] = {
    {FIEMAP_EXTENT_UNKNOWN, "UNKNOWN", "the data's location is not known"},
    {FIEMAP_EXTENT_DELALLOC, "DELALLOC", "the data has no blocks yet (delayed allocation)"},
    {FIEMAP_EXTENT_ENCODED, "ENCODED", "the blocks hold the data compressed or otherwise encoded"},
    {FIEMAP_EXTENT_DATA_ENCRYPTED, "DATA_ENCRYPTED", "the blocks hold the data encrypted"},
    {FIEMAP_EXTENT_NOT_ALIGNED, "NOT_ALIGNED", "the data does not start on a block"},
    {FIEMAP_EXTENT_DATA_INLINE, "DATA_INLINE", "the data lives inside file system metadata"},
    {FIEMAP_EXTENT_DATA_TAIL, "DATA_TAIL", "the block is shared with other files' tails"},
    {FIEMAP_EXTENT_UNWRITTEN, "UNWRITTEN", "the blocks are allocated but read as zeros through the file system, not as what the device holds"},
    {FIEMAP_EXTENT_SHARED, "SHARED", "the blocks are shared with another file (reflink, snapshot): a copy-on-write file system may move them"},
};
inline constexpr std::uint32_t passed_fiemap_flags = FIEMAP_EXTENT_LAST | FIEMAP_EXTENT_MERGED;

/// The map's extents from FIEMAP's records of a file of `file_size` bytes: refused flags
/// checked, extents past the end of the file dropped, each cut at the device block holding the
/// file's last byte, `partition_offset` added, counted in `device_block` blocks, and extents
/// that continue each other in the file and on the device merged. Throws `host::error`
/// (naming `path`) for a refused flag, an extent not on device blocks, or records out of order.
[[nodiscard]] inline std::vector<extent> extents_from_fiemap(std::span<const fiemap_record> records, std::uint64_t file_size, std::uint32_t device_block,
                                                             std::uint64_t partition_offset, const std::string& path) {
  const std::string operation = "Take extent map";
  const std::uint64_t dbs = device_block;
  std::vector<extent> out;
  std::uint64_t next = 0;
  for (std::size_t i = 0; i < records.size(); ++i) {
    const fiemap_record& r = records[i];
    if (r.logical >= file_size) continue;  // past EOF (preallocation): no byte of the file there
    const std::string which = "extent " + std::to_string(i) + " at file offset " + std::to_string(r.logical);
    for (const auto& f : refused_fiemap_flags) {
      if ((r.flags & f.flag) != 0) throw host::error(operation, path, which + " is " + f.name + ": " + f.why);
    }
    if ((r.flags & ~passed_fiemap_flags) != 0) {
      char hex[16];
      std::snprintf(hex, sizeof hex, "0x%x", r.flags);
      throw host::error(operation, path, which + " has FIEMAP flags " + hex + " this tool does not know");
    }
    if (r.length == 0 || r.logical < next) throw host::error(operation, path, which + " is empty or out of order");
    if (r.logical % dbs != 0 || r.physical % dbs != 0) {
      throw host::error(operation, path, which + " (device byte " + std::to_string(r.physical) + ") is not on a " + std::to_string(dbs) + "-byte device block");
    }
    if (r.physical > ~std::uint64_t{0} - partition_offset) throw host::error(operation, path, which + ": device offset past 2^64 - 1");
    const std::uint64_t end = r.length > file_size - r.logical ? file_size : r.logical + r.length;  // file bytes it holds
    if (end < file_size && (end - r.logical) % dbs != 0) {
      throw host::error(operation, path, which + " is " + std::to_string(r.length) + " bytes, not whole " + std::to_string(dbs) + "-byte device blocks");
    }
    const extent e{r.logical, (r.physical + partition_offset) / dbs, (end - r.logical + dbs - 1) / dbs};
    if (!out.empty() && out.back().file_offset + out.back().blocks * dbs == e.file_offset && out.back().lba + out.back().blocks == e.lba) {
      out.back().blocks += e.blocks;
    } else {
      out.push_back(e);
    }
    next = end;
  }
  return out;
}

/// What `take_extent_map` cannot find out by itself, or should not.
struct take_options {
  /// The block size the LBAs count in: the namespace's, as cunvme will see it. 0: the logical
  /// block size of the device the file system is on (sysfs), which is the namespace's where the
  /// file system is on that NVMe namespace, but not for a loop device over an image (512).
  std::uint32_t device_block_bytes = 0;
  /// Bytes to add to FIEMAP's offsets: the start of the partition (or of whatever the file
  /// system's device is inside) on the namespace. Unset: from sysfs, 0 for a whole device.
  std::optional<std::uint64_t> partition_offset_bytes;
};

namespace detail {

[[nodiscard]] inline std::string read_sysfs_line(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::string s;
  std::getline(in, s);
  return s;
}

/// FIEMAP of the whole file, `sync` with FIEMAP_FLAG_SYNC; at most extent_map_max_extents records.
[[nodiscard]] inline std::vector<fiemap_record> fiemap_all(int fd, bool sync, const std::string& path) {
  constexpr std::uint32_t batch = 256;
  std::vector<std::byte> raw(sizeof(fiemap) + batch * sizeof(fiemap_extent));
  std::vector<fiemap_record> out;
  std::uint64_t start = 0;
  for (;;) {
    std::memset(raw.data(), 0, raw.size());
    auto* fm = reinterpret_cast<fiemap*>(raw.data());
    fm->fm_start = start;
    fm->fm_length = FIEMAP_MAX_OFFSET - start;
    fm->fm_flags = sync ? FIEMAP_FLAG_SYNC : 0;
    fm->fm_extent_count = batch;
    if (ioctl(fd, FS_IOC_FIEMAP, fm) != 0) throw host::os_error("FIEMAP", path, "the file system must report extents (ext4, XFS)");
    if (fm->fm_mapped_extents == 0) return out;
    for (std::uint32_t i = 0; i < fm->fm_mapped_extents; ++i) {
      const fiemap_extent& e = fm->fm_extents[i];
      out.push_back({e.fe_logical, e.fe_physical, e.fe_length, e.fe_flags});
      if (out.size() > extent_map_max_extents) throw host::error("FIEMAP", path, "more than " + std::to_string(extent_map_max_extents) + " extents");
      if ((e.fe_flags & FIEMAP_EXTENT_LAST) != 0) return out;
    }
    const fiemap_extent& last = fm->fm_extents[fm->fm_mapped_extents - 1];
    if (last.fe_length == 0 || last.fe_logical + last.fe_length <= start) throw host::error("FIEMAP", path, "the extents do not advance");
    start = last.fe_logical + last.fe_length;
  }
}

/// The identity of the open file `fd` (`st` its fstat): FS_IOC_GETVERSION's generation where
/// the file system answers it.
[[nodiscard]] inline file_identity identity_of(int fd, const struct stat& st) {
  file_identity id;
  id.device = static_cast<std::uint64_t>(st.st_dev);
  id.inode = static_cast<std::uint64_t>(st.st_ino);
  int generation = 0;
  id.has_generation = ioctl(fd, FS_IOC_GETVERSION, &generation) == 0;
  id.generation = id.has_generation ? static_cast<std::uint32_t>(generation) : 0;
  id.size = static_cast<std::uint64_t>(st.st_size);
  id.mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  id.ctime_ns = static_cast<std::int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec;
  return id;
}

}  // namespace detail

/// Checks, while its file system is mounted, that the file at `path` is still the version
/// `map` was taken of (`file_identity`: the same file system, inode and generation, size and
/// times). Throws `host::error` naming the first difference — a file deleted and written anew,
/// written in place, truncated, or whose metadata changed (chmod, rename, a new link) — or
/// naming a version 1 map, which records no identity. A map that passes can still go stale
/// later: check again just before the file system is unmounted.
inline void check_file_identity(const extent_map& map, const std::string& path) {
  const std::string operation = "Check the file against its extent map";
  if (!map.identity) throw host::error(operation, path, "the map is of version 1 and records no file identity: take it again to check it");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw host::os_error(operation, path);
  struct stat st {};
  const bool stat_ok = fstat(fd, &st) == 0;
  const int e = errno;
  const file_identity now = stat_ok ? detail::identity_of(fd, st) : file_identity{};
  ::close(fd);
  if (!stat_ok) {
    errno = e;
    throw host::os_error(operation, path);
  }
  const file_identity& then = *map.identity;
  const auto differ = [&](const char* what, auto a, auto b, const char* meaning) {
    if (a != b) {
      throw host::error(operation, path, std::string(what) + " was " + std::to_string(a) + " when the map was taken and is " + std::to_string(b) + " now: " + meaning +
                                       "; the map may name blocks that still hold the old version (its hash would match): take the map again");
    }
  };
  differ("the file system (st_dev)", then.device, now.device, "the path is on another file system");
  differ("the inode", then.inode, now.inode, "the file was replaced (deleted and written anew, or another file renamed over it)");
  if (then.has_generation && now.has_generation) differ("the inode generation", then.generation, now.generation, "the file was deleted and its inode reused");
  differ("the size", then.size, now.size, "the file was written or truncated");
  differ("the modification time (ns)", then.mtime_ns, now.mtime_ns, "the file was written");
  differ("the status-change time (ns)", then.ctime_ns, now.ctime_ns, "the file or its metadata changed (written, chmod, renamed or linked)");
}

/// The extent map of the regular file at `path` on a mounted ext2/3/4 or XFS file system (on
/// others FIEMAP's offsets are not device offsets: btrfs reports addresses in its own chunk
/// space). FIEMAP_FLAG_SYNC writes the file's dirty data first, so that the device holds what
/// the hash is taken of. Refused: a file system on device-mapper or md (its offsets are not
/// the namespace's), refused FIEMAP flags (`refused_fiemap_flags`), extents not on device
/// blocks, and a file whose size, modification time or extents change while the map is taken.
/// After this returns the file must not change, and is best read only once its file system
/// is unmounted (the fs may still move blocks, e.g. online defragmentation).
[[nodiscard]] inline extent_map take_extent_map(const std::string& path, const take_options& options = {}) {
  const std::string operation = "Take extent map";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw host::os_error(operation, path);
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } close_it{fd};
  struct stat before {};
  if (fstat(fd, &before) != 0) throw host::os_error(operation, path);
  if (!S_ISREG(before.st_mode)) throw host::error(operation, path, "not a regular file");
  struct statfs fs {};
  if (fstatfs(fd, &fs) != 0) throw host::os_error(operation, path);
  constexpr long ext_magic = 0xEF53, xfs_magic = 0x58465342;
  if (fs.f_type != ext_magic && fs.f_type != xfs_magic) {
    char hex[24];
    std::snprintf(hex, sizeof hex, "0x%lx", static_cast<unsigned long>(fs.f_type));
    throw host::error(operation, path, std::string("the file system (magic ") + hex + ") is not ext2/3/4 or XFS, whose FIEMAP offsets are device offsets");
  }
  int fs_block = 0;
  if (ioctl(fd, FIGETBSZ, &fs_block) != 0) throw host::os_error("FIGETBSZ", path);

  extent_map map;
  map.file_size = static_cast<std::uint64_t>(before.st_size);
  map.fs_block_bytes = static_cast<std::uint32_t>(fs_block);
  // The device: /sys/dev/block/MAJ:MIN is the partition or whole disk the file system is on.
  namespace fsys = std::filesystem;
  const fsys::path sys = "/sys/dev/block/" + std::to_string(major(before.st_dev)) + ":" + std::to_string(minor(before.st_dev));
  std::error_code ec;
  const fsys::path real = fsys::canonical(sys, ec);
  std::uint32_t logical_block = 0;
  if (!ec) {
    if (fsys::exists(real / "dm") || fsys::exists(real / "md")) {
      throw host::error(operation, path, "the file system is on " + real.filename().string() +
                                       " (device-mapper or md): its offsets are not a namespace's; put it on a plain partition or whole namespace");
    }
    const bool is_partition = fsys::exists(real / "partition");
    const fsys::path disk = is_partition ? real.parent_path() : real;
    map.device = disk.filename().string();
    if (is_partition) {
      map.partition = real.filename().string();
      const std::string start = detail::read_sysfs_line(real / "start");  // in 512-byte sectors, whatever the block size
      std::uint64_t sectors = 0;
      const auto [end, perr] = std::from_chars(start.data(), start.data() + start.size(), sectors);
      if (perr != std::errc{} || end != start.data() + start.size() || start.empty() || sectors > (~std::uint64_t{0} >> 9)) {
        throw host::error(operation, path, "cannot read the partition start from " + (real / "start").string());
      }
      map.partition_offset_bytes = sectors << 9;
    }
    const std::string lbs = detail::read_sysfs_line(disk / "queue" / "logical_block_size");
    logical_block = static_cast<std::uint32_t>(std::strtoul(lbs.c_str(), nullptr, 10));
  } else if (!options.partition_offset_bytes || options.device_block_bytes == 0) {
    throw host::error(operation, path, "no " + sys.string() + ": the file system is not on a block device this tool can name; give the partition offset and device block size");
  }
  if (options.partition_offset_bytes) {
    map.partition = "-";
    map.partition_offset_bytes = *options.partition_offset_bytes;
  }
  map.device_block_bytes = options.device_block_bytes != 0 ? options.device_block_bytes : logical_block;
  if (!std::has_single_bit(map.device_block_bytes) || map.device_block_bytes < 512) {
    throw host::error(operation, path, "device block size " + std::to_string(map.device_block_bytes) + " is not a power of two of at least 512");
  }

  const std::vector<fiemap_record> records = detail::fiemap_all(fd, true, path);
  map.extents = extents_from_fiemap(records, map.file_size, map.device_block_bytes, map.partition_offset_bytes, path);

  sha256 hash;
  std::vector<std::byte> chunk(std::size_t{1} << 20);
  std::uint64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, chunk.data(), chunk.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw host::os_error(operation + ": read", path);
    if (n == 0) break;
    hash.update(chunk.data(), static_cast<std::size_t>(n));
    total += static_cast<std::uint64_t>(n);
  }
  map.sha256 = sha256::hex(hash.finish());
  struct stat after {};
  if (fstat(fd, &after) != 0) throw host::os_error(operation, path);
  // FIEMAP_FLAG_SYNC may itself change the status-change time (writeback): the identity is the
  // one after it, compared with the same taken again after the hash.
  map.identity = detail::identity_of(fd, after);
  struct stat last {};
  if (fstat(fd, &last) != 0) throw host::os_error(operation, path);
  if (total != map.file_size || after.st_size != before.st_size || after.st_mtim.tv_sec != before.st_mtim.tv_sec ||
      after.st_mtim.tv_nsec != before.st_mtim.tv_nsec || detail::fiemap_all(fd, false, path) != records || detail::identity_of(fd, last) != *map.identity) {
    throw host::error(operation, path, "the file changed while its map was taken: stop what writes it and take the map again");
  }
  validate_extent_map(map, operation, path);
  return map;
}

}  // namespace loader
CUNVME_NAMESPACE_END
