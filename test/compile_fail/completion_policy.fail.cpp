// A completion policy without `progress` is not a completion::policy: queue_policies<> refuses it.
// expect-error: policy<Completion>
// expect-error: progress<
#include <cunvme/policy/queue.cuh>

namespace cn = cunvme;

struct completion_without_progress {
  template <class Doorbell>
  static void drain(const cn::queue_view&);
#ifdef COMPILE_FAIL_CONTROL
  template <class Doorbell>
  static void progress(const cn::queue_view&);
#endif
};

using queue_t = cn::queue_policies<cn::slots::exclusive, completion_without_progress>;
[[maybe_unused]] queue_t* use = nullptr;
