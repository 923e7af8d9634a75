// A GPU address stand-in for host tests: the emulator's IOMMU maps a device range without
// touching it, so tests of GPU mappings need no GPU.
#pragma once

#include <cstdint>

inline void* fake_gpu_address() { return reinterpret_cast<void*>(std::uintptr_t{1} << 40); }
