// PRP builders: turn (buffer, offset, length) into PRP1/PRP2 and, beyond two pages, a PRP
// list in memory the caller reserved for the command (NVMe 2.0 section 4.1.1). Host and
// device code use the same functions; nothing allocates.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/spec/queue_entry.cuh>

#include <cuda/std/concepts>
#include <cuda/std/cstdint>

CUNVME_NAMESPACE_BEGIN
namespace prp {

/// A buffer description a PRP builder (and so a reader) can take: the bus address of any byte
/// and the size of the pieces it is contiguous in.
template <class B>
concept buffer = requires(const B& b, cuda::std::uint64_t offset) {
  { b.bus(offset) } -> cuda::std::same_as<cuda::std::uint64_t>;
  { b.page_shift } -> cuda::std::convertible_to<unsigned>;
};

/// A buffer contiguous in bus address space (one registered region, a huge page, an IOVA range).
///
/// When to choose it: whenever the buffer is one bus range — the emulator's IOMMU maps every
/// buffer so, VFIO maps IOVA ranges so, a 2 MiB huge page is one. It costs one add per PRP
/// entry and no memory reads.
struct contiguous {
  cuda::std::uint64_t base = 0;
  static constexpr unsigned page_shift = 63;  // no page boundary ever splits it
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t bus(cuda::std::uint64_t offset) const noexcept { return base + offset; }
};

/// A buffer described page by page: 4 KiB host pages, 64 KiB GPU pages, any power of two.
///
/// When to choose it: buffers pinned page by page without an IOMMU (pagemap, the kernel
/// module's host pins, nvidia_p2p's 64 KiB GPU pages). Each PRP entry reads one page address;
/// the pages must be at least as large as the controller's page and aligned to it.
struct page_list {
  const cuda::std::uint64_t* pages = nullptr;  ///< bus address of each buffer page
  unsigned page_shift = 12;                    ///< log2 of the buffer's page size
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t bus(cuda::std::uint64_t offset) const noexcept {
    return pages[offset >> page_shift] + (offset & ((cuda::std::uint64_t{1} << page_shift) - 1));
  }
};

static_assert(buffer<contiguous>);
static_assert(buffer<page_list>);

/// Memory reserved for one command's PRP list: page aligned and contiguous, `capacity`
/// entries. Its last entry on each controller page chains to the next page when needed.
struct list_memory {
  cuda::std::uint64_t* entries = nullptr;  ///< where this code writes the list
  cuda::std::uint64_t bus = 0;             ///< where the controller reads it (its first page)
  cuda::std::uint32_t capacity = 0;
  /// The bus address of each controller page of the list, for list memory that is contiguous
  /// only page by page (4 KiB pages pinned without an IOMMU): chain pointers then go to the
  /// next page's own address (4.1.1 needs each list page, not the whole list, contiguous).
  /// nullptr: the whole list is one bus range from `bus`.
  const cuda::std::uint64_t* pages = nullptr;
};

struct prp_entries {
  cuda::std::uint64_t prp1 = 0;
  cuda::std::uint64_t prp2 = 0;
};

enum class build_result : cuda::std::uint8_t {
  ok,
  unaligned_start,    ///< PRP1 must be dword aligned
  pages_misaligned,   ///< a later controller page of the buffer does not start on a page boundary
  list_too_small,     ///< the transfer needs more list entries than were reserved
  list_misaligned,    ///< the list memory's bus address is not aligned to the controller page
  invalid_page_size,  ///< the controller page is not 2^12..2^27 bytes (CC.MPS), or the buffer's page shift exceeds 63
  range_overflow,     ///< offset + length, or the bus range of a list without `pages`, does not fit 64 bits
};

/// Whether 2^`page_shift` bytes is a controller page CC.MPS can select (4 KiB to 128 MiB).
[[nodiscard]] CUNVME_HOST_DEVICE constexpr bool valid_page_shift(unsigned page_shift) noexcept { return page_shift >= 12 && page_shift <= 27; }

/// Entries needed in the list memory for `length` bytes starting `first_offset` bytes into
/// a controller page of 2^`page_shift` bytes (chain pointers included). Exact for every
/// length up to 2^64 - 1 (at most about 2^52 entries); UINT64_MAX, which no list memory
/// holds, when `page_shift` is not a valid controller page.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t list_entries_needed(cuda::std::uint64_t first_offset, cuda::std::uint64_t length,
                                                                               unsigned page_shift) noexcept {
  if (!valid_page_shift(page_shift)) return ~cuda::std::uint64_t{0};
  const cuda::std::uint64_t page = cuda::std::uint64_t{1} << page_shift;
  const cuda::std::uint64_t first = page - (first_offset & (page - 1));
  if (length <= first + page) return 0;  // first + page ≤ 2^28: cannot wrap
  const cuda::std::uint64_t rest = length - first;
  // Rounded up by quotient and remainder: `rest + page - 1` wraps for lengths near 2^64.
  const cuda::std::uint64_t data_entries = rest / page + (rest % page != 0 ? 1 : 0);
  const cuda::std::uint64_t per_page = page / 8;
  // Every full list page but the last gives up one slot to the chain pointer.
  const cuda::std::uint64_t chains = data_entries > per_page ? (data_entries - 2) / (per_page - 1) : 0;
  return data_entries + chains;  // ≤ 2^52 + 2^52 / 511
}

/// Bytes of PRP list one command of up to `max_transfer` bytes can need, in whole controller
/// pages (at least one): the worst case starts PRP1 four bytes before a page boundary.
/// UINT64_MAX (no allocation succeeds) when `page_shift` is not a valid controller page.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t list_bytes_per_command(cuda::std::uint64_t max_transfer, unsigned page_shift) noexcept {
  if (!valid_page_shift(page_shift)) return ~cuda::std::uint64_t{0};
  const cuda::std::uint64_t page = cuda::std::uint64_t{1} << page_shift;
  // ≤ 2^53 entries: the byte count and its rounding fit 64 bits.
  const cuda::std::uint64_t bytes = (list_entries_needed(page - 4, max_transfer, page_shift) * 8 + page - 1) / page * page;
  return bytes > page ? bytes : page;
}

namespace detail {

/// Whether buffer bytes [from, from + n) (n ≥ 1, from + n - 1 representable) are one range
/// of bus addresses, as one PRP entry describes them: no buffer page boundary inside breaks it.
template <class Buffer>
[[nodiscard]] CUNVME_HOST_DEVICE constexpr bool one_bus_range(const Buffer& buffer, cuda::std::uint64_t from, cuda::std::uint64_t n) noexcept {
  const cuda::std::uint64_t start = buffer.bus(from);
  const cuda::std::uint64_t last = from + (n - 1);
  const cuda::std::uint64_t buffer_page_mask = (cuda::std::uint64_t{1} << buffer.page_shift) - 1;
  // The last byte of each buffer page in the range; the next page starts one past it and
  // cannot wrap because it is still ≤ last.
  for (cuda::std::uint64_t page_end = from | buffer_page_mask; page_end < last; page_end += buffer_page_mask + 1) {
    const cuda::std::uint64_t next = page_end + 1;
    if (buffer.bus(next) != start + (next - from)) return false;
  }
  return true;
}

}  // namespace detail

/// Fills `out` for bytes [offset, offset + length) of `buffer` with controller pages of
/// 2^`page_shift` bytes (CC.MPS + 12), writing a PRP list into `list` when the transfer
/// spans more than two pages.
///
/// Every precondition is checked and a violation returns its `build_result` (then `out` is
/// left zeroed and nothing is written past `list.capacity` entries): a valid controller page
/// (`valid_page_shift`) and buffer page shift (12..63), offset + length within 64 bits, a
/// dword-aligned start, each PRP entry's bytes one bus range (buffer pages at least as large
/// as the controller's and aligned to it, once the transfer leaves PRP1's page), and list
/// memory that is page aligned, large enough and not wrapping the bus address space.
///
/// Usage: examples/snippets/host.cpp, `build_prps`.
template <class Buffer>
[[nodiscard]] CUNVME_HOST_DEVICE constexpr build_result build(const Buffer& buffer, cuda::std::uint64_t offset, cuda::std::uint64_t length,
                                                          unsigned page_shift, list_memory list, prp_entries& out) noexcept {
  out = prp_entries{};
  const unsigned buffer_shift = static_cast<unsigned>(buffer.page_shift);
  if (!valid_page_shift(page_shift) || buffer_shift < 12 || buffer_shift > 63) return build_result::invalid_page_size;
  // The last byte, offset + length - 1, must be representable: every later sum stays below it.
  if (length != 0 && length - 1 > ~cuda::std::uint64_t{0} - offset) return build_result::range_overflow;
  const cuda::std::uint64_t page = cuda::std::uint64_t{1} << page_shift;
  prp_entries e{buffer.bus(offset), 0};
  if (!spec::prp_dword_aligned(e.prp1)) return build_result::unaligned_start;
  const cuda::std::uint64_t first = page - (e.prp1 & (page - 1));
  // Controller pages after the first must each be one contiguous, page-aligned piece of
  // bus space: true when the buffer's own pages are at least as large and aligned.
  if (length > first && buffer_shift < page_shift) return build_result::pages_misaligned;
  if (length != 0 && !detail::one_bus_range(buffer, offset, length < first ? length : first)) return build_result::pages_misaligned;
  if (length <= first) {
    out = e;
    return build_result::ok;
  }
  if (length <= first + page) {
    e.prp2 = buffer.bus(offset + first);
    if ((e.prp2 & (page - 1)) != 0 || !detail::one_bus_range(buffer, offset + first, length - first)) return build_result::pages_misaligned;
    out = e;
    return build_result::ok;
  }
  const cuda::std::uint64_t needed = list_entries_needed(e.prp1, length, page_shift);
  if (needed > list.capacity) return build_result::list_too_small;
  // Chain pointers sit in each list page's last slot, counted from a page boundary.
  if ((list.bus & (page - 1)) != 0) return build_result::list_misaligned;
  // As one range the whole list must fit below 2^64; page by page each page does, being aligned.
  if (list.pages == nullptr && needed * 8 - 1 > ~cuda::std::uint64_t{0} - list.bus) return build_result::range_overflow;
  e.prp2 = list.bus;
  const cuda::std::uint64_t per_page = page / 8;
  // needed ≤ capacity < 2^32 bounds length below 2^60: `at + page` cannot wrap.
  cuda::std::uint64_t slot = 0;
  for (cuda::std::uint64_t at = first; at < length; at += page) {
    const cuda::std::uint64_t chunk = length - at < page ? length - at : page;
    if ((slot + 1) % per_page == 0 && chunk != length - at) {
      // The last slot of a list page points to the next list page (4.1.1).
      const cuda::std::uint64_t next = list.pages != nullptr ? list.pages[(slot + 1) / per_page] : list.bus + (slot + 1) * 8;
      if ((next & (page - 1)) != 0) return build_result::list_misaligned;
      list.entries[slot] = next;
      ++slot;
    }
    const cuda::std::uint64_t entry = buffer.bus(offset + at);
    if ((entry & (page - 1)) != 0 || !detail::one_bus_range(buffer, offset + at, chunk)) return build_result::pages_misaligned;
    list.entries[slot++] = entry;
  }
  out = e;
  return build_result::ok;
}

}  // namespace prp
CUNVME_NAMESPACE_END
