// The loader's host side for Python: the C++ safetensors parser, file placement and read plans
// (include/cunvme/loader/), so that Python loads by exactly the C++ rules.
#pragma once

#include <nanobind/nanobind.h>

namespace cunvme_python {

/// Adds safetensors_header, plan_reads, default_layer_key and group_keys to `m`.
void register_loader(nanobind::module_& m);

}  // namespace cunvme_python
