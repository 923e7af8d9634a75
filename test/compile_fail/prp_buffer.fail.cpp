// A buffer description without `page_shift` is not a prp::buffer: block_reader refuses it.
// expect-error: buffer<Prp>
// expect-error: b.page_shift
#include <cunvme/io/reader.cuh>

namespace cn = cunvme;

struct buffer_without_page_shift {
  cuda::std::uint64_t base;
  cuda::std::uint64_t bus(cuda::std::uint64_t offset) const;
#ifdef COMPILE_FAIL_CONTROL
  unsigned page_shift;
#endif
};

using queue_t = cn::queue_policies<cn::slots::exclusive, cn::completion::cooperative>;
using reader_t = cn::block_reader<queue_t, buffer_without_page_shift, cn::doorbell::mmio>;
[[maybe_unused]] reader_t* use = nullptr;
