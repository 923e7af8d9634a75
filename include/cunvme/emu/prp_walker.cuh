// Turns a command's PRP entries into the list of memory segments its data occupies
// (NVMe Base Specification 2.0, section 4.1.1 "Physical Region Page Entry and List").
//
// The PRP rules themselves (dword-aligned PRP1, page-aligned later entries, PRP2 as an entry
// when the transfer spans two pages and as a list pointer beyond, lists chained through their
// last entry) are `prp::walk`'s, shared with the on-GPU null controller; this adds what the
// CPU emulator knows: every address inside a registered region, and CMB and host data not
// mixed unless CMBLOC.CDPMLS allows it.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/emu/dma_space.cuh>
#include <cunvme/policy/prp_walk.cuh>
#include <cunvme/spec/status.cuh>

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
/// Usage: examples/snippets/emu.cpp, `walk_prps`.
class prp_walker {
 public:
  [[nodiscard]] spec::status walk(const dma_space::view& dma, std::uint64_t prp1, std::uint64_t prp2, std::uint64_t length,
                                  std::uint64_t page_size, bool allow_cmb_mixing) {
    segments_.clear();
    saw_cmb_ = saw_other_ = false;
    // A whole 4 KiB list page per read, as one region lookup.
    const spec::status s = prp::walk<512>(
        prp1, prp2, length, page_size,
        [&](std::uint64_t bus, std::uint64_t* entries, std::uint64_t count) { return dma.read(bus, entries, count * sizeof(std::uint64_t)); },
        [&](std::uint64_t bus, std::uint64_t bytes) { return add(dma, bus, bytes); });
    if (s != spec::status::successful_completion) return s;
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
  bool saw_cmb_ = false;
  bool saw_other_ = false;
};

}  // namespace emu
CUNVME_NAMESPACE_END
