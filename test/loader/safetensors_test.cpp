// The safetensors header parser: good headers read as written, and every kind of malformed
// header refused with a host::error that names the file and the entry.
#include <cunvme/loader/safetensors.cuh>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace loader = cunvme::loader;

namespace {

/// A file image: the length, `json`, then `data_bytes` bytes.
std::vector<std::byte> image(const std::string& json, std::uint64_t data_bytes) {
  std::vector<std::byte> f(8 + json.size() + data_bytes);
  const std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) f[static_cast<std::size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  for (std::size_t i = 0; i < json.size(); ++i) f[8 + i] = static_cast<std::byte>(json[i]);
  return f;
}

loader::safetensors_header parse(const std::string& json, std::uint64_t data_bytes) {
  const auto f = image(json, data_bytes);
  return loader::parse(f.data(), f.size(), f.size(), "test.safetensors");
}

/// The message of the error parsing `json` throws ("" when it parses).
std::string refusal(const std::string& json, std::uint64_t data_bytes = 64) {
  try {
    (void)parse(json, data_bytes);
  } catch (const cunvme::host::error& e) {
    CHECK(e.operation() == "Parse the safetensors header");
    CHECK(e.device() == "test.safetensors");
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a header reads as written: tensors by offset, metadata, the data offset") {
  const std::string json =
      R"({"b":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]},"__metadata__":{"format":"pt"},)"
      R"("a":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},"s":{"dtype":"I64","shape":[],"data_offsets":[32,40]}})";
  const auto h = parse(json + "    ", 40);
  CHECK(h.header_bytes == json.size() + 4);
  CHECK(h.data_offset == 8 + json.size() + 4);
  REQUIRE(h.tensors.size() == 3);
  CHECK(h.tensors[0].name == "a");
  CHECK(h.tensors[0].type == loader::dtype::F16);
  CHECK(h.tensors[0].shape == std::vector<std::uint64_t>{4});
  CHECK(h.tensors[1].name == "b");
  CHECK(h.tensors[1].bytes() == 24);
  CHECK(h.tensors[1].elements() == 6);
  CHECK(h.tensors[2].shape.empty());  // a scalar: one element
  CHECK(h.tensors[2].bytes() == 8);
  CHECK(h.metadata.at("format") == "pt");
  REQUIRE(h.find("b") != nullptr);
  CHECK(h.file_offset(*h.find("b")) == h.data_offset + 8);
  CHECK(h.find("nope") == nullptr);
}

TEST_CASE("every dtype the table names parses, with its element size") {
  for (const loader::dtype_entry& e : loader::dtype_table) {
    // 8 elements: whole bytes for every type, the packed sub-byte ones included.
    const std::uint64_t bytes = 8 * e.bits / 8;
    const std::string json = R"({"t":{"dtype":")" + std::string(e.name) + R"(","shape":[2,4],"data_offsets":[0,)" + std::to_string(bytes) + "]}}";
    CAPTURE(json);
    const auto h = parse(json, bytes);
    CHECK(h.tensors.at(0).type == e.type);
    CHECK(h.tensors.at(0).elements() == 8);
    CHECK(loader::name(e.type) == e.name);
    CHECK(loader::element_bits(e.type) == e.bits);
  }
}

TEST_CASE("the dtype table is safetensors' complete Dtype enum, each with its size in bits") {
  // safetensors 0.8's Dtype (safetensors/src/tensor.rs), in its order, with `bitsize()`.
  const std::pair<const char*, unsigned> reference[] = {
      {"BOOL", 8},  {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"U8", 8},   {"I8", 8},   {"F8_E5M2", 8}, {"F8_E4M3", 8},
      {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16}, {"U16", 16}, {"F16", 16}, {"BF16", 16}, {"I32", 32},
      {"U32", 32},  {"F32", 32}, {"C64", 64},    {"F64", 64},    {"I64", 64}, {"U64", 64},
  };
  REQUIRE(loader::dtype_table.size() == std::size(reference));
  for (const auto& [dtype_name, bits] : reference) {
    CAPTURE(dtype_name);
    const auto* e = std::find_if(loader::dtype_table.begin(), loader::dtype_table.end(), [&](const loader::dtype_entry& x) { return x.name == dtype_name; });
    REQUIRE(e != loader::dtype_table.end());
    CHECK(e->bits == bits);
    // As the reference's writer would write it: 16 elements.
    const std::string json = R"({"t":{"dtype":")" + std::string(dtype_name) + R"(","shape":[16],"data_offsets":[0,)" + std::to_string(2 * bits) + "]}}";
    CHECK(parse(json, 2 * bits).tensors.at(0).bytes() == 2 * bits);
  }
}

TEST_CASE("sub-byte tensors: bytes are elements x bits / 8, and a tensor that ends inside a byte is refused") {
  // F4: two elements a byte; F6: four elements in three bytes.
  CHECK(parse(R"({"t":{"dtype":"F4","shape":[3,2],"data_offsets":[0,3]}})", 3).tensors.at(0).bytes() == 3);
  CHECK(parse(R"({"t":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}})", 3).tensors.at(0).elements() == 4);
  CHECK(parse(R"({"t":{"dtype":"F6_E3M2","shape":[0],"data_offsets":[0,0]}})", 3).tensors.at(0).bytes() == 0);
  CHECK(refusal(R"({"t":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})").find("12 bits, not whole bytes") != std::string::npos);
  CHECK(refusal(R"({"t":{"dtype":"F6_E2M3","shape":[2],"data_offsets":[0,2]}})").find("12 bits, not whole bytes") != std::string::npos);
  CHECK(refusal(R"({"t":{"dtype":"F4","shape":[4],"data_offsets":[0,4]}})").find("is 2 bytes, data_offsets [0,4] span 4") != std::string::npos);
  // The element count times the bits is checked for overflow, as the reference does.
  CHECK(refusal(R"({"t":{"dtype":"F4","shape":[4611686018427387904,2],"data_offsets":[0,8]}})").find("more than 2^64") != std::string::npos);
}

TEST_CASE("gaps, trailing bytes, empty tensors and empty headers are accepted") {
  CHECK(parse("{}", 0).tensors.empty());
  const auto h = parse(R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},"e":{"dtype":"F32","shape":[0,5],"data_offsets":[6,6]}})", 4096);
  CHECK(h.tensors.size() == 2);
  CHECK(h.find("e")->bytes() == 0);
}

TEST_CASE("the header length is checked against the cap and the file") {
  std::vector<std::byte> f(8, std::byte{0});
  CHECK_THROWS_WITH_AS((void)loader::header_length(f.data(), 7, "f"), doctest::Contains("fewer than the 8"), cunvme::host::error);
  CHECK_THROWS_WITH_AS((void)loader::header_length(f.data(), 8, "f"), doctest::Contains("too short"), cunvme::host::error);
  const std::uint64_t over = loader::max_header_bytes + 1;
  for (int i = 0; i < 8; ++i) f[static_cast<std::size_t>(i)] = static_cast<std::byte>((over >> (8 * i)) & 0xff);
  CHECK_THROWS_WITH_AS((void)loader::header_length(f.data(), 1ull << 40, "f"), doctest::Contains("exceeds the format's limit"), cunvme::host::error);
  f.assign(8, std::byte{0xff});  // 2^64 - 1
  CHECK_THROWS_WITH_AS((void)loader::header_length(f.data(), 1ull << 40, "f"), doctest::Contains("exceeds"), cunvme::host::error);
  f.assign(8, std::byte{0});
  f[0] = std::byte{100};
  CHECK_THROWS_WITH_AS((void)loader::header_length(f.data(), 50, "f"), doctest::Contains("runs past the end of the file"), cunvme::host::error);
  CHECK(loader::header_length(f.data(), 108, "f") == 100);
  // parse() with too short a prefix says how much it needs.
  auto img = image("{}", 0);
  CHECK_THROWS_WITH_AS((void)loader::parse(img.data(), 9, img.size(), "f"), doctest::Contains("first 10 bytes"), cunvme::host::error);
}

TEST_CASE("malformed headers are refused, each with its reason") {
  struct bad {
    const char* json;
    const char* reason;
  };
  const std::string ok_entry = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";
  const bad cases[] = {
      {R"( {})", "does not start with '{'"},
      {R"([1,2])", "does not start with '{'"},
      {R"({"a":)", "not valid JSON"},
      {R"({"a":{}} x)", "not valid JSON"},
      {"{\"a\xff\":1}", "not valid JSON"},  // not UTF-8
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", "appears twice"},
      {R"({"a":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}})", "appears twice"},
      {R"({"__metadata__":{"k":"1","k":"2"}})", "appears twice"},
      {R"({"a":{"dtype":"F32","shape":[[2]],"data_offsets":[0,8]}})", "nested deeper"},
      {R"({"a":{"dtype":"F32","shape":[[[2]]],"data_offsets":[0,8]}})", "nested deeper"},
      {R"({"a":1})", "not an object"},
      {R"({"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "empty name"},
      {R"({"a":{"dtype":"F32","shape":[2]}})", "no 'data_offsets'"},
      {R"({"a":{"shape":[2],"data_offsets":[0,8]}})", "no 'dtype'"},
      {R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", "no 'shape'"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", "unknown field 'extra'"},
      {R"({"a":{"dtype":"F5","shape":[2],"data_offsets":[0,1]}})", "unknown dtype \"F5\""},
      {R"({"a":{"dtype":"F4","shape":[1],"data_offsets":[0,1]}})", "4 bits, not whole bytes"},
      {R"({"a":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}})", "unknown dtype"},
      {R"({"a":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", "unknown dtype 7"},
      {R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", "not an array"},
      {R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", "shape[0] is -2"},
      {R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", "shape[0] is 2.0"},
      {R"({"a":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,8]}})", "not an integer"},
      {R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", "more than 2^64 bits"},
      {R"({"a":{"dtype":"U8","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", "more than 2^64 bits"},
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "is 12 bytes, data_offsets [0,8] span 8"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", "end before they begin"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", "not [begin, end]"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,16]}})", "not [begin, end]"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0.0,8]}})", "data_offsets[0] is 0.0"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":["0",8]}})", "data_offsets[0]"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", "data_offsets[0] is -8"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[60,68]}})", "run past the end of the file"},
      {R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551615,0]}})", "end before they begin"},
      {R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", "overlap"},
      {R"({"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]},"b":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},"c":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", "'a' [0, 32) and 'c' [12, 16) overlap"},
      {R"({"__metadata__":[1]})", "__metadata__ is array"},
      {R"({"__metadata__":{"k":1}})", "__metadata__['k'] is 1"},
  };
  for (const bad& b : cases) {
    const std::string json = b.json, said = refusal(json);
    CAPTURE(json);
    CAPTURE(said);
    CHECK(said.find(b.reason) != std::string::npos);
  }
  CHECK(refusal(R"({"a":{)" + ok_entry + "}}") == "");
  // Deep nesting is refused at the first token past the format's depth, whatever follows.
  CHECK(refusal(R"({"a":{"shape":[[[[[[[[[[[[)" + std::string(100000, '[')).find("nested deeper") != std::string::npos);
  // Rank is bounded before the product is formed.
  std::string many = R"({"a":{"dtype":"U8","shape":[)";
  for (int i = 0; i < 65; ++i) many += i == 0 ? "1" : ",1";
  CHECK(refusal(many + R"(],"data_offsets":[0,1]}})").find("more than 64 elements") != std::string::npos);
  // A huge array is refused at its 65th element, before the rest is parsed (here the rest is
  // not even JSON: the error would otherwise be a syntax error).
  std::string huge = R"({"a":{"dtype":"U8","shape":[)";
  for (int i = 0; i < 500'000; ++i) huge += "1,";
  CHECK(refusal(huge + "x").find("more than 64 elements") != std::string::npos);
}
