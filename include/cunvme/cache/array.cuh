// `array<T>`: a file of T's on a namespace or a volume, read and written element by element
// through a page cache by GPU or CPU threads. The layout is plain — element i is the
// sizeof(T) bytes at byte `first_byte + i × sizeof(T)` — so data written by `copy_n`, `dd` or
// the host path reads back as written.
//
// Usage: examples/snippets/kernels.cu, `gather` and `caches`.
#pragma once

#include <cunvme/cache/page_cache.cuh>
#include <cunvme/config.cuh>
#include <cunvme/detail/checked.cuh>
#include <cunvme/io/io_result.cuh>
#include <cunvme/policy/group.cuh>

#include <cuda/std/cstdint>
#include <cuda/std/cstring>
#include <cuda/std/type_traits>

CUNVME_NAMESPACE_BEGIN

/// One element read through the cache: its value where `result` is success.
template <class T>
struct element {
  io_result result{};
  T value{};
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool ok() const noexcept { return result.ok(); }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr explicit operator bool() const noexcept { return ok(); }
};

/// An array of `size` T's at byte `first_byte` of what `Cache` covers. Trivially copyable:
/// kernels take it by value. An element that straddles two pages (T's size not dividing the
/// page, or an unaligned `first_byte`) is read and written piece by piece.
/// @tparam T     trivially copyable
/// @tparam Cache `page_cache<Queue, Doorbell>`
template <class T, class Cache>
class array {
  static_assert(cuda::std::is_trivially_copyable_v<T>, "array<T>: T is copied as bytes, so it must be trivially copyable");

 public:
  CUNVME_HOST_DEVICE array(const Cache& cache, cuda::std::uint64_t first_byte, cuda::std::uint64_t size) noexcept
      : cache_(cache), first_(first_byte), size_(size) {}

  [[nodiscard]] CUNVME_HOST_DEVICE cuda::std::uint64_t size() const noexcept { return size_; }
  [[nodiscard]] CUNVME_HOST_DEVICE const Cache& cache() const noexcept { return cache_; }

  /// Element `i`, or why it could not be had (`invalid_request` past the end or past what the
  /// cache covers; the cache's own failures as they came).
  [[nodiscard]] CUNVME_HOST_DEVICE element<T> operator[](cuda::std::uint64_t i) const {
    element<T> e;
    e.result = get(i, e.value);
    return e;
  }

  /// Copies element `i` into `out` (untouched on failure).
  [[nodiscard]] CUNVME_HOST_DEVICE io_result get(cuda::std::uint64_t i, T& out) const {
    alignas(T) unsigned char bytes[sizeof(T)];  // aligned: the cache copies it in T-wide loads, not byte by byte
    const io_result r = move(i, bytes, page_access::read);
    if (r.ok()) cuda::std::memcpy(&out, bytes, sizeof(T));
    return r;
  }

  /// Writes `value` as element `i` through the cache: its page becomes dirty and reaches the
  /// device on eviction or `cache().flush()`. An element across two pages is written in two
  /// pieces; a failure between them leaves the first piece written.
  [[nodiscard]] CUNVME_HOST_DEVICE io_result set(cuda::std::uint64_t i, const T& value) const {
    alignas(T) unsigned char bytes[sizeof(T)];
    cuda::std::memcpy(bytes, &value, sizeof(T));
    return move(i, bytes, page_access::write);
  }

  /// Copies elements [i, i + count) into `out`, taking each page they lie on once (a run of
  /// edges of a graph, a row of a table). On failure `out` holds the elements before the
  /// failing page's; the rest are left as they were.
  [[nodiscard]] CUNVME_HOST_DEVICE io_result copy(cuda::std::uint64_t i, cuda::std::uint64_t count, T* out) const {
    if (count == 0) return io_result{};
    cuda::std::uint64_t at = 0, last = 0;
    if (count > size_ || !byte_of(i, at) || !byte_of(i + count - 1, last)) return io_result::failure(io_error::invalid_request, 0, 0);
    const cuda::std::uint64_t bytes = count * sizeof(T);
    auto* to = reinterpret_cast<unsigned char*>(out);
    for (cuda::std::uint64_t done = 0; done < bytes;) {
      const cuda::std::uint64_t offset = at + done;
      const cuda::std::uint64_t room = cache_.page_bytes() - offset % cache_.page_bytes();
      const cuda::std::uint64_t piece = bytes - done < room ? bytes - done : room;
      if (const io_result r = cache_.read(offset, piece, to + done); !r.ok()) return r;
      done += piece;
    }
    return io_result{};
  }

  /// The group's threads gather `count` elements, `out[k] = (*this)[indices[k]]`, each thread
  /// taking k = rank, rank + size, …; every thread of the group calls it with the same
  /// arguments. Threads whose elements share a page in a round take it once: the lowest-ranked
  /// one acquires it, copies every such thread's element out and releases it at once — so no
  /// thread holds a page while another waits for a slot, and a grid of warps needs no more
  /// slots than pages it reads at one time. Returns this thread's first failure (its `out[k]`
  /// is left as it was); the others' elements are unaffected.
  CUNVME_EXEC_CHECK_DISABLE
  template <thread_group Group>
  [[nodiscard]] CUNVME_HOST_DEVICE io_result gather(Group& g, const cuda::std::uint64_t* indices, cuda::std::uint64_t count, T* out) const {
    io_result first{};
    const cuda::std::uint32_t n = g.size(), me = g.rank();
    for (cuda::std::uint64_t base = 0; base < count; base += n) {
      const cuda::std::uint64_t k = base + me;
      const bool mine = k < count;
      const cuda::std::uint64_t index = mine ? indices[k] : 0;
      cuda::std::uint64_t within = 0;
      const cuda::std::uint64_t page = mine ? whole_page_of(index, within) : no_page;
      // The lowest rank wanting the same page leads it; the leader notes who else wants it.
      cuda::std::uint32_t leader = me;
      cuda::std::uint64_t wanting = 0;  // bit s: thread s's element lies on this page (groups of up to 64)
      for (cuda::std::uint32_t s = 0; s < n; ++s) {
        if (g.broadcast(page, s) != page) continue;
        if (s < leader) leader = s;
        if (s < 64) wanting |= cuda::std::uint64_t{1} << s;
      }
      const bool leads = page != no_page && leader == me && n <= 64;
      bool served = false;
      if (leads) {
        const cached_page held = cache_.acquire(page, page_access::read);
        if (held.ok()) {
          for (cuda::std::uint32_t s = 0; s < n; ++s) {
            if ((wanting >> s & 1) == 0) continue;
            cuda::std::uint64_t at = 0;
            (void)whole_page_of(indices[base + s], at);
            cuda::std::memcpy(out + base + s, held.data + at, sizeof(T));
          }
          (void)cache_.release(page);
          served = true;
        }
      }
      // Whether this thread's leader served it (the leader's own failure is not theirs to report).
      bool mine_served = false;
      for (cuda::std::uint32_t s = 0; s < n; ++s) {
        const bool v = g.broadcast(served ? 1 : 0, s) != 0;
        if (s == leader) mine_served = v && page != no_page;
      }
      if (mine && !mine_served) {
        // A straddling element, or the leader's acquire failed: this thread's own access gets
        // its own honest result.
        if (const io_result r = get(index, out[k]); !r.ok() && first.ok()) first = r;
      }
      g.sync();  // the leaders' copies into `out` are visible to the whole group
    }
    return first;
  }

 private:
  static constexpr cuda::std::uint64_t no_page = ~cuda::std::uint64_t{0};

  /// The byte of element `i`; false past the end or where the sum wraps.
  [[nodiscard]] CUNVME_HOST_DEVICE bool byte_of(cuda::std::uint64_t i, cuda::std::uint64_t& at) const noexcept {
    cuda::std::uint64_t offset = 0;
    return i < size_ && !detail::mul_overflows<cuda::std::uint64_t>(i, sizeof(T), offset) && !detail::add_overflows(first_, offset, at) &&
           at <= ~cuda::std::uint64_t{0} - sizeof(T);
  }

  /// The page holding all of element `i` (`within` its byte there), or `no_page` where the
  /// element is out of range or straddles two pages.
  [[nodiscard]] CUNVME_HOST_DEVICE cuda::std::uint64_t whole_page_of(cuda::std::uint64_t i, cuda::std::uint64_t& within) const noexcept {
    cuda::std::uint64_t at = 0;
    if (!byte_of(i, at)) return no_page;
    const cuda::std::uint64_t page = at / cache_.page_bytes();
    within = at % cache_.page_bytes();
    return within + sizeof(T) <= cache_.page_bytes() ? page : no_page;
  }

  /// Reads or writes element `i` as `bytes`, page piece by page piece.
  [[nodiscard]] CUNVME_HOST_DEVICE io_result move(cuda::std::uint64_t i, unsigned char* bytes, page_access access) const {
    cuda::std::uint64_t at = 0;
    if (!byte_of(i, at)) return io_result::failure(io_error::invalid_request, 0, 0);
    for (cuda::std::uint64_t done = 0; done < sizeof(T);) {
      const cuda::std::uint64_t offset = at + done;
      const cuda::std::uint64_t room = cache_.page_bytes() - offset % cache_.page_bytes();
      const cuda::std::uint64_t piece = sizeof(T) - done < room ? sizeof(T) - done : room;
      const io_result r = access == page_access::read ? cache_.read(offset, piece, bytes + done) : cache_.write(offset, piece, bytes + done);
      if (!r.ok()) return r;
      done += piece;
    }
    return io_result{};
  }

  Cache cache_;
  cuda::std::uint64_t first_;
  cuda::std::uint64_t size_;
};

CUNVME_NAMESPACE_END
