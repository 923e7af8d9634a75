// Pinned, mapped host memory that `cunvme::device` reuses for page tables and per-warp
// results: kernels read and write it through UVA, the host reads it once a copy is done.
// Handed out in power-of-two sizes and kept when given back, so copies after the first
// allocate nothing. CUDA host code.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/cuda_error.cuh>

#include <cuda_runtime.h>

#include <bit>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

CUNVME_NAMESPACE_BEGIN
namespace detail {

/// Buffers are freed only when the pool is: cudaFreeHost may wait for the whole device, which
/// must never happen while a copy's kernel waits for the controller. The pool holds at most
/// what was in use at once; it lives as long as any buffer from it (leases share it).
class pinned_pool : public std::enable_shared_from_this<pinned_pool> {
 public:
  /// A buffer from the pool, given back when the lease ends.
  class lease {
   public:
    lease() = default;
    lease(lease&& o) noexcept : pool_(std::move(o.pool_)), p_(std::exchange(o.p_, nullptr)), bytes_(o.bytes_) {}
    lease& operator=(lease&& o) noexcept {
      if (this != &o) {
        release();
        pool_ = std::move(o.pool_);
        p_ = std::exchange(o.p_, nullptr);
        bytes_ = o.bytes_;
      }
      return *this;
    }
    ~lease() { release(); }

    [[nodiscard]] void* get() const noexcept { return p_; }
    template <class T>
    [[nodiscard]] T* as() const noexcept {
      return static_cast<T*>(p_);
    }

   private:
    friend class pinned_pool;
    lease(std::shared_ptr<pinned_pool> pool, void* p, std::size_t bytes) : pool_(std::move(pool)), p_(p), bytes_(bytes) {}
    void release() noexcept {
      if (p_ != nullptr) pool_->give_back(p_, bytes_);
      p_ = nullptr;
      pool_.reset();
    }
    std::shared_ptr<pinned_pool> pool_;
    void* p_ = nullptr;
    std::size_t bytes_ = 0;
  };

  explicit pinned_pool(std::string device) : device_(std::move(device)) {}
  pinned_pool(const pinned_pool&) = delete;
  pinned_pool& operator=(const pinned_pool&) = delete;
  ~pinned_pool() {
    for (auto& [bytes, p] : free_) (void)cudaFreeHost(p);
  }

  /// At least `bytes` of pinned, mapped memory; `before_allocating()` runs first where the
  /// pool has none to reuse and CUDA must allocate. Throws `host::error` when CUDA has none.
  template <class Before>
  [[nodiscard]] lease take(std::size_t bytes, Before&& before_allocating) {
    const std::size_t size = std::bit_ceil(std::max<std::size_t>(bytes, 256));
    {
      const std::lock_guard lock(mutex_);
      if (const auto it = free_.find(size); it != free_.end()) {
        void* p = it->second;
        free_.erase(it);
        return lease(shared_from_this(), p, size);
      }
    }
    before_allocating();
    void* p = nullptr;
    host::cuda_check(cudaHostAlloc(&p, size, cudaHostAllocMapped), "Allocate pinned memory", device_, std::to_string(size) + " bytes");
    return lease(shared_from_this(), p, size);
  }

 private:
  void give_back(void* p, std::size_t bytes) noexcept {
    const std::lock_guard lock(mutex_);
    free_.emplace(bytes, p);
  }

  std::string device_;
  std::mutex mutex_;
  std::multimap<std::size_t, void*> free_;
};

}  // namespace detail
CUNVME_NAMESPACE_END
