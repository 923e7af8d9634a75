// Groups: the threads that cooperate on one request (a warp splitting a read, a thread block, or CPU
// threads standing in for them). Readers and slot policies are written once against the
// `thread_group` concept; this header has the host groups (no CUB), `device_group.cuh` the
// GPU ones (CUB and cooperative groups).
//
// Every group operation is collective: all members call it, in the same order.
#pragma once

#include <cunvme/config.cuh>

#include <cuda/std/concepts>
#include <cuda/std/cstdint>

#include <barrier>
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

CUNVME_NAMESPACE_BEGIN

/// What readers and slot policies need of a group of cooperating threads.
template <class G>
concept thread_group = requires(G& g, cuda::std::uint32_t count, cuda::std::uint32_t& total, cuda::std::uint64_t value, bool flag) {
  { g.rank() } -> cuda::std::convertible_to<cuda::std::uint32_t>;
  { g.size() } -> cuda::std::convertible_to<cuda::std::uint32_t>;
  g.sync();
  /// The sum of `count` over the members ranked below this one; `total` gets the group's sum.
  { g.exclusive_sum(count, total) } -> cuda::std::same_as<cuda::std::uint32_t>;
  /// `value` as member `source` passed it.
  { g.broadcast(value, count) } -> cuda::std::same_as<cuda::std::uint64_t>;
  { g.min(value) } -> cuda::std::same_as<cuda::std::uint64_t>;
  { g.any(flag) } -> cuda::std::same_as<bool>;
};

/// A group of one: the per-thread form of every reader. Costs nothing.
struct single_thread {
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t rank() const noexcept { return 0; }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t size() const noexcept { return 1; }
  CUNVME_HOST_DEVICE constexpr void sync() const noexcept {}
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t exclusive_sum(cuda::std::uint32_t count, cuda::std::uint32_t& total) const noexcept {
    total = count;
    return 0;
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t broadcast(cuda::std::uint64_t value, cuda::std::uint32_t) const noexcept {
    return value;
  }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t min(cuda::std::uint64_t value) const noexcept { return value; }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool any(bool flag) const noexcept { return flag; }
};
static_assert(thread_group<single_thread>);

/// CPU threads acting as one group, as a warp or a thread block does on the GPU: the same collective
/// reader code runs in CPU threads (and under ThreadSanitizer). Each of `size` threads takes
/// its `member_at(rank)` and uses it as its group.
///
/// When to choose it: tests and host-side tools that want the warp/thread-block code paths without
/// a GPU; it synchronises through a std::barrier, so it is far slower than a warp.
/// Usage: examples/snippets/host.cpp, `read_as_a_group`.
class host_group {
  struct state;

 public:
  explicit host_group(cuda::std::uint32_t size) : shared_(std::make_shared<state>(size)) {
    if (size == 0) throw std::invalid_argument("host_group: a group needs at least one thread");
  }

  class member {
   public:
    [[nodiscard]] cuda::std::uint32_t rank() const noexcept { return rank_; }
    [[nodiscard]] cuda::std::uint32_t size() const noexcept { return static_cast<cuda::std::uint32_t>(shared_->values.size()); }
    void sync() { shared_->barrier.arrive_and_wait(); }
    [[nodiscard]] cuda::std::uint32_t exclusive_sum(cuda::std::uint32_t count, cuda::std::uint32_t& total) {
      publish(count);
      cuda::std::uint64_t below = 0, sum = 0;
      for (cuda::std::uint32_t r = 0; r < size(); ++r) {
        if (r == rank_) below = sum;
        sum += shared_->values[r];
      }
      sync();  // the values may be overwritten by the next operation only after all have read
      total = static_cast<cuda::std::uint32_t>(sum);
      return static_cast<cuda::std::uint32_t>(below);
    }
    [[nodiscard]] cuda::std::uint64_t broadcast(cuda::std::uint64_t value, cuda::std::uint32_t source) {
      publish(value);
      const cuda::std::uint64_t result = shared_->values.at(source);
      sync();
      return result;
    }
    [[nodiscard]] cuda::std::uint64_t min(cuda::std::uint64_t value) {
      publish(value);
      cuda::std::uint64_t result = value;
      for (const auto v : shared_->values) result = v < result ? v : result;
      sync();
      return result;
    }
    [[nodiscard]] bool any(bool flag) { return min(flag ? 0 : 1) == 0; }

   private:
    friend class host_group;
    member(std::shared_ptr<state> s, cuda::std::uint32_t r) : shared_(std::move(s)), rank_(r) {}
    void publish(cuda::std::uint64_t value) {
      shared_->values[rank_] = value;
      sync();
    }
    std::shared_ptr<state> shared_;
    cuda::std::uint32_t rank_;
  };

  /// The handle thread `rank` (0 ≤ rank < size) uses as its group.
  [[nodiscard]] member member_at(cuda::std::uint32_t rank) const {
    if (rank >= shared_->values.size()) {
      throw std::out_of_range("host_group: rank " + std::to_string(rank) + " of a group of " + std::to_string(shared_->values.size()));
    }
    return member(shared_, rank);
  }

 private:
  struct state {
    explicit state(cuda::std::uint32_t n) : barrier(static_cast<std::ptrdiff_t>(n)), values(n) {}
    std::barrier<> barrier;
    std::vector<cuda::std::uint64_t> values;
  };
  std::shared_ptr<state> shared_;
};
static_assert(thread_group<host_group::member>);

CUNVME_NAMESPACE_END
