// Diagnosis probe behind bench/RESULTS.md "Two threads on one emulated device" (2026-11-29); kept as raw data, not built.
// Two threads load one file through one emulator-backed device, N rounds; an optional third thread makes one kind of
// CUDA call every millisecond; a watchdog dumps every thread's stack (glibc backtrace) after 4 s without progress.
// Build: nvcc -std=c++20 -O2 -g -arch=sm_90 [-I<old loader.cuh dir>] -Iinclude -Xlinker -export-dynamic THIS -o tt -lcuda -lpthread
// Run:   tt ROUNDS THREADS LAYERS DIM STREAM_MODE(0 legacy, 1 own non-blocking) INTERFERER
#include <cunvme/emu/cuda_memory.cuh>
#include <cunvme/facade/copy.cuh>
#include <cunvme/facade/device.cuh>
#include <cunvme/loader/loader.cuh>
#include <nlohmann/json.hpp>
#include <cuda_runtime.h>
#include <execinfo.h>
#include <dirent.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>
#include <vector>
namespace loader = cunvme::loader;
struct written { std::string path; std::vector<std::byte> bytes; };
written write_model(const std::string& path, int layers, std::uint64_t dim) {
  std::vector<std::pair<std::string, std::pair<std::string, std::vector<std::uint64_t>>>> tensors;
  tensors.push_back({"embed.weight", {"F16", {dim, dim}}});
  for (int i = 0; i < layers; ++i) {
    tensors.push_back({"layers." + std::to_string(i) + ".weight", {"F32", {dim, dim}}});
    tensors.push_back({"layers." + std::to_string(i) + ".bias", {"F16", {dim}}});
  }
  nlohmann::json h = nlohmann::json::object();
  std::uint64_t offset = 0;
  for (const auto& [name, spec] : tensors) {
    std::uint64_t bytes = spec.first == "F32" ? 4 : 2;
    for (std::uint64_t d : spec.second) bytes *= d;
    h[name] = {{"dtype", spec.first}, {"shape", spec.second}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = h.dump();
  text.append((4096 - (8 + text.size()) % 4096) % 4096, ' ');
  written w{path, {}};
  w.bytes.resize(8 + text.size() + offset);
  const std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) w.bytes[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  std::memcpy(w.bytes.data() + 8, text.data(), text.size());
  std::mt19937_64 rng(42);
  for (std::size_t i = 8 + text.size(); i < w.bytes.size(); ++i) w.bytes[i] = static_cast<std::byte>(rng());
  w.bytes.resize((w.bytes.size() + 4095) / 4096 * 4096);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(w.bytes.data()), w.bytes.size());
  return w;
}
static void dump(int) {
  void* frames[64];
  int n = backtrace(frames, 64);
  char head[64];
  int len = snprintf(head, sizeof head, "=== thread %ld\n", (long)syscall(SYS_gettid));
  (void)!write(2, head, len);
  backtrace_symbols_fd(frames, n, 2);
}
static void dump_all() {
  DIR* d = opendir("/proc/self/task");
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    syscall(SYS_tgkill, getpid(), atoi(e->d_name), SIGUSR2);
    usleep(50000);
  }
  closedir(d);
}
int main(int argc, char** argv) {
  cunvme::emu::prepare_cuda_environment();
  signal(SIGUSR2, dump);
  const int iterations = argc > 1 ? atoi(argv[1]) : 20;
  const int threads_n = argc > 2 ? atoi(argv[2]) : 2;
  const int layers = argc > 3 ? atoi(argv[3]) : 2;
  const int dim = argc > 4 ? atoi(argv[4]) : 256;
  const int stream_mode = argc > 5 ? atoi(argv[5]) : 0;  // 0: legacy default stream, 1: a non-blocking stream per load
  const std::string interferer = argc > 6 ? argv[6] : "none";
  const written w = write_model("/tmp/two_threads.safetensors", layers, dim);
  cunvme::device dev("emu:file=" + w.path + ",readonly,lba=4096");
  loader::safetensors_file file(dev, loader::file_placement::contiguous(dev.block_bytes(), 0, w.bytes.size(), dev.ns().lba_count), w.path);
  std::atomic<int> progress{0};
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    int last = -1; auto since = std::chrono::steady_clock::now(); bool dumped = false;
    while (!done) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      int p = progress;
      if (p != last) { last = p; since = std::chrono::steady_clock::now(); dumped = false; continue; }
      if (!dumped && std::chrono::steady_clock::now() - since > std::chrono::seconds(4)) {
        fprintf(stderr, "--- no progress for 4 s at %d; stacks:\n", p);
        dump_all(); dumped = true;
      }
    }
  });
  std::thread noise([&] {
    if (interferer == "none") return;
    void* g = nullptr; cudaMalloc(&g, 1 << 20);
    std::vector<char> h(1 << 20);
    std::vector<void*> kept, kept_host;
    if (interferer == "free") for (int i = 0; i < 4000; ++i) { void* p; cudaMalloc(&p, 2 << 20); kept.push_back(p); }
    if (interferer == "freehost") for (int i = 0; i < 4000; ++i) { void* p; cudaHostAlloc(&p, 1 << 16, 0); kept_host.push_back(p); }
    long n = 0;
    while (!done) {
      if (interferer == "devsync") cudaDeviceSynchronize();
      else if (interferer == "malloc_free") { void* p; cudaMalloc(&p, 64 << 20); cudaFree(p); }
      else if (interferer == "malloc") { void* p; if (cudaMalloc(&p, 2 << 20) == cudaSuccess) kept.push_back(p); }
      else if (interferer == "free") { if (!kept.empty()) { cudaFree(kept.back()); kept.pop_back(); } }
      else if (interferer == "memcpy_legacy") cudaMemcpy(h.data(), g, h.size(), cudaMemcpyDeviceToHost);
      else if (interferer == "hostalloc") { void* p; cudaHostAlloc(&p, 1 << 20, 0); cudaFreeHost(p); }
      else if (interferer == "hostalloc_only") { void* p; if (cudaHostAlloc(&p, 1 << 16, 0) == cudaSuccess) kept_host.push_back(p); }
      else if (interferer == "freehost") { if (!kept_host.empty()) { cudaFreeHost(kept_host.back()); kept_host.pop_back(); } }
      ++n;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    fprintf(stderr, "interferer %s ran %ld times\n", interferer.c_str(), n);
    for (void* p : kept) cudaFree(p);
    for (void* p : kept_host) cudaFreeHost(p);
  });
  int failures = 0;
  for (int it = 0; it < iterations; ++it) {
    std::vector<std::thread> threads;
    std::vector<std::string> failed(threads_n);
    std::vector<int> ok(threads_n, 0);
    for (int i = 0; i < threads_n; ++i) {
      threads.emplace_back([&, i] {
        try {
          loader::safetensors_file mine(dev, file.placement(), w.path);
          cudaStream_t s = nullptr;
          if (stream_mode == 1) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
          loader::loaded_tensors all = mine.load({}, s);
          all.wait();
          bool same = true;
          for (const loader::gpu_tensor& t : all.tensors()) {
            std::vector<std::byte> got(t.info->bytes());
            bool copied = stream_mode == 1 ? cudaMemcpyAsync(got.data(), t.data, got.size(), cudaMemcpyDeviceToHost, s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess
                                           : cudaMemcpy(got.data(), t.data, got.size(), cudaMemcpyDeviceToHost) == cudaSuccess;
            same = same && copied &&
                   std::equal(got.begin(), got.end(), w.bytes.begin() + mine.header().file_offset(*t.info));
          }
          ok[i] = same;
          if (s) cudaStreamDestroy(s);
        } catch (const std::exception& e) { failed[i] = e.what(); }
        ++progress;
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < threads_n; ++i) {
      if (!failed[i].empty() || !ok[i]) { ++failures; fprintf(stderr, "iteration %d thread %d: %s\n", it, i, failed[i].empty() ? "wrong bytes" : failed[i].c_str()); }
    }
  }
  done = true; watchdog.join(); noise.join();
  printf("%d of %d loads failed\n", failures, iterations * threads_n);
  return failures != 0;
}
