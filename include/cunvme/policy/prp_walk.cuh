// The PRP walk: one implementation of the rules a controller applies to a command's PRP
// entries (NVMe Base Specification 2.0, section 4.1.1 "Physical Region Page Entry and List",
// Figure 87), shared by the CPU emulator (`emu::prp_walker`) and the on-GPU null controller.
// It lives in namespace `prp` beside the builder (policy/prp.cuh), whose output it reads back.
// It is `__host__ __device__`, allocates nothing and throws nothing: memory is reached through
// the caller's two callbacks, so each controller keeps its own notion of what is reachable.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/policy/prp.cuh>
#include <cunvme/spec/queue_entry.cuh>
#include <cunvme/spec/status.cuh>

#include <cuda/std/bit>
#include <cuda/std/cstdint>

CUNVME_NAMESPACE_BEGIN
namespace prp {

/// Walks the PRPs of a `length`-byte transfer with memory pages of `page_size` bytes.
///
/// Calls `segment(bus, bytes) -> spec::status` for each piece of the data in transfer order
/// (each within one memory page; a non-success status ends the walk with that status) and
/// `read_entries(bus, std::uint64_t* out, count) -> bool` to fetch `count` (1..Chunk)
/// consecutive PRP list entries, all inside one memory page (false: Data Transfer Error).
/// A range passed to either may end exactly at 2^64; none wraps.
///
/// The rules, and the status a violation gets:
/// - PRP1 is dword aligned (bits 1:0 are zero) and may start anywhere in its page; it maps
///   up to that page's end. Otherwise PRP Offset Invalid.
/// - When the rest fits one page, PRP2 is that page's entry: page aligned, or PRP Offset Invalid.
/// - Beyond that PRP2 points to a PRP List: dword aligned, possibly with an offset into its
///   page; the list's 8-byte entries fill the rest of that page (a pointer that leaves no
///   whole entry before its page end is PRP Offset Invalid). Every list entry is page aligned.
///   When more pages remain than the list page has entries, its last entry points to the next
///   list page, which is page aligned (PRP Offset Invalid otherwise).
/// - A page size CC.MPS cannot select is Invalid Field in Command.
///
/// Bounded: every list page but the first maps at least page/8 - 1 pages of data, so the walk
/// makes at most ceil(length / page) + 1 `segment` calls and as many list reads, cycles in
/// the lists included. Callers bound `length` (MDTS) or stop the walk from `segment`.
CUNVME_EXEC_CHECK_DISABLE
template <unsigned Chunk = 1, class ReadEntries, class Segment>
[[nodiscard]] CUNVME_HOST_DEVICE spec::status walk(cuda::std::uint64_t prp1, cuda::std::uint64_t prp2, cuda::std::uint64_t length,
                                                   cuda::std::uint64_t page_size, ReadEntries&& read_entries, Segment&& segment) {
  static_assert(Chunk >= 1, "at least one list entry per read");
  constexpr auto ok = spec::status::successful_completion;
  if (length == 0) return ok;
  // A memory page size CC.MPS can select: a power of two, 4 KiB..128 MiB (valid_page_shift).
  if (page_size == 0 || (page_size & (page_size - 1)) != 0 || !valid_page_shift(static_cast<unsigned>(cuda::std::countr_zero(page_size)))) {
    return spec::status::invalid_field_in_command;
  }
  if (!spec::prp_dword_aligned(prp1)) return spec::status::prp_offset_invalid;
  const cuda::std::uint64_t mask = page_size - 1;

  const cuda::std::uint64_t room = page_size - (prp1 & mask);
  const cuda::std::uint64_t first = length < room ? length : room;
  if (const spec::status s = segment(prp1, first); s != ok) return s;
  cuda::std::uint64_t remaining = length - first;
  if (remaining == 0) return ok;

  if (remaining <= page_size) {
    // Exactly one more page: PRP2 is that page's entry and has no offset.
    if ((prp2 & mask) != 0) return spec::status::prp_offset_invalid;
    return segment(prp2, remaining);
  }

  if (!spec::prp_dword_aligned(prp2)) return spec::status::prp_offset_invalid;
  cuda::std::uint64_t list = prp2;
  cuda::std::uint64_t entries[Chunk];
  while (remaining > 0) {
    const cuda::std::uint64_t slots = (page_size - (list & mask)) / sizeof(cuda::std::uint64_t);
    if (slots == 0) return spec::status::prp_offset_invalid;  // 4 bytes before the page end: no entry fits
    // Rounded up by quotient and remainder: `remaining + page_size - 1` wraps near 2^64.
    const cuda::std::uint64_t pages_left = remaining / page_size + (remaining % page_size != 0 ? 1 : 0);
    // When more pages remain than this list page has slots, its last slot chains to the
    // next list page (4.1.1: "the last entry … is a pointer to the next PRP List").
    const bool chains = pages_left > slots;
    const cuda::std::uint64_t data_entries = chains ? slots - 1 : pages_left;
    const cuda::std::uint64_t to_read = chains ? slots : data_entries;
    cuda::std::uint64_t next_list = 0;
    // list + to_read * 8 stays within list's page, so no address below wraps.
    for (cuda::std::uint64_t done = 0; done < to_read;) {
      const cuda::std::uint64_t n = to_read - done < Chunk ? to_read - done : Chunk;
      if (!read_entries(list + done * sizeof(cuda::std::uint64_t), entries, n)) return spec::status::data_transfer_error;
      for (cuda::std::uint64_t i = 0; i < n; ++i, ++done) {
        if (done == data_entries) {  // only when chaining: the list page's last slot
          next_list = entries[i];
          ++done;  // == to_read: the chain pointer was the last entry to read
          break;
        }
        if ((entries[i] & mask) != 0) return spec::status::prp_offset_invalid;
        const cuda::std::uint64_t bytes = remaining < page_size ? remaining : page_size;
        if (const spec::status s = segment(entries[i], bytes); s != ok) return s;
        remaining -= bytes;
      }
    }
    if (chains) {
      // A chained list page starts at its page boundary, so every further page yields at
      // least page/8 - 1 data entries and the walk terminates.
      if ((next_list & mask) != 0) return spec::status::prp_offset_invalid;
      list = next_list;
    }
  }
  return ok;
}

}  // namespace prp
CUNVME_NAMESPACE_END
