// A slot policy without `ensure_rung` is not a slots::policy: queue_policies<> refuses it.
// expect-error: policy<Slots>
// expect-error: ensure_rung<
#include <cunvme/policy/queue.cuh>

namespace cn = cunvme;

// Declarations only: the concept looks at them in unevaluated operands.
struct slots_without_ensure_rung {
  template <cn::thread_group Group, class Progress>
  static bool reserve(const cn::queue_view&, Group&, cuda::std::uint32_t, cuda::std::uint64_t, Progress&&, cuda::std::uint64_t&);
  template <class Doorbell, cn::thread_group Group>
  static void commit(const cn::queue_view&, Group&, cuda::std::uint64_t, cuda::std::uint32_t);
#ifdef COMPILE_FAIL_CONTROL
  template <class Doorbell>
  static void ensure_rung(const cn::queue_view&, cuda::std::uint64_t);
#endif
};

using queue_t = cn::queue_policies<slots_without_ensure_rung, cn::completion::cooperative>;
[[maybe_unused]] queue_t* use = nullptr;
