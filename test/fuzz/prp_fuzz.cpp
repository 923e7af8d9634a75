// libFuzzer harness: PRP build (prp::build, list_entries_needed, list_bytes_per_command) and
// PRP walk (prp::walk, emu::prp_walker) against a small model of NVMe 2.0 section 4.1.1
// written here, one rule per line, with no shared code.
//
// Each input is either a build case or a walk case (first byte):
// - build: a buffer (contiguous, or a page list with page sizes 4 KiB..128 KiB and aligned,
//   unaligned or scattered pages), an offset, a length (small, page multiples, near 2^64),
//   a controller page size (mostly 4..64 KiB, sometimes invalid) and list memory (capacity,
//   alignment, bus address near the top of the space) with guard entries after it. Oracles:
//   no entry past the capacity is written; `bus` is never asked for an offset outside the
//   transfer; an error is one the inputs justify (checked independently); a success gives
//   PRPs the model walks without error, that map exactly the requested bytes, and whose list
//   uses exactly `list_entries_needed` entries, which `list_bytes_per_command` covers.
// - walk: PRP1, PRP2 and list contents that point anywhere (inside the fake memory's regions,
//   at page ends, 4 bytes before a page end, at the top of the address space, into cycles),
//   any length and page size. Oracles: every list read and data segment is inside one page
//   and every read stays inside the fake memory; the shared walker with one entry per read
//   returns exactly the model's status and segments; with larger reads it agrees on success
//   and segments; the emulator's prp_walker over the same regions agrees with it; every walk
//   ends within its step budget.
#include <cunvme/emu/dma_space.cuh>
#include <cunvme/policy/prp_walk.cuh>
#include <cunvme/emu/prp_walker.cuh>
#include <cunvme/policy/prp.cuh>

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

namespace prp = cunvme::prp;
namespace emu = cunvme::emu;
namespace spec = cunvme::spec;
using u64 = std::uint64_t;
using u128 = unsigned __int128;

namespace {

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "prp_fuzz finding: %s\n", what);
  std::abort();
}
void require(bool ok, const char* what) {
  if (!ok) finding(what);
}

u64 mix(u64 x) {  // splitmix64: deterministic filler from a fuzzed seed
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// ---- the model ----------------------------------------------------------------------------

struct segment {
  u64 bus;
  u64 length;
  bool operator==(const segment&) const = default;
};

struct walk_result {
  spec::status status = spec::status::successful_completion;
  std::vector<segment> segments;
  u64 entries_read = 0;
  bool budget_hit = false;
};

/// Reads 8 bytes at `bus`; nullopt where any byte is outside the memory.
using read8_fn = std::optional<u64> (*)(const void* memory, u64 bus);

/// NVMe 2.0 4.1.1 as a controller reads it, one list entry at a time.
walk_result model_walk(u64 prp1, u64 prp2, u64 length, u64 page, const void* memory, read8_fn read8, std::size_t budget) {
  walk_result r;
  auto fail = [&](spec::status s) {
    r.status = s;
    return r;
  };
  auto emit = [&](u64 bus, u64 n) {
    if (r.segments.size() == budget) {
      r.budget_hit = true;
      return false;
    }
    r.segments.push_back({bus, n});
    return true;
  };
  if (length == 0) return r;
  bool power_of_two = page != 0 && (page & (page - 1)) == 0;
  if (!power_of_two || page < 4096 || page > (u64{1} << 27)) return fail(spec::status::invalid_field_in_command);
  if (prp1 % 4 != 0) return fail(spec::status::prp_offset_invalid);
  u64 first = page - prp1 % page;
  if (first > length) first = length;
  if (!emit(prp1, first)) return fail(spec::status::data_transfer_error);
  u64 rest = length - first;
  if (rest == 0) return r;
  if (rest <= page) {
    if (prp2 % page != 0) return fail(spec::status::prp_offset_invalid);
    if (!emit(prp2, rest)) return fail(spec::status::data_transfer_error);
    return r;
  }
  if (prp2 % 4 != 0) return fail(spec::status::prp_offset_invalid);
  u64 slot = prp2;  // the next list entry to read
  while (rest > 0) {
    const u64 left_in_page = page - slot % page;
    if (left_in_page < 8) return fail(spec::status::prp_offset_invalid);
    const bool last_slot_of_page = left_in_page < 16;
    const std::optional<u64> e = read8(memory, slot);
    if (!e) return fail(spec::status::data_transfer_error);
    ++r.entries_read;
    if (last_slot_of_page && rest > page) {  // more than one page left: this entry chains
      if (*e % page != 0) return fail(spec::status::prp_offset_invalid);
      slot = *e;
      continue;
    }
    if (*e % page != 0) return fail(spec::status::prp_offset_invalid);
    const u64 n = rest < page ? rest : page;
    if (!emit(*e, n)) return fail(spec::status::data_transfer_error);
    rest -= n;
    slot += 8;
  }
  return r;
}

/// List entries for `length` bytes after PRP1 at `first_offset`, in 128-bit arithmetic.
u128 model_entries_needed(u64 first_offset, u64 length, unsigned shift) {
  const u128 page = u128{1} << shift;
  const u128 first = page - (first_offset % page);
  if (u128{length} <= first + page) return 0;
  const u128 data = (u128{length} - first + page - 1) / page;
  const u128 per_page = page / 8;
  if (data <= per_page) return data;
  const u128 list_pages = 1 + (data - per_page + (per_page - 2)) / (per_page - 1);
  return data + (list_pages - 1);
}

// ---- fake memory --------------------------------------------------------------------------

struct region {
  u64 bus;
  std::vector<std::byte> bytes;
};

struct memory {
  std::vector<region> regions;
  std::size_t reads = 0;
};

std::optional<u64> memory_read8(const void* m, u64 bus) {
  const auto& mem = *static_cast<const memory*>(m);
  unsigned char b[8];
  for (unsigned i = 0; i < 8; ++i) {
    const u64 at = bus + i;
    if (at < bus) return std::nullopt;  // past 2^64
    bool found = false;
    for (const region& r : mem.regions) {
      if (at >= r.bus && at - r.bus < r.bytes.size()) {
        b[i] = static_cast<unsigned char>(r.bytes[at - r.bus]);
        found = true;
        break;
      }
    }
    if (!found) return std::nullopt;
  }
  u64 v;
  std::memcpy(&v, b, 8);
  return v;
}

/// A pointer the walk can meet: into a region (page aligned, at an offset, at a page end,
/// 4 bytes before one), at the top of the space, zero, or anything.
u64 pick_pointer(u64 r, const memory& mem, u64 page) {
  const u64 kind = r % 16;
  r = mix(r);
  if (kind == 13) return ~u64{0} - (page - 1) - (r % 4 == 0 ? 0 : page * (r % 3));  // top pages of the space
  if (kind == 14) return 0;
  if (kind == 15) return mix(r);
  const region& reg = mem.regions[r % mem.regions.size()];
  r = mix(r);
  const u64 pages = reg.bytes.size() / 4096;
  const u64 base = reg.bus + 4096 * (r % (pages + 1));
  switch (kind % 6) {
    case 0:
    case 1: return base & ~(page - 1);
    case 2: return base + 8 * (mix(r) % 512);
    case 3: return (base & ~(page - 1)) + page - 4;
    case 4: return (base & ~(page - 1)) + page - 8;
    default: return base + 4 * (mix(r) % 1024);
  }
}

// ---- walk case ----------------------------------------------------------------------------

constexpr std::size_t walk_budget = 2048;

template <unsigned Chunk>
walk_result core_walk(u64 prp1, u64 prp2, u64 length, u64 page, memory& mem) {
  walk_result r;
  r.status = prp::walk<Chunk>(
      prp1, prp2, length, page,
      [&](u64 bus, u64* out, u64 count) {
        require(count >= 1 && count <= Chunk, "read_entries count outside 1..Chunk");
        require(bus % page + count * 8 <= page, "read_entries range crosses a page");
        ++mem.reads;
        for (u64 i = 0; i < count; ++i) {
          const std::optional<u64> e = memory_read8(&mem, bus + 8 * i);
          if (!e) return false;
          out[i] = *e;
        }
        r.entries_read += count;
        return true;
      },
      [&](u64 bus, u64 n) {
        require(n >= 1 && n <= page, "segment length outside 1..page");
        require(bus % page + n <= page, "segment crosses a page");
        if (r.segments.size() == walk_budget) {
          r.budget_hit = true;
          return spec::status::data_transfer_error;
        }
        r.segments.push_back({bus, n});
        return spec::status::successful_completion;
      });
  return r;
}

std::vector<segment> merged(const std::vector<segment>& in, const memory& mem) {
  // prp_walker merges pieces contiguous in bus space and inside one region.
  auto region_of = [&](u64 bus) -> const region* {
    for (const region& r : mem.regions) {
      if (bus >= r.bus && bus - r.bus < r.bytes.size()) return &r;
    }
    return nullptr;
  };
  std::vector<segment> out;
  for (const segment& s : in) {
    if (!out.empty() && out.back().bus + out.back().length == s.bus && region_of(out.back().bus) == region_of(s.bus) &&
        region_of(s.bus) != nullptr && s.bus + s.length - region_of(s.bus)->bus <= region_of(s.bus)->bytes.size()) {
      out.back().length += s.length;
    } else {
      out.push_back(s);
    }
  }
  return out;
}

void walk_case(FuzzedDataProvider& in) {
  memory mem;
  const unsigned region_count = in.ConsumeIntegralInRange<unsigned>(1, 3);
  for (unsigned i = 0; i < region_count; ++i) {
    const u64 pages = in.ConsumeIntegralInRange<u64>(1, 20);
    // Regions 1 MiB apart (so their guard gaps hold any page size), or near the top.
    const u64 bus = in.ConsumeBool() ? (u64{1} << 20) * (i + 1) : ~u64{0} - (u64{1} << 20) * (i + 1) - pages * 4096 + 1;
    mem.regions.push_back({bus & ~u64{4095}, std::vector<std::byte>(pages * 4096)});
  }
  const unsigned page_choice = in.ConsumeIntegral<std::uint8_t>();
  const u64 page = page_choice < 240 ? u64{4096} << (page_choice % 5) : in.ConsumeIntegral<u64>();
  const u64 seed = in.ConsumeIntegral<u64>();
  // Region contents: list entries of the kinds a walk meets; the first few from the input.
  u64 r = seed;
  for (region& reg : mem.regions) {
    for (std::size_t at = 0; at + 8 <= reg.bytes.size(); at += 8) {
      r = mix(r);
      const u64 v = in.remaining_bytes() >= 9 && in.ConsumeBool() ? in.ConsumeIntegral<u64>() : pick_pointer(r, mem, page < 4096 ? 4096 : page);
      std::memcpy(reg.bytes.data() + at, &v, 8);
    }
  }
  const u64 safe_page = (page >= 4096 && (page & (page - 1)) == 0 && page <= (u64{1} << 27)) ? page : 4096;
  const u64 prp1 = in.ConsumeBool() ? in.ConsumeIntegral<u64>() : pick_pointer(mix(seed ^ 1), mem, safe_page);
  const u64 prp2 = in.ConsumeBool() ? in.ConsumeIntegral<u64>() : pick_pointer(mix(seed ^ 2), mem, safe_page);
  u64 length;
  switch (in.ConsumeIntegralInRange<int>(0, 4)) {
    case 0: length = in.ConsumeIntegralInRange<u64>(0, 3 * safe_page); break;
    case 1: length = safe_page * in.ConsumeIntegralInRange<u64>(0, 1200) + in.ConsumeIntegralInRange<u64>(0, 8) * 4 - 16; break;
    case 2: length = ~u64{0} - in.ConsumeIntegralInRange<u64>(0, 2 * safe_page); break;
    default: length = in.ConsumeIntegral<u64>(); break;
  }

  const walk_result model = model_walk(prp1, prp2, length, page, &mem, memory_read8, walk_budget);
  const walk_result one = core_walk<1>(prp1, prp2, length, page, mem);
  require(one.status == model.status, "prp::walk<1> status differs from the model");
  require(one.segments == model.segments, "prp::walk<1> segments differ from the model");
  require(one.budget_hit == model.budget_hit, "prp::walk<1> budget differs from the model");
  require(one.entries_read == model.entries_read, "prp::walk<1> read other list entries than the model");
  const bool model_ok = model.status == spec::status::successful_completion;
  const walk_result wide = core_walk<512>(prp1, prp2, length, page, mem);
  const walk_result odd = core_walk<3>(prp1, prp2, length, page, mem);
  for (const walk_result* w : {&wide, &odd}) {
    require((w->status == spec::status::successful_completion) == model_ok, "chunked prp::walk disagrees with the model on success");
    if (model_ok) require(w->segments == model.segments, "chunked prp::walk segments differ from the model");
    require(w->status == spec::status::successful_completion || w->status == spec::status::prp_offset_invalid ||
                w->status == spec::status::data_transfer_error || w->status == spec::status::invalid_field_in_command,
            "prp::walk returned a status it does not document");
  }

  // The emulator's walker over the same regions: the same answer; segments merged per region.
  if (model.budget_hit) return;  // prp_walker has no budget: its caller bounds the length (MDTS)
  emu::dma_space dma;
  for (region& reg : mem.regions) require(dma.map_at(reg.bus, reg.bytes.data(), reg.bytes.size(), emu::memory_kind::host), "map_at refused a region");
  emu::prp_walker walker;
  const spec::status s = walker.walk(dma.pin(), prp1, prp2, length, page, false);
  if (model_ok) {
    // A model segment outside every region is Data Transfer Error for the emulator.
    bool all_mapped = true;
    for (const segment& seg : model.segments) all_mapped = all_mapped && dma.find(seg.bus, seg.length).has_value();
    if (!all_mapped) {
      require(s == spec::status::data_transfer_error, "prp_walker accepted data outside every region");
      return;
    }
    require(s == spec::status::successful_completion, "prp_walker refused PRPs the model accepts");
    const std::vector<segment> expect = merged(model.segments, mem);
    require(walker.segments().size() == expect.size(), "prp_walker merged segments differently");
    for (std::size_t i = 0; i < expect.size(); ++i) {
      const auto& got = walker.segments()[i];
      require(got.region.bus + got.offset == expect[i].bus && got.length == expect[i].length, "prp_walker segment differs");
    }
  } else {
    require(s != spec::status::successful_completion, "prp_walker accepted PRPs the model refuses");
  }
}

// ---- build case ---------------------------------------------------------------------------

/// A buffer for prp::build that records every offset it is asked about.
struct probe_buffer {
  const std::vector<u64>* pages = nullptr;  ///< empty: contiguous from `base`
  u64 base = 0;
  u64 seed = 0;
  unsigned page_shift = 63;
  u64 lo = 0, hi = 0;  ///< offsets build may ask about
  mutable bool strayed = false;

  /// The shift this harness computes with: a page shift past 63 (which build must refuse
  /// before asking anything) is read as 63.
  [[nodiscard]] unsigned effective_shift() const { return page_shift > 63 ? 63 : page_shift; }

  [[nodiscard]] u64 address(u64 offset) const {
    if (pages->empty()) return base + offset;
    const unsigned shift = effective_shift();
    const u64 index = offset >> shift;
    const u64 mask = (u64{1} << shift) - 1;
    // Pages past the listed ones: aligned, scattered, deterministic.
    const u64 page_bus = index < pages->size() ? (*pages)[index] : mix(seed ^ index) & ~mask;
    return page_bus + (offset & mask);
  }
  [[nodiscard]] u64 bus(u64 offset) const {
    if (offset < lo || offset > hi) strayed = true;
    return address(offset);
  }
};
static_assert(prp::buffer<probe_buffer>);

/// List memory as the controller sees it: one bus range from `list.bus`, or (list.pages)
/// page k of the entries at its own bus address.
struct list_view {
  prp::list_memory list;
  u64 page = 4096;
  u64 page_count = 0;  ///< entries of list.pages
};

std::optional<u64> list_read8(const void* m, u64 bus) {
  const auto& v = *static_cast<const list_view*>(m);
  const prp::list_memory& l = v.list;
  if (l.pages == nullptr) {
    if (bus < l.bus || bus - l.bus >= u64{l.capacity} * 8 || (bus - l.bus) % 8 != 0) return std::nullopt;
    return l.entries[(bus - l.bus) / 8];
  }
  for (u64 k = 0; k < v.page_count; ++k) {
    const u64 start = k == 0 ? l.bus : l.pages[k];
    if (bus < start || bus - start >= v.page || (bus - start) % 8 != 0) continue;
    const u64 index = k * (v.page / 8) + (bus - start) / 8;
    if (index < l.capacity) return l.entries[index];
  }
  return std::nullopt;
}

/// Whether the buffer bytes of some PRP entry of this transfer are not one bus range, or an
/// entry after PRP1 is not page aligned (checked byte-page by byte-page, up to `limit` pieces).
std::optional<bool> model_has_break(const probe_buffer& b, u64 offset, u64 length, u64 page, u64 limit) {
  u64 at = 0;
  for (u64 piece = 0; at < length; ++piece) {
    if (piece == limit) return std::nullopt;
    const u64 start = b.address(offset + at);
    if (piece > 0 && start % page != 0) return true;
    const u64 n = piece == 0 ? (page - start % page < length ? page - start % page : length) : (length - at < page ? length - at : page);
    const u64 bpage = u64{1} << b.effective_shift();
    for (u64 k = (offset + at) / bpage + 1; b.pages->size() != 0 && k * bpage < offset + at + n && k * bpage > offset + at; ++k) {
      if (b.address(k * bpage) != start + (k * bpage - (offset + at))) return true;
    }
    at += n;
  }
  return false;
}

void build_case(FuzzedDataProvider& in) {
  const std::uint8_t shift_choice = in.ConsumeIntegral<std::uint8_t>();
  const unsigned shift = shift_choice < 240 ? 12 + shift_choice % 5 : shift_choice % 70;
  std::vector<u64> pages;
  probe_buffer buf;
  buf.pages = &pages;
  buf.seed = in.ConsumeIntegral<u64>();
  if (in.ConsumeBool()) {
    buf.base = in.ConsumeBool() ? in.ConsumeIntegral<u64>() : in.ConsumeIntegralInRange<u64>(0, 1 << 20) * 4;
  } else {
    const std::uint8_t bshift = in.ConsumeIntegral<std::uint8_t>();
    buf.page_shift = bshift < 240 ? 12 + bshift % 6 : bshift % 70;
    const unsigned count = in.ConsumeIntegralInRange<unsigned>(1, 64);
    const int style = in.ConsumeIntegralInRange<int>(0, 3);
    const u64 bpage = u64{1} << buf.effective_shift();
    u64 next = in.ConsumeIntegral<u64>() & ~(bpage - 1);
    for (unsigned i = 0; i < count; ++i) {
      u64 p;
      if (style == 0) {
        p = next + u64{i} * bpage;  // contiguous
      } else if (style == 1) {
        p = mix(buf.seed + i) & ~(bpage - 1);  // scattered, aligned
      } else if (style == 2) {
        p = in.ConsumeIntegral<u64>();  // anything
      } else {
        p = (mix(buf.seed + i) & ~(bpage - 1)) + (in.ConsumeBool() ? 4 * in.ConsumeIntegralInRange<u64>(0, 1024) : 0);
      }
      pages.push_back(p);
    }
  }
  const u64 page = u64{1} << (shift < 64 ? shift : 12);
  u64 offset, length;
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      offset = in.ConsumeIntegralInRange<u64>(0, 4 * page);
      length = in.ConsumeIntegralInRange<u64>(0, 3 * page);
      break;
    case 1:
      offset = in.ConsumeIntegralInRange<u64>(0, 1024) * 4;
      length = page * in.ConsumeIntegralInRange<u64>(0, 1100) + in.ConsumeIntegralInRange<u64>(0, 16) * 4 - 32;
      break;
    case 2:
      offset = in.ConsumeIntegral<u64>();
      length = ~u64{0} - in.ConsumeIntegralInRange<u64>(0, 3 * page);
      break;
    default:
      offset = in.ConsumeIntegral<u64>();
      length = in.ConsumeIntegral<u64>();
      break;
  }
  const u64 capacity = in.ConsumeIntegralInRange<u64>(0, 1100);
  constexpr u64 guard_entries = 64;
  constexpr u64 guard = 0xfeedfacecafebeefull;
  std::vector<u64> list_storage(capacity + guard_entries, guard);
  u64 list_bus;
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: list_bus = in.ConsumeIntegralInRange<u64>(1, 1 << 20) * (u64{1} << 17); break;
    case 1: list_bus = (~u64{0} - in.ConsumeIntegralInRange<u64>(0, 8) * page + 1) & ~(page - 1); break;
    case 2: list_bus = in.ConsumeIntegralInRange<u64>(1, 1 << 20) * (u64{1} << 17) + in.ConsumeIntegralInRange<u64>(1, 511) * 8; break;
    default: list_bus = in.ConsumeIntegral<u64>(); break;
  }
  // List memory contiguous only page by page, sometimes with a page off its alignment.
  std::vector<u64> list_pages;
  if (in.ConsumeBool()) {
    const u64 count = capacity / (page / 8) + 1;
    const bool one_unaligned = in.ConsumeIntegralInRange<int>(0, 7) == 0;
    const u64 bad = one_unaligned ? in.ConsumeIntegralInRange<u64>(1, count) : 0;
    list_pages.push_back(list_bus);
    for (u64 k = 1; k < count; ++k) list_pages.push_back((mix(list_bus + k) & ~(page - 1)) + (k == bad ? 8 : 0));
  }
  const prp::list_memory list{list_storage.data(), list_bus, static_cast<std::uint32_t>(capacity), list_pages.empty() ? nullptr : list_pages.data()};
  const list_view view{list, page, list_pages.size()};
  buf.lo = offset;
  buf.hi = length == 0 ? offset : (offset + (length - 1) < offset ? ~u64{0} : offset + (length - 1));

  prp::prp_entries e{0x1111, 0x2222};
  const prp::build_result result = prp::build(buf, offset, length, shift, list, e);
  for (u64 i = capacity; i < list_storage.size(); ++i) require(list_storage[i] == guard, "build wrote past the list memory");
  require(!buf.strayed, "build asked the buffer about an offset outside the transfer");

  const bool shift_ok = shift >= 12 && shift <= 27;
  const bool range_wraps = length != 0 && offset + (length - 1) < offset;
  const u64 needed = shift_ok ? prp::list_entries_needed(buf.address(offset), length, shift) : 0;
  if (shift_ok) {
    const u128 expect = model_entries_needed(buf.address(offset), length, shift);
    require(u128{needed} == expect, "list_entries_needed differs from the 128-bit count");
    const u64 bytes = prp::list_bytes_per_command(length, shift);
    require(u128{bytes} >= 8 * expect && bytes % page == 0 && bytes >= page, "list_bytes_per_command does not cover the worst case");
  } else {
    require(prp::list_entries_needed(0, length, shift) == ~u64{0}, "list_entries_needed accepted an invalid page shift");
  }

  if (result != prp::build_result::ok) {
    require(e.prp1 == 0 && e.prp2 == 0, "a refused build left PRPs behind");
    switch (result) {
      case prp::build_result::invalid_page_size:
        require(!shift_ok || buf.page_shift < 12 || buf.page_shift > 63, "invalid_page_size without a bad page size");
        break;
      case prp::build_result::range_overflow: {
        // Page by page, no list page wraps (each is page aligned); as one range, the whole list may.
        const bool list_wraps = list_pages.empty() && needed > 0 && u128{list_bus} + u128{needed} * 8 > (u128{1} << 64);
        require(range_wraps || list_wraps, "range_overflow without a wrapping range");
        break;
      }
      case prp::build_result::unaligned_start: require(buf.address(offset) % 4 != 0, "unaligned_start for an aligned start"); break;
      case prp::build_result::list_too_small: require(needed > capacity, "list_too_small with room enough"); break;
      case prp::build_result::list_misaligned: {
        bool misaligned = list_bus % page != 0;
        for (const u64 p : list_pages) misaligned = misaligned || p % page != 0;
        require(misaligned, "list_misaligned for an aligned list");
        break;
      }
      case prp::build_result::pages_misaligned: {
        const bool smaller = buf.page_shift < shift && length > page - buf.address(offset) % page;
        const std::optional<bool> brk = model_has_break(buf, offset, length, page, 4096);
        require(smaller || !brk || *brk, "pages_misaligned for pages that line up");
        break;
      }
      case prp::build_result::ok: break;
    }
    return;
  }
  require(shift_ok && !range_wraps && buf.page_shift >= 12 && buf.page_shift <= 63, "build accepted a bad page size or a wrapping range");
  require(e.prp1 == buf.address(offset), "PRP1 is not the buffer's first byte");
  const walk_result w = model_walk(e.prp1, e.prp2, length, page, &view, list_read8, ~std::size_t{0});
  require(w.status == spec::status::successful_completion, "the model refuses the PRPs build made");
  require(w.entries_read == needed, "the list uses other than list_entries_needed entries");
  u64 at = 0;
  const u64 bpage = u64{1} << buf.effective_shift();
  for (const segment& s : w.segments) {
    // Every buffer page inside the segment continues the segment's bus range.
    require(buf.address(offset + at) == s.bus, "a PRP entry does not start at its bytes' bus address");
    for (u64 k = (offset + at) / bpage + 1; !pages.empty() && k * bpage > offset + at && k * bpage < offset + at + s.length; ++k) {
      require(buf.address(k * bpage) == s.bus + (k * bpage - (offset + at)), "a PRP entry spans a break in the buffer");
    }
    at += s.length;
  }
  require(at == length, "the PRPs map another length than requested");
  // The shared walker reads the list just as the model does.
  walk_result core;
  core.status = prp::walk<1>(
      e.prp1, e.prp2, length, page,
      [&](u64 bus, u64* out, u64 count) {
        for (u64 i = 0; i < count; ++i) {
          const std::optional<u64> v = list_read8(&view, bus + 8 * i);
          if (!v) return false;
          out[i] = *v;
        }
        return true;
      },
      [&](u64 bus, u64 n) {
        core.segments.push_back({bus, n});
        return spec::status::successful_completion;
      });
  require(core.status == spec::status::successful_completion && core.segments == w.segments, "prp::walk disagrees with the model on built PRPs");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  if (in.ConsumeBool()) {
    build_case(in);
  } else {
    walk_case(in);
  }
  return 0;
}
