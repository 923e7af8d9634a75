// PRP builders: turn (buffer, offset, length) into PRP1/PRP2 and, beyond two pages, a PRP
// list in memory the caller reserved for the command (NVMe 2.0 section 4.1.1). Host and
// device code use the same functions; nothing allocates.
#pragma once

#include <cunvme/config.cuh>

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
  cuda::std::uint64_t bus = 0;             ///< where the controller reads it
  cuda::std::uint32_t capacity = 0;
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
};

/// Entries needed in the list memory for `length` bytes starting `first_offset` bytes into
/// a controller page of 2^`page_shift` bytes (chain pointers included).
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t list_entries_needed(cuda::std::uint64_t first_offset,
                                                                               cuda::std::uint64_t length, unsigned page_shift) noexcept {
  const cuda::std::uint64_t page = cuda::std::uint64_t{1} << page_shift;
  const cuda::std::uint64_t first = page - (first_offset & (page - 1));
  if (length <= first + page) return 0;
  const cuda::std::uint64_t data_entries = (length - first + page - 1) / page;
  const cuda::std::uint64_t per_page = page / 8;
  // Every full list page but the last gives up one slot to the chain pointer.
  const cuda::std::uint64_t chains = data_entries > per_page ? (data_entries - 2) / (per_page - 1) : 0;
  return static_cast<cuda::std::uint32_t>(data_entries + chains);
}

/// Bytes of PRP list one command of up to `max_transfer` bytes can need, in whole controller
/// pages (at least one): the worst case starts PRP1 four bytes before a page boundary.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t list_bytes_per_command(cuda::std::uint64_t max_transfer, unsigned page_shift) noexcept {
  const cuda::std::uint64_t page = cuda::std::uint64_t{1} << page_shift;
  const cuda::std::uint64_t bytes = (cuda::std::uint64_t{list_entries_needed(page - 4, max_transfer, page_shift)} * 8 + page - 1) / page * page;
  return bytes > page ? bytes : page;
}

/// Fills `out` for bytes [offset, offset + length) of `buffer` with controller pages of
/// 2^`page_shift` bytes (CC.MPS + 12), writing a PRP list into `list` when the transfer
/// spans more than two pages.
///
/// ```
/// prp::prp_entries e;
/// if (prp::build(prp::page_list{buf.pages().data(), 12}, 0, 64 * 1024, 12, slot_list, e) == prp::build_result::ok) {
///   sqe.prp1 = e.prp1; sqe.prp2 = e.prp2;
/// }
/// ```
template <class Buffer>
[[nodiscard]] CUNVME_HOST_DEVICE constexpr build_result build(const Buffer& buffer, cuda::std::uint64_t offset, cuda::std::uint64_t length,
                                                          unsigned page_shift, list_memory list, prp_entries& out) noexcept {
  const cuda::std::uint64_t page = cuda::std::uint64_t{1} << page_shift;
  out = prp_entries{buffer.bus(offset), 0};
  if ((out.prp1 & 3u) != 0) return build_result::unaligned_start;
  const cuda::std::uint64_t first = page - (out.prp1 & (page - 1));
  if (length <= first) return build_result::ok;
  // Controller pages after the first must each be one contiguous, page-aligned piece of
  // bus space: true when the buffer's own pages are at least as large and aligned.
  if (buffer.page_shift < page_shift) return build_result::pages_misaligned;
  if (length <= first + page) {
    out.prp2 = buffer.bus(offset + first);
    return (out.prp2 & (page - 1)) == 0 ? build_result::ok : build_result::pages_misaligned;
  }
  if (list_entries_needed(out.prp1, length, page_shift) > list.capacity) return build_result::list_too_small;
  out.prp2 = list.bus;
  const cuda::std::uint64_t per_page = page / 8;
  cuda::std::uint32_t slot = 0;
  for (cuda::std::uint64_t at = first; at < length; at += page) {
    const bool last_data = at + page >= length;
    if ((slot + 1) % per_page == 0 && !last_data) {
      // The last slot of a list page points to the next list page (4.1.1).
      list.entries[slot] = list.bus + (cuda::std::uint64_t{slot} + 1) * 8;
      ++slot;
    }
    const cuda::std::uint64_t entry = buffer.bus(offset + at);
    if ((entry & (page - 1)) != 0) return build_result::pages_misaligned;
    list.entries[slot++] = entry;
  }
  return build_result::ok;
}

}  // namespace prp
CUNVME_NAMESPACE_END
