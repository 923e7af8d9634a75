// A queue's policies, named together: how submitters take SQ slots and who drains the CQ.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/policy/completion.cuh>
#include <cunvme/policy/slots.cuh>

CUNVME_NAMESPACE_BEGIN

/// What readers and writers take as their `Queue` parameter: a bundle naming a slot policy
/// (`Q::slots`) and a completion policy (`Q::completion`), each checked by its own concept.
/// `queue_policies<Slots, Completion>` is the one shipped; a user type that names both works as well.
template <class Q>
concept queue_policy = requires {
  typename Q::slots;
  typename Q::completion;
} && slots::policy<typename Q::slots> && completion::policy<typename Q::completion>;

/// The policies a reader uses on its queue pair: a bundle of two policies, not a queue (the
/// queue pair is the `queue_view` a reader is given).
/// @tparam Slots      `slots::exclusive`, `slots::warp_aggregated` or `slots::multi_producer`
/// @tparam Completion `completion::cooperative` or `completion::dedicated_poller`
/// Usage: examples/snippets/host.cpp, `queue` (the alias every reader there uses).
template <slots::policy Slots, completion::policy Completion>
struct queue_policies {
  using slots = Slots;
  using completion = Completion;
};

static_assert(queue_policy<queue_policies<slots::exclusive, completion::cooperative>>);
static_assert(queue_policy<queue_policies<slots::exclusive, completion::dedicated_poller>>);
static_assert(queue_policy<queue_policies<slots::warp_aggregated, completion::cooperative>>);
static_assert(queue_policy<queue_policies<slots::warp_aggregated, completion::dedicated_poller>>);
static_assert(queue_policy<queue_policies<slots::multi_producer, completion::cooperative>>);
static_assert(queue_policy<queue_policies<slots::multi_producer, completion::dedicated_poller>>);

CUNVME_NAMESPACE_END
