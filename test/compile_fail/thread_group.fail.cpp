// A group without `any` is not a thread_group: the per-group read refuses it.
// expect-error: thread_group<Group>
// expect-error: g.any(flag)
#include <cunvme/io/reader.cuh>

namespace cn = cunvme;

struct group_without_any {
  cuda::std::uint32_t rank() const;
  cuda::std::uint32_t size() const;
  void sync();
  cuda::std::uint32_t exclusive_sum(cuda::std::uint32_t, cuda::std::uint32_t&);
  cuda::std::uint64_t broadcast(cuda::std::uint64_t, cuda::std::uint32_t);
  cuda::std::uint64_t min(cuda::std::uint64_t);
#ifdef COMPILE_FAIL_CONTROL
  bool any(bool);
#endif
};

using queue_t = cn::queue_policies<cn::slots::exclusive, cn::completion::cooperative>;
using reader_t = cn::block_reader<queue_t, cn::prp::contiguous, cn::doorbell::mmio>;

[[maybe_unused]] auto call(const reader_t& r, group_without_any& g, const cn::prp::contiguous& dst) { return r.read(g, 0, 1, dst, 0); }
