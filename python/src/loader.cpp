// The loader's host side, bound: cunvme.safetensors (Python) reads the header through a Device
// and asks these for what the C++ loader would do. Errors of the format or of a placement are
// `cunvme.FormatError` (a ValueError).
#include "loader.hpp"

#include "errors.hpp"

#include <cunvme/host/error.cuh>
#include <cunvme/loader/layers.cuh>
#include <cunvme/loader/placement.cuh>
#include <cunvme/loader/safetensors.cuh>

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace nb = nanobind;
namespace loader = cunvme::loader;

namespace cunvme_python {
namespace {

/// Runs `f`, turning the loader's `host::error`s into FormatError (and a JSON library error,
/// should one ever escape the parser's own handling: it, too, can only come from the file).
template <class F>
auto as_format_error(F&& f) {
  try {
    return f();
  } catch (const cunvme::host::error& e) {
    throw format_failure{e.what()};
  } catch (const nlohmann::json::exception& e) {
    throw format_failure{std::string("Parse the safetensors header: ") + e.what()};
  }
}

nb::dict header_dict(const loader::safetensors_header& h) {
  nb::dict d;
  d["header_bytes"] = h.header_bytes;
  d["data_offset"] = h.data_offset;
  d["file_bytes"] = h.file_bytes;
  nb::list tensors;
  for (const loader::tensor_info& t : h.tensors) {
    nb::dict e;
    e["name"] = t.name;
    e["dtype"] = std::string(loader::name(t.type));
    e["element_bytes"] = loader::element_bytes(t.type);
    e["element_bits"] = loader::element_bits(t.type);
    nb::list shape;
    for (std::uint64_t s : t.shape) shape.append(s);
    e["shape"] = nb::tuple(shape);
    e["begin"] = t.begin;
    e["end"] = t.end;
    tensors.append(e);
  }
  d["tensors"] = tensors;
  nb::dict metadata;
  for (const auto& [k, v] : h.metadata) metadata[k.c_str()] = v;
  d["metadata"] = metadata;
  return d;
}

}  // namespace

void register_loader(nb::module_& m) {
  m.def("safetensors_header_length",
        [](nb::bytes first8, std::uint64_t file_bytes, const std::string& source) {
          // A file shorter than 8 bytes has fewer to give: header_length refuses it by its size
          // before it reads any.
          if (first8.size() < std::min<std::uint64_t>(8, file_bytes)) {
            throw format_failure{"Parse the safetensors header on " + source + ": the header length needs the file's first 8 bytes"};
          }
          std::array<std::byte, 8> padded{};
          std::memcpy(padded.data(), first8.data(), std::min<std::size_t>(8, first8.size()));
          return as_format_error([&] { return loader::header_length(padded.data(), file_bytes, source); });
        },
        nb::arg("first8"), nb::arg("file_bytes"), nb::arg("source"),
        "N, from a safetensors file's first 8 bytes (all of it when shorter), checked (C++ header_length).");
  m.def("safetensors_header",
        [](nb::bytes json, std::uint64_t file_bytes, const std::string& source) {
          const std::string_view text(json.c_str(), json.size());
          loader::safetensors_header h;
          {
            nb::gil_scoped_release release;  // up to 100 MB of JSON
            h = as_format_error([&] { return loader::parse_header(text, file_bytes, source); });
          }
          return header_dict(h);
        },
        nb::arg("json"), nb::arg("file_bytes"), nb::arg("source"),
        "The header's JSON (the N bytes after the length) parsed and checked by the C++ parser: a dict with header_bytes, "
        "data_offset, file_bytes, tensors (by data offset: name, dtype, element_bytes (1 for packed sub-byte types), element_bits, "
        "shape, begin, end) and metadata.");
  m.def("plan_reads",
        [](std::uint64_t block_bytes, std::uint64_t file_bytes, const std::vector<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>>& extents,
           const std::vector<std::pair<std::uint64_t, std::uint64_t>>& ranges) {
          return as_format_error([&] {
            std::vector<loader::file_extent> e;
            for (const auto& [offset, lba, blocks] : extents) e.push_back({offset, lba, blocks});
            const auto where = loader::file_placement::from_extents(block_bytes, file_bytes, std::move(e));
            std::vector<loader::byte_range> r;
            for (const auto& [offset, length] : ranges) r.push_back({offset, length});
            const loader::read_plan plan = loader::plan_reads(where, r);
            std::vector<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>> reads;
            for (const loader::block_read& b : plan.reads) reads.emplace_back(b.lba, b.blocks, b.buffer_offset);
            return std::make_tuple(plan.buffer_bytes, reads, plan.offsets);
          });
        },
        nb::arg("block_bytes"), nb::arg("file_bytes"), nb::arg("extents"), nb::arg("ranges"),
        "C++ plan_reads over file_placement::from_extents: (buffer_bytes, [(lba, blocks, buffer_offset)], [offset of each range]).");
  m.def("contiguous_extents",
        [](std::uint64_t block_bytes, std::uint64_t first_lba, std::uint64_t file_bytes, std::uint64_t device_blocks) {
          return as_format_error([&] {
            std::vector<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>> out;
            const auto where = loader::file_placement::contiguous(block_bytes, first_lba, file_bytes, device_blocks);
            for (const loader::file_extent& e : where.extents()) {
              out.emplace_back(e.file_offset, e.lba, e.blocks);
            }
            return out;
          });
        },
        nb::arg("block_bytes"), nb::arg("first_lba"), nb::arg("file_bytes"), nb::arg("device_blocks"),
        "The extents of file_placement::contiguous: [(file_offset, lba, blocks)].");
  m.def("default_layer_key", [](const std::string& name) { return loader::default_layer_key(name); }, nb::arg("name"),
        "The name up to the first all-digit dotted part ('model.layers.3.w' -> 'model.layers.3'), or ''.");
  m.def("group_keys",
        [](const std::vector<std::string>& keys) {
          loader::safetensors_header h;
          for (const std::string& k : keys) h.tensors.push_back({k, loader::dtype::U8, {}, 0, 0});
          std::vector<std::pair<std::string, std::vector<std::size_t>>> out;
          for (loader::layer_group& g : loader::group_by_layer(h, [](std::string_view k) { return std::string(k); })) {
            out.emplace_back(std::move(g.key), std::move(g.tensors));
          }
          return out;
        },
        nb::arg("keys"), "Indices grouped by equal key, groups in natural order (C++ group_by_layer).");
}

}  // namespace cunvme_python
