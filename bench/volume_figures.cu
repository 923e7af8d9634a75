// volume_figures — the cache and volume figures of issue 17 (bench/RESULTS.md, P7a–c), each
// with its baseline in the same run, on volumes of on-GPU null controllers with data (the
// command path's figures, not a drive's: no PCIe, no host threads):
//
//   P7a  8-byte reads through `array<uint64_t>` (per thread `a[i]`), every access a hit, ÷ the
//        same reads from a plain GPU array, 64 Ki to 4 Mi threads, by a kernel with the
//        compiler's registers and by one bounded to 64 (`__launch_bounds__(256, 4)`), in two
//        shapes: coalesced (a warp reads 32 consecutive elements of one random page, BaM's
//        shape) and random (each lane its own element); HBM's copy bandwidth beside them.
//        Checked by comparing the sums of the values read, so nothing is verified inside the
//        timed kernels. On a volume of four
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

/// P7a's two access shapes.
enum class shape {
  random,     ///< every lane its own element
  coalesced,  ///< a warp's 32 lanes read 32 consecutive elements (256 bytes) of one random page: BaM's benchmark shape
};

/// The element thread `thread` reads in round `r` of a span of `mask + 1` elements (a power of
/// two: no division). A hash of a few integer operations, so that making the index costs
/// little beside the read it names.
template <shape S>
__device__ __forceinline__ std::uint64_t element(std::uint64_t thread, unsigned r, std::uint64_t mask, std::uint64_t seed) {
  if constexpr (S == shape::random) {
    return mix(seed ^ (thread << 20) ^ r) & mask;
  } else {
    const std::uint64_t page = mix(seed ^ ((thread / 32) << 20) ^ r) & (mask >> 9);
    return page << 9 | ((r * 32u) & 511u) | (thread & 31u);
  }
}

/// Adds a thread's sum of the values it read into `sum`, a warp at a time. The gathers are
/// checked by comparing sums afterwards, so that no expected value is computed while timed.
__device__ void add_to_sum(unsigned long long* sum, unsigned long long v) {
  for (int lanes = 16; lanes > 0; lanes /= 2) v += __shfl_down_sync(0xffffffffu, v, lanes);
  if (threadIdx.x % 32 == 0) atomicAdd(sum, v);
}

/// `rounds` elements per thread through the cache (`a[i]`, every one a hit after the warm-up).
template <shape S>
__device__ void gather_through_cache(words_t a, std::uint64_t mask, unsigned rounds, std::uint64_t seed, unsigned long long* sum, tally* t) {
  const std::uint64_t thread = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  unsigned long long total = 0, failed = 0;
  for (unsigned r = 0; r < rounds; ++r) {
    std::uint64_t v = 0;
    if (a.get(element<S>(thread, r, mask, seed), v).ok()) {
      total += v;
    } else {
      ++failed;
    }
  }
  add_to_sum(sum, total);
  if (failed != 0) atomicAdd(&t->failed, failed);
}

/// The gather as a kernel of the caller's would be written: the compiler gives it the registers
/// the miss path wants (168–174 on sm_90), which leaves room for one block of 256 per SM.
template <shape S>
__global__ void cached_gather(words_t a, std::uint64_t mask, unsigned rounds, std::uint64_t seed, unsigned long long* sum, tally* t) {
  gather_through_cache<S>(a, mask, rounds, seed, sum, t);
}

/// The same with its registers bounded for four blocks of 256 per SM (64 registers; the miss
/// path then keeps some of its state on the stack), as docs/volume-cache.md advises.
template <shape S>
__global__ void __launch_bounds__(256, 4) cached_gather_bounded(words_t a, std::uint64_t mask, unsigned rounds, std::uint64_t seed, unsigned long long* sum, tally* t) {
  gather_through_cache<S>(a, mask, rounds, seed, sum, t);
}

/// The same elements from a plain GPU array of the same words: the baseline of the same shape.
template <shape S>
__global__ void plain_gather(const std::uint64_t* words, std::uint64_t mask, unsigned rounds, std::uint64_t seed, unsigned long long* sum) {
  const std::uint64_t thread = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  unsigned long long total = 0;
  for (unsigned r = 0; r < rounds; ++r) total += words[element<S>(thread, r, mask, seed)];
  add_to_sum(sum, total);
}

/// Thread p reads element p × 512: every page of the first `pages` once (the warm-up).
__global__ void touch_pages(words_t a, std::uint64_t pages, tally* t) {
  const std::uint64_t p = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  std::uint64_t v = 0;
  if (p < pages && !a.get(p * 512, v).ok()) atomicAdd(&t->failed, 1ull);
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

/// Seconds `launch(stream)` took on a stream of its own, by CUDA events around it;
/// `while_running()` runs on the host between the launch and the wait.
template <class Launch, class While>
double elapsed_seconds(Launch launch, While while_running) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event"), check(cudaEventCreate(&b), "event");
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  check(cudaEventRecord(a, s), "record");
  launch(s);
  check(cudaGetLastError(), "launch");
  check(cudaEventRecord(b, s), "record");
  while_running();
  check(cudaStreamSynchronize(s), "run");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, a, b), "time");
  cudaEventDestroy(a), cudaEventDestroy(b), cudaStreamDestroy(s);
  return ms / 1e3;
}
template <class Launch>
double elapsed_seconds(Launch launch) {
  return elapsed_seconds(launch, [] {});
}

/// Runs `launch(tally)` for `seconds` (stopping it through the mapped stop word) or to its end.
template <class Launch>
figure timed(tally* t, double seconds, bool until_stopped, Launch launch) {
  *t = {};
  const double took = elapsed_seconds(launch, [&] {
    if (!until_stopped) return;
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    __atomic_store_n(&t->stop, 1u, __ATOMIC_RELEASE);
  });
  figure f;
  f.per_second = t->ok / took;
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
    emu::prepare_kernels_to_run_beside(raw_reads, cached_pages, cached_gather<shape::random>, cached_gather<shape::coalesced>,
                                       cached_gather_bounded<shape::random>, cached_gather_bounded<shape::coalesced>, plain_gather<shape::random>,
                                       plain_gather<shape::coalesced>, touch_pages);
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
    // P7a: 8-byte reads over 64 MiB of a volume of four emulators, cached in 16384 GPU-memory
    // slots (all hits after a warm-up pass), against the same reads from a plain GPU array,
    // for 64 Ki to 4 Mi threads and both shapes; HBM's copy bandwidth measured beside them.
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
      const std::uint64_t span = (std::uint64_t{64} << 20) / 8;  // a power of two: `element` masks
      const std::uint64_t mask = span - 1;
      std::uint64_t* words = nullptr;
      unsigned long long* sums = nullptr;
      check(cudaMalloc(&words, span * 8), "plain words");
      check(cudaMalloc(&sums, sizeof *sums), "sum");
      copy_words_out<<<264, 256>>>(vol.view(), words, span);
      check(cudaDeviceSynchronize(), "plain words");
      {
        // The physical limit in this run: a 1 GiB device-to-device copy, bytes read and written.
        void* from = nullptr;
        void* to = nullptr;
        check(cudaMalloc(&from, std::size_t{1} << 30), "copy source"), check(cudaMalloc(&to, std::size_t{1} << 30), "copy target");
        double best = 1e30;
        for (int k = 0; k < 3; ++k) {
          best = std::min(best, elapsed_seconds([&](cudaStream_t s) {
            check(cudaMemcpyAsync(to, from, std::size_t{1} << 30, cudaMemcpyDeviceToDevice, s), "device copy");
          }));
        }
        cudaFree(from), cudaFree(to);
        std::printf("P7a HBM device-to-device copy (read + write)  %8.1f GB/s\n", 2.0 * (1u << 30) / best / 1e9);
      }
      host::page_cache_memory memory(vol, 4096, 16384, host::gpu_bookkeeping(*ctrls[0], where), host::slot_allocator(host::allocate_gpu));
      const cache_t c(memory.device_view(), vol.device_view());
      const words_t a(c, 0, vol.blocks() * 512 / 8);
      // Warm-up: every page of the span once (16384 pages into 16384 slots: nothing evicted).
      (void)timed(t, seconds, false, [&](cudaStream_t s) { touch_pages<<<static_cast<unsigned>(span / 512 / 256), 256, 0, s>>>(a, span / 512, t); });
      if (t->failed != 0) throw std::runtime_error("warming the cache: " + std::to_string(t->failed) + " reads failed");
      // One shape and thread count: the plain gather, then the cached one, 5 times each (best
      // and median reported); figures only when every cached run's sum of the values read
      // equals the plain array's and the cache counted no miss among them.
      constexpr int repeats = 5;
      const auto run_pair = [&](shape sh, unsigned n_threads) {
        const unsigned rounds = std::max(8u, static_cast<unsigned>((std::uint64_t{1} << 27) / n_threads));
        const double reads = double(n_threads) * rounds;
        const char* name = sh == shape::random ? "random" : "coalesced";
        const unsigned blocks = n_threads / 256;
        std::vector<double> plain_rates, cached_rates, bounded_rates;
        unsigned long long plain_sum = 0;
        bool sums_agree = true;
        const std::uint64_t misses_before = memory.counters().misses;
        *t = {};
        const auto time_one = [&](auto launch) {
          check(cudaMemset(sums, 0, sizeof *sums), "clear the sum");
          check(cudaDeviceSynchronize(), "clear the sum");
          const double took = elapsed_seconds(launch);
          unsigned long long sum = 0;
          check(cudaMemcpy(&sum, sums, sizeof sum, cudaMemcpyDeviceToHost), "read the sum");
          return std::pair<double, unsigned long long>{reads / took, sum};
        };
        for (int k = 0; k < repeats; ++k) {
          const auto [rate, sum] = time_one([&](cudaStream_t s) {
            if (sh == shape::random) plain_gather<shape::random><<<blocks, 256, 0, s>>>(words, mask, rounds, 11, sums);
            else plain_gather<shape::coalesced><<<blocks, 256, 0, s>>>(words, mask, rounds, 11, sums);
          });
          plain_rates.push_back(rate);
          plain_sum = sum;
        }
        // One cached kernel (its random and coalesced instances), `repeats` times; each sum must be the plain array's.
        const auto time_cached = [&](auto random_kernel, auto coalesced_kernel, std::vector<double>& rates) {
          for (int k = 0; k < repeats; ++k) {
            const auto [rate, sum] = time_one([&](cudaStream_t s) {
              (sh == shape::random ? random_kernel : coalesced_kernel)<<<blocks, 256, 0, s>>>(a, mask, rounds, 11, sums, t);
            });
            rates.push_back(rate);
            sums_agree = sums_agree && sum == plain_sum;
          }
        };
        time_cached(cached_gather<shape::random>, cached_gather<shape::coalesced>, cached_rates);
        time_cached(cached_gather_bounded<shape::random>, cached_gather_bounded<shape::coalesced>, bounded_rates);
        const std::uint64_t missed = memory.counters().misses - misses_before;
        const auto best = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
        const auto median = [](std::vector<double> v) {
          std::sort(v.begin(), v.end());
          return v[v.size() / 2];
        };
        std::printf("P7a %-9s %7u threads x %4u: plain best %12.0f reads/s (%7.1f GB/s), median %12.0f", name, n_threads, rounds, best(plain_rates),
                    best(plain_rates) * 8 / 1e9, median(plain_rates));
        if (t->failed != 0 || !sums_agree || missed != 0) {
          std::printf("; cached FAILED (%llu failed reads, sums %s, %llu misses): no figure\n", t->failed, sums_agree ? "agree" : "differ",
                      static_cast<unsigned long long>(missed));
          all_ok = false;
          return;
        }
        std::printf("; cached best %12.0f reads/s (%7.1f GB/s), median %12.0f; cached / plain (best) %.3f", best(cached_rates),
                    best(cached_rates) * 8 / 1e9, median(cached_rates), best(cached_rates) / best(plain_rates));
        std::printf("; bounded (64 registers) best %12.0f reads/s (%7.1f GB/s), median %12.0f; bounded / plain (best) %.3f\n", best(bounded_rates),
                    best(bounded_rates) * 8 / 1e9, median(bounded_rates), best(bounded_rates) / best(plain_rates));
      };
      std::vector<unsigned> sweep = {65536u, 262144u, 1048576u, 4194304u};
      if (threads > 65536u && std::find(sweep.begin(), sweep.end(), threads) == sweep.end()) sweep.push_back(threads);
      std::sort(sweep.begin(), sweep.end());
      for (const shape sh : {shape::coalesced, shape::random}) {
        for (const unsigned n : sweep) run_pair(sh, n);
      }
      std::printf("P7a %llu hits counted by the cache (BaM's published warm-cache figure: 22.7 G reads/s on an A100)\n",
                  static_cast<unsigned long long>(memory.counters().hits));
      cudaFree(words), cudaFree(sums);
    }
    cudaFreeHost(t);
    return all_ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "volume_figures: %s\n", e.what());
    return 1;
  }
}
