// cunvme — configuration: the only header that defines macros.
//
// Every other cunvme header includes this one first. It defines
//   CUNVME_HOST_DEVICE       the execution-space annotation (`__host__ __device__` under a
//                            CUDA compiler, nothing under a plain C++ compiler), so the same
//                            queue code runs in CPU threads (and under TSan/ASan) and on GPUs;
//   CUNVME_DEVICE_COMPILATION defined while a CUDA compiler emits device code;
//   CUNVME_EXEC_CHECK_DISABLE before __host__ __device__ templates that call caller-supplied,
//                            possibly host-only, groups or callables;
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

// Placed before a __host__ __device__ function template that calls what its caller passes in
// (a group, a callable): instantiated with host-only ones (CPU thread groups), it runs on the
// host only, and nvcc must not reject it for the device (CCCL's _CCCL_EXEC_CHECK_DISABLE).
#if defined(__CUDACC__)
#  define CUNVME_EXEC_CHECK_DISABLE _Pragma("nv_exec_check_disable")
#else
#  define CUNVME_EXEC_CHECK_DISABLE
#endif

// The ABI namespace carries the version; bump it with any layout or signature change.
#define CUNVME_NAMESPACE_BEGIN \
  namespace cunvme {           \
  inline namespace abi_v0_1 {
#define CUNVME_NAMESPACE_END \
  }                          \
  }
