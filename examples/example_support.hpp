// What the GPU examples share and nobody needs to copy: the skip without a GPU (exit 77, which
// Meson reports as "skipped"), CUDA error checks, the hash their checks use, and filling an
// emulated namespace. CUDA host code: include from .cu files.
#pragma once

#include <cunvme/facade/copy.cuh>
#include <cunvme/host/cuda_error.cuh>
#include <cunvme/host/backend/emu_backend.cuh>
#include <cunvme/host/gpu/gpu_reach.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

namespace example {

/// splitmix64's finaliser: a cheap, well-mixed 64-bit hash.
__host__ __device__ constexpr std::uint64_t mix(std::uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// A checksum term: word `word` at index `index`. A sum of terms can be added up in any order
/// (by warps finishing in any order), and the index makes it notice words that trade places.
__host__ __device__ constexpr std::uint64_t term(std::uint64_t word, std::uint64_t index) { return mix(word ^ (index * 0x9e3779b97f4a7c15ull)); }

inline void check(cudaError_t e, const char* what) { cunvme::host::cuda_check(e, what, "the GPU"); }

/// A non-blocking stream: nothing on the legacy default stream (Thrust's allocations and
/// copies) waits for kernels that poll for the controller, nor they for it.
struct stream {
  cudaStream_t s = nullptr;
  stream() { check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "create a stream"); }
  stream(const stream&) = delete;
  ~stream() { (void)cudaStreamDestroy(s); }
  operator cudaStream_t() const noexcept { return s; }
};

/// One T in pinned host memory that kernels reach through its pointer (mapped): an outcome or a
/// count the host reads once the stream is synchronized. Value-initialized; freed on scope
/// exit, also when an exception unwinds.
template <class T>
struct mapped {
  T* p = nullptr;
  explicit mapped(const char* what) {
    check(cudaHostAlloc(&p, sizeof(T), cudaHostAllocMapped), what);
    *p = T{};
  }
  mapped(const mapped&) = delete;
  mapped& operator=(const mapped&) = delete;
  ~mapped() { (void)cudaFreeHost(p); }
  [[nodiscard]] T* get() const noexcept { return p; }
  T& operator*() const noexcept { return *p; }
  T* operator->() const noexcept { return p; }
};

/// A CUDA event, destroyed on scope exit.
struct event {
  cudaEvent_t e = nullptr;
  event() { check(cudaEventCreate(&e), "create an event"); }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event() { (void)cudaEventDestroy(e); }
  operator cudaEvent_t() const noexcept { return e; }
};

/// Milliseconds between two recorded events that have completed.
inline float milliseconds(const event& from, const event& to) {
  float ms = 0;
  check(cudaEventElapsedTime(&ms, from, to), "time");
  return ms;
}

/// Wall time since construction, as the caller of a blocking call sees it.
struct timer {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  [[nodiscard]] double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); }
};

/// Fills namespace 1 of an emulated `dev` with `word(i)` as its i-th 64-bit word, a MiB at a
/// time; false (nothing written) when `dev` is a real controller.
template <class Word>
bool fill(cunvme::device& dev, Word&& word) {
  auto* emulator = dynamic_cast<cunvme::host::emu_backend*>(&dev.controller().backend());
  if (emulator == nullptr) return false;
  cunvme::emu::backing_store& store = emulator->controller().store(dev.ns().nsid);
  const std::uint64_t bytes = dev.ns().lba_count * dev.block_bytes();
  std::vector<std::uint64_t> chunk(1 << 17);
  for (std::uint64_t at = 0; at < bytes; at += chunk.size() * 8) {
    const std::uint64_t n = std::min<std::uint64_t>(chunk.size() * 8, bytes - at);
    for (std::uint64_t w = 0; w < n / 8; ++w) chunk[w] = word(at / 8 + w);
    store.write(at, chunk.data(), n);
  }
  return true;
}

/// main() of a GPU example: prepares the CUDA environment, skips (77) without a GPU, and runs
/// `body`, reporting an exception as a failure (1).
template <class Body>
int run_main(const char* name, Body&& body) {
  cunvme::host::prepare_cuda_environment();  // before any CUDA call: kernels wait for emulated I/O
  int gpus = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&gpus); e != cudaSuccess || gpus == 0) {
    std::printf("%s: no CUDA GPU (%s): skipped\n", name, e != cudaSuccess ? cunvme::host::cuda_error_text(e).c_str() : "none found");
    return 77;
  }
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace example
