// cunvme_bench: fio-style measurements of the GPU I/O path, and of the machine's limits it is
// compared with, in one program:
//
//   cunvme_bench --rw randread --bs 4096 --qd 4 --threads 8192 --queues 8 --time 5
//   cunvme_bench --device gpu-null --rw randread --bs 512 --qd 8 --threads 65536 --queues 64
//   cunvme_bench --baseline h2d --size 8G        # pinned cudaMemcpy host → GPU
//   cunvme_bench --baseline pingpong             # GPU ↔ CPU round trip through pinned memory
//
// Every GPU thread keeps `qd` commands in flight with the asynchronous reader/writer; the
// threads of one block share one queue (block b uses queue b % queues). Latency is each
// command's submit-to-seen-complete time from %globaltimer (nanoseconds) into a log-linear
// histogram (16 buckets per octave: ±3 %); IOPS and bandwidth use the CUDA-event time of the
// whole kernel. `--json` prints one object (with the histogram) for bench/sweep.py; a run whose
// commands failed or whose reads did not verify prints no figure and exits 1 (its object holds
// "error" instead). The options and their checks: cunvme_bench_options.hpp; the record:
// cunvme_bench_report.hpp.
//
// Devices: `emu[:keys]` (the emulator on host threads, see host/open.cuh; `--devices N` opens N
// of them, the queues spread over them), `gpu-null` (the on-GPU null controller: the command
// path alone, no data moved) and `gpu-null:copy` (it also copies a GPU-resident namespace).
// `--volume striped|mirrored` makes the `--devices` one volume (emulators, drives, or that many
// null controllers): each command goes where `volume_view` puts its blocks, on the queue pair of
// the thread's SM there — striping measured as the cache and `volume_io` use it:
//
//   cunvme_bench --device gpu-null:copy --devices 4 --volume striped --queues 32 --threads 16384 --verify
#include <cunvme/emu/cuda_memory.cuh>
#include <cunvme/emu/gpu_null_controller.cuh>
#include <cunvme/host/cuda_error.cuh>
#include <cunvme/host/gpu/gpu_dma_buf.cuh>
#include <cunvme/host/gpu/gpu_queue.cuh>
#include <cunvme/host/gpu/gpu_reach.cuh>
#include <cunvme/host/open.cuh>
#include <cunvme/host/owners/volume_members.cuh>
#include <cunvme/io/reader.cuh>
#include <cunvme/volume/volume.cuh>

#include "cunvme_bench_options.hpp"
#include "cunvme_bench_report.hpp"
#include "queue_probe.hpp"

#include <cuda/std/bit>

#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace cunvme;
using u64 = std::uint64_t;
using bench::usage_error;
using bench::cunvme_bench::max_qd;
using bench::cunvme_bench::options;

// ---- latency histogram ---------------------------------------------------------------------

constexpr unsigned sub_buckets = 16;
constexpr unsigned latency_bins = sub_buckets * 38;  // up to 2^41 ns

__host__ __device__ constexpr unsigned latency_bin(u64 ns) {
  if (ns < sub_buckets) return static_cast<unsigned>(ns);
  const unsigned octave = 63 - static_cast<unsigned>(cuda::std::countl_zero(ns));  // ≥ 4
  const unsigned bin = (octave - 3) * sub_buckets + static_cast<unsigned>((ns >> (octave - 4)) & (sub_buckets - 1));
  return bin < latency_bins ? bin : latency_bins - 1;
}
/// The lowest latency of a bin, and the one above its highest.
constexpr u64 bin_low(unsigned bin) {
  if (bin < sub_buckets) return bin;
  const unsigned octave = bin / sub_buckets + 3;
  return u64{sub_buckets + bin % sub_buckets} << (octave - 4);
}
constexpr u64 bin_high(unsigned bin) { return bin < sub_buckets ? bin + 1 : bin_low(bin) + (u64{1} << (bin / sub_buckets - 1)); }
static_assert(latency_bin(15) == 15 && latency_bin(16) == 16 && latency_bin(31) == 31 && latency_bin(32) == 32);
static_assert(bin_low(latency_bin(1000)) <= 1000 && bin_high(latency_bin(1000)) > 1000);
static_assert(bin_low(latency_bin(123456789)) <= 123456789 && bin_high(latency_bin(123456789)) > 123456789);

// ---- what the kernel does -------------------------------------------------------------------

struct params {
  std::uint32_t blocks = 8;         ///< LBAs per command
  std::uint32_t qd = 1;             ///< commands in flight per thread
  u64 ops_per_thread = 0;           ///< 0: run for duration_ns
  u64 duration_ns = 0;
  u64 seed = 1;
  u64 lba_range = 0;                ///< LBAs the run addresses (from 0)
  std::uint32_t threads = 0;        ///< GPU threads doing I/O
  bool write = false, random = true, verify = false;
};

struct counts {
  unsigned long long ops, bytes, errors, timeouts, mismatches, max_ns, first_error;
  unsigned long long hist[latency_bins];
};

/// One queue as the kernel sees it: its reader and writer, and the buffer its threads use.
template <class Reader, class Writer>
struct lane_queue {
  Reader r;
  Writer w;
  prp::contiguous buf;
  std::uint64_t* data;  ///< GPU-usable address of the buffer (for --verify)
  u64 slots;            ///< buffer slots of bs bytes
};

__device__ u64 mix(u64 x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

/// Where a run's commands go: one namespace's queues, the threads of block b on queue b % queues
/// (thread t on queue t with exclusive slots).
template <class Reader, class Writer>
struct queue_router {
  using lane = lane_queue<Reader, Writer>;
  const lane* queues;
  unsigned count;
  bool per_thread;
  /// The queue of `tid`'s command at `lba`, and the LBA there.
  __device__ unsigned route(u64 tid, u64 lba, u64& device_lba) const {
    device_lba = lba;
    return static_cast<unsigned>(per_thread ? tid : blockIdx.x % count);
  }
  [[nodiscard]] __device__ const lane& at(unsigned i) const { return queues[i]; }
};

/// The --devices as one volume: a command goes to the member `volume_view::locate` gives, on the
/// queue pair `volume_view::queue_for` gives this thread there (its SM's).
template <class Reader, class Writer>
struct volume_router {
  using lane = lane_queue<Reader, Writer>;
  volume_view v;
  const lane* lanes;  ///< [member × queues per member]: member m's queues in the order of its queue list
  unsigned per_member;
  std::uint32_t blocks;  ///< of one command (it lies on one member: --stripe is a multiple of --bs)
  __device__ unsigned route(u64, u64 lba, u64& device_lba) const {
    const volume_run run = v.locate(lba, blocks);
    device_lba = run.lba;
    const auto queue = static_cast<unsigned>(&v.queue_for(run.member) - v.members[run.member].queues);
    return run.member * per_member + queue;
  }
  [[nodiscard]] __device__ const lane& at(unsigned i) const { return lanes[i]; }
};

template <class Router>
__global__ void __launch_bounds__(256) io_kernel(Router router, params p, counts* out, unsigned long long* progress) {
  __shared__ unsigned hist[latency_bins];
  for (unsigned i = threadIdx.x; i < latency_bins; i += blockDim.x) hist[i] = 0;
  __syncthreads();
  const u64 tid = u64{blockIdx.x} * blockDim.x + threadIdx.x;
  unsigned long long ops = 0, bytes = 0, errors = 0, timeouts = 0, mismatches = 0, max_ns = 0, first_error = 0, reported = 0;
  if (tid < p.threads) {
    const u64 lba_bytes = u64{1} << router.at(0).r.ns().lba_shift;
    const u64 bs = p.blocks * lba_bytes;
    const u64 commands_in_range = p.lba_range / p.blocks;
    io_handle h[max_qd];
    u64 started[max_qd] = {}, lba[max_qd] = {};  // lba: on the device the command went to
    unsigned lane[max_qd] = {};
    u64 issued = 0;
    const u64 deadline = access::now_ns() + p.duration_ns;
    auto finish = [&](unsigned k) {
      const u64 ns = access::now_ns() - started[k];
      const auto& q = router.at(lane[k]);
      if (h[k].result.ok()) {
        ++ops;
        bytes += bs;
        atomicAdd(&hist[latency_bin(ns)], 1u);
        max_ns = ns > max_ns ? ns : max_ns;
        if (p.verify && !p.write) {
          const std::uint64_t* words = q.data + ((tid * p.qd + k) % q.slots) * (bs / 8);
          mismatches += words[0] != host::pattern_word(lba[k] * lba_bytes);
          mismatches += words[bs / 8 - 1] != host::pattern_word(lba[k] * lba_bytes + bs - 8);
        }
      } else {
        ++errors;
        timeouts += h[k].result.error == io_error::timeout;
        if (first_error == 0) first_error = static_cast<unsigned long long>(h[k].result.error) << 16 | static_cast<unsigned>(h[k].result.status);
      }
      h[k] = io_handle{};
      if (ops - reported >= 256) {
        cuda::atomic_ref<unsigned long long, cuda::thread_scope_system>(*progress).fetch_add(ops - reported, cuda::std::memory_order_relaxed);
        reported = ops;
      }
    };
    for (unsigned round = 0;; ++round) {
      const bool more = p.ops_per_thread != 0 ? issued < p.ops_per_thread : access::now_ns() < deadline;
      bool busy = false, in_flight = false;
      for (unsigned k = 0; k < p.qd; ++k) {
        if (h[k].state == io_handle::phase::in_flight) {
          const auto& q = router.at(lane[k]);
          if (!(more ? q.r.test(h[k]) : (q.r.wait(h[k]), true))) {
            in_flight = true;
            continue;
          }
          finish(k);
          busy = true;
        }
        if (!more || (p.ops_per_thread != 0 && issued >= p.ops_per_thread)) continue;  // the quota, not one round's worth more
        const u64 i = issued;
        const u64 command = p.random ? mix(p.seed ^ (tid << 24) ^ i) % commands_in_range : (tid + i * p.threads) % commands_in_range;
        lane[k] = router.route(tid, command * p.blocks, lba[k]);
        const auto& q = router.at(lane[k]);
        const u64 offset = ((tid * p.qd + k) % q.slots) * bs;
        started[k] = access::now_ns();
        h[k] = p.write ? q.w.submit_write(lba[k], p.blocks, q.buf, offset) : q.r.submit_read(lba[k], p.blocks, q.buf, offset);
        if (h[k].state == io_handle::phase::in_flight) {
          ++issued;
          in_flight = busy = true;
        } else if (h[k].result.error == io_error::no_command_id) {
          h[k] = io_handle{};  // every CID in flight: try again after finishing some
        } else {
          ++issued;
          finish(k);
        }
      }
      if (!more && !in_flight) break;
      if (!busy) access::back_off(round % 8);
    }
  }
  cuda::atomic_ref<unsigned long long, cuda::thread_scope_system>(*progress).fetch_add(ops - reported, cuda::std::memory_order_relaxed);
  atomicAdd(&out->ops, ops);
  atomicAdd(&out->bytes, bytes);
  if (errors) atomicAdd(&out->errors, errors);
  if (timeouts) atomicAdd(&out->timeouts, timeouts);
  if (mismatches) atomicAdd(&out->mismatches, mismatches);
  if (first_error) atomicCAS(&out->first_error, 0ull, first_error);
  atomicMax(&out->max_ns, max_ns);
  __syncthreads();
  for (unsigned i = threadIdx.x; i < latency_bins; i += blockDim.x) {
    if (hist[i] != 0) atomicAdd(&out->hist[i], static_cast<unsigned long long>(hist[i]));
  }
}

/// One warp per queue; lane 0 drains for everybody until `*stop`.
__global__ void poller_kernel(const queue_view* views, unsigned count, std::uint32_t* stop) {
  const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  if (warp < count && threadIdx.x % 32 == 0) (void)completion::poller<doorbell::mmio>::run(views[warp], *stop);
}

/// The smallest step of %globaltimer this GPU shows.
__global__ void timer_step(unsigned long long* out) {
  u64 smallest = ~u64{0}, last = access::now_ns();
  for (int i = 0; i < 100000; ++i) {
    const u64 now = access::now_ns();
    if (now != last) smallest = now - last < smallest ? now - last : smallest;
    last = now;
  }
  *out = smallest;
}

/// The GPU side of the ping-pong: answers each odd value with the next even one.
__global__ void pong(std::uint32_t* word, unsigned rounds) {
  cuda::atomic_ref<std::uint32_t, cuda::thread_scope_system> w(*word);
  for (unsigned i = 0; i < rounds; ++i) {
    while (w.load(cuda::std::memory_order_acquire) != 2 * i + 1) {
    }
    w.store(2 * i + 2, cuda::std::memory_order_release);
  }
}

// ---- host side ---------------------------------------------------------------------------------

void check(cudaError_t e, const char* what) { cunvme::host::cuda_check(e, what, "the GPU"); }

std::string gpu_name() {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "query the GPU");
  return prop.name;
}

/// Prints "\r[=====     ] 53%  1.23 M ops/s" on stderr while `running`, for runs past 1 s.
class progress_bar {
 public:
  progress_bar(const unsigned long long* done, u64 total, double seconds, bool show) : done_(done), total_(total), seconds_(seconds), show_(show && isatty(2)) {}
  void tick() {
    const auto now = std::chrono::steady_clock::now();
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    if (!show_ || elapsed < 1.0 || now - last_ < std::chrono::milliseconds(200)) return;
    const u64 done = __atomic_load_n(done_, __ATOMIC_RELAXED);
    const double fraction = total_ != 0 ? static_cast<double>(done) / total_ : elapsed / seconds_;
    const int filled = static_cast<int>(std::min(1.0, fraction) * 30);
    std::fprintf(stderr, "\r[%-30s] %3d%%  %.3g M ops/s ", std::string(filled, '=').c_str(), static_cast<int>(std::min(1.0, fraction) * 100),
                 (done - last_done_) / std::chrono::duration<double>(now - last_).count() / 1e6);
    last_ = now;
    last_done_ = done;
    drawn_ = true;
  }
  ~progress_bar() {
    if (drawn_) std::fprintf(stderr, "\r%60s\r", "");
  }

 private:
  const unsigned long long* done_;
  u64 total_;
  double seconds_;
  bool show_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_ = start_;
  u64 last_done_ = 0;
};

bench::cunvme_bench::latency_summary summarize(const counts& c) {
  bench::cunvme_bench::latency_summary p;
  u64 total = 0;
  double sum = 0;
  for (unsigned b = 0; b < latency_bins; ++b) {
    total += c.hist[b];
    sum += c.hist[b] * 0.5 * static_cast<double>(bin_low(b) + bin_high(b));
  }
  if (total == 0) return p;
  p.mean = sum / total;
  auto at = [&](double q) {
    const u64 rank = static_cast<u64>(std::ceil(q * total));
    u64 seen = 0;
    for (unsigned b = 0; b < latency_bins; ++b) {
      seen += c.hist[b];
      if (seen >= rank) return 0.5 * static_cast<double>(bin_low(b) + bin_high(b));
    }
    return 0.0;
  };
  p.p50 = at(0.50);
  p.p99 = at(0.99);
  p.p999 = at(0.999);
  return p;
}

/// The devices and queues of one run, whatever the target.
struct target {
  std::vector<std::unique_ptr<host::controller>> controllers;
  std::vector<emu::controller*> emulators;
  std::vector<std::unique_ptr<host::io_queue>> queues;  // host-made queues (emulator, real)
  std::vector<host::dma_buffer> buffers;                // one per controller
  std::vector<std::unique_ptr<emu::gpu_null_controller>> nulls;
  std::vector<void*> gpu_allocations;                   // the null controllers' buffers, a null volume's tables
  std::vector<queue_view> views;
  std::vector<namespace_view> namespaces;
  std::vector<prp::contiguous> bufs;
  std::vector<std::uint64_t*> data;
  std::vector<std::vector<unsigned>> member_queues;     // a volume's: member m's queues (indices into views)
  std::unique_ptr<host::volume> volume;                 // a volume of emulators or drives
  volume_view volume_shape{};                           // its view for kernels (member table in GPU memory)
  u64 buffer_bytes = 0;
  std::vector<std::string> notes;

  ~target() {
    volume.reset();
    queues.clear();
    buffers.clear();
    for (void* p : gpu_allocations) cudaFree(p);
  }
  void start() {
    for (auto& n : nulls) n->start();
  }
  void stop() {
    for (auto& n : nulls) n->stop();
  }
  template <class T>
  [[nodiscard]] T* to_gpu(const std::vector<T>& items, const char* what) {
    void* p = nullptr;
    check(cudaMalloc(&p, sizeof(T) * items.size()), what);
    gpu_allocations.push_back(p);
    check(cudaMemcpy(p, items.data(), sizeof(T) * items.size(), cudaMemcpyHostToDevice), what);
    return static_cast<T*>(p);
  }
};

__global__ void fill_pattern(std::uint64_t* words, u64 count) {
  for (u64 i = u64{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += u64{gridDim.x} * blockDim.x) words[i] = host::pattern_word(i * 8);
}

void open_drives(const options& o, target& t);

/// The null controllers' volume, laid out as `host::volume` lays out one of drives (which takes
/// host::io_queue members, and a null controller's queues are not): the member table in GPU
/// memory, each member's usable blocks whole stripes.
void null_volume(const options& o, target& t) {
  const unsigned lba_shift = t.namespaces[0].lba_shift;
  volume_view& v = t.volume_shape;
  v.layout = o.volume == "mirrored" ? volume_layout::mirrored : volume_layout::striped;
  v.lba_shift = lba_shift;
  // Mirrored reads take the replicas in turn by 64 KiB, as host::volume::mirrored's do.
  const u64 stripe = v.layout == volume_layout::mirrored ? 64 * 1024 : o.stripe;
  v.stripe_shift = static_cast<std::uint32_t>(cuda::std::countr_zero(stripe)) - lba_shift;
  v.member_count = o.devices;
  v.timeout_ns = 10'000'000'000ull;
  std::vector<volume_member> members;
  u64 least = ~u64{0};
  for (const auto& queues : t.member_queues) {
    std::vector<queue_view> views;
    for (unsigned q : queues) views.push_back(t.views[q]);
    members.push_back({t.to_gpu(views, "copy a member's queue views"), static_cast<std::uint32_t>(views.size()), t.namespaces[queues[0]]});
    least = std::min<u64>(least, t.namespaces[queues[0]].lba_count);
  }
  v.blocks = v.layout == volume_layout::mirrored ? least : (least >> v.stripe_shift << v.stripe_shift) * o.devices;
  v.members = t.to_gpu(members, "copy the member table");
}

void open_target(const options& o, target& t) {
  if (o.on_null_controller()) {
    // --devices null controllers (a volume's members, or drives side by side); queue q on
    // controller q % devices, as the emulators' queues are.
    const bench::cunvme_bench::null_device null = bench::cunvme_bench::null_device_of(o.device);
    t.buffer_bytes = o.buffer_per_device();
    std::vector<void*> buffers;
    for (unsigned c = 0; c < o.devices; ++c) {
      emu::gpu_null_controller::options n;
      n.queues = (o.queues - c + o.devices - 1) / o.devices;
      n.entries = o.entries;
      n.move_data = null.copy;
      n.timing = null.timing;
      n.lba_count = n.move_data ? (u64{1} << 22) : (u64{1} << 32);  // 2 GiB of namespace when it is real
      n.blocks = o.null_blocks;
      t.nulls.push_back(std::make_unique<emu::gpu_null_controller>(n));
      if (n.move_data) {
        fill_pattern<<<1024, 256>>>(reinterpret_cast<std::uint64_t*>(t.nulls.back()->data()), (n.lba_count << n.lba_shift) / 8);
        check(cudaDeviceSynchronize(), "fill the null controller's namespace");
      }
      void* buffer = nullptr;
      check(cudaMalloc(&buffer, t.buffer_bytes), "allocate the data buffer");
      t.gpu_allocations.push_back(buffer);
      buffers.push_back(buffer);
    }
    t.member_queues.resize(o.devices);
    for (unsigned q = 0; q < o.queues; ++q) {
      const unsigned c = q % o.devices;
      t.member_queues[c].push_back(q);
      t.views.push_back(t.nulls[c]->views()[q / o.devices]);
      t.namespaces.push_back(t.nulls[c]->namespace_view());
      t.bufs.push_back(prp::contiguous{reinterpret_cast<u64>(buffers[c])});
      t.data.push_back(static_cast<std::uint64_t*>(buffers[c]));
    }
    if (null.timing.enabled()) {
      char model[160];
      std::snprintf(model, sizeof model, "a modelled drive: %.3g IOPS, %.3g GB/s, %.0f us read latency each",
                    null.timing.max_iops, null.timing.max_bytes_per_second / 1e9, null.timing.read_latency_ns / 1e3);
      t.notes.push_back(std::string("on-GPU null controller as ") + model + (null.copy ? ", with data" : ", no data moved") +
                        ": the library's command path against drives modelled on the GPU");
    } else {
      t.notes.push_back(null.copy ? "on-GPU null controller (copies a GPU-resident namespace): the command path, not a drive"
                                  : "on-GPU null controller (no data moved): the command path, not a drive");
    }
    if (o.on_volume()) null_volume(o, t);
  } else {
    open_drives(o, t);
  }
  if (o.on_volume()) {
    t.notes.push_back(o.volume + " volume of " + std::to_string(o.devices) + " members, " +
                      std::to_string(t.volume_shape.stripe_blocks() << t.volume_shape.lba_shift) + "-byte stripe, " +
                      std::to_string(o.queues / o.devices) + " queue pairs each (a thread takes its SM's)");
  }
}

void open_drives(const options& o, target& t) {
  const auto tier = static_cast<host::tier>(o.tier);
  t.buffer_bytes = o.buffer_per_device();
  // Ask each controller for the queue pairs this run puts on it (the default asks for 16).
  host::controller_options asked;
  asked.io_queue_pairs = static_cast<std::uint16_t>(std::min<unsigned>((o.queues + o.devices - 1) / o.devices, 65535));
  for (unsigned d = 0; d < o.devices; ++d) {
    t.controllers.push_back(host::open(o.device, asked, host::gpu_reach()));
    host::controller& ctrl = *t.controllers.back();
    (void)host::use_gpu_dma_buf(ctrl);  // tiers 2 and 3 through the kernel module's dma-buf import, where it has it
    if (auto* e = dynamic_cast<host::emu_backend*>(&ctrl.backend())) t.emulators.push_back(&e->controller());
    t.buffers.push_back(tier == host::tier::host_queues_host_data ? ctrl.memory().allocate(t.buffer_bytes) : host::allocate_gpu(ctrl, t.buffer_bytes));
  }
  for (unsigned q = 0; q < o.queues; ++q) {
    const unsigned d = q % o.devices;
    host::controller& ctrl = *t.controllers[d];
    t.queues.push_back(host::make_gpu_queue(ctrl, std::min<std::uint32_t>(o.entries, ctrl.cap().max_queue_entries()), tier));
    t.views.push_back(t.queues.back()->view());
    t.namespaces.push_back(t.queues.back()->namespace_view(1));
    t.bufs.push_back(prp::contiguous{t.buffers[d].bus()});
    t.data.push_back(static_cast<std::uint64_t*>(t.buffers[d].device_data()));
  }
  if (!t.emulators.empty() && o.device.find("nodata") != std::string::npos) t.notes.push_back("emulator without data movement (nodata): commands only");
  if (o.on_volume()) {
    // Member d: namespace 1 of device d, with the queues made on it (queue q is on device q % devices).
    std::vector<host::volume::member> members(o.devices);
    t.member_queues.resize(o.devices);
    for (unsigned q = 0; q < o.queues; ++q) {
      members[q % o.devices].queues.push_back(t.queues[q].get());
      members[q % o.devices].nsid = 1;
      t.member_queues[q % o.devices].push_back(q);
    }
    host::io_queue_memory table = host::gpu_bookkeeping(*t.controllers[0], tier);
    t.volume = std::make_unique<host::volume>(o.volume == "mirrored" ? host::volume::mirrored(members, std::move(table))
                                                                     : host::volume::striped(members, o.stripe, std::move(table)));
    t.volume_shape = t.volume->device_view();
  }
}

struct result {
  counts c{};
  double seconds = 0, cpu = 0;
  unsigned sms_busy = 0, sm_count = 0;  ///< SMs the I/O kernel's blocks occupied, of the GPU's
  u64 emulator_commands = 0;
  u64 doorbell_errors = 0, dma_faults = 0, completions_dropped = 0;  ///< the emulators' own view of trouble
  bench::queue_stages stages;  ///< --probe: summed over the probed queue pairs and snapshots
  u64 probe_samples = 0;
  unsigned probed_queues = 0;
  std::string probe_error;
};

/// --probe: copies the first queue pairs' counters, completion records and CQs on a stream of
/// its own while the run goes on, and sorts each copy into stages (bench/queue_probe.hpp). Made
/// before any kernel starts (its pinned allocation would wait for them, and a throw with the
/// null controller running would leave it running); it never throws: a step that fails stops
/// the probe and keeps the reason, and the run itself goes on.
class queue_prober {
 public:
  static constexpr unsigned most_queues = 16;

  explicit queue_prober(const std::vector<queue_view>& views) {
    for (std::size_t i = 0; i < views.size() && i < most_queues; ++i) views_.push_back(views[i]);
    std::size_t bytes = 0;
    for (const queue_view& v : views_) bytes += sizeof(queue_counters) + std::size_t{v.cids()} * sizeof(completion_record) + std::size_t{v.entries} * sizeof(spec::completion_entry);
    if (!ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "create its stream")) return;
    (void)ok(cudaHostAlloc(&staging_, bytes, cudaHostAllocDefault), "allocate its pinned memory");
  }
  queue_prober(const queue_prober&) = delete;
  queue_prober& operator=(const queue_prober&) = delete;
  ~queue_prober() {
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
    cudaFreeHost(staging_);
  }

  void sample() {
    if (!error_.empty()) return;
    auto* at = static_cast<std::byte*>(staging_);
    bool copied = true;
    const auto copy = [&](const void* from, std::size_t bytes) {
      copied = copied && ok(cudaMemcpyAsync(at, from, bytes, cudaMemcpyDefault, stream_), "copy a queue's bookkeeping");
      at += bytes;
    };
    for (const queue_view& v : views_) {
      copy(v.counters, sizeof(queue_counters));
      copy(v.records, std::size_t{v.cids()} * sizeof(completion_record));
      copy(v.cq, std::size_t{v.entries} * sizeof(spec::completion_entry));
    }
    if (!ok(cudaStreamSynchronize(stream_), "wait for its copies") || !copied) return;
    at = static_cast<std::byte*>(staging_);
    for (const queue_view& v : views_) {
      queue_counters c;
      std::memcpy(&c, at, sizeof c);
      at += sizeof c;
      std::vector<completion_record> records(v.cids());
      std::memcpy(records.data(), at, records.size() * sizeof(completion_record));
      at += records.size() * sizeof(completion_record);
      std::vector<spec::completion_entry> cq(v.entries);
      std::memcpy(cq.data(), at, cq.size() * sizeof(spec::completion_entry));
      at += cq.size() * sizeof(spec::completion_entry);
      stages_ += bench::classify(c, records, cq);
    }
    ++samples_;
  }

  void report_into(result& r) const {
    r.stages = stages_;
    r.probe_samples = samples_;
    r.probed_queues = static_cast<unsigned>(views_.size());
    r.probe_error = error_;
  }

 private:
  /// Whether `e` is success; otherwise keeps the first failure and clears CUDA's last error.
  bool ok(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return true;
    (void)cudaGetLastError();
    if (error_.empty()) error_ = std::string("the probe could not ") + what + ": " + host::cuda_error_text(e);
    return false;
  }

  std::vector<queue_view> views_;
  cudaStream_t stream_ = nullptr;
  void* staging_ = nullptr;
  bench::queue_stages stages_;
  u64 samples_ = 0;
  std::string error_;
};

template <class Slots, class Completion, class Doorbell>
result run_io(const options& o, target& t) {
  using reader = block_reader<queue_policies<Slots, Completion>, prp::contiguous, Doorbell>;
  using writer = block_writer<queue_policies<Slots, Completion>, prp::contiguous, Doorbell>;
  using lq = lane_queue<reader, writer>;
  const namespace_view ns = t.namespaces[0];
  const u64 bs_blocks = o.bs >> ns.lba_shift;
  // What only the opened device can tell; the checks of the options alone ran when they parsed.
  if (bs_blocks == 0 || (bs_blocks << ns.lba_shift) != o.bs) throw usage_error("--bs must be a multiple of the LBA size (" + std::to_string(ns.lba_size()) + ")");
  if (bs_blocks > ns.max_blocks) throw usage_error("--bs is larger than one command may carry (" + std::to_string(u64{ns.max_blocks} << ns.lba_shift) + " bytes)");
  const u64 slots = t.buffer_bytes / o.bs;

  // The queues in the order the router indexes them: a volume's member by member, each in the
  // order of its queue list.
  std::vector<unsigned> order;
  if (o.on_volume()) {
    for (const auto& queues : t.member_queues) order.insert(order.end(), queues.begin(), queues.end());
  } else {
    for (unsigned q = 0; q < o.queues; ++q) order.push_back(q);
  }
  std::vector<lq> table;
  for (unsigned q : order) table.push_back(lq{reader(t.views[q], t.namespaces[q]), writer(t.views[q], t.namespaces[q]), t.bufs[q], t.data[q], slots});
  lq* device_table = nullptr;
  queue_view* device_views = nullptr;
  counts* out = nullptr;
  unsigned long long* progress = nullptr;
  std::uint32_t* stop = nullptr;
  check(cudaMalloc(&device_table, sizeof(lq) * table.size()), "allocate the queue table");
  check(cudaMemcpy(device_table, table.data(), sizeof(lq) * table.size(), cudaMemcpyHostToDevice), "copy the queue table");
  check(cudaMalloc(&device_views, sizeof(queue_view) * t.views.size()), "allocate the views");
  check(cudaMemcpy(device_views, t.views.data(), sizeof(queue_view) * t.views.size(), cudaMemcpyHostToDevice), "copy the views");
  check(cudaMalloc(&out, sizeof(counts)), "allocate the counters");
  check(cudaMemset(out, 0, sizeof(counts)), "zero the counters");
  check(cudaHostAlloc(&progress, sizeof *progress, cudaHostAllocMapped), "allocate the progress word");
  check(cudaHostAlloc(&stop, sizeof *stop, cudaHostAllocMapped), "allocate the stop word");
  *progress = 0;
  *stop = 0;

  params p;
  p.blocks = static_cast<std::uint32_t>(bs_blocks);
  p.qd = o.qd;
  p.threads = o.threads;
  p.write = o.rw == "write" || o.rw == "randwrite";
  p.random = o.rw == "randread" || o.rw == "randwrite";
  p.verify = o.verify;
  p.seed = o.seed;
  p.lba_range = o.on_volume() ? t.volume_shape.blocks : ns.lba_count;
  const queue_router<reader, writer> by_queue{device_table, o.queues, std::is_same_v<Slots, slots::exclusive>};
  const volume_router<reader, writer> by_volume{t.volume_shape, device_table, o.queues / o.devices, p.blocks};
  const u64 total_ops = o.size / o.bs;
  p.ops_per_thread = o.size != 0 ? std::max<u64>(1, (total_ops + o.threads - 1) / o.threads) : 0;
  p.duration_ns = static_cast<u64>(o.time * 1e9);

  cudaStream_t work = nullptr, side = nullptr;
  check(cudaStreamCreateWithFlags(&work, cudaStreamNonBlocking), "create a stream");
  check(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "create a stream");
  // The controller and poller kernels run until stopped: the I/O kernel must be loaded and its
  // local memory reserved before they start, or its launch waits for them forever.
  emu::prepare_kernels_to_run_beside(io_kernel<queue_router<reader, writer>>, io_kernel<volume_router<reader, writer>>, poller_kernel);
  std::optional<queue_prober> prober;  // before any kernel starts (see queue_prober)
  if (o.probe) prober.emplace(t.views);
  // A profiler range around the device's and the readers' kernels (no-op without a profiler):
  // Nsight Compute's kernel replay serialises kernels, and the null controller's kernel runs
  // until the I/O kernel ends, so only a range (`ncu --replay-mode app-range`) can see both.
  (void)cudaProfilerStart();
  t.start();
  if (std::is_same_v<Completion, completion::dedicated_poller>) {
    poller_kernel<<<(o.queues * 32 + 127) / 128, 128, 0, side>>>(device_views, o.queues, stop);
    check(cudaGetLastError(), "launch the pollers");
  }
  u64 emulator_before = 0;
  for (auto* e : t.emulators) emulator_before += e->stats().io_commands;
  cudaEvent_t begin, end;
  check(cudaEventCreate(&begin), "create an event");
  check(cudaEventCreate(&end), "create an event");
  const double cpu_before = bench::process_cpu_seconds();
  check(cudaEventRecord(begin, work), "record an event");
  const unsigned grid = (o.threads + o.block_threads - 1) / o.block_threads;
  // The GPU time a user pays for the I/O: the SMs the kernel's blocks occupy, busy for the whole
  // kernel (its threads submit and poll; they do nothing else).
  result r;
  {
    int device = 0, sms = 0, per_sm = 0;
    check(cudaGetDevice(&device), "find the GPU");
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "count the SMs");
    if (o.on_volume()) {
      check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, io_kernel<decltype(by_volume)>, static_cast<int>(o.block_threads), 0), "occupancy");
    } else {
      check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, io_kernel<decltype(by_queue)>, static_cast<int>(o.block_threads), 0), "occupancy");
    }
    r.sm_count = static_cast<unsigned>(sms);
    r.sms_busy = std::min<unsigned>(r.sm_count, (grid + static_cast<unsigned>(std::max(per_sm, 1)) - 1) / static_cast<unsigned>(std::max(per_sm, 1)));
  }
  if (o.on_volume()) {
    io_kernel<<<grid, o.block_threads, 0, work>>>(by_volume, p, out, progress);
  } else {
    io_kernel<<<grid, o.block_threads, 0, work>>>(by_queue, p, out, progress);
  }
  check(cudaGetLastError(), "launch the I/O kernel");
  check(cudaEventRecord(end, work), "record an event");
  {
    progress_bar bar(progress, o.size != 0 ? p.ops_per_thread * o.threads : 0, o.time, true);
    while (cudaEventQuery(end) == cudaErrorNotReady) {
      bar.tick();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (prober && cudaEventQuery(end) == cudaErrorNotReady) prober->sample();  // snapshots while the I/O kernel runs, not after
    }
  }
  check(cudaEventSynchronize(end), "run the I/O kernel");
  if (prober) prober->report_into(r);
  r.cpu = bench::process_cpu_seconds() - cpu_before;
  float ms = 0;
  check(cudaEventElapsedTime(&ms, begin, end), "time the kernel");
  r.seconds = ms / 1e3;
  __atomic_store_n(stop, 1u, __ATOMIC_RELEASE);
  check(cudaStreamSynchronize(side), "stop the pollers");
  t.stop();
  (void)cudaProfilerStop();
  for (auto* e : t.emulators) {
    const auto s = e->stats();
    r.emulator_commands += s.io_commands;
    r.doorbell_errors += s.doorbell_errors;
    r.dma_faults += s.dma_faults;
    r.completions_dropped += s.completions_dropped;
  }
  r.emulator_commands -= emulator_before;
  check(cudaMemcpy(&r.c, out, sizeof(counts), cudaMemcpyDeviceToHost), "read the counters");
  cudaFree(device_table);
  cudaFree(device_views);
  cudaFree(out);
  cudaFreeHost(progress);
  cudaFreeHost(stop);
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  cudaStreamDestroy(work);
  cudaStreamDestroy(side);
  return r;
}

template <class Slots, class Completion>
result pick_doorbell(const options& o, target& t) {
  if (o.doorbell == "mmio") return run_io<Slots, Completion, doorbell::mmio>(o, t);
  if (o.doorbell == "coalescing") return run_io<Slots, Completion, doorbell::coalescing<doorbell::mmio>>(o, t);
  throw usage_error("--doorbell must be mmio or coalescing");
}
template <class Slots>
result pick_completion(const options& o, target& t) {
  if (o.completion == "cooperative") return pick_doorbell<Slots, completion::cooperative>(o, t);
  if (o.completion == "dedicated_poller") return pick_doorbell<Slots, completion::dedicated_poller>(o, t);
  throw usage_error("--completion must be cooperative or dedicated_poller");
}
result pick(const options& o, target& t) {
  if (o.slots == "warp_aggregated") return pick_completion<slots::warp_aggregated>(o, t);
  if (o.slots == "multi_producer") return pick_completion<slots::multi_producer>(o, t);
  if (o.slots == "exclusive") return pick_completion<slots::exclusive>(o, t);
  throw usage_error("--slots must be exclusive, warp_aggregated or multi_producer");
}

/// The kernel's counters and the emulators' as the report takes them.
bench::cunvme_bench::measurement measured(const result& r, const target& t, u64 timer_step_ns) {
  bench::cunvme_bench::measurement m;
  m.seconds = r.seconds;
  m.sms_busy = r.sms_busy;
  m.sm_count = r.sm_count;
  m.cpu_seconds = r.cpu;
  m.ops = r.c.ops;
  m.bytes = r.c.bytes;
  m.errors = r.c.errors;
  m.timeouts = r.c.timeouts;
  m.mismatches = r.c.mismatches;
  if (r.c.first_error != 0) {
    m.first_error = std::string(to_string(static_cast<io_error>(r.c.first_error >> 16))) + ", NVMe status " + std::to_string(r.c.first_error & 0xffff);
  }
  m.latency = summarize(r.c);
  m.max_ns = r.c.max_ns;
  for (unsigned b = 0; b < latency_bins; ++b) {
    if (r.c.hist[b] != 0) m.histogram.emplace_back(bin_low(b), r.c.hist[b]);
  }
  m.timer_step_ns = timer_step_ns;
  m.emulated = !t.emulators.empty();
  m.emulator_commands = r.emulator_commands;
  m.emulator_doorbell_errors = r.doorbell_errors;
  m.emulator_dma_faults = r.dma_faults;
  m.emulator_completions_dropped = r.completions_dropped;
  m.stages = r.stages;
  m.probe_samples = r.probe_samples;
  m.probed_queues = r.probed_queues;
  m.queues = static_cast<unsigned>(t.views.size());
  m.probe_error = r.probe_error;
  return m;
}

int run_benchmark(const options& o) {
  target t;
  open_target(o, t);
  unsigned long long* step = nullptr;
  check(cudaMallocManaged(&step, sizeof *step), "allocate");
  timer_step<<<1, 1>>>(step);
  check(cudaDeviceSynchronize(), "measure the timer");
  const u64 timer_ns = *step;
  cudaFree(step);
  const bench::cunvme_bench::measurement m = measured(pick(o, t), t, timer_ns);
  const bench::cunvme_bench::run_context ran{bench::now_text(), gpu_name(), t.nulls.empty() ? o.tier : 3u, t.notes};
  // Nothing below prints a figure of a run that failed: `failure` decides for the text and the JSON alike.
  const std::string failed = bench::cunvme_bench::failure(m);
  if (o.json) {
    std::printf("%s\n", bench::one_line(bench::cunvme_bench::report(o, ran, m)).c_str());
  } else {
    std::printf("%s: bs=%llu qd=%u threads=%u queues=%u entries=%u slots=%s completion=%s doorbell=%s tier=%u device=%s x%u%s\n", o.rw.c_str(),
                static_cast<unsigned long long>(o.bs), o.qd, o.threads, o.queues, o.entries, o.slots.c_str(), o.completion.c_str(), o.doorbell.c_str(),
                ran.tier, o.device.c_str(), o.devices, o.verify ? " verify" : "");
    for (const auto& n : t.notes) std::printf("  note: %s\n", n.c_str());
    if (failed.empty()) {
      std::printf("  %llu ops in %.3f s: IOPS=%.4g, BW=%.3f GB/s, errors=0, mismatches=0%s\n", static_cast<unsigned long long>(m.ops), m.seconds, m.iops(),
                  m.gb_per_s(), o.verify ? " (every read checked)" : "");
      std::printf("  GPU time on I/O: %u of %u SMs for the whole kernel, %.3f SM-µs per command\n", m.sms_busy, m.sm_count, m.sm_us_per_command());
      std::printf("  lat (ns): p50=%.0f p99=%.0f p99.9=%.0f mean=%.0f max=%llu (globaltimer step %llu ns; histogram ±3%%)\n", m.latency.p50, m.latency.p99,
                  m.latency.p999, m.latency.mean, static_cast<unsigned long long>(m.max_ns), static_cast<unsigned long long>(timer_ns));
      if (m.probe_samples != 0) {
        const auto n = m.stages_per_queue();
        const auto us = m.stage_microseconds();
        std::printf("  where commands wait (%u queue pairs, %llu snapshots; commands per queue pair / µs per command): waiting for an SQ slot %.1f / %.1f, "
                    "unrung %.1f / %.1f, at the device %.1f / %.1f, CQE unread %.1f / %.1f, being delivered %.1f / %.1f, record untaken %.1f / %.1f\n",
                    m.probed_queues, static_cast<unsigned long long>(m.probe_samples), n.waiting_for_slot, us.waiting_for_slot, n.unrung, us.unrung,
                    n.at_device, us.at_device, n.cq_unread, us.cq_unread, n.being_delivered, us.being_delivered, n.record_untaken, us.record_untaken);
      }
      if (!m.probe_error.empty()) std::printf("  %s\n", m.probe_error.c_str());
      if (m.emulated) {
        std::printf("  host CPU: %.3f s for %llu emulated I/Os = %.3f CPU-s per million I/Os\n", m.cpu_seconds,
                    static_cast<unsigned long long>(m.emulator_commands), m.cpu_s_per_million_ios());
      }
    }
  }
  if (!failed.empty()) {
    std::fprintf(stderr, "cunvme_bench: the run failed, no figures reported: %s\n", failed.c_str());
    return 1;
  }
  return 0;
}

int run_h2d(const options& o) {
  const u64 total = o.size != 0 ? o.size : u64{8} << 30;
  const u64 chunk = std::min<u64>(total, u64{256} << 20);
  void* host = nullptr;
  void* gpu = nullptr;
  check(cudaHostAlloc(&host, chunk, cudaHostAllocDefault), "allocate pinned memory");
  check(cudaMalloc(&gpu, chunk), "allocate GPU memory");
  check(cudaMemcpy(gpu, host, chunk, cudaMemcpyHostToDevice), "warm up");
  cudaEvent_t begin, end;
  check(cudaEventCreate(&begin), "create an event");
  check(cudaEventCreate(&end), "create an event");
  check(cudaEventRecord(begin), "record");
  u64 moved = 0;
  for (; moved + chunk <= total; moved += chunk) check(cudaMemcpyAsync(gpu, host, chunk, cudaMemcpyHostToDevice), "copy");
  check(cudaEventRecord(end), "record");
  check(cudaEventSynchronize(end), "copy");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, begin, end), "time");
  const double gbps = moved / (ms / 1e3) / 1e9;
  if (o.json) {
    std::printf("%s\n", bench::one_line(bench::cunvme_bench::h2d_report(bench::now_text(), gpu_name(), moved, chunk, ms / 1e3)).c_str());
  } else {
    std::printf("h2d: pinned cudaMemcpy host → GPU, %llu bytes in %llu-byte copies: %.2f GB/s\n", static_cast<unsigned long long>(moved),
                static_cast<unsigned long long>(chunk), gbps);
  }
  cudaFreeHost(host);
  cudaFree(gpu);
  return 0;
}

int run_pingpong(const options& o) {
  constexpr unsigned rounds = 100000;
  std::uint32_t* word = nullptr;
  check(cudaHostAlloc(&word, sizeof *word, cudaHostAllocMapped), "allocate pinned memory");
  *word = 0;
  pong<<<1, 1>>>(word, rounds);
  check(cudaGetLastError(), "launch");
  std::vector<double> trips;
  trips.reserve(rounds);
  for (unsigned i = 0; i < rounds; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    __atomic_store_n(word, 2 * i + 1, __ATOMIC_RELEASE);
    // Bounded: a GPU that stopped answering (a faulted kernel) must not hang the benchmark.
    for (unsigned spins = 0; __atomic_load_n(word, __ATOMIC_ACQUIRE) != 2 * i + 2; ++spins) {
      if (spins % 4096 == 0 && std::chrono::steady_clock::now() - t0 > std::chrono::seconds(5)) {
        throw std::runtime_error("ping-pong: the GPU did not answer round " + std::to_string(i) + " within 5 s");
      }
    }
    trips.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
  }
  check(cudaDeviceSynchronize(), "ping-pong");
  cudaFreeHost(word);
  std::sort(trips.begin(), trips.end());
  double sum = 0;
  for (const double t : trips) sum += t;
  const double p50 = trips[trips.size() / 2], p99 = trips[trips.size() * 99 / 100], mean = sum / trips.size();
  if (o.json) {
    std::printf("%s\n", bench::one_line(bench::cunvme_bench::pingpong_report(bench::now_text(), gpu_name(), rounds, p50, p99, mean)).c_str());
  } else {
    std::printf("pingpong: CPU → GPU → CPU through one pinned word, %u rounds: p50 %.0f ns, p99 %.0f ns, mean %.0f ns\n", rounds, p50, p99, mean);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Pollers and the null controller spin beside the I/O kernel, and the emulator's copies
  // must not queue behind it (see prepare_cuda_environment).
  emu::prepare_cuda_environment();
  options o;
  if (const std::optional<int> exit_code = bench::parse_command_line(*bench::cunvme_bench::make_app(o), argc, argv)) return *exit_code;
  // In --json mode every ending prints one object: sweep.py records the reason with the figure's row.
  const auto refuse = [&o](const std::string& why, int exit_code) {
    if (o.json) {
      std::printf("%s\n", bench::one_line(bench::cunvme_bench::error_report(o, bench::now_text(), why)).c_str());
    } else {
      std::fprintf(stderr, "cunvme_bench: %s\n", why.c_str());
    }
    return exit_code;
  };
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) return refuse("no CUDA GPU: cunvme_bench needs one", 77);
  try {
    // The waiting host thread sleeps instead of spinning: the CPU time reported is the emulator's.
    // LmemResizeToMax: local memory once reserved stays (see prepare_kernels_to_run_beside).
    check(cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync | cudaDeviceLmemResizeToMax), "set device flags");
    if (o.baseline == "h2d") return run_h2d(o);
    if (o.baseline == "pingpong") return run_pingpong(o);
    return run_benchmark(o);
  } catch (const usage_error& e) {
    return refuse(e.what(), 2);
  } catch (const std::exception& e) {
    return refuse(e.what(), 1);
  }
}
