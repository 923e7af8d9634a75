// Scratch probe: per-command cudaMemcpyAsync vs cudaMemcpyBatchAsync vs a pull kernel, from T host threads.
#include <cuda_runtime.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); std::exit(1); } } while (0)
struct seg { const char* src; char* dst; size_t n; };
__global__ void pull(const seg* segs, int count) {
  for (int s = blockIdx.x; s < count; s += gridDim.x) {
    const uint4* src = reinterpret_cast<const uint4*>(segs[s].src);
    uint4* dst = reinterpret_cast<uint4*>(segs[s].dst);
    for (size_t i = threadIdx.x; i < segs[s].n / 16; i += blockDim.x) dst[i] = src[i];
  }
}
int main() {
  const size_t host_bytes = size_t{2} << 30;
  char* host; CK(cudaHostAlloc((void**)&host, host_bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  for (size_t i = 0; i < host_bytes; i += 4096) host[i] = char(i >> 12);
  char* dev; CK(cudaMalloc(&dev, size_t{1} << 30));
  const int burst = 64;
  for (size_t size : {size_t{4096}, size_t{131072}}) {
    for (int threads : {1, 4, 8, 16}) {
      for (int mode = 0; mode < 3; ++mode) {
        std::atomic<long> copies{0};
        std::atomic<bool> stop{false};
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t) ts.emplace_back([&, t] {
          cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
          seg* segs; CK(cudaHostAlloc((void**)&segs, sizeof(seg) * burst, cudaHostAllocMapped | cudaHostAllocPortable));
          std::vector<void*> d(burst), sr(burst); std::vector<size_t> n(burst, size);
          cudaMemcpyAttributes attr{}; attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream; size_t idx = 0;
          unsigned long long k = t * 7919ull;
          while (!stop.load()) {
            for (int i = 0; i < burst; ++i, ++k) {
              const size_t off = (k * 2654435761ull % (host_bytes / size)) * size;
              const size_t doff = ((t * burst + i) * size) % (size_t{1} << 30);
              sr[i] = host + off; d[i] = dev + doff; segs[i] = {host + off, dev + doff, size};
            }
            if (mode == 0) for (int i = 0; i < burst; ++i) CK(cudaMemcpyAsync(d[i], sr[i], size, cudaMemcpyHostToDevice, s));
            else if (mode == 1) CK(cudaMemcpyBatchAsync(d.data(), sr.data(), n.data(), burst, &attr, &idx, 1, s));
            else { pull<<<32, 256, 0, s>>>(segs, burst); CK(cudaGetLastError()); }
            CK(cudaStreamSynchronize(s));
            copies += burst;
          }
          CK(cudaFreeHost(segs)); CK(cudaStreamDestroy(s));
        });
        auto t0 = std::chrono::steady_clock::now();
        std::this_thread::sleep_for(std::chrono::milliseconds(700));
        stop = true; for (auto& t : ts) t.join();
        double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        static const char* names[] = {"memcpyAsync x64", "memcpyBatchAsync", "pull kernel"};
        std::printf("size %7zu threads %2d %-18s %9.0f copies/s %6.2f GB/s\n", size, threads, names[mode], copies / sec, copies * double(size) / sec / 1e9);
      }
    }
  }
  void* pin; CK(cudaHostAlloc(&pin, 256 << 20, 0));
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a)); for (int i = 0; i < 8; ++i) CK(cudaMemcpyAsync(dev, pin, 256 << 20, cudaMemcpyHostToDevice)); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
  float ms; CK(cudaEventElapsedTime(&ms, a, b)); std::printf("pinned H2D 256 MiB x8: %.2f GB/s\n", 8.0 * (256 << 20) / ms / 1e6);
}
