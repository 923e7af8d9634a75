// Tensors grouped by layer, for loading a model one layer at a time. Host code, no CUDA.
//
// Usage: examples/snippets/loader.cpp, `layers`.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/loader/safetensors.cuh>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace loader {

/// The layer a tensor belongs to: its name up to and including the first dot-separated part
/// that is all digits ("model.layers.12.attn.q.weight" → "model.layers.12"), or "" for names
/// with no such part (embeddings, the final norm, the head: one group of their own).
[[nodiscard]] inline std::string default_layer_key(std::string_view tensor) {
  std::size_t start = 0;
  while (start <= tensor.size()) {
    const std::size_t dot = std::min(tensor.find('.', start), tensor.size());
    const std::string_view part = tensor.substr(start, dot - start);
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return std::string(tensor.substr(0, dot));
    }
    start = dot + 1;
  }
  return {};
}

/// Orders keys as people read them: runs of digits compare as numbers ("layers.9" before
/// "layers.10"; leading zeros then length break ties), everything else bytewise; "" first.
[[nodiscard]] inline bool natural_less(std::string_view a, std::string_view b) {
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      std::size_t ei = i, ej = j;
      while (ei < a.size() && digit(a[ei])) ++ei;
      while (ej < b.size() && digit(b[ej])) ++ej;
      std::string_view x = a.substr(i, ei - i), y = b.substr(j, ej - j);
      const std::string_view xs = x.substr(std::min(x.find_first_not_of('0'), x.size()));
      const std::string_view ys = y.substr(std::min(y.find_first_not_of('0'), y.size()));
      if (xs.size() != ys.size()) return xs.size() < ys.size();
      if (xs != ys) return xs < ys;
      if (x.size() != y.size()) return x.size() < y.size();
      i = ei, j = ej;
    } else {
      if (a[i] != b[j]) return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]);
      ++i, ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

/// One layer: its key and its tensors (indices into `safetensors_header::tensors`, file order).
struct layer_group {
  std::string key;
  std::vector<std::size_t> tensors;
};

/// The header's tensors grouped by `key(name)`, groups in `natural_less` order of their keys.
[[nodiscard]] inline std::vector<layer_group> group_by_layer(const safetensors_header& h,
                                                             const std::function<std::string(std::string_view)>& key = default_layer_key) {
  std::map<std::string, std::vector<std::size_t>, bool (*)(std::string_view, std::string_view)> by_key(natural_less);
  for (std::size_t i = 0; i < h.tensors.size(); ++i) by_key[key(h.tensors[i].name)].push_back(i);
  std::vector<layer_group> groups;
  for (auto& [k, v] : by_key) groups.push_back({k, std::move(v)});
  return groups;
}

}  // namespace loader
CUNVME_NAMESPACE_END
