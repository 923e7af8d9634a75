// A doorbell policy without `coalesces` is not a doorbell::policy: block_reader refuses it.
// expect-error: policy<Doorbell>
// expect-error: D::coalesces
#include <cunvme/io/reader.cuh>

namespace cn = cunvme;

struct doorbell_without_coalesces {
  static bool usable(const cn::queue_view&);
  static void ring(const cn::queue_view&, cn::doorbell::which, cuda::std::uint32_t, cuda::std::uint32_t);
#ifdef COMPILE_FAIL_CONTROL
  static constexpr bool coalesces = false;
#endif
};

using queue_t = cn::queue_policies<cn::slots::exclusive, cn::completion::cooperative>;
using reader_t = cn::block_reader<queue_t, cn::prp::contiguous, doorbell_without_coalesces>;
[[maybe_unused]] reader_t* use = nullptr;
