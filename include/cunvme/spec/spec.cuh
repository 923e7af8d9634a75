// The NVMe specification layer: plain constexpr data, every layout pinned by static_assert.
#pragma once

#include <cunvme/spec/bit_field.cuh>
#include <cunvme/spec/command_fields.cuh>
#include <cunvme/spec/identify.cuh>
#include <cunvme/spec/log_page.cuh>
#include <cunvme/spec/opcodes.cuh>
#include <cunvme/spec/queue_entry.cuh>
#include <cunvme/spec/registers.cuh>
#include <cunvme/spec/shadow_doorbell.cuh>
#include <cunvme/spec/status.cuh>
