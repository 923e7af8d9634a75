// multi_gpu_scaling: aggregate command rate of N GPUs sharing one controller, one process, a
// `cunvme::device` per GPU (its own queue pairs on the shared controller), for N = 1, 2, 4, …
// up to the GPUs present, measured in one run so the ratios compare like with like:
//
//   multi_gpu_scaling --device "emu:nodata,spin,workers=16" --bs 4096 --commands 64
//   multi_gpu_scaling --device "emu:pattern,workers=16" --bs 131072 --commands 16
//
// Every GPU thread reads `--commands` blocks of `--bs` bytes at pseudo-random LBAs, one at a
// time, into its own slot of a buffer on its GPU, all GPUs at once (a host thread per GPU
// launches, all after one barrier); the figure is all commands over the wall time from the
// barrier to the last GPU's end. A run whose commands failed prints no figure and exits 1;
// with data moved (not `nodata`), every thread's last read is checked against the pattern
// (`emu:pattern`) and a mismatch is a failure too. One JSON object per line.
//
// The emulator serves every GPU from its host worker threads: its figure is bounded by them
// (say so beside it); the GPUs' own share shows in the per-GPU rate.
#include <cunvme/facade/device.cuh>
#include <cunvme/host/backend/uri_options.cuh>
#include <cunvme/host/cuda_error.cuh>
#include <cunvme/host/gpu/gpu_queue.cuh>
#include <cunvme/host/gpu/gpu_reach.cuh>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cuda_runtime.h>

#include <barrier>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using reader_set = cunvme::device::io_set<cunvme::device::reader>;

__device__ std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

/// Each thread: `commands` reads of `blocks` at pseudo-random aligned LBAs into its slot.
__global__ void read_loop(reader_set set, cunvme::prp::page_list dst, std::uint64_t blocks, std::uint64_t slots_in_namespace, unsigned commands,
                          unsigned gpu, std::uint64_t* last_lba, unsigned long long* failed) {
  const std::uint64_t t = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const auto r = set.at(t / 32);
  std::uint64_t lba = 0;
  for (unsigned i = 0; i < commands; ++i) {
    lba = mix((std::uint64_t{gpu} << 48) ^ (t << 20) ^ i) % slots_in_namespace * blocks;
    if (!r.read(lba, blocks, dst, t * blocks * set.ns.block_bytes())) atomicAdd(failed, 1ull);
  }
  last_lba[t] = lba;
}

/// Counts the words of each thread's slot that do not hold the pattern of its last read.
__global__ void check_slots(const std::uint64_t* data, std::uint64_t words_per_slot, std::uint64_t block_bytes, const std::uint64_t* last_lba,
                            std::uint64_t threads, unsigned long long* wrong) {
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < threads * words_per_slot; i += std::uint64_t{gridDim.x} * blockDim.x) {
    const std::uint64_t t = i / words_per_slot, w = i % words_per_slot;
    if (data[i] != cunvme::host::pattern_word(last_lba[t] * block_bytes + 8 * w)) atomicAdd(wrong, 1ull);
  }
}

struct gpu_side {
  cunvme::host::dma_buffer buffer;
  std::uint64_t* pages = nullptr;
  std::uint64_t* last_lba = nullptr;
  unsigned long long* counts = nullptr;  // failed, wrong
  cudaStream_t stream = nullptr;
  unsigned page_shift = 12;
};

/// The physical limit beside each figure: pinned host → GPU copies into the first `n` GPUs at
/// once (256 MiB each, three times, the best), in GB/s; 0 where a copy failed.
double pinned_h2d_all(int n) {
  constexpr std::size_t bytes = std::size_t{256} << 20;
  std::vector<void*> host(n), gpu(n);
  std::vector<cudaStream_t> streams(n);
  bool ok = true;
  for (int g = 0; g < n; ++g) {
    ok = ok && cudaSetDevice(g) == cudaSuccess && cudaHostAlloc(&host[g], bytes, cudaHostAllocPortable) == cudaSuccess &&
         cudaMalloc(&gpu[g], bytes) == cudaSuccess && cudaStreamCreateWithFlags(&streams[g], cudaStreamNonBlocking) == cudaSuccess;
  }
  double best = 0;
  for (int pass = 0; ok && pass < 3; ++pass) {
    const auto began = std::chrono::steady_clock::now();
    for (int g = 0; g < n; ++g) ok = ok && cudaMemcpyAsync(gpu[g], host[g], bytes, cudaMemcpyHostToDevice, streams[g]) == cudaSuccess;
    for (int g = 0; g < n; ++g) ok = ok && cudaStreamSynchronize(streams[g]) == cudaSuccess;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    best = std::max(best, static_cast<double>(bytes) * n / seconds / 1e9);
  }
  for (int g = 0; g < n; ++g) {
    (void)cudaSetDevice(g);
    if (streams[g] != nullptr) (void)cudaStreamDestroy(streams[g]);
    (void)cudaFree(gpu[g]);
    (void)cudaFreeHost(host[g]);
  }
  (void)cudaSetDevice(0);
  return ok ? best : 0;
}

}  // namespace

int main(int argc, char** argv) {
  cunvme::host::prepare_cuda_environment();
  CLI::App app("Aggregate command rate of N GPUs sharing one controller (one process, a device per GPU)");
  std::string uri = "emu:nodata,spin,workers=16";
  std::uint64_t bs = 4096;
  unsigned commands = 64, threads = 8192, queues = 8;
  int max_gpus = 0;
  app.add_option("--device", uri, "the shared controller (opened once, for GPU 0)");
  app.add_option("--bs", bs, "bytes per command (a multiple of the block size)")->check(CLI::Range(512, 1 << 20));
  app.add_option("--commands", commands, "commands per GPU thread")->check(CLI::Range(1, 1 << 20));
  app.add_option("--threads", threads, "GPU threads per GPU (a multiple of 256)")->check(CLI::Range(256, 1 << 22));
  app.add_option("--queues", queues, "queue pairs per GPU")->check(CLI::Range(1, 16));
  app.add_option("--max-gpus", max_gpus, "largest N (0: every GPU present)");
  CLI11_PARSE(app, argc, argv);
  if (threads % 256 != 0) {
    std::fputs("--threads must be a multiple of 256\n", stderr);
    return 2;
  }
  int present = 0;
  if (cudaGetDeviceCount(&present) != cudaSuccess || present == 0) {
    std::puts("no CUDA GPU: skipped");
    return 77;
  }
  const int top = max_gpus > 0 ? std::min(max_gpus, present) : present;
  std::vector<int> counts;
  for (int n = 1; n < top; n *= 2) counts.push_back(n);
  counts.push_back(top);

  double one_gpu_rate = 0;
  int status = 0;
  for (const int n : counts) {
    cunvme::device_options options;
    options.tuning = cunvme::copy_tuning{4, 32, queues};
    options.controller.io_queue_pairs = 128;  // up to 8 GPUs × 16 queue pairs, as far as the controller grants
    std::vector<std::unique_ptr<cunvme::device>> devices;
    options.gpu = 0;
    devices.push_back(std::make_unique<cunvme::device>(uri, options));
    for (int g = 1; g < n; ++g) {
      options.gpu = g;
      devices.push_back(std::make_unique<cunvme::device>(devices.front()->shared_controller(), options));
    }
    const std::uint64_t block = devices.front()->block_bytes();
    const std::uint64_t blocks = bs / block;
    const std::uint64_t slots_in_namespace = devices.front()->ns().lba_count / blocks;
    std::vector<gpu_side> sides(n);
    for (int g = 0; g < n; ++g) {
      const auto scope = devices[g]->make_current();
      gpu_side& s = sides[g];
      s.buffer = cunvme::host::allocate_gpu(devices[g]->controller(), std::size_t{threads} * bs);
      const std::vector<std::uint64_t> pages = s.buffer.pages();
      s.page_shift = static_cast<unsigned>(std::countr_zero(s.buffer.page_size()));
      cunvme::host::cuda_check(cudaMalloc(&s.pages, pages.size() * 8), "page table", "bench");
      cunvme::host::cuda_check(cudaMemcpy(s.pages, pages.data(), pages.size() * 8, cudaMemcpyHostToDevice), "page table", "bench");
      cunvme::host::cuda_check(cudaMalloc(&s.last_lba, std::size_t{threads} * 8), "last LBAs", "bench");
      cunvme::host::cuda_check(cudaMalloc(&s.counts, 2 * sizeof(unsigned long long)), "counters", "bench");
      cunvme::host::cuda_check(cudaMemset(s.counts, 0, 2 * sizeof(unsigned long long)), "counters", "bench");
      cunvme::host::cuda_check(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "stream", "bench");
    }
    std::barrier start(n + 1);
    std::vector<std::thread> launchers;
    std::vector<std::chrono::steady_clock::time_point> ended(n);
    for (int g = 0; g < n; ++g) {
      launchers.emplace_back([&, g] {
        const auto scope = devices[g]->make_current();
        gpu_side& s = sides[g];
        // One warm-up launch (module load, first copies), then the measured one.
        read_loop<<<threads / 256, 256, 0, s.stream>>>(devices[g]->readers(), cunvme::prp::page_list{s.pages, s.page_shift}, blocks, slots_in_namespace, 1,
                                                         static_cast<unsigned>(g), s.last_lba, s.counts);
        (void)cudaStreamSynchronize(s.stream);
        start.arrive_and_wait();
        read_loop<<<threads / 256, 256, 0, s.stream>>>(devices[g]->readers(), cunvme::prp::page_list{s.pages, s.page_shift}, blocks, slots_in_namespace,
                                                         commands, static_cast<unsigned>(g), s.last_lba, s.counts);
        (void)cudaStreamSynchronize(s.stream);
        ended[g] = std::chrono::steady_clock::now();
      });
    }
    start.arrive_and_wait();
    const auto began = std::chrono::steady_clock::now();
    for (auto& t : launchers) t.join();
    auto last = began;
    for (const auto& e : ended) last = std::max(last, e);
    const double seconds = std::chrono::duration<double>(last - began).count();
    unsigned long long failed = 0, wrong = 0;
    const bool moved = uri.find("nodata") == std::string::npos && uri.find("pattern") != std::string::npos;
    std::string error;
    for (int g = 0; g < n; ++g) {
      const auto scope = devices[g]->make_current();
      gpu_side& s = sides[g];
      if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) error = "GPU " + std::to_string(g) + ": " + cudaGetErrorString(e);
      if (moved) {
        check_slots<<<256, 256, 0, s.stream>>>(static_cast<const std::uint64_t*>(s.buffer.device_data()), bs / 8, block, s.last_lba, threads, s.counts + 1);
      }
      unsigned long long host_counts[2] = {0, 0};
      if (cudaMemcpy(host_counts, s.counts, sizeof host_counts, cudaMemcpyDeviceToHost) != cudaSuccess) error = "GPU " + std::to_string(g) + ": counters unreadable";
      failed += host_counts[0];
      wrong += host_counts[1];
    }
    const double total = static_cast<double>(n) * threads * commands;
    nlohmann::json out{{"gpus", n}, {"device", uri}, {"bs", bs}, {"threads_per_gpu", threads}, {"commands_per_thread", commands}, {"queues_per_gpu", queues},
                       {"data_checked", moved}};
    if (!error.empty() || failed != 0 || wrong != 0) {
      out["error"] = !error.empty() ? error : std::to_string(failed) + " commands failed, " + std::to_string(wrong) + " words wrong";
      status = 1;
    } else {
      const double rate = total / seconds;
      if (n == 1) one_gpu_rate = rate;
      out["seconds"] = seconds;
      out["commands"] = total;
      out["iops"] = rate;
      out["gb_per_s"] = rate * static_cast<double>(bs) / 1e9;
      out["iops_per_gpu"] = rate / n;
      if (one_gpu_rate > 0) out["scaling_vs_1_gpu"] = rate / one_gpu_rate / n;
    }
    out["pinned_h2d_gb_per_s"] = pinned_h2d_all(n);  // the host → GPUs limit, the same GPUs at once
    std::puts(out.dump().c_str());
    std::fflush(stdout);
    for (int g = 0; g < n; ++g) {
      const auto scope = devices[g]->make_current();
      (void)cudaStreamDestroy(sides[g].stream);
      (void)cudaFree(sides[g].pages);
      (void)cudaFree(sides[g].last_lba);
      (void)cudaFree(sides[g].counts);
      sides[g].buffer = {};
    }
  }
  return status;
}
