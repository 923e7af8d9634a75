// Overflow-checked size arithmetic: the one implementation every size computed from a
// caller's or a controller's values goes through (block counts × block sizes, offset +
// length, entries × entry sizes), on the host and in device code alike. A product or sum that
// does not fit is reported, never wrapped: a wrapped size passes a bounds check and then
// moves more bytes than the buffer holds.
#pragma once

#include <cunvme/config.cuh>

#include <cuda/std/cstdint>
#include <cuda/std/limits>
#include <cuda/std/type_traits>

CUNVME_NAMESPACE_BEGIN
namespace detail {

/// Whether `a * b` does not fit in `T`; otherwise stores it in `product`. Unsigned integers
/// only (sizes), written without compiler builtins so it compiles for the device as well.
///
/// Usage: examples/snippets/spec.cpp, `bytes_of`.
template <class T>
[[nodiscard]] CUNVME_HOST_DEVICE constexpr bool mul_overflows(T a, T b, T& product) noexcept {
  static_assert(cuda::std::is_unsigned_v<T>, "checked arithmetic is for sizes: unsigned integers");
  if (b != 0 && a > cuda::std::numeric_limits<T>::max() / b) return true;
  product = static_cast<T>(a * b);
  return false;
}

/// Whether `a + b` does not fit in `T`; otherwise stores it in `sum`.
template <class T>
[[nodiscard]] CUNVME_HOST_DEVICE constexpr bool add_overflows(T a, T b, T& sum) noexcept {
  static_assert(cuda::std::is_unsigned_v<T>, "checked arithmetic is for sizes: unsigned integers");
  if (a > cuda::std::numeric_limits<T>::max() - b) return true;
  sum = static_cast<T>(a + b);
  return false;
}

/// `a + b`, or the largest `T` where that does not fit: a deadline `now + timeout` with a huge
/// timeout is "never", not a moment in the past.
template <class T>
[[nodiscard]] CUNVME_HOST_DEVICE constexpr T saturating_add(T a, T b) noexcept {
  T sum{};
  return add_overflows(a, b, sum) ? cuda::std::numeric_limits<T>::max() : sum;
}

/// `value` rounded up to a multiple of `granule` (a power of two, or any non-zero value), or
/// false when that does not fit in `T`.
template <class T>
[[nodiscard]] CUNVME_HOST_DEVICE constexpr bool round_up_overflows(T value, T granule, T& rounded) noexcept {
  static_assert(cuda::std::is_unsigned_v<T>, "checked arithmetic is for sizes: unsigned integers");
  const T rest = value % granule;
  if (rest == 0) {
    rounded = value;
    return false;
  }
  return add_overflows(value, static_cast<T>(granule - rest), rounded);
}

/// Whether [offset, offset + length) lies within `size` bytes, without forming a sum that can
/// wrap.
template <class T>
[[nodiscard]] CUNVME_HOST_DEVICE constexpr bool range_within(T offset, T length, T size) noexcept {
  static_assert(cuda::std::is_unsigned_v<T>, "checked arithmetic is for sizes: unsigned integers");
  return offset <= size && length <= size - offset;
}

}  // namespace detail
CUNVME_NAMESPACE_END
