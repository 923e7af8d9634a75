// The safetensors format (Hugging Face): an 8-byte little-endian header length N, N bytes of
// JSON `{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}`,
// then the tensors' bytes; offsets count from the first byte after the header. Host code, no
// CUDA: the header is parsed with nlohmann-json (Debian `nlohmann-json3-dev`) and checked
// strictly, so a damaged or hostile file is a `host::error` naming the file and the entry,
// never a crash, a wrapped size or a read outside the file.
//
// Usage: examples/snippets/loader.cpp, `parse_file`.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/checked.cuh>
#include <cunvme/host/error.cuh>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace loader {

/// The element types safetensors names: its `Dtype` enum as of safetensors 0.8, in its order
/// (which is by size in bits). F4 and F6_* are packed: elements share bytes, and a tensor of
/// them must end on a byte (elements × bits a multiple of 8), as the reference requires.
enum class dtype : std::uint8_t {
  BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ,
  I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64
};

struct dtype_entry {
  dtype type;
  std::string_view name;  ///< as the header spells it
  std::uint8_t bits;      ///< per element (the reference's `bitsize()`)
};

/// One table: the name each dtype has in headers and its element size.
inline constexpr std::array<dtype_entry, 22> dtype_table{{
    {dtype::BOOL, "BOOL", 8},       {dtype::F4, "F4", 4},       {dtype::F6_E2M3, "F6_E2M3", 6},
    {dtype::F6_E3M2, "F6_E3M2", 6}, {dtype::U8, "U8", 8},       {dtype::I8, "I8", 8},
    {dtype::F8_E5M2, "F8_E5M2", 8}, {dtype::F8_E4M3, "F8_E4M3", 8}, {dtype::F8_E8M0, "F8_E8M0", 8},
    {dtype::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8}, {dtype::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8},
    {dtype::I16, "I16", 16},        {dtype::U16, "U16", 16},    {dtype::F16, "F16", 16},
    {dtype::BF16, "BF16", 16},      {dtype::I32, "I32", 32},    {dtype::U32, "U32", 32},
    {dtype::F32, "F32", 32},        {dtype::C64, "C64", 64},    {dtype::F64, "F64", 64},
    {dtype::I64, "I64", 64},        {dtype::U64, "U64", 64},
}};
static_assert([] {
  for (std::size_t i = 0; i < dtype_table.size(); ++i) {
    if (static_cast<std::size_t>(dtype_table[i].type) != i) return false;
  }
  return true;
}(), "dtype_table is indexed by dtype: keep it in the enum's order");

[[nodiscard]] constexpr std::string_view name(dtype t) noexcept { return dtype_table[static_cast<std::size_t>(t)].name; }
[[nodiscard]] constexpr unsigned element_bits(dtype t) noexcept { return dtype_table[static_cast<std::size_t>(t)].bits; }
/// Bytes per element; 1 for the packed sub-byte types, whose elements share bytes: in both
/// cases the alignment a typed view of the tensor's first byte needs.
[[nodiscard]] constexpr unsigned element_bytes(dtype t) noexcept { return element_bits(t) < 8 ? 1 : element_bits(t) / 8; }

/// The format's own cap on N (the reference implementation's MAX_HEADER_SIZE): parsing never
/// holds more than this much JSON.
inline constexpr std::uint64_t max_header_bytes = 100'000'000;
/// Dimensions per tensor: far above any real tensor, and it bounds what one entry may cost.
inline constexpr std::size_t max_rank = 64;

/// One tensor of the file. `begin` and `end` count from the start of the data (the byte after
/// the header), as the header's data_offsets do; `end - begin == bytes()`.
struct tensor_info {
  std::string name;
  loader::dtype type = dtype::U8;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;

  [[nodiscard]] std::uint64_t bytes() const noexcept { return end - begin; }
  /// The shape's product (a parsed header's fits: elements × bits was checked below 2^64).
  [[nodiscard]] std::uint64_t elements() const noexcept {
    std::uint64_t n = 1;
    for (std::uint64_t d : shape) n *= d;
    return n;
  }
};

/// A parsed, checked header.
struct safetensors_header {
  std::uint64_t header_bytes = 0;  ///< N
  std::uint64_t data_offset = 0;   ///< 8 + N: where tensor offsets count from, in the file
  std::uint64_t file_bytes = 0;    ///< the file's size it was checked against
  std::vector<tensor_info> tensors;                ///< by `begin`, then by name
  std::map<std::string, std::string> metadata;     ///< "__metadata__", if any

  /// The tensor called `name`, or nullptr.
  [[nodiscard]] const tensor_info* find(std::string_view tensor) const {
    const auto it = index_.find(std::string(tensor));
    return it == index_.end() ? nullptr : &tensors[it->second];
  }
  /// The file byte offset of a tensor's first byte.
  [[nodiscard]] std::uint64_t file_offset(const tensor_info& t) const noexcept { return data_offset + t.begin; }

  void build_index() {
    index_.clear();
    for (std::size_t i = 0; i < tensors.size(); ++i) index_.emplace(tensors[i].name, i);
  }

 private:
  std::unordered_map<std::string, std::size_t> index_;
};

namespace detail {

inline constexpr std::string_view parse_operation = "Parse the safetensors header";

[[noreturn]] inline void refuse(std::string_view source, const std::string& reason) {
  throw host::error(std::string(parse_operation), std::string(source), reason);
}

/// A header value as an unsigned 64-bit integer; `what` names it in the error. JSON numbers
/// with a fraction or exponent, negative ones and ones past 2^64 - 1 (which nlohmann reads as
/// floating point) are refused.
[[nodiscard]] inline std::uint64_t unsigned_value(const nlohmann::json& v, std::string_view source, const std::string& what) {
  if (!v.is_number_unsigned()) refuse(source, what + " is " + v.dump() + ", not an integer in 0..2^64-1");
  return v.get<std::uint64_t>();
}

/// Watches the parse: refuses duplicate keys in any object (nlohmann would keep the last one
/// silently: two different tensors under one name), nesting deeper than the format's three
/// levels (top object, tensor entry, shape array) and arrays longer than `max_rank` (the
/// format's arrays are a shape and a pair of offsets), each at the first token past the limit,
/// so a hostile header never grows a large document first.
class parse_guard {
 public:
  explicit parse_guard(std::string_view source) : source_(source) {}

  bool operator()(int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using event_t = nlohmann::json::parse_event_t;
    if (depth > 3) refuse(source_, "JSON nested deeper than the format's three levels (object, tensor entry, shape)");
    switch (event) {
      case event_t::object_start:
        open_.push_back({false, 0});
        keys_.emplace_back();
        break;
      case event_t::array_start: open_.push_back({true, 0}); break;
      case event_t::object_end:
        open_.pop_back();
        keys_.pop_back();
        counted();
        break;
      case event_t::array_end:
        open_.pop_back();
        counted();
        break;
      case event_t::value: counted(); break;
      case event_t::key:
        if (!keys_.back().insert(parsed.get<std::string>()).second) {
          refuse(source_, "the key '" + parsed.get<std::string>() + "' appears twice in one object");
        }
        break;
    }
    return true;
  }

 private:
  struct container {
    bool array;
    std::size_t values;
  };
  /// A value completed: one more element of the array it is in, if any.
  void counted() {
    if (!open_.empty() && open_.back().array && ++open_.back().values > max_rank) {
      refuse(source_, "an array of more than " + std::to_string(max_rank) + " elements (shapes have at most " + std::to_string(max_rank) +
                          " dimensions, data_offsets two)");
    }
  }

  std::string_view source_;
  std::vector<container> open_;
  std::vector<std::set<std::string>> keys_;
};

[[nodiscard]] inline dtype dtype_named(const nlohmann::json& v, std::string_view source, const std::string& tensor) {
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    for (const dtype_entry& e : dtype_table) {
      if (e.name == s) return e.type;
    }
  }
  std::string known;
  for (const dtype_entry& e : dtype_table) known += (known.empty() ? "" : ", ") + std::string(e.name);
  refuse(source, "tensor '" + tensor + "': unknown dtype " + v.dump() + " (known: " + known + ")");
}

[[nodiscard]] inline tensor_info tensor_entry(const std::string& tensor, const nlohmann::json& entry, std::uint64_t data_bytes,
                                              std::string_view source) {
  const std::string at = "tensor '" + tensor + "'";
  if (tensor.empty()) refuse(source, "a tensor has an empty name");
  if (!entry.is_object()) refuse(source, at + ": its entry is " + std::string(entry.type_name()) + ", not an object");
  for (const auto& [key, value] : entry.items()) {
    (void)value;
    if (key != "dtype" && key != "shape" && key != "data_offsets") refuse(source, at + ": unknown field '" + key + "'");
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key)) refuse(source, at + ": no '" + key + "'");
  }
  tensor_info t;
  t.name = tensor;
  t.type = dtype_named(entry["dtype"], source, tensor);

  const nlohmann::json& shape = entry["shape"];
  if (!shape.is_array()) refuse(source, at + ": shape is " + shape.dump() + ", not an array");
  if (shape.size() > max_rank) refuse(source, at + ": " + std::to_string(shape.size()) + " dimensions (at most " + std::to_string(max_rank) + ")");
  // In bits, as the reference counts (so sub-byte types need no special case), overflow-checked
  // at every step.
  std::uint64_t bits = element_bits(t.type);
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const std::uint64_t extent = unsigned_value(shape[d], source, at + ": shape[" + std::to_string(d) + "]");
    t.shape.push_back(extent);
    if (cunvme::detail::mul_overflows(bits, extent, bits)) refuse(source, at + ": shape " + shape.dump() + " holds more than 2^64 bits");
  }
  if (bits % 8 != 0) {
    refuse(source, at + ": shape " + shape.dump() + " of " + std::string(name(t.type)) + " is " + std::to_string(bits) +
                       " bits, not whole bytes (a packed tensor must end on a byte)");
  }
  const std::uint64_t bytes = bits / 8;

  const nlohmann::json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) refuse(source, at + ": data_offsets is " + offsets.dump() + ", not [begin, end]");
  t.begin = unsigned_value(offsets[0], source, at + ": data_offsets[0]");
  t.end = unsigned_value(offsets[1], source, at + ": data_offsets[1]");
  if (t.end < t.begin) refuse(source, at + ": data_offsets " + offsets.dump() + " end before they begin");
  if (t.end - t.begin != bytes) {
    refuse(source, at + ": shape " + shape.dump() + " of " + std::string(name(t.type)) + " is " + std::to_string(bytes) +
                       " bytes, data_offsets " + offsets.dump() + " span " + std::to_string(t.end - t.begin));
  }
  if (t.end > data_bytes) {
    refuse(source, at + ": data_offsets " + offsets.dump() + " run past the end of the file (" + std::to_string(data_bytes) +
                       " data bytes after the header)");
  }
  return t;
}

}  // namespace detail

/// N from a file's first 8 bytes, checked against the format's cap and the file's size.
[[nodiscard]] inline std::uint64_t header_length(const std::byte* first8, std::uint64_t file_bytes, std::string_view source) {
  if (file_bytes < 8) detail::refuse(source, "the file has " + std::to_string(file_bytes) + " bytes, fewer than the 8 of the header length");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<std::uint64_t>(first8[i]);  // little endian on any host
  if (n < 2) detail::refuse(source, "header length " + std::to_string(n) + ": too short for a JSON object");
  if (n > max_header_bytes) {
    detail::refuse(source, "header length " + std::to_string(n) + " exceeds the format's limit of " + std::to_string(max_header_bytes) + " bytes");
  }
  if (n > file_bytes - 8) {
    detail::refuse(source, "header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(file_bytes) + " bytes)");
  }
  return n;
}

/// Parses and checks the header's JSON (`json`: the N bytes after the length) of a file of
/// `file_bytes` bytes. Checked: the text is one JSON object (whitespace after it, as writers
/// pad with, is fine) starting with '{', valid UTF-8, with no duplicate key; "__metadata__" is
/// an object of strings; every other key is a non-empty tensor name whose entry has exactly
/// dtype (a known one), shape (at most `max_rank` integers, their product × the element's bits
/// within 2^64 and a multiple of 8) and data_offsets ([begin, end], integers, end - begin the shape's bytes, end
/// within the file); no two tensors share a byte. Gaps between tensors and bytes after the
/// last are accepted (the reference implementation refuses them): a file padded to whole
/// blocks for a block device still loads. Throws `host::error` naming `source`.
[[nodiscard]] inline safetensors_header parse_header(std::string_view json, std::uint64_t file_bytes, std::string_view source) {
  safetensors_header h;
  h.header_bytes = json.size();
  if (h.header_bytes > max_header_bytes) detail::refuse(source, "a header of " + std::to_string(json.size()) + " bytes exceeds the format's limit");
  if (file_bytes < 8 || h.header_bytes > file_bytes - 8) detail::refuse(source, "the header runs past the end of the file");
  h.data_offset = 8 + h.header_bytes;
  h.file_bytes = file_bytes;
  const std::uint64_t data_bytes = file_bytes - h.data_offset;
  if (json.empty() || json.front() != '{') detail::refuse(source, "the header does not start with '{'");

  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(json.begin(), json.end(), detail::parse_guard(source));
  } catch (const nlohmann::json::exception& e) {
    detail::refuse(source, std::string("not valid JSON: ") + e.what());
  }
  if (!doc.is_object()) detail::refuse(source, "the header is " + std::string(doc.type_name()) + ", not a JSON object");

  for (const auto& [key, value] : doc.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) detail::refuse(source, "__metadata__ is " + std::string(value.type_name()) + ", not an object of strings");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) detail::refuse(source, "__metadata__['" + k + "'] is " + v.dump() + ", not a string");
        h.metadata.emplace(k, v.get<std::string>());
      }
      continue;
    }
    h.tensors.push_back(detail::tensor_entry(key, value, data_bytes, source));
  }

  std::sort(h.tensors.begin(), h.tensors.end(), [](const tensor_info& a, const tensor_info& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.name < b.name;
  });
  // Sorted by begin, two tensors share a byte exactly when one begins before a non-empty
  // earlier one ends; the farthest end so far covers every earlier tensor. Empty tensors
  // hold no byte and overlap nothing.
  const tensor_info* reaching = nullptr;
  for (const tensor_info& t : h.tensors) {
    if (t.bytes() == 0) continue;
    if (reaching != nullptr && t.begin < reaching->end) {
      detail::refuse(source, "tensors '" + reaching->name + "' [" + std::to_string(reaching->begin) + ", " + std::to_string(reaching->end) +
                                 ") and '" + t.name + "' [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + ") overlap");
    }
    if (reaching == nullptr || t.end > reaching->end) reaching = &t;
  }
  h.build_index();
  return h;
}

/// `parse_header` over a file's first bytes: the length, then the JSON, from `prefix` (which
/// must hold at least 8 + N bytes; fewer is refused, naming how many are needed).
[[nodiscard]] inline safetensors_header parse(const std::byte* prefix, std::uint64_t prefix_bytes, std::uint64_t file_bytes, std::string_view source) {
  if (prefix_bytes < 8) detail::refuse(source, "the header length needs the file's first 8 bytes");
  const std::uint64_t n = header_length(prefix, file_bytes, source);
  if (prefix_bytes - 8 < n) detail::refuse(source, "the header needs the file's first " + std::to_string(8 + n) + " bytes");
  return parse_header(std::string_view(reinterpret_cast<const char*>(prefix) + 8, static_cast<std::size_t>(n)), file_bytes, source);
}

}  // namespace loader
CUNVME_NAMESPACE_END
