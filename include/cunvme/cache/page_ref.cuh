// What a page cache's users hold: the kind of access they ask for (`page_access`), the page they
// got (`cached_page`) and a scoped reference to it (`page_ref`), for any cache with `acquire` and
// `release` — `page_cache` (page_cache.cuh) is the one.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/io/io_result.cuh>

#include <cuda/std/cstdint>

CUNVME_NAMESPACE_BEGIN

/// What an acquirer means to do with a page: writers mark it dirty, so it is written back
/// before its slot is reused and by `flush`.
enum class page_access : cuda::std::uint8_t { read, write };

/// An acquired page: its bytes until `release`, or why there are none.
struct cached_page {
  io_result result{};
  unsigned char* data = nullptr;  ///< page_bytes() bytes of the page; nullptr unless `result` is success

  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool ok() const noexcept { return result.ok(); }
};

/// A scoped reference to a page: acquired on construction, released on destruction (or
/// `reset`). Move-only.
/// Usage: examples/snippets/host.cpp, `page_cache_reads`.
template <class Cache>
class page_ref {
 public:
  CUNVME_HOST_DEVICE page_ref(const Cache& cache, cuda::std::uint64_t page, page_access access)
      : cache_(&cache), page_(page), got_(cache.acquire(page, access)) {}
  page_ref(const page_ref&) = delete;
  page_ref& operator=(const page_ref&) = delete;
  CUNVME_HOST_DEVICE page_ref(page_ref&& o) noexcept : cache_(o.cache_), page_(o.page_), got_(o.got_) { o.cache_ = nullptr; }
  CUNVME_HOST_DEVICE page_ref& operator=(page_ref&& o) noexcept {
    if (this != &o) {
      reset();
      cache_ = o.cache_, page_ = o.page_, got_ = o.got_;
      o.cache_ = nullptr;
    }
    return *this;
  }
  CUNVME_HOST_DEVICE ~page_ref() { reset(); }

  [[nodiscard]] CUNVME_HOST_DEVICE bool ok() const noexcept { return cache_ != nullptr && got_.ok(); }
  [[nodiscard]] CUNVME_HOST_DEVICE const io_result& result() const noexcept { return got_.result; }
  /// The page's bytes while this reference is held; nullptr after a failure or `reset`.
  [[nodiscard]] CUNVME_HOST_DEVICE unsigned char* data() const noexcept { return ok() ? got_.data : nullptr; }
  [[nodiscard]] CUNVME_HOST_DEVICE cuda::std::uint64_t page() const noexcept { return page_; }
  /// Releases the reference now (nothing where the acquire failed).
  CUNVME_HOST_DEVICE void reset() noexcept {
    if (cache_ != nullptr && got_.ok()) cache_->release(page_);
    cache_ = nullptr;
  }

 private:
  const Cache* cache_;
  cuda::std::uint64_t page_;
  cached_page got_;
};

template <class Cache>
page_ref(const Cache&, cuda::std::uint64_t, page_access) -> page_ref<Cache>;

CUNVME_NAMESPACE_END
