// A queue's policies, named together: how submitters take SQ slots and who drains the CQ.
#pragma once

#include <cunvme/policy/completion.cuh>
#include <cunvme/config.cuh>
#include <cunvme/policy/slots.cuh>

CUNVME_NAMESPACE_BEGIN

/// The policies a reader uses on its queue pair.
/// @tparam Slots      `slots::exclusive`, `slots::warp_aggregated` or `slots::multi_producer`
/// @tparam Completion `completion::cooperative` or `completion::dedicated_poller`
/// ```
/// using queue = cunvme::queue<cunvme::slots::warp_aggregated, cunvme::completion::cooperative>;
/// ```
template <slots::policy Slots, completion::policy Completion>
struct queue {
  using slots = Slots;
  using completion = Completion;
};

CUNVME_NAMESPACE_END
