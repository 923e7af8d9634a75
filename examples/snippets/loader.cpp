// Usage snippets of the loader's host side (include/cunvme/loader/safetensors.cuh,
// placement.cuh, layers.cuh), compiled and run by `meson test` (suite `snippets`) so they cannot
// drift from the headers. Each function is the snippet a header's comment points to by name;
// main runs them on a small safetensors file it builds in memory.
#include "snippet_check.hpp"

#include <cunvme/loader/layers.cuh>
#include <cunvme/loader/placement.cuh>
#include <cunvme/loader/safetensors.cuh>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace ld = cunvme::loader;

namespace {

using snippet::expect;

/// `header_length` and `parse_header`: the 8-byte length, then the JSON it announces.
ld::safetensors_header parse_file(const std::vector<std::byte>& file) {
  const std::uint64_t n = ld::header_length(file.data(), file.size(), "model.safetensors");
  // … read bytes [8, 8 + n) …
  const std::string_view json_text(reinterpret_cast<const char*>(file.data()) + 8, n);
  ld::safetensors_header h = ld::parse_header(json_text, file.size(), "model.safetensors");
  for (const ld::tensor_info& t : h.tensors) std::printf("%s at file byte %llu\n", t.name.c_str(), static_cast<unsigned long long>(h.data_offset + t.begin));
  return h;
}

/// `file_placement` and `plan_reads`: the block reads that bring byte ranges into one buffer.
ld::read_plan plan(std::uint64_t file_bytes, std::uint64_t dev_blocks, const ld::safetensors_header& h) {
  auto where = ld::file_placement::contiguous(512, /*first_lba*/ 0, file_bytes, dev_blocks);
  std::vector<ld::byte_range> ranges;
  for (const auto& t : h.tensors) ranges.push_back({h.file_offset(t), t.bytes()});
  ld::read_plan p = ld::plan_reads(where, ranges);
  // for (const auto& r : p.reads) … copy_n(dev, r.lba, r.blocks, buffer + r.buffer_offset, stream) …
  // range i's bytes are then at buffer + p.offsets[i]
  return p;
}

/// `group_by_layer`: layers by the default key, or by a key of your own.
std::size_t layers(const ld::safetensors_header& header) {
  auto groups = ld::group_by_layer(header);  // "model.layers.7.mlp.w" → "model.layers.7"
  auto mine = ld::group_by_layer(header, [](std::string_view n) { return std::string(n.substr(0, n.find('/'))); });
  return groups.size() * 100 + mine.size();
}

}  // namespace

int main() {
  const std::string json =
      R"({"model.layers.7.mlp.w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
      R"("model.layers.10.mlp.w":{"dtype":"F32","shape":[4],"data_offsets":[16,32]}})";
  std::vector<std::byte> file(8 + json.size() + 32);
  const std::uint64_t n = json.size();
  std::memcpy(file.data(), &n, 8);
  std::memcpy(file.data() + 8, json.data(), json.size());
  const ld::safetensors_header h = parse_file(file);
  expect(h.tensors.size() == 2, "parse_header");
  const ld::read_plan p = plan(file.size(), 1024, h);
  expect(p.reads.size() == 1 && p.offsets.size() == 2, "plan_reads");
  expect(layers(h) == 202, "group_by_layer");
  return snippet::finish("loader");
}
