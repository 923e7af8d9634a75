// multi_gpu_scaling: aggregate command rate of N GPUs sharing one controller, one process, a
// `cunvme::device` per GPU (its own queue pairs on the shared controller), for N = 1, 2, 4, …
// up to the GPUs present, measured in one run so the ratios compare like with like:
//
//   multi_gpu_scaling --device "emu:nodata,spin,workers=16" --bs 4096 --commands 64
//   multi_gpu_scaling --device "emu:pattern,workers=16" --bs 131072 --commands 16
//   multi_gpu_scaling --device "gpu-null:timing=scm" --bs 4096 --commands 256 --controller-blocks 16
//
// `gpu-null[:timing=PRESET]`: one on-GPU null controller (a modelled drive, `emu::timing_preset`;
// no data moved) on GPU 0 shared by every GPU: each GPU's queue pairs live in its own memory
// (`gpu_null_controller::options::queue_gpus`), the controller's warps reach them by peer access.
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
#include <cunvme/emu/gpu_null_controller.cuh>
#include <cunvme/emu/timing_model.cuh>
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
    if (const cunvme::io_result res = r.read(lba, blocks, dst, t * blocks * set.ns.block_bytes()); !res) {
      atomicAdd(failed, 1ull);
      // failed[2]: the kind of one failure (io_error << 16 | NVMe status), for the record's error.
      atomicExch(failed + 2, (static_cast<unsigned long long>(res.error) << 16) | static_cast<unsigned long long>(res.status));
    }
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

/// "no free command identifier within the timeout", "NVMe error status 0x…": a failure's kind
/// from read_loop's packed word.
std::string failure_kind(unsigned long long packed) {
  std::string kind = cunvme::to_string(static_cast<cunvme::io_error>(packed >> 16));
  if (static_cast<cunvme::io_error>(packed >> 16) == cunvme::io_error::nvme_status) {
    char status[16];
    std::snprintf(status, sizeof status, " 0x%llx", packed & 0xffffu);
    kind += status;
  }
  return kind;
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

/// A GPU's side of a run, on the current GPU: its page table (`pages`), one last-LBA slot per
/// thread, the counters (failed, wrong, one failure's kind) and a stream.
template <class Side>
void make_bookkeeping(Side& s, const std::vector<std::uint64_t>& pages, unsigned threads) {
  cunvme::host::cuda_check(cudaMalloc(&s.pages, pages.size() * 8), "page table", "bench");
  cunvme::host::cuda_check(cudaMemcpy(s.pages, pages.data(), pages.size() * 8, cudaMemcpyHostToDevice), "page table", "bench");
  cunvme::host::cuda_check(cudaMalloc(&s.last_lba, std::size_t{threads} * 8), "last LBAs", "bench");
  cunvme::host::cuda_check(cudaMalloc(&s.counts, 3 * sizeof(unsigned long long)), "counters", "bench");
  cunvme::host::cuda_check(cudaMemset(s.counts, 0, 3 * sizeof(unsigned long long)), "counters", "bench");
  cunvme::host::cuda_check(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "stream", "bench");
}

/// Undoes `make_bookkeeping` (on the side's GPU).
template <class Side>
void free_bookkeeping(Side& s) {
  (void)cudaStreamDestroy(s.stream);
  (void)cudaFree(s.pages);
  (void)cudaFree(s.last_lba);
  (void)cudaFree(s.counts);
}

/// Runs `launch(g, commands_per_thread)` for each of the first `n` GPUs from a host thread of
/// its own: once with one command per thread (module load, first copies), then, all GPUs after
/// one barrier, with `commands`. Returns the wall time from the barrier to the last GPU's end.
template <class Launch>
double timed_on_every_gpu(int n, unsigned commands, Launch&& launch) {
  std::barrier start(n + 1);
  std::vector<std::thread> launchers;
  std::vector<std::chrono::steady_clock::time_point> ended(n);
  for (int g = 0; g < n; ++g) {
    launchers.emplace_back([&, g] {
      launch(g, 1u);
      start.arrive_and_wait();
      launch(g, commands);
      ended[g] = std::chrono::steady_clock::now();
    });
  }
  start.arrive_and_wait();
  const auto began = std::chrono::steady_clock::now();
  for (auto& t : launchers) t.join();
  auto last = began;
  for (const auto& e : ended) last = std::max(last, e);
  return std::chrono::duration<double>(last - began).count();
}

/// One null controller on GPU 0 with `queues` pairs per GPU on each of the first `n` GPUs: the
/// run's record (no data moves; every command's io_result is checked).
nlohmann::json null_controller_run(int n, const std::string& uri, std::uint64_t bs, unsigned threads, unsigned commands, unsigned queues,
                                   unsigned controller_blocks) {
  cunvme::emu::gpu_null_controller::options o;
  if (const auto colon = uri.find(":timing="); colon != std::string::npos) {
    const auto preset = cunvme::emu::timing_preset(uri.substr(colon + 8));
    if (!preset) throw std::invalid_argument("unknown timing preset in " + uri);
    o.timing = *preset;
  } else if (uri != "gpu-null") {
    throw std::invalid_argument("gpu-null takes only :timing=PRESET, not " + uri);
  }
  o.queues = queues * static_cast<std::uint32_t>(n);
  o.entries = 1024;
  o.blocks = controller_blocks;
  for (int g = 0; g < n; ++g) o.queue_gpus.insert(o.queue_gpus.end(), queues, g);
  cunvme::host::cuda_check(cudaSetDevice(0), "use GPU 0", "bench");
  cunvme::emu::prepare_kernels_to_run_beside(read_loop);
  cunvme::emu::gpu_null_controller null(o);
  const std::uint64_t blocks = bs >> null.namespace_view().lba_shift;
  const std::uint64_t slots_in_namespace = null.namespace_view().lba_count / blocks;
  struct side {
    void* buffer = nullptr;
    std::uint64_t *pages = nullptr, *last_lba = nullptr;
    unsigned long long* counts = nullptr;
    cudaStream_t stream = nullptr;
    reader_set set{};
  };
  std::vector<side> sides(n);
  constexpr std::uint64_t gpu_page = 64 * 1024;
  for (int g = 0; g < n; ++g) {
    cunvme::host::cuda_check(cudaSetDevice(g), "use a GPU", "bench");
    side& s = sides[g];
    const std::size_t bytes = (std::size_t{threads} * bs + gpu_page - 1) / gpu_page * gpu_page;
    cunvme::host::cuda_check(cudaMalloc(&s.buffer, bytes + gpu_page), "buffer", "bench");
    // Bus addresses are GPU virtual addresses for the null controller: the buffer's own pages.
    const std::uintptr_t first = (reinterpret_cast<std::uintptr_t>(s.buffer) + gpu_page - 1) / gpu_page * gpu_page;
    std::vector<std::uint64_t> pages(bytes / gpu_page);
    for (std::size_t i = 0; i < pages.size(); ++i) pages[i] = first + i * gpu_page;
    make_bookkeeping(s, pages, threads);
    for (unsigned q = 0; q < queues; ++q) s.set.views[q] = null.views()[static_cast<std::size_t>(g) * queues + q];
    s.set.ns = null.namespace_view();
    s.set.count = queues;
  }
  // Started once every GPU's side is made: allocations and memsets on GPU 0 would wait for it.
  (void)cudaSetDevice(0);
  null.start();
  const double seconds = timed_on_every_gpu(n, commands, [&](int g, unsigned each) {
    (void)cudaSetDevice(g);
    side& s = sides[g];
    read_loop<<<threads / 256, 256, 0, s.stream>>>(s.set, cunvme::prp::page_list{s.pages, 16}, blocks, slots_in_namespace, each, static_cast<unsigned>(g),
                                                   s.last_lba, s.counts);
    (void)cudaStreamSynchronize(s.stream);
  });
  unsigned long long failed = 0;
  std::string error, kind;
  for (int g = 0; g < n; ++g) {
    (void)cudaSetDevice(g);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) error = "GPU " + std::to_string(g) + ": " + cudaGetErrorString(e);
    unsigned long long c[3] = {0, 0, 0};
    if (cudaMemcpy(c, sides[g].counts, sizeof c, cudaMemcpyDeviceToHost) != cudaSuccess) error = "GPU " + std::to_string(g) + ": counters unreadable";
    failed += c[0];
    if (c[0] != 0) kind = failure_kind(c[2]);
  }
  (void)cudaSetDevice(0);
  null.stop();
  nlohmann::json out{{"gpus", n}, {"device", uri}, {"bs", bs}, {"threads_per_gpu", threads}, {"commands_per_thread", commands}, {"queues_per_gpu", queues},
                     {"controller_blocks", controller_blocks}, {"data_checked", false}, {"note", "on-GPU null controller on GPU 0, queues in each GPU's memory: the command path, not a drive"}};
  if (!error.empty() || failed != 0) {
    out["error"] = !error.empty() ? error : std::to_string(failed) + " commands failed (one: " + kind + ")";
  } else {
    const double total = static_cast<double>(n) * threads * commands;
    out["seconds"] = seconds;
    out["commands"] = total;
    out["iops"] = total / seconds;
    out["iops_per_gpu"] = total / seconds / n;
  }
  for (int g = 0; g < n; ++g) {
    (void)cudaSetDevice(g);
    free_bookkeeping(sides[g]);
    (void)cudaFree(sides[g].buffer);
  }
  (void)cudaSetDevice(0);
  return out;
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
  unsigned controller_blocks = 16;
  app.add_option("--controller-blocks", controller_blocks, "gpu-null: the controller kernel's blocks of 128 threads")->check(CLI::Range(1, 1024));
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
  if (uri.rfind("gpu-null", 0) == 0) {
    for (const int n : counts) {
      nlohmann::json out;
      try {
        out = null_controller_run(n, uri, bs, threads, commands, queues, controller_blocks);
      } catch (const std::exception& e) {
        out = nlohmann::json{{"gpus", n}, {"device", uri}, {"error", e.what()}};
      }
      if (out.contains("error")) {
        status = 1;
      } else {
        if (n == 1) one_gpu_rate = out["iops"].get<double>();
        if (one_gpu_rate > 0) out["scaling_vs_1_gpu"] = out["iops"].get<double>() / one_gpu_rate / n;
      }
      std::puts(out.dump().c_str());
      std::fflush(stdout);
    }
    return status;
  }
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
      make_bookkeeping(s, pages, threads);
    }
    const double seconds = timed_on_every_gpu(n, commands, [&](int g, unsigned each) {
      const auto scope = devices[g]->make_current();
      gpu_side& s = sides[g];
      read_loop<<<threads / 256, 256, 0, s.stream>>>(devices[g]->readers(), cunvme::prp::page_list{s.pages, s.page_shift}, blocks, slots_in_namespace, each,
                                                     static_cast<unsigned>(g), s.last_lba, s.counts);
      (void)cudaStreamSynchronize(s.stream);
    });
    unsigned long long failed = 0, wrong = 0;
    std::string kind;
    const bool moved = uri.find("nodata") == std::string::npos && uri.find("pattern") != std::string::npos;
    std::string error;
    for (int g = 0; g < n; ++g) {
      const auto scope = devices[g]->make_current();
      gpu_side& s = sides[g];
      if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) error = "GPU " + std::to_string(g) + ": " + cudaGetErrorString(e);
      if (moved) {
        check_slots<<<256, 256, 0, s.stream>>>(static_cast<const std::uint64_t*>(s.buffer.device_data()), bs / 8, block, s.last_lba, threads, s.counts + 1);
      }
      unsigned long long host_counts[3] = {0, 0, 0};
      if (cudaMemcpy(host_counts, s.counts, sizeof host_counts, cudaMemcpyDeviceToHost) != cudaSuccess) error = "GPU " + std::to_string(g) + ": counters unreadable";
      failed += host_counts[0];
      if (host_counts[0] != 0) kind = failure_kind(host_counts[2]);
      wrong += host_counts[1];
    }
    const double total = static_cast<double>(n) * threads * commands;
    nlohmann::json out{{"gpus", n}, {"device", uri}, {"bs", bs}, {"threads_per_gpu", threads}, {"commands_per_thread", commands}, {"queues_per_gpu", queues},
                       {"data_checked", moved}};
    if (!error.empty() || failed != 0 || wrong != 0) {
      out["error"] = !error.empty() ? error : std::to_string(failed) + " commands failed (one: " + kind + "), " + std::to_string(wrong) + " words wrong";
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
      free_bookkeeping(sides[g]);
      sides[g].buffer = {};
    }
  }
  return status;
}
