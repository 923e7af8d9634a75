// volume_figures — the cache and volume figures of issue 17 (bench/RESULTS.md, P7a–c), each
// with its baseline in the same run, on volumes of on-GPU null controllers with data (the
// command path's figures, not a drive's: no PCIe, no host threads):
//
//   P7a  random 8-byte gathers through `array<uint64_t>`, every access a hit, ÷ the same gather
//        from a plain GPU array (per thread `a[i]`, and a warp's `gather`) — on a volume of four
//        emulators (hits do no I/O; with no endless controller kernel beside them, Nsight
//        Compute can profile these kernels: `--only p7a`)
//   P7b  random 4 KiB pages through the cache, (almost) every access a miss, ÷ raw `volume_io`
//        4 KiB reads on the same volume with the same threads
//   P7c  raw `volume_io` 4 KiB random reads on 4 controllers ÷ on 1, the same threads
//
//   build/bench/volume_figures [--threads N] [--seconds S] [--only p7a|p7b|p7c] [--controller-blocks N]
//
// Every read is checked against the namespace's words (`word_at(offset, member)`); a figure
// whose kernel failed or whose data did not verify is not printed (exit 1).
#include <cunvme/cache/array.cuh>
#include <cunvme/cache/page_cache.cuh>
#include <cunvme/emu/gpu_null_controller.cuh>
#include <cunvme/host/cuda_error.cuh>
#include <cunvme/host/gpu/gpu_queue.cuh>
#include <cunvme/host/gpu/gpu_reach.cuh>
#include <cunvme/host/open.cuh>
#include <cunvme/host/owners/page_cache_memory.cuh>
#include <cunvme/host/backend/uri_options.cuh>
#include <cunvme/host/owners/volume_members.cuh>
#include <cunvme/policy/device_group.cuh>
#include <cunvme/volume/volume.cuh>

#include <cuda/std/cstring>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace cunvme;
using queue_t = queue_policies<slots::multi_producer, completion::cooperative>;
using io_t = volume_io<queue_t, doorbell::mmio>;
using cache_t = page_cache<queue_t, doorbell::mmio>;
using words_t = array<std::uint64_t, cache_t>;

void check(cudaError_t e, const char* what) { cunvme::host::cuda_check(e, what, "the GPU"); }

__host__ __device__ constexpr std::uint64_t mix(std::uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
/// Member m's word at byte `o` of its namespace.
__host__ __device__ constexpr std::uint64_t word_at(std::uint64_t o, std::uint64_t m) { return mix(o ^ (m << 56)) | 1; }

__global__ void fill_words(std::uint64_t* data, std::uint64_t words, std::uint64_t member) {
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < words; i += std::uint64_t{gridDim.x} * blockDim.x) {
    data[i] = word_at(i * 8, member);
  }
}

/// The word volume word `i` holds.
__host__ __device__ std::uint64_t expected(const volume_view& v, std::uint64_t i) {
  const volume_run run = v.locate(i * 8 / v.block_bytes(), 1);
  return word_at(run.lba * v.block_bytes() + i * 8 % v.block_bytes(), run.member);
}

/// The word volume word `i` of four `emu:pattern` members holds (each member's namespace
/// holds `pattern_word(its own byte offset)`).
__host__ __device__ std::uint64_t pattern_expected(const volume_view& v, std::uint64_t i) {
  const volume_run run = v.locate(i * 8 / v.block_bytes(), 1);
  return host::pattern_word(run.lba * v.block_bytes() + i * 8 % v.block_bytes());
}

struct tally {
  unsigned long long ok, failed, mismatched;
  unsigned stop;
};

/// N null controllers with data as one striped volume, and GPU memory every member reaches
/// (the null controllers' bus addresses are GPU virtual addresses: one description serves all).
class null_volume {
 public:
  null_volume(unsigned members, std::uint64_t lba_count, std::uint32_t queues_each, unsigned controller_blocks = 4) {
    std::vector<volume_member> table;
    for (unsigned m = 0; m < members; ++m) {
      emu::gpu_null_controller::options o;
      o.queues = queues_each;
      o.entries = 1024;
      o.lba_count = lba_count;
      o.move_data = true;
      o.blocks = controller_blocks;
      ctrls_.push_back(std::make_unique<emu::gpu_null_controller>(o));
      fill_words<<<264, 256>>>(reinterpret_cast<std::uint64_t*>(ctrls_.back()->data()), lba_count * 512 / 8, m);
      check(cudaGetLastError(), "fill a namespace");
      queue_view* views = nullptr;
      check(cudaMalloc(&views, queues_each * sizeof(queue_view)), "allocate queue views");
      check(cudaMemcpy(views, ctrls_.back()->views().data(), queues_each * sizeof(queue_view), cudaMemcpyHostToDevice), "copy queue views");
      allocations_.push_back(views);
      table.push_back({views, queues_each, ctrls_.back()->namespace_view()});
    }
    volume_member* members_at = nullptr;
    check(cudaMalloc(&members_at, table.size() * sizeof(volume_member)), "allocate the member table");
    check(cudaMemcpy(members_at, table.data(), table.size() * sizeof(volume_member), cudaMemcpyHostToDevice), "copy the member table");
    allocations_.push_back(members_at);
    view_.members = members_at;
    view_.member_count = members;
    view_.stripe_shift = 7;  // 64 KiB
    view_.lba_shift = 9;
    view_.blocks = (lba_count >> 7 << 7) * members;
    view_.timeout_ns = 10'000'000'000ull;
    check(cudaDeviceSynchronize(), "fill the namespaces");
  }
  ~null_volume() {
    stop();
    for (void* p : allocations_) cudaFree(p);
  }
  void start() {
    for (auto& c : ctrls_) c->start();
  }
  void stop() {
    for (auto& c : ctrls_) c->stop();
  }
  [[nodiscard]] const volume_view& view() const noexcept { return view_; }
  /// `bytes` of GPU memory every member reaches, as one bus range each.
  [[nodiscard]] void* allocate(std::size_t bytes, member_buffers<prp::contiguous>& buffers) {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "allocate a buffer");
    allocations_.push_back(p);
    std::vector<prp::contiguous> bus(view_.member_count, prp::contiguous{reinterpret_cast<std::uint64_t>(p)});
    prp::contiguous* table = nullptr;
    check(cudaMalloc(&table, bus.size() * sizeof bus[0]), "allocate a buffer table");
    check(cudaMemcpy(table, bus.data(), bus.size() * sizeof bus[0], cudaMemcpyHostToDevice), "copy a buffer table");
    allocations_.push_back(table);
    buffers.bus = table;
    return p;
  }
  /// A page cache of `slots` 4 KiB slots over the volume, all in GPU memory.
  [[nodiscard]] page_cache_view cache(std::uint32_t slots) {
    page_cache_view v;
    v.pages = view_.blocks / 8;
    v.slots = slots;
    v.page_shift = 12;
    v.nsid = 0;
    v.blocks_per_page = 8;
    v.members = view_.member_count;
    v.data_pages = slots;
    page_cache_layout layout;
    if (!page_cache_layout::of(v.pages, slots, std::uint64_t{slots} * view_.member_count, layout)) throw std::runtime_error("cache layout");
    void* book = nullptr;
    check(cudaMalloc(&book, layout.bytes), "allocate cache bookkeeping");
    check(cudaMemset(book, 0, layout.bytes), "zero cache bookkeeping");
    allocations_.push_back(book);
    void* data = nullptr;
    check(cudaMalloc(&data, std::size_t{slots} * 4096), "allocate cache slots");
    allocations_.push_back(data);
    std::vector<std::uint64_t> bus;
    for (unsigned m = 0; m < view_.member_count; ++m)
      for (std::uint32_t s = 0; s < slots; ++s) bus.push_back(reinterpret_cast<std::uint64_t>(data) + std::uint64_t{s} * 4096);
    check(cudaMemcpy(static_cast<unsigned char*>(book) + layout.bus_pages_at, bus.data(), bus.size() * 8, cudaMemcpyHostToDevice), "copy bus pages");
    layout.bind(v, book);
    v.data = static_cast<unsigned char*>(data);
    v.data_bus = prp::page_list{reinterpret_cast<const std::uint64_t*>(static_cast<unsigned char*>(book) + layout.bus_pages_at), 12};
    return v;
  }

 private:
  std::vector<std::unique_ptr<emu::gpu_null_controller>> ctrls_;
  std::vector<void*> allocations_;
  volume_view view_{};
};

// ---- kernels: each runs until `stop` (set by the host after the measured time) --------------

/// Raw 4 KiB random reads on the volume into each thread's own 4 KiB, the first and last word checked.
__global__ void raw_reads(io_t io, member_buffers<prp::contiguous> bus, const std::uint64_t* buffer, std::uint64_t seed, tally* t) {
  const std::uint64_t thread = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const std::uint64_t pages = io.view().blocks / 8;
  unsigned long long ok = 0, failed = 0, bad = 0;
  for (std::uint64_t i = 0; !cuda::atomic_ref<unsigned, cuda::thread_scope_system>(t->stop).load(cuda::std::memory_order_relaxed); ++i) {
    const std::uint64_t page = mix(seed ^ (thread << 24) ^ i) % pages;
    if (!io.read(page * 8, 8, bus, thread * 4096).ok()) {
      ++failed;
      continue;
    }
    ++ok;
    const std::uint64_t* got = buffer + thread * 512;
    bad += got[0] != expected(io.view(), page * 512) || got[511] != expected(io.view(), page * 512 + 511);
  }
  atomicAdd(&t->ok, ok), atomicAdd(&t->failed, failed), atomicAdd(&t->mismatched, bad);
}

/// Random 4 KiB pages through the cache: a word of each checked.
__global__ void cached_pages(cache_t c, volume_view shape, std::uint64_t seed, tally* t) {
  const std::uint64_t thread = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  unsigned long long ok = 0, failed = 0, bad = 0;
  for (std::uint64_t i = 0; !cuda::atomic_ref<unsigned, cuda::thread_scope_system>(t->stop).load(cuda::std::memory_order_relaxed); ++i) {
    const std::uint64_t page = mix(seed ^ (thread << 24) ^ i) % c.pages();
    const cached_page p = c.acquire(page, page_access::read);
    if (!p.ok()) {
      ++failed;
      continue;
    }
    std::uint64_t w = 0;
    cuda::std::memcpy(&w, p.data + 8 * (i % 512), 8);
    (void)c.release(page);
    ++ok;
    bad += w != expected(shape, page * 512 + i % 512);
  }
  atomicAdd(&t->ok, ok), atomicAdd(&t->failed, failed), atomicAdd(&t->mismatched, bad);
}

/// `rounds` random 8-byte elements per thread of the first `span`: per thread (`a[i]`) or per warp (`gather`).
template <bool Warp>
__global__ void gather_words(words_t a, volume_view shape, std::uint64_t span, unsigned rounds, std::uint64_t seed, std::uint64_t* scratch, tally* t) {
  // P7a's volume is of `emu:pattern` members: their words are `pattern_expected`.
  __shared__ warp_group::temp_storage storage[8];
  warp_group warp(storage[threadIdx.x / 32]);
  const std::uint64_t thread = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  std::uint64_t* indices = scratch + thread / 32 * 64;
  unsigned long long ok = 0, failed = 0, bad = 0;
  for (unsigned r = 0; r < rounds; ++r) {
    const std::uint64_t i = mix(seed ^ (thread << 20) ^ r) % span;
    std::uint64_t v = 0;
    io_result res;
    if constexpr (Warp) {
      indices[warp.rank()] = i;
      __syncwarp();
      res = a.gather(warp, indices, 32, indices + 32);
      v = indices[32 + warp.rank()];
      __syncwarp();
    } else {
      res = a.get(i, v);
    }
    if (res.ok()) {
      ++ok;
      bad += v != pattern_expected(shape, i);
    } else {
      ++failed;
    }
  }
  atomicAdd(&t->ok, ok), atomicAdd(&t->failed, failed), atomicAdd(&t->mismatched, bad);
}

/// Thread p reads element p × 512: every page of the first `pages` once (the warm-up).
__global__ void touch_pages(words_t a, std::uint64_t pages, tally* t) {
  const std::uint64_t p = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  std::uint64_t v = 0;
  if (p < pages && !a.get(p * 512, v).ok()) atomicAdd(&t->failed, 1ull);
}

/// The same gather from a plain GPU array of the words.
__global__ void plain_gather(const std::uint64_t* words, volume_view shape, std::uint64_t span, unsigned rounds, std::uint64_t seed, tally* t) {
  const std::uint64_t thread = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  unsigned long long ok = 0, bad = 0;
  for (unsigned r = 0; r < rounds; ++r) {
    const std::uint64_t i = mix(seed ^ (thread << 20) ^ r) % span;
    ++ok;
    bad += words[i] != pattern_expected(shape, i);
  }
  atomicAdd(&t->ok, ok), atomicAdd(&t->mismatched, bad);
}

__global__ void copy_words_out(const volume_view shape, std::uint64_t* words, std::uint64_t span) {
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < span; i += std::uint64_t{gridDim.x} * blockDim.x) {
    words[i] = pattern_expected(shape, i);
  }
}

struct figure {
  double per_second = 0;
  bool ok = false;
  std::string why;
};

/// Runs `launch(tally)` for `seconds` (stopping it through the mapped stop word) or to its end.
template <class Launch>
figure timed(tally* t, double seconds, bool until_stopped, Launch launch) {
  *t = {};
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event"), check(cudaEventCreate(&b), "event");
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  check(cudaEventRecord(a, s), "record");
  launch(s);
  check(cudaGetLastError(), "launch");
  check(cudaEventRecord(b, s), "record");
  if (until_stopped) {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    __atomic_store_n(&t->stop, 1u, __ATOMIC_RELEASE);
  }
  check(cudaStreamSynchronize(s), "run");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, a, b), "time");
  cudaEventDestroy(a), cudaEventDestroy(b), cudaStreamDestroy(s);
  figure f;
  f.per_second = t->ok / (ms / 1e3);
  f.ok = t->failed == 0 && t->mismatched == 0 && t->ok > 0;
  if (!f.ok) f.why = std::to_string(t->failed) + " failed, " + std::to_string(t->mismatched) + " mismatched of " + std::to_string(t->ok);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  unsigned threads = 8192;
  double seconds = 2;
  std::string only;
  unsigned controller_blocks = 4;  // thread blocks each null controller runs on
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "volume_figures: %s needs a value\n", a.c_str());
      return 2;
    }
    if (a == "--threads") threads = static_cast<unsigned>(std::strtoul(argv[i + 1], nullptr, 10));
    else if (a == "--seconds") seconds = std::strtod(argv[i + 1], nullptr);
    else if (a == "--only") only = argv[i + 1];
    else if (a == "--controller-blocks") controller_blocks = static_cast<unsigned>(std::strtoul(argv[i + 1], nullptr, 10));
    else {
      std::fprintf(stderr, "volume_figures: unknown option %s (--threads N, --seconds S, --only p7a|p7b|p7c, --controller-blocks N)\n", a.c_str());
      return 2;
    }
  }
  if (!only.empty() && only != "p7a" && only != "p7b" && only != "p7c") {
    std::fprintf(stderr, "volume_figures: --only takes p7a, p7b or p7c\n");
    return 2;
  }
  const auto want = [&](const char* f) { return only.empty() || only == f; };
  if (threads == 0 || threads % 256 != 0 || seconds <= 0 || controller_blocks == 0 || controller_blocks > 64) {
    std::fprintf(stderr, "volume_figures: --threads is a positive multiple of 256, --seconds positive, --controller-blocks 1..64\n");
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each figure as it comes, also into a file
  host::prepare_cuda_environment();          // before any CUDA call: P7a's emulators copy beside kernels
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    std::printf("volume_figures: no CUDA GPU: skipped\n");
    return 77;
  }
  try {
    (void)cudaSetDeviceFlags(cudaDeviceLmemResizeToMax);
    tally* t = nullptr;
    check(cudaHostAlloc(&t, sizeof *t, cudaHostAllocMapped), "allocate the tally");
    emu::prepare_kernels_to_run_beside(raw_reads, cached_pages, gather_words<false>, gather_words<true>, plain_gather, touch_pages);
    const unsigned grid = threads / 256;
    constexpr std::uint64_t lbas = std::uint64_t{1} << 20;  // 512 MiB a member
    bool all_ok = true;
    const auto report = [&](const char* name, const figure& f) {
      if (!f.ok) {
        std::printf("%-44s FAILED (%s): no figure\n", name, f.why.c_str());
        all_ok = false;
      } else {
        std::printf("%-44s %12.0f /s\n", name, f.per_second);
      }
    };

    // P7c: raw 4 KiB reads, 1 member then 4.
    figure raw[2];
    for (unsigned k = 0; k < (want("p7c") ? 2u : 0u); ++k) {
      const unsigned members = k == 0 ? 1 : 4;
      null_volume vol(members, lbas, 8, controller_blocks);
      member_buffers<prp::contiguous> bus;
      const auto* buffer = static_cast<const std::uint64_t*>(vol.allocate(std::size_t{threads} * 4096, bus));
      vol.start();
      raw[k] = timed(t, seconds, true, [&](cudaStream_t s) { raw_reads<<<grid, 256, 0, s>>>(io_t(vol.view()), bus, buffer, 3 + k, t); });
      vol.stop();
      report(k == 0 ? "P7c raw 4 KiB reads, 1 null controller" : "P7c raw 4 KiB reads, 4 null controllers", raw[k]);
    }
    if (raw[0].ok && raw[1].ok) std::printf("P7c striping 4 / 1: %.2fx (target >= 3.6x)\n", raw[1].per_second / raw[0].per_second);

    // P7b: random pages through a cache of 8192 slots (32 MiB) over 2 GiB: 98 % misses.
    if (want("p7b")) {
      null_volume vol(4, lbas, 8);
      member_buffers<prp::contiguous> bus;
      const auto* buffer = static_cast<const std::uint64_t*>(vol.allocate(std::size_t{threads} * 4096, bus));
      const cache_t c(vol.cache(8192), vol.view());
      vol.start();
      const figure base = timed(t, seconds, true, [&](cudaStream_t s) { raw_reads<<<grid, 256, 0, s>>>(io_t(vol.view()), bus, buffer, 5, t); });
      const unsigned cache_threads = std::min(threads, 4096u);  // at most half the slots held at once
      const figure miss = timed(t, seconds, true, [&](cudaStream_t s) { cached_pages<<<cache_threads / 256, 256, 0, s>>>(c, vol.view(), 6, t); });
      const figure base_same = timed(t, seconds, true, [&](cudaStream_t s) { raw_reads<<<cache_threads / 256, 256, 0, s>>>(io_t(vol.view()), bus, buffer, 7, t); });
      vol.stop();
      report("P7b raw 4 KiB reads, 4 controllers", base);
      report("P7b raw 4 KiB reads, cache's thread count", base_same);
      report("P7b cached random pages (misses)", miss);
      if (miss.ok && base_same.ok) std::printf("P7b misses / raw, same threads: %.2f (target >= 0.9)\n", miss.per_second / base_same.per_second);
    }
    // P7a: 8-byte gathers over 64 MiB of a volume of four emulators, cached in 16384 slots:
    // all hits after a warm-up pass.
    if (want("p7a")) {
      constexpr auto where = host::tier::host_queues_host_data;
      std::vector<std::unique_ptr<host::controller>> ctrls;
      std::vector<std::unique_ptr<host::io_queue>> queues;
      std::vector<host::volume::member> members;
      for (int m = 0; m < 4; ++m) {
        ctrls.push_back(host::open("emu:pattern,blocks=65536,workers=4", {}, host::gpu_reach()));
        queues.push_back(host::make_gpu_queue(*ctrls.back(), 1024, where));
        members.push_back({{queues.back().get()}, 1});
      }
      const auto vol = host::volume::striped(members, 64 * 1024, host::gpu_bookkeeping(*ctrls[0], where));
      const std::uint64_t span = (std::uint64_t{64} << 20) / 8;
      std::uint64_t* scratch = nullptr;
      std::uint64_t* words = nullptr;
      check(cudaMalloc(&scratch, std::size_t{threads} * 2 * 8), "scratch");
      check(cudaMalloc(&words, span * 8), "plain words");
      copy_words_out<<<264, 256>>>(vol.view(), words, span);
      check(cudaDeviceSynchronize(), "plain words");
      constexpr unsigned rounds = 256;
      const figure plain = timed(t, seconds, false, [&](cudaStream_t s) { plain_gather<<<grid, 256, 0, s>>>(words, vol.view(), span, rounds, 11, t); });
      report("P7a plain GPU array gather", plain);
      // The slots in pinned host memory (every hit's bytes cross PCIe), then in GPU memory.
      for (const bool gpu_slots : {false, true}) {
        const std::string where_slots = gpu_slots ? "GPU-memory slots" : "pinned-host slots";
        host::page_cache_memory memory(vol, 4096, 16384, host::gpu_bookkeeping(*ctrls[0], where), gpu_slots ? host::slot_allocator(host::allocate_gpu) : host::slot_allocator{});
        const cache_t c(memory.device_view(), vol.device_view());
        const words_t a(c, 0, vol.blocks() * 512 / 8);
        // Warm-up: every page of the span once (16384 pages into 16384 slots: nothing evicted).
        (void)timed(t, seconds, false, [&](cudaStream_t s) { touch_pages<<<static_cast<unsigned>(span / 512 / 256), 256, 0, s>>>(a, span / 512, t); });
        if (t->failed != 0) throw std::runtime_error("warming the cache: " + std::to_string(t->failed) + " reads failed");
        const std::uint64_t warm_misses = memory.counters().misses;
        const figure per_thread = timed(t, seconds, false, [&](cudaStream_t s) { gather_words<false><<<grid, 256, 0, s>>>(a, vol.view(), span, rounds, 11, scratch, t); });
        const figure per_warp = timed(t, seconds, false, [&](cudaStream_t s) { gather_words<true><<<grid, 256, 0, s>>>(a, vol.view(), span, rounds, 11, scratch, t); });
        const std::uint64_t missed = memory.counters().misses - warm_misses;
        const std::uint64_t hits = memory.counters().hits;
        if (missed != 0) {
          std::printf("P7a (%s): %llu misses after the warm-up: not every access was a hit, no figure\n", where_slots.c_str(), static_cast<unsigned long long>(missed));
          all_ok = false;
        }
        report(("P7a cached a[i] per thread, " + where_slots).c_str(), per_thread);
        report(("P7a cached warp gather(), " + where_slots).c_str(), per_warp);
        std::printf("P7a (%s): %llu hits counted by the cache\n", where_slots.c_str(), static_cast<unsigned long long>(hits));
        if (missed == 0 && plain.ok && per_thread.ok) {
          std::printf("P7a hits / plain, %s, per thread: %.3f; warp gather: %.3f (target >= 0.5)\n", where_slots.c_str(), per_thread.per_second / plain.per_second,
                      per_warp.ok ? per_warp.per_second / plain.per_second : 0.0);
        }
      }
      cudaFree(scratch), cudaFree(words);
    }
    cudaFreeHost(t);
    return all_ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "volume_figures: %s\n", e.what());
    return 1;
  }
}
