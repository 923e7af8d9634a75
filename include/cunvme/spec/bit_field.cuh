// A field of a little-endian register or structure word, by bit position.
//
// The spec layer never uses C++ bitfields: their layout is implementation-defined and a
// bitfield store to a register is a hidden read-modify-write (Linux nvme.h makes the same
// choice). Structures keep raw words; accessors extract fields with this helper.
#pragma once

#include <cunvme/config.cuh>

#include <cuda/std/cstdint>
#include <cuda/std/type_traits>

CUNVME_NAMESPACE_BEGIN
namespace spec {

/// Bits [Lsb, Lsb + Width) of a raw word of type `Raw`, read and written as `Value`.
///
/// @tparam Raw   unsigned integer type of the whole word (register or dword)
/// @tparam Lsb   position of the field's least significant bit
/// @tparam Width number of bits
/// @tparam Value type the field is presented as (an integer, `bool` or an enum)
///
/// Usage: examples/snippets/spec.cpp, `mqes_field`.
template <class Raw, unsigned Lsb, unsigned Width, class Value = Raw>
struct bit_field {
  static_assert(cuda::std::is_unsigned_v<Raw>, "a raw register word is an unsigned integer");
  static_assert(Width > 0 && Lsb + Width <= sizeof(Raw) * 8, "the field must lie inside the word");

  using raw_type   = Raw;
  using value_type = Value;
  static constexpr unsigned lsb   = Lsb;
  static constexpr unsigned width = Width;
  /// The field's bits, right-aligned.
  static constexpr Raw max = Width == sizeof(Raw) * 8 ? static_cast<Raw>(~Raw{0})
                                                      : static_cast<Raw>((Raw{1} << Width) - 1u);
  /// The field's bits in place.
  static constexpr Raw mask = static_cast<Raw>(max << Lsb);

  [[nodiscard]] CUNVME_HOST_DEVICE static constexpr Value get(Raw raw) noexcept {
    return static_cast<Value>((raw >> Lsb) & max);
  }

  /// `raw` with this field replaced by `value`; bits of `value` above `Width` are dropped
  /// (check `fits` first where the value comes from outside).
  [[nodiscard]] CUNVME_HOST_DEVICE static constexpr Raw set(Raw raw, Value value) noexcept {
    return static_cast<Raw>((raw & static_cast<Raw>(~mask)) |
                            ((static_cast<Raw>(value) & max) << Lsb));
  }

  /// Whether `value` is representable in the field without truncation.
  [[nodiscard]] CUNVME_HOST_DEVICE static constexpr bool fits(Value value) noexcept {
    return static_cast<cuda::std::uint64_t>(value) <= static_cast<cuda::std::uint64_t>(max);
  }
};

}  // namespace spec
CUNVME_NAMESPACE_END
