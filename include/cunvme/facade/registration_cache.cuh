// Which mapping of GPU memory a transfer uses: the bookkeeping of `cunvme::device`'s buffer
// registrations (cuFile's cuFileBufRegister, and a bounded cache of the buffers it was not
// told about). Host code without CUDA: the allocations come from the caller (the driver's
// cuMemGetAddressRange and buffer ID), the mappings from a callable, so the policy is tested
// everywhere.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/memory/gpu_window.cuh>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

CUNVME_NAMESPACE_BEGIN

/// A GPU allocation as the driver describes it.
struct gpu_allocation {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  /// CU_POINTER_ATTRIBUTE_BUFFER_ID: unique over the process's lifetime, never reused after a
  /// free. It is how a mapping of memory freed and allocated again at the same address is told
  /// from a live one.
  std::uint64_t id = 0;

  [[nodiscard]] bool overlaps(const gpu_allocation& o) const noexcept { return base < o.base + o.size && o.base < base + size; }
};

/// Mappings of GPU memory for the controller, each covering a `host::gpu_window` of one
/// allocation, made by a callable `make(host::gpu_window) -> std::shared_ptr<const Mapping>`.
///
/// Two kinds of entries:
/// - registered buffers (`register_buffer`): kept until `deregister_buffer` or `clear`, as
///   cuFile keeps them. The rule is cuFile's too: deregister before freeing. A registered
///   buffer found freed (its address range now in an allocation of another ID) is dropped and
///   the transfer refused with `host::error`.
/// - cached ones, for transfers to memory nobody registered: at most `capacity`, the least
///   recently used dropped first. A transfer outside a cached window of its allocation maps the
///   union of both; one whose allocation was freed and replaced maps afresh.
/// Dropping an entry drops the cache's reference only: a transfer still holding the mapping
/// keeps it until it is done.
template <class Mapping>
class registration_cache {
 public:
  using mapping_ptr = std::shared_ptr<const Mapping>;

  /// `gpu_page`: the GPU's page size (64 KiB on NVIDIA GPUs), the granule of peer mappings.
  registration_cache(std::size_t capacity, std::size_t gpu_page, std::string device)
      : capacity_(capacity), gpu_page_(gpu_page), device_(std::move(device)) {}

  /// Maps `bytes` at `address` in allocation `a` until `deregister_buffer(address)`.
  template <class Make>
  void register_buffer(const gpu_allocation& a, std::uintptr_t address, std::size_t bytes, Make&& make) {
    drop_stale(a);
    for (const entry& e : entries_) {
      if (e.registered && e.registered_at == address) {
        throw host::error("Register a buffer", device_, "GPU address " + std::to_string(address) + " is registered already");
      }
    }
    const host::gpu_window w = host::gpu_window::of(address, bytes, a.base, a.size, gpu_page_, device_);
    entries_.push_back(entry{a, w, true, address, ++clock_, make(w)});
  }

  /// Forgets the buffer registered at `address`; false when there is none.
  bool deregister_buffer(std::uintptr_t address) {
    const auto it = std::find_if(entries_.begin(), entries_.end(), [&](const entry& e) { return e.registered && e.registered_at == address; });
    if (it == entries_.end()) return false;
    entries_.erase(it);
    return true;
  }

  /// The mapping for `bytes` at `address` in allocation `a`: a registered buffer's or a cached
  /// one covering them, else a new one, cached.
  template <class Make>
  [[nodiscard]] mapping_ptr find(const gpu_allocation& a, std::uintptr_t address, std::size_t bytes, Make&& make) {
    // Checked first: a transfer never leaves its allocation, whatever is cached.
    host::gpu_window w = host::gpu_window::of(address, bytes, a.base, a.size, gpu_page_, device_);
    drop_stale(a);
    entry* cached = nullptr;
    for (entry& e : entries_) {
      if (e.allocation.id != a.id) continue;
      if (e.window.start <= address && address + bytes <= e.window.start + e.window.bytes) {
        e.last_use = ++clock_;
        return e.mapping;
      }
      if (!e.registered) cached = &e;
    }
    if (cached != nullptr) {
      // Grow the allocation's cached window rather than map a second one beside it.
      const std::uintptr_t start = std::min(w.start, cached->window.start);
      const std::uintptr_t end = std::max(w.start + w.bytes, cached->window.start + cached->window.bytes);
      w = host::gpu_window::of(start, end - start, a.base, a.size, gpu_page_, device_);
      entries_.erase(entries_.begin() + (cached - entries_.data()));
    }
    mapping_ptr m = make(w);
    entries_.push_back(entry{a, w, false, 0, ++clock_, m});
    while (cached_count() > capacity_) {
      auto lru = entries_.end();
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (!it->registered && (lru == entries_.end() || it->last_use < lru->last_use)) lru = it;
      }
      entries_.erase(lru);
    }
    return m;
  }

  /// Drops every entry, registered buffers included.
  void clear() noexcept { entries_.clear(); }

  [[nodiscard]] std::size_t registered_count() const noexcept {
    return static_cast<std::size_t>(std::count_if(entries_.begin(), entries_.end(), [](const entry& e) { return e.registered; }));
  }
  [[nodiscard]] std::size_t cached_count() const noexcept { return entries_.size() - registered_count(); }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

 private:
  struct entry {
    gpu_allocation allocation;
    host::gpu_window window;
    bool registered = false;
    std::uintptr_t registered_at = 0;
    std::uint64_t last_use = 0;
    mapping_ptr mapping;
  };

  /// Drops the entries of allocations freed since: another allocation now holds their
  /// addresses. A registered one means its buffer was freed before it was deregistered.
  void drop_stale(const gpu_allocation& a) {
    bool registered = false;
    std::uintptr_t at = 0;
    std::erase_if(entries_, [&](const entry& e) {
      if (e.allocation.id == a.id || !e.allocation.overlaps(a)) return false;
      if (e.registered) {
        registered = true;
        at = e.registered_at;
      }
      return true;
    });
    if (registered) {
      throw host::error("Use a registered buffer", device_,
                        "the buffer registered at GPU address " + std::to_string(at) +
                            " was freed while registered (deregister_buffer before freeing it, as cuFile requires); its registration is dropped");
    }
  }

  std::vector<entry> entries_;
  std::size_t capacity_;
  std::size_t gpu_page_;
  std::string device_;
  std::uint64_t clock_ = 0;
};

CUNVME_NAMESPACE_END
