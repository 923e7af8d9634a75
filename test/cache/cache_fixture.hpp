// What the cache suite's tests share: the queue and cache types they drive from CPU threads.
#pragma once

#include <cunvme/cache/page_cache.cuh>

#include "../policies/policy_fixture.hpp"

namespace test {

using cache_queue = cunvme::queue_policies<slots::multi_producer, completion::cooperative>;
using cpu_cache = cunvme::page_cache<cache_queue, doorbell::mmio>;
using cunvme::page_access;
using cunvme::page_state;
namespace page_word = cunvme::page_word;
namespace slot_owner = cunvme::slot_owner;

}  // namespace test
