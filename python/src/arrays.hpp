// A caller's array as bytes (numpy and buffers, DLPack, __cuda_array_interface__), checked for
// what the extension needs before a pointer is handed on, and a CUDA stream from what Python
// libraries call one. Refusals are ValueError (size, layout, read-only) or TypeError (kind).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>

namespace cunvme_python {

/// The bytes of a caller's array, once checked: where they are, how many, on which side, and
/// the imported DLPack tensor or buffer, held until the transfer is done (an exporter may
/// hand out memory that lives only as long as its export).
struct array_bytes {
  std::byte* data = nullptr;
  std::size_t bytes = 0;
  bool gpu = false;
  nanobind::ndarray<nanobind::ro> exported{};
};

/// `obj`'s bytes: a `__cuda_array_interface__` array (GPU), else a DLPack array or a buffer.
/// `role` ("out", "src") names it in messages; `writable` refuses read-only arrays.
[[nodiscard]] array_bytes describe(nanobind::handle obj, const char* role, bool writable);

/// A CUDA stream from None (the legacy default stream), an int handle, a torch stream
/// (`.cuda_stream`), a cupy stream (`.ptr`) or an object with `__cuda_stream__`.
[[nodiscard]] std::uintptr_t stream_handle(nanobind::handle s);

/// Product of `count` and `size`; nullopt when it does not fit.
[[nodiscard]] inline std::optional<std::size_t> times(std::size_t count, std::size_t size) {
  if (size != 0 && count > std::numeric_limits<std::size_t>::max() / size) return std::nullopt;
  return count * size;
}

}  // namespace cunvme_python
