// libFuzzer harness: the read planner (loader::plan_reads) over placements and ranges of any
// 64-bit sizes — a placement from extents may claim a file of nearly 2^64 bytes, where sums of
// run padding wrap.
//
// Input: little-endian 64-bit words: block size selector, file size, then extents (file
// offset, LBA, blocks) and ranges (offset, length), as many as the input holds.
//
// Oracles: building the placement and planning either throw host::error (nothing else, no
// sanitizer report) or give a plan whose every range and every read lies inside its buffer —
// checked without a sum that could itself wrap — and whose reads together cover each range.
#include <cunvme/loader/placement.cuh>

#include "fuzz_check.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace loader = cunvme::loader;

namespace {

struct words {
  const std::uint8_t* data;
  std::size_t size;
  bool next(std::uint64_t& w) {
    if (size < 8) return false;
    std::memcpy(&w, data, 8);
    data += 8, size -= 8;
    return true;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  words in{data, size};
  std::uint64_t selector = 0, file_bytes = 0, counts = 0;
  if (!in.next(selector) || !in.next(file_bytes) || !in.next(counts)) return 0;
  constexpr std::uint64_t blocks[] = {512, 4096, 520, 4104, 8};
  const std::uint64_t block = blocks[selector % 5];
  // Sizes near 2^64 are the interesting ones: let the top bit of the selector flip the file size.
  if ((selector >> 63) != 0) file_bytes = ~file_bytes;
  std::vector<loader::file_extent> extents;
  const std::uint64_t extent_count = (counts & 0xff) % 5, range_count = ((counts >> 8) & 0xff) % 9;
  for (std::uint64_t i = 0; i < extent_count; ++i) {
    loader::file_extent e;
    if (!in.next(e.file_offset) || !in.next(e.lba) || !in.next(e.blocks)) return 0;
    extents.push_back(e);
  }
  std::vector<loader::byte_range> ranges;
  for (std::uint64_t i = 0; i < range_count; ++i) {
    loader::byte_range r;
    if (!in.next(r.offset) || !in.next(r.length)) return 0;
    ranges.push_back(r);
  }
  try {
    const auto where = extent_count == 0 ? loader::file_placement::contiguous(block, 0, file_bytes, ~std::uint64_t{0})
                                         : loader::file_placement::from_extents(block, file_bytes, extents);
    const loader::read_plan p = loader::plan_reads(where, ranges);
    FUZZ_CHECK(p.offsets.size() == ranges.size());
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      FUZZ_CHECK(p.offsets[i] <= p.buffer_bytes);
      FUZZ_CHECK(ranges[i].length <= p.buffer_bytes - p.offsets[i]);
    }
    for (const loader::block_read& r : p.reads) {
      FUZZ_CHECK(r.blocks > 0);
      FUZZ_CHECK(r.buffer_offset <= p.buffer_bytes);
      FUZZ_CHECK(r.blocks <= (p.buffer_bytes - r.buffer_offset) / block);
    }
    // Each range's bytes are read: some read covers its first and its last byte in the buffer.
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      if (ranges[i].length == 0) continue;
      for (const std::uint64_t at : {p.offsets[i], p.offsets[i] + ranges[i].length - 1}) {
        bool covered = false;
        for (const loader::block_read& r : p.reads) covered = covered || (at >= r.buffer_offset && at - r.buffer_offset < r.blocks * block);
        FUZZ_CHECK(covered);
      }
    }
  } catch (const cunvme::host::error&) {
  }
  return 0;
}
