// libFuzzer harness: the extent map parser (loader/extent_map.cuh) on any bytes. Oracles: a map
// is either parsed or refused with a host::error (no other exception, no crash, no sanitizer
// report); a parsed map formats back to exactly the input (the format has one spelling per map);
// its extents, checked here independently, are in file order, disjoint, inside the file's
// last device block and clear of LBA 2^64.
#include <cunvme/loader/extent_map.cuh>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

namespace host = cunvme::host;
namespace loader = cunvme::loader;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  loader::extent_map map;
  try {
    map = loader::parse_extent_map(text, "fuzz");
  } catch (const host::error&) {
    return 0;
  }
  if (loader::format_extent_map(map) != text) std::abort();
  const unsigned __int128 dbs = map.device_block_bytes;
  const unsigned __int128 end = (map.file_size + dbs - 1) / dbs * dbs;
  unsigned __int128 next = 0;
  for (const auto& e : map.extents) {
    const unsigned __int128 start = e.file_offset, stop = start + e.blocks * dbs;
    if (e.blocks == 0 || start < next || start >= map.file_size || stop > end || start % dbs != 0) std::abort();
    if (static_cast<unsigned __int128>(e.lba) + e.blocks - 1 > ~std::uint64_t{0}) std::abort();
    next = stop;
  }
  return 0;
}
