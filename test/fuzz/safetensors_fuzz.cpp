// libFuzzer harness: the safetensors header parser (loader::parse) and the read planner over
// what it accepts. Each input is a whole file: its first 8 bytes the header length, then JSON.
//
// Oracles: parse either throws host::error (nothing else, no sanitizer report, no allocation
// beyond the 100 MB header cap's worth) or returns a header whose every tensor lies within the
// file, has end - begin == shape product × element size, and shares no byte with another;
// `find` finds each by name. Plans over the accepted tensors cover each tensor's bytes inside
// the buffer, and their reads stay on the file's blocks.
#include <cunvme/loader/layers.cuh>
#include <cunvme/loader/placement.cuh>
#include <cunvme/loader/safetensors.cuh>

#include "fuzz_check.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace loader = cunvme::loader;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  loader::safetensors_header h;
  try {
    h = loader::parse(bytes, size, size, "fuzz");
  } catch (const cunvme::host::error&) {
    return 0;
  }
  const std::uint64_t data_bytes = size - h.data_offset;
  FUZZ_CHECK(h.data_offset == 8 + h.header_bytes && h.data_offset <= size);
  std::vector<loader::byte_range> ranges;
  for (std::size_t i = 0; i < h.tensors.size(); ++i) {
    const loader::tensor_info& t = h.tensors[i];
    FUZZ_CHECK(t.begin <= t.end && t.end <= data_bytes);
    unsigned __int128 product = loader::element_bits(t.type);
    // Accepted shapes have every prefix product below 2^64 (the parser refuses at the first
    // that is not), so 128 bits hold each step exactly.
    for (std::uint64_t d : t.shape) product *= d;
    FUZZ_CHECK(t.shape.size() <= loader::max_rank);
    FUZZ_CHECK(product == static_cast<unsigned __int128>(t.bytes()) * 8);
    if (i > 0) FUZZ_CHECK(h.tensors[i - 1].begin <= t.begin);
    for (std::size_t j = 0; j < i; ++j) {
      const loader::tensor_info& u = h.tensors[j];
      if (t.bytes() != 0 && u.bytes() != 0) FUZZ_CHECK(u.end <= t.begin || t.end <= u.begin);
    }
    FUZZ_CHECK(h.find(t.name) == &t);
    ranges.push_back({h.file_offset(t), t.bytes()});
  }
  (void)loader::group_by_layer(h);
  for (const std::uint64_t block : {512u, 4096u}) {
    const auto where = loader::file_placement::contiguous(block, 0, size, (size + block - 1) / block);
    const loader::read_plan p = loader::plan_reads(where, ranges);
    // Inside the buffer, checked without a sum that could itself wrap.
    for (std::size_t i = 0; i < ranges.size(); ++i) FUZZ_CHECK(p.offsets[i] <= p.buffer_bytes && ranges[i].length <= p.buffer_bytes - p.offsets[i]);
    for (const loader::block_read& r : p.reads) {
      FUZZ_CHECK(r.lba + r.blocks <= (size + block - 1) / block);
      FUZZ_CHECK(r.buffer_offset <= p.buffer_bytes && r.blocks <= (p.buffer_bytes - r.buffer_offset) / block);
    }
  }
  return 0;
}
