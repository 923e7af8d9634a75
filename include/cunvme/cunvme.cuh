// cunvme — the whole library: `#include <cunvme/cunvme.cuh>`.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/spec/spec.cuh>
