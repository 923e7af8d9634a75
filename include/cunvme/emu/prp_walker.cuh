// Turns a command's PRP entries into the list of memory segments its data occupies
// (NVMe Base Specification 2.0, section 4.1.1 "Physical Region Page Entry and List").
//
// Every rule a careful controller applies is applied here: dword-aligned PRP1, page-aligned
// later entries, PRP2 as an entry when the transfer spans two pages and as a list pointer
// beyond, lists chained through their last entry, every address inside a registered
// region, and CMB and host data not mixed unless CMBLOC.CDPMLS allows it.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/emu/dma_space.cuh>
#include <cunvme/spec/status.cuh>

#include <algorithm>
#include <cstdint>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace emu {

/// A piece of a transfer: `length` bytes at `offset` inside `region`.
struct data_segment {
  dma_region region;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

/// Walks PRP entries; reuses its buffers so the I/O path does not allocate once warm.
///
/// ```
/// emu::prp_walker walker;
/// auto status = walker.walk(dma.pin(), sqe.prp1, sqe.prp2, bytes, page_size, /*cmb mixing*/ false);
/// if (status == spec::status::successful_completion) for (auto& s : walker.segments()) …
/// ```
class prp_walker {
 public:
  [[nodiscard]] spec::status walk(const dma_space::view& dma, std::uint64_t prp1, std::uint64_t prp2, std::uint64_t length,
                                  std::uint64_t page_size, bool allow_cmb_mixing) {
    segments_.clear();
    saw_cmb_ = saw_other_ = false;
    if (length == 0) return spec::status::successful_completion;
    // PRP entries are dword aligned: bits 1:0 are reserved (Figure 87).
    if ((prp1 & 0x3u) != 0) return spec::status::prp_offset_invalid;

    const std::uint64_t first = std::min(length, page_size - (prp1 & (page_size - 1)));
    if (auto s = add(dma, prp1, first); s != spec::status::successful_completion) return s;
    std::uint64_t remaining = length - first;
    if (remaining == 0) return finish(allow_cmb_mixing);

    if (remaining <= page_size) {
      // Exactly one more page: PRP2 is that page's entry and has no offset.
      if ((prp2 & (page_size - 1)) != 0) return spec::status::prp_offset_invalid;
      if (auto s = add(dma, prp2, remaining); s != spec::status::successful_completion) return s;
      return finish(allow_cmb_mixing);
    }

    // PRP2 points at a PRP List; it may carry a dword-aligned offset into its page.
    if ((prp2 & 0x3u) != 0) return spec::status::prp_offset_invalid;
    std::uint64_t list = prp2;
    while (remaining > 0) {
      const std::uint64_t slots = (page_size - (list & (page_size - 1))) / sizeof(std::uint64_t);
      const std::uint64_t pages_left = (remaining + page_size - 1) / page_size;
      // When more pages remain than this list page has slots, its last slot chains to the
      // next list page (4.1.1: "the last entry … is a pointer to the next PRP List").
      const bool chains = pages_left > slots;
      const std::uint64_t data_entries = chains ? slots - 1 : pages_left;
      entries_.resize(static_cast<std::size_t>(chains ? slots : data_entries));
      if (!entries_.empty() && !dma.read(list, entries_.data(), entries_.size() * sizeof(std::uint64_t))) {
        return spec::status::data_transfer_error;
      }
      for (std::uint64_t i = 0; i < data_entries; ++i) {
        const std::uint64_t entry = entries_[static_cast<std::size_t>(i)];
        if ((entry & (page_size - 1)) != 0) return spec::status::prp_offset_invalid;
        const std::uint64_t chunk = std::min(remaining, page_size);
        if (auto s = add(dma, entry, chunk); s != spec::status::successful_completion) return s;
        remaining -= chunk;
      }
      if (chains) {
        list = entries_.back();
        // A chained list page starts at its page boundary, so every further page yields at
        // least one data entry and the walk terminates.
        if ((list & (page_size - 1)) != 0) return spec::status::prp_offset_invalid;
      }
    }
    return finish(allow_cmb_mixing);
  }

  [[nodiscard]] const std::vector<data_segment>& segments() const noexcept { return segments_; }

 private:
  [[nodiscard]] spec::status add(const dma_space::view& dma, std::uint64_t bus, std::uint64_t length) {
    if (!segments_.empty()) {
      data_segment& last = segments_.back();
      // Pages contiguous in bus space and in one region merge into one copy.
      if (last.region.bus + last.offset + last.length == bus && last.region.contains(bus, length)) {
        last.length += length;
        return spec::status::successful_completion;
      }
    }
    const auto region = dma.find(bus, length);
    if (!region) return spec::status::data_transfer_error;
    (region->kind == memory_kind::cmb ? saw_cmb_ : saw_other_) = true;
    segments_.push_back(data_segment{*region, bus - region->bus, length});
    return spec::status::successful_completion;
  }

  [[nodiscard]] spec::status finish(bool allow_cmb_mixing) const {
    if (saw_cmb_ && saw_other_ && !allow_cmb_mixing) return spec::status::invalid_use_of_controller_memory_buffer;
    return spec::status::successful_completion;
  }

  std::vector<data_segment> segments_;
  std::vector<std::uint64_t> entries_;
  bool saw_cmb_ = false;
  bool saw_other_ = false;
};

}  // namespace emu
CUNVME_NAMESPACE_END
