// A null NVMe controller that runs on a few SMs of the same GPU, to measure the command path
// (slot reservation, SQE writes, doorbells, CQ drains, completion records) without PCIe or host
// threads in the way. Its queues, doorbells and (optional) namespace live in GPU memory; bus
// addresses are GPU virtual addresses. Each controller warp serves its queues: it reads the SQ
// tail doorbell, fetches up to 32 SQEs at once (one per lane), checks each as a controller
// would (opcode, namespace, LBA range, PRP alignment), optionally copies the data between the
// namespace and the PRP pages, and posts the CQEs with the phase tag (DW3 last, with release).
// With a timing model (`options::timing`, the emulator's `emu::timing_model` and its
// arithmetic, `emu::timing_costs`) it is a modelled drive on the GPU: each command's CQE is held
// until its due time — its latency passed and its share of the drive's IOPS and bandwidth
// reserved on the controller's timeline — so a benchmark measures how many GPU threads hold
// such drives busy, with no host thread in the way (issue 18, P2).
//
// Numbers measured against it are the command path's, not a drive's: label them so.
//
// The emulator's second device, for benchmarks and GPU tests: it checks commands by the CPU
// emulator's own rules (`nvm_checks`) and walks PRPs with the policies' walker (`prp::walk`),
// both shared with the CPU emulator (the kernel side is gpu_null_kernel.cuh), and lays out
// queues with `bookkeeping_layout`; it takes `namespace_view` from the io layer only to hand
// its readers the namespace. CUDA failures are `host::error`s (`host::cuda_check`).
//
// ```
// cunvme::emu::gpu_null_controller ctrl({.queues = 8, .entries = 1024});
// ctrl.start();
// reader r(ctrl.views()[0], ctrl.namespace_view());   // any block_reader over prp::contiguous
// my_kernel<<<…>>>(r, cunvme::prp::contiguous{reinterpret_cast<std::uint64_t>(gpu_buffer)}, …);
// ctrl.stop();
// ```
// CUDA host code: include from .cu files. The controller kernel runs until `stop()`, so a
// kernel launched beside it must not need anything the driver does only on an idle GPU:
// loading its code (lazy module loading) or growing the local-memory reservation (a kernel
// with more local memory per thread than any before it). Either waits for the controller
// kernel to end: a deadlock. Pass your kernels to `prepare_kernels_to_run_beside` before
// `start()` (the same holds for a dedicated poller kernel).
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/emu/gpu_null_kernel.cuh>
#include <cunvme/emu/timing_model.cuh>
#include <cunvme/host/cuda_error.cuh>
#include <cunvme/host/gpu/gpu_context.cuh>
#include <cunvme/io/namespace_view.cuh>
#include <cunvme/policy/prp.cuh>
#include <cunvme/policy/queue_view.cuh>
#include <cunvme/spec/queue_entry.cuh>

#include <cuda/std/cstdint>

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace emu {

/// Loads `kernels` and reserves the local memory they need, so that launching them while a
/// persistent kernel runs (this controller, a dedicated poller kernel) does not wait for it
/// (see the top of this file). Keeps the reservation from shrinking back after launches.
template <class... Kernels>
void prepare_kernels_to_run_beside(Kernels... kernels) {
  std::size_t need = 0;
  auto inspect = [&](auto kernel) {
    cudaFuncAttributes a{};
    host::cuda_check(cudaFuncGetAttributes(&a, kernel), "Prepare kernels to run beside a persistent kernel", "the GPU", "cudaFuncGetAttributes");
    need = std::max(need, a.localSizeBytes);
  };
  (inspect(kernels), ...);
  unsigned flags = 0;
  if (cudaGetDeviceFlags(&flags) == cudaSuccess && (flags & cudaDeviceLmemResizeToMax) == 0) {
    (void)cudaSetDeviceFlags(flags | cudaDeviceLmemResizeToMax);  // refused once the context runs: the limit below still holds
    (void)cudaGetLastError();
  }
  std::size_t stack = 0;
  if (cudaDeviceGetLimit(&stack, cudaLimitStackSize) == cudaSuccess && need + 1024 > stack) {
    host::cuda_check(cudaDeviceSetLimit(cudaLimitStackSize, need + 1024), "Prepare kernels to run beside a persistent kernel", "the GPU",
                     "reserving local memory");
  }
}

/// Owns the queues, namespace and kernel of an on-GPU null controller (see the top of this file).
class gpu_null_controller {
 public:
  struct options {
    std::uint32_t queues = 1;
    std::uint32_t entries = 1024;                       ///< per queue (2..65536)
    std::uint64_t lba_count = std::uint64_t{1} << 21;   ///< namespace size in LBAs
    std::uint32_t lba_shift = 9;
    bool move_data = false;                             ///< keep the namespace in GPU memory and copy it
    std::uint32_t max_transfer_bytes = 1u << 20;        ///< MDTS
    unsigned blocks = 4;                                ///< controller blocks (a few SMs; no more than one warp per queue are launched)
    unsigned threads_per_block = 128;
    std::chrono::nanoseconds timeout = std::chrono::seconds(10);  ///< of the readers' waits
    emu::timing_model timing = emu::timing_model::none();       ///< the modelled drive; none: CQEs as fast as it goes
    /// A drive shared by GPUs: queue i's memory (SQ, CQ, bookkeeping, doorbells) on GPU
    /// `queue_gpus[i]` (CUDA ordinals; one per queue), where that GPU's submitters keep their
    /// atomics local; the controller kernel, on the GPU current at construction, reaches them
    /// by peer access (enabled here; refused where the GPUs have none). Empty: every queue on
    /// the controller's own GPU.
    std::vector<int> queue_gpus{};
  };

  explicit gpu_null_controller(options o) : o_(o) {
    if (o.queues == 0 || o.entries < 2 || o.entries > 65536) throw std::invalid_argument("gpu_null_controller: queues ≥ 1 and entries 2..65536");
    if (o.threads_per_block % 32 != 0 || o.threads_per_block == 0 || o.threads_per_block > 1024 || o.blocks == 0) {
      throw std::invalid_argument("gpu_null_controller: blocks of 32 to 1024 threads, whole warps, and at least one block");
    }
    timing_ = emu::timing_costs::of(o.timing);  // throws std::invalid_argument for a rate that is no number
    check(cudaGetDevice(&home_), "find the controller's GPU");
    try {
      build(o);
    } catch (...) {
      release_all();  // what was allocated before the failure, on every GPU
      throw;
    }
  }

 private:
  void build(const options& o) {
    const std::uint64_t page = 4096;
    const std::uint32_t cids = o.entries - 1;
    const std::uint32_t list_entries = static_cast<std::uint32_t>(prp::list_bytes_per_command(o.max_transfer_bytes, 12) / 8);
    const bookkeeping_layout book = bookkeeping_layout::of(o.entries);
    const std::size_t sq_bytes = std::size_t{o.entries} * sizeof(spec::submission_entry);
    const std::size_t cq_bytes = std::size_t{o.entries} * sizeof(spec::completion_entry);
    const std::size_t lists_bytes = std::size_t{cids} * list_entries * 8;
    const std::size_t held_bytes = std::size_t{o.entries} * sizeof(null_detail::pending_completion);
    // Per queue, page-aligned pieces: SQ, CQ, PRP lists, bookkeeping, held CQEs, then doorbells + state.
    auto up = [&](std::size_t b) { return (b + page - 1) / page * page; };
    const std::size_t per_queue = up(sq_bytes) + up(cq_bytes) + up(lists_bytes) + up(book.bytes) + up(held_bytes) + page;
    std::vector<std::byte*> queue_at(o.queues);
    if (o.queue_gpus.empty()) {
      queue_memory_ = allocate_on(home_, per_queue * o.queues + page, "queues");
      auto* base = reinterpret_cast<std::byte*>(up(reinterpret_cast<std::uintptr_t>(queue_memory_)));
      for (std::uint32_t i = 0; i < o.queues; ++i) queue_at[i] = base + per_queue * i;
    } else {
      if (o.queue_gpus.size() != o.queues) throw std::invalid_argument("gpu_null_controller: queue_gpus names one GPU per queue");
      for (std::uint32_t i = 0; i < o.queues; ++i) {
        const int gpu = o.queue_gpus[i];
        if (gpu != home_) reach_peer(gpu);
        queue_memories_.push_back({gpu, allocate_on(gpu, per_queue + page, "queues")});
        queue_at[i] = reinterpret_cast<std::byte*>(up(reinterpret_cast<std::uintptr_t>(queue_memories_.back().second)));
      }
    }
    std::vector<null_detail::queue> queues(o.queues);
    views_.resize(o.queues);
    for (std::uint32_t i = 0; i < o.queues; ++i) {
      std::byte* at = queue_at[i];
      queue_view& v = views_[i];
      v.sq = reinterpret_cast<spec::submission_entry*>(at);
      v.cq = reinterpret_cast<spec::completion_entry*>(at + up(sq_bytes));
      std::byte* lists = at + up(sq_bytes) + up(cq_bytes);
      std::byte* bookkeeping = lists + up(lists_bytes);
      auto* held = reinterpret_cast<null_detail::pending_completion*>(bookkeeping + up(book.bytes));
      std::byte* registers = bookkeeping + up(book.bytes) + up(held_bytes);
      v.sq_doorbell = reinterpret_cast<std::uint32_t*>(registers);
      v.cq_doorbell = reinterpret_cast<std::uint32_t*>(registers + 4);
      v.entries = o.entries;
      v.qid = static_cast<std::uint16_t>(i + 1);
      book.bind(v, bookkeeping);
      v.prp_lists = reinterpret_cast<std::uint64_t*>(lists);
      v.prp_lists_bus = reinterpret_cast<std::uint64_t>(lists);
      v.list_entries = list_entries;
      v.page_shift = 12;
      v.timeout_ns = static_cast<std::uint64_t>(o.timeout.count());
      queues[i] = null_detail::queue{v.sq, v.cq, v.sq_doorbell, v.cq_doorbell, reinterpret_cast<null_detail::queue_state*>(registers + 64), held, o.entries,
                                     v.qid};
    }
    queue_table_ = static_cast<null_detail::queue*>(allocate_on(home_, sizeof(null_detail::queue) * o.queues, "queue table"));
    check(cudaMemcpy(queue_table_, queues.data(), sizeof(null_detail::queue) * o.queues, cudaMemcpyHostToDevice), "copy the queue table");
    if (o.move_data) data_ = static_cast<std::byte*>(allocate_on(home_, o.lba_count << o.lba_shift, "namespace"));
    timeline_ = static_cast<std::uint64_t*>(allocate_on(home_, 2 * sizeof *timeline_, "timeline"));  // the timeline, then the epoch
    check(cudaHostAlloc(&stop_, sizeof *stop_, cudaHostAllocMapped), "allocate the stop word");
    *stop_ = 0;
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "create the controller's stream");
  }

 public:
  gpu_null_controller(const gpu_null_controller&) = delete;
  gpu_null_controller& operator=(const gpu_null_controller&) = delete;

  ~gpu_null_controller() {
    try {
      stop();
    } catch (const std::exception&) {  // a destructor does not throw; the kernel's end is waited for either way
    }
    release_all();
  }

  /// Launches the controller kernel on its own stream (after `prepare_kernels_to_run_beside`),
  /// on the controller's GPU whatever GPU is current.
  void start() {
    if (running_) return;
    const host::gpu_context_scope home(home_, "gpu-null", std::nothrow);
    prepare_kernels_to_run_beside(null_detail::run<>, null_detail::start_clock<>);
    std::atomic_ref<std::uint32_t>(*stop_).store(0, std::memory_order_release);
    null_detail::controller_view c{queue_table_, o_.queues, reinterpret_cast<cuda::std::byte*>(data_), o_.lba_count, o_.lba_shift, 12, o_.max_transfer_bytes, stop_,
                                   o_.timing.enabled(), timing_, timeline_, timeline_ + 1};
    null_detail::start_clock<><<<1, 1, 0, stream_>>>(timeline_ + 1, timeline_);
    // No more blocks than the queues need: a warp serves at least one queue.
    const unsigned warps_per_block = o_.threads_per_block / 32;
    const unsigned blocks = std::min<unsigned>(o_.blocks, (o_.queues + warps_per_block - 1) / warps_per_block);
    null_detail::run<><<<blocks, o_.threads_per_block, 0, stream_>>>(c);
    check(cudaGetLastError(), "launch the controller kernel");
    running_ = true;
  }
  /// Tells the controller kernel to end and waits for it.
  void stop() {
    if (!running_) return;
    const host::gpu_context_scope home(home_, "gpu-null", std::nothrow);
    std::atomic_ref<std::uint32_t>(*stop_).store(1, std::memory_order_release);
    running_ = false;
    check(cudaStreamSynchronize(stream_), "end the controller kernel");
  }

  [[nodiscard]] const std::vector<queue_view>& views() const noexcept { return views_; }
  [[nodiscard]] cunvme::namespace_view namespace_view() const noexcept {
    const std::uint64_t blocks = std::uint64_t{o_.max_transfer_bytes} >> o_.lba_shift;
    cunvme::namespace_view v;  // no metadata: the null controller's blocks are data only
    v.nsid = 1;
    v.lba_shift = o_.lba_shift;
    v.max_blocks = static_cast<std::uint32_t>(blocks < 65536 ? blocks : 65536);
    v.lba_count = o_.lba_count;
    return v;
  }
  /// Namespace 1's bytes in GPU memory (nullptr unless `move_data`): fill it before reading.
  [[nodiscard]] std::byte* data() const noexcept { return data_; }
  [[nodiscard]] const options& config() const noexcept { return o_; }

 private:
  static void check(cudaError_t e, const std::string& what) { host::cuda_check(e, what, "gpu-null"); }
  /// Zeroed memory on GPU `gpu` (the controller's own, or a queue's): zeroed on a stream of its
  /// own, so that a persistent kernel running there (another controller, a poller) is not waited for.
  [[nodiscard]] void* allocate_on(int gpu, std::size_t bytes, const char* what) const {
    const host::gpu_context_scope there(gpu, "gpu-null", std::nothrow);
    void* p = nullptr;
    cudaStream_t zeroing = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&zeroing, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMemsetAsync(p, 0, bytes, zeroing);
    if (e == cudaSuccess) e = cudaStreamSynchronize(zeroing);
    if (zeroing != nullptr) (void)cudaStreamDestroy(zeroing);
    if (e != cudaSuccess && p != nullptr) (void)cudaFree(p);
    check(e, std::string("allocate the ") + what + " on GPU " + std::to_string(gpu));
    return p;
  }
  /// Frees whatever is allocated (the constructor's failure path and the destructor), and
  /// leaves the calling thread's current GPU as it was.
  void release_all() noexcept {
    const host::gpu_context_scope home(home_, "gpu-null", std::nothrow);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    if (stop_ != nullptr) (void)cudaFreeHost(stop_);
    (void)cudaFree(queue_table_);
    (void)cudaFree(data_);
    (void)cudaFree(timeline_);
    (void)cudaFree(queue_memory_);
    for (const auto& [gpu, memory] : queue_memories_) {
      const host::gpu_context_scope there(gpu, "gpu-null", std::nothrow);
      (void)cudaFree(memory);
    }
    stream_ = nullptr, stop_ = nullptr, queue_table_ = nullptr, data_ = nullptr, timeline_ = nullptr, queue_memory_ = nullptr;
    queue_memories_.clear();
  }
  /// Lets the controller's GPU reach GPU `gpu`'s memory (peer access, once).
  void reach_peer(int gpu) const {
    int can = 0;
    check(cudaDeviceCanAccessPeer(&can, home_, gpu), "ask for peer access");
    if (can == 0) throw std::invalid_argument("gpu_null_controller: GPU " + std::to_string(home_) + " cannot reach GPU " + std::to_string(gpu) + "'s memory (no peer access)");
    const cudaError_t e = cudaDeviceEnablePeerAccess(gpu, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
      return;
    }
    check(e, "enable peer access to GPU " + std::to_string(gpu));
  }

  options o_;
  void* queue_memory_ = nullptr;
  int home_ = 0;                                         ///< the controller's GPU (current at construction)
  std::vector<std::pair<int, void*>> queue_memories_;    ///< per queue on its GPU (with queue_gpus)
  null_detail::queue* queue_table_ = nullptr;
  std::byte* data_ = nullptr;
  std::uint64_t* timeline_ = nullptr;  // the modelled drive's timeline: its reservations' end, in ticks
  emu::timing_costs timing_{};
  std::uint32_t* stop_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool running_ = false;
  std::vector<queue_view> views_;
};

}  // namespace emu
CUNVME_NAMESPACE_END
