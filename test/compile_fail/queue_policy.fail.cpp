// A queue bundle that names no completion policy is not a queue_policy: block_reader refuses it.
// expect-error: queue_policy<Queue>
// expect-error: Q::completion
#include <cunvme/io/reader.cuh>

namespace cn = cunvme;

struct queue_without_completion {
  using slots = cn::slots::exclusive;
#ifdef COMPILE_FAIL_CONTROL
  using completion = cn::completion::cooperative;
#endif
};

using reader_t = cn::block_reader<queue_without_completion, cn::prp::contiguous, cn::doorbell::mmio>;
[[maybe_unused]] reader_t* use = nullptr;
