// Where a file's bytes lie on a namespace ("file byte offset → LBA ranges"), and the reads that
// bring a set of byte ranges of the file into one buffer. Host code, no CUDA.
//
// A file on the emulator backed by it (`emu:file=PATH`) starts at LBA 0 and runs on
// contiguously: `file_placement::contiguous`. A file in a filesystem on a real controller is a
// list of extents (FIEMAP's answer, mapped to LBAs): `file_placement::from_extents`, or
// `from_extent_map` over a map the `extent_map` tool took (loader/extent_map.cuh). All answer
// `map`, which is all the loader asks.
//
// Usage: examples/snippets/loader.cpp, `plan`.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/checked.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/loader/extent_map.cuh>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace loader {

/// `blocks` blocks of the file from byte `file_offset` (a multiple of the block size) lie at
/// `lba` on, one after another.
/// Bytes [file_offset, file_offset + blocks × block size) of the file are blocks [lba, lba +
/// blocks) of the namespace: the extent maps' own type, so a map's extents serve as they are.
using file_extent = loader::extent;

/// A run of blocks to read and where it goes in the destination buffer.
struct block_read {
  std::uint64_t lba = 0;
  std::uint64_t blocks = 0;
  std::uint64_t buffer_offset = 0;
  friend bool operator==(const block_read&, const block_read&) = default;
};

/// Where a file lies on a namespace of `block_bytes()`-byte blocks. Bytes of the file no
/// extent holds (a hole, or the tail a device too short for the file lacks) cannot be read:
/// `map` refuses them, naming the range.
class file_placement {
 public:
  /// The file from `first_lba` on, `file_bytes` bytes in ⌈file_bytes / block_bytes⌉ blocks, of
  /// which the device holds `device_blocks - first_lba`. The emulator backed by the file holds
  /// all ⌈file_bytes / block_bytes⌉ of them, the last one's bytes past the file reading as zeros.
  [[nodiscard]] static file_placement contiguous(std::uint64_t block_bytes, std::uint64_t first_lba, std::uint64_t file_bytes,
                                                 std::uint64_t device_blocks) {
    check_block(block_bytes);
    check_size(block_bytes, file_bytes);
    const std::uint64_t needed = file_bytes / block_bytes + (file_bytes % block_bytes != 0 ? 1 : 0);
    const std::uint64_t held = device_blocks > first_lba ? std::min(needed, device_blocks - first_lba) : 0;
    std::vector<file_extent> extents;
    if (held > 0) extents.push_back({0, first_lba, held});
    return file_placement(block_bytes, file_bytes, std::move(extents));
  }

  /// A file given extent by extent (FIEMAP, mapped to LBAs of this namespace). Checked: file
  /// offsets are multiples of the block size, extents are in file order and do not overlap,
  /// none is empty, and no LBA range wraps. Gaps are holes.
  [[nodiscard]] static file_placement from_extents(std::uint64_t block_bytes, std::uint64_t file_bytes, std::vector<file_extent> extents) {
    check_block(block_bytes);
    check_size(block_bytes, file_bytes);
    std::uint64_t next = 0;
    for (const file_extent& e : extents) {
      const std::string at = "extent at file byte " + std::to_string(e.file_offset);
      if (e.blocks == 0) refuse(at + " is empty");
      if (e.file_offset % block_bytes != 0) refuse(at + " does not start on a " + std::to_string(block_bytes) + "-byte block");
      if (e.file_offset < next) refuse(at + " overlaps the extent before it, or the extents are out of file order");
      std::uint64_t bytes = 0, end = 0, last = 0;
      if (cunvme::detail::mul_overflows(e.blocks, block_bytes, bytes) || cunvme::detail::add_overflows(e.file_offset, bytes, end) ||
          cunvme::detail::add_overflows(e.lba, e.blocks - 1, last)) {
        refuse(at + ": " + std::to_string(e.blocks) + " blocks run past 2^64");
      }
      next = end;
    }
    return file_placement(block_bytes, file_bytes, std::move(extents));
  }

  /// The file an extent map describes (`loader::read_extent_map_file`), on the namespace it was
  /// taken for. The map's holes — which its own reader returns as zeros — are refused here when a
  /// tensor's bytes fall in one (`map` throws); its SHA-256 is not checked by the loader: verify
  /// the file with `read_by_extent_map` (or `extent_map verify`) before trusting loads by it.
  [[nodiscard]] static file_placement from_extent_map(const loader::extent_map& m) {
    return from_extents(m.device_block_bytes, m.file_size, m.extents);
  }

  [[nodiscard]] std::uint64_t block_bytes() const noexcept { return block_bytes_; }
  [[nodiscard]] std::uint64_t file_bytes() const noexcept { return file_bytes_; }
  [[nodiscard]] const std::vector<file_extent>& extents() const noexcept { return extents_; }

  /// The block reads that bring file bytes [offset, offset + length), widened to whole blocks,
  /// into a buffer from `buffer_offset` on: the block holding `offset` lands at
  /// `buffer_offset`, so byte `offset` at `buffer_offset + offset % block_bytes()`. One read
  /// per extent touched. Throws `host::error` when a byte lies past the file or in no extent,
  /// or when the reads would run past byte 2^64 - 1 of the buffer.
  [[nodiscard]] std::vector<block_read> map(std::uint64_t offset, std::uint64_t length, std::uint64_t buffer_offset = 0) const {
    std::vector<block_read> reads;
    if (length == 0) return reads;
    std::uint64_t end = 0;
    if (cunvme::detail::add_overflows(offset, length, end) || end > file_bytes_) {
      refuse("file bytes [" + std::to_string(offset) + ", +" + std::to_string(length) + ") run past the file's " + std::to_string(file_bytes_));
    }
    std::uint64_t block = offset / block_bytes_;
    const std::uint64_t last = (end - 1) / block_bytes_;
    for (const file_extent& e : extents_) {
      const std::uint64_t first_in = e.file_offset / block_bytes_;
      if (block > last) break;
      if (first_in + e.blocks <= block) continue;
      if (first_in > block) break;  // a hole before this extent
      const std::uint64_t n = std::min(last, first_in + e.blocks - 1) - block + 1;
      reads.push_back({e.lba + (block - first_in), n, buffer_offset});
      // The file's blocks end below 2^64 bytes (check_size), the buffer's need not.
      std::uint64_t bytes = 0;
      if (cunvme::detail::mul_overflows(n, block_bytes_, bytes) || cunvme::detail::add_overflows(buffer_offset, bytes, buffer_offset)) {
        refuse("file bytes [" + std::to_string(offset) + ", +" + std::to_string(length) + ") read to buffer offset " +
               std::to_string(reads.front().buffer_offset) + " would run past byte 2^64 - 1 of the buffer");
      }
      block += n;
    }
    if (block <= last) {
      refuse("file bytes [" + std::to_string(block * block_bytes_) + ", " + std::to_string(std::min(file_bytes_, (last + 1) * block_bytes_)) +
             ") lie on no block of the device (a hole, or a device shorter than the file)");
    }
    return reads;
  }

 private:
  file_placement(std::uint64_t block_bytes, std::uint64_t file_bytes, std::vector<file_extent> extents)
      : block_bytes_(block_bytes), file_bytes_(file_bytes), extents_(std::move(extents)) {}

  [[noreturn]] static void refuse(const std::string& reason) { throw host::error("Place a file on a namespace", "loader", reason); }
  static void check_block(std::uint64_t block_bytes) {
    // Readers need whole dwords per block (PRP entries are dword aligned); NVMe's LBA data
    // sizes stop far below 1 MiB, and the bound keeps plan_reads' alignment within 64 bits.
    if (block_bytes < 4 || block_bytes % 4 != 0 || block_bytes > (1u << 20)) {
      refuse("a block of " + std::to_string(block_bytes) + " bytes (a multiple of 4, at most 1 MiB, is needed)");
    }
  }

  /// Every block of the file, the last one whole, must end below 2^64 bytes: a plan widens
  /// ranges to blocks, and sizes past that would wrap to small numbers (a plan with its reads
  /// outside its buffer).
  static void check_size(std::uint64_t block_bytes, std::uint64_t file_bytes) {
    std::uint64_t padded = 0;
    if (cunvme::detail::round_up_overflows(file_bytes, block_bytes, padded)) {
      refuse("a file of " + std::to_string(file_bytes) + " bytes in " + std::to_string(block_bytes) + "-byte blocks ends past 2^64 bytes");
    }
  }

  std::uint64_t block_bytes_;
  std::uint64_t file_bytes_;
  std::vector<file_extent> extents_;
};

/// A byte range of the file wanted in the buffer.
struct byte_range {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

/// The reads that bring a set of file byte ranges into one buffer, and where each range lands.
struct read_plan {
  std::vector<block_read> reads;       ///< in buffer order
  std::vector<std::uint64_t> offsets;  ///< range i's first byte is at buffer + offsets[i]
  std::uint64_t buffer_bytes = 0;      ///< the buffer needs this many bytes
};

/// Where runs start in the buffer: a multiple of this (and of the block size), so a range's
/// address keeps its file offset's alignment modulo 4 KiB — elements the file aligns stay
/// aligned — and every read starts on a dword, as PRP entries must.
inline constexpr std::uint64_t run_alignment = 4096;

/// Plans `ranges` (in any order, possibly overlapping) into one buffer: ranges whose blocks
/// touch or overlap share one run of blocks, read once; runs start on `run_alignment`. Reads
/// go straight into the buffer the ranges are handed out from: nothing is copied after the
/// DMA. The price: up to two blocks per run of bytes nobody asked for, read and kept.
[[nodiscard]] inline read_plan plan_reads(const file_placement& where, const std::vector<byte_range>& ranges) {
  read_plan plan;
  plan.offsets.assign(ranges.size(), 0);
  const std::uint64_t block = where.block_bytes();
  const std::uint64_t align = std::lcm(run_alignment, block);
  std::vector<std::size_t> order(ranges.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return ranges[a].offset < ranges[b].offset; });

  std::uint64_t run_first = 0, run_end = 0, run_at = 0;  // blocks [run_first, run_end) at buffer run_at
  bool open = false;
  // Every size and offset of the plan is checked: a placement may claim a file of nearly
  // 2^64 bytes, and runs' padding adds to it, so any sum or product may wrap.
  const auto too_large = [] { throw host::error("Plan reads", "loader", "the buffer would exceed 2^64 - 1 bytes (the runs' padding included)"); };
  auto close_run = [&] {
    if (!open) return;
    // The last block may be a partial one at the end of the file: map the file's bytes only.
    // The file's blocks end below 2^64 (file_placement), so these cannot wrap.
    const std::uint64_t from = run_first * block;
    const std::uint64_t run_bytes = (run_end - run_first) * block;
    const std::uint64_t bytes = std::min(run_bytes, where.file_bytes() - from);
    std::uint64_t end = 0;
    if (cunvme::detail::add_overflows(run_at, run_bytes, end)) too_large();
    for (const block_read& r : where.map(from, bytes, run_at)) plan.reads.push_back(r);
    plan.buffer_bytes = end;
    open = false;
  };
  for (std::size_t i : order) {
    const byte_range& r = ranges[i];
    std::uint64_t end = 0;
    if (cunvme::detail::add_overflows(r.offset, r.length, end) || end > where.file_bytes()) {
      throw host::error("Plan reads", "loader", "file bytes [" + std::to_string(r.offset) + ", +" + std::to_string(r.length) + ") run past the file");
    }
    if (r.length == 0) {
      // Nothing to read: an empty tensor is handed out at the buffer's start, never past its
      // end (its file offset may lie in no run at all).
      plan.offsets[i] = 0;
      continue;
    }
    const std::uint64_t first = r.offset / block;
    const std::uint64_t stop = end / block + (end % block != 0 ? 1 : 0);
    if (!open || first > run_end) {
      close_run();
      std::uint64_t at = plan.buffer_bytes;
      if (cunvme::detail::round_up_overflows(at, align, at)) too_large();
      run_first = first, run_end = std::max(stop, first), run_at = at, open = true;
    } else {
      run_end = std::max(run_end, stop);
    }
    if (cunvme::detail::add_overflows(run_at, r.offset - run_first * block, plan.offsets[i])) too_large();
  }
  close_run();
  return plan;
}

}  // namespace loader
CUNVME_NAMESPACE_END
