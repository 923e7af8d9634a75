// cunvme — configuration: the only header that defines macros.
//
// Every other cunvme header includes this one first. It defines
//   CUNVME_HOST_DEVICE       the execution-space annotation (`__host__ __device__` under a
//                            CUDA compiler, nothing under a plain C++ compiler), so the same
//                            queue code runs in CPU threads (and under TSan/ASan) and on GPUs;
//   CUNVME_DEVICE_COMPILATION defined while a CUDA compiler emits device code;
//   CUNVME_NAMESPACE_BEGIN / CUNVME_NAMESPACE_END, which open `cunvme` together with an inline
//                            ABI namespace (as CUB's util_namespace.cuh does), so objects built
//                            from different cunvme versions never clash at link time.
#pragma once

#define CUNVME_VERSION_MAJOR 0
#define CUNVME_VERSION_MINOR 1
#define CUNVME_VERSION_PATCH 0

#if defined(__CUDACC__) || defined(__NVCOMPILER_CUDA__)
#  define CUNVME_HOST_DEVICE __host__ __device__
#else
#  define CUNVME_HOST_DEVICE
#endif

#if defined(__CUDA_ARCH__)
#  define CUNVME_DEVICE_COMPILATION 1
#endif

// The ABI namespace carries the version; bump it with any layout or signature change.
#define CUNVME_NAMESPACE_BEGIN \
  namespace cunvme {           \
  inline namespace abi_v0_1 {
#define CUNVME_NAMESPACE_END \
  }                          \
  }
