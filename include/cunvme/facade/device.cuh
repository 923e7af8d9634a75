// `cunvme::device`: a controller, GPU queue pairs and a namespace, ready for `copy_n`, with the
// GPU buffers it maps for the controller kept mapped between copies. CUDA host code.
//
// Usage: examples/snippets/facade.cu, `registered`.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/facade/gpu_address_range.cuh>
#include <cunvme/facade/pending_copy.cuh>
#include <cunvme/facade/pinned_pool.cuh>
#include <cunvme/facade/registration_cache.cuh>
#include <cunvme/facade/tuning.cuh>
#include <cunvme/host/cuda_error.cuh>
#include <cunvme/host/gpu/gpu_context.cuh>
#include <cunvme/host/gpu/gpu_dma_buf.cuh>
#include <cunvme/host/gpu/gpu_queue.cuh>
#include <cunvme/host/gpu/gpu_reach.cuh>
#include <cunvme/host/memory/gpu_window.cuh>
#include <cunvme/host/open.cuh>
#include <cunvme/io/reader.cuh>
#include <cunvme/policy/device_group.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

CUNVME_NAMESPACE_BEGIN

struct device_options {
  /// The GPU (CUDA ordinal, as the process sees them) whose kernels and memory the device
  /// serves; -1: the GPU current on the thread that constructs it.
  int gpu = -1;
  std::uint32_t nsid = 1;
  std::uint32_t queue_entries = 1024;
  std::chrono::nanoseconds timeout = std::chrono::seconds(10);
  host::controller_options controller{};
  /// `copy_n`'s launch shape and the queue pairs opened for it; empty: `copy_tuning_for` the
  /// current GPU.
  std::optional<copy_tuning> tuning{};
  /// Buffers nobody registered that stay mapped after their copy (the least recently used
  /// is unmapped first). 0: each copy maps its buffer and unmaps it when done.
  std::size_t cached_buffers = 16;
};

namespace detail {

/// GPU memory mapped for the controller and its page table, resident in pinned memory the
/// kernels read: one registration. Unmapped when the last copy using it is done.
struct gpu_for_controller_mapping {
  host::dma_buffer mapped;
  pinned_pool::lease table;
  unsigned page_shift = 12;
  std::uintptr_t start = 0;  ///< the window's first byte …
  std::uint64_t lead = 0;    ///< … lies this far into the table's first page

  [[nodiscard]] prp::page_list pages() const noexcept { return prp::page_list{table.as<std::uint64_t>(), page_shift}; }
  /// Where GPU address `address` lies in `pages()`.
  [[nodiscard]] std::uint64_t offset_of(std::uintptr_t address) const noexcept { return lead + (address - start); }
};

}  // namespace detail

/// A controller, GPU queue pairs (queues in pinned host memory, data straight into GPU memory:
/// tier 2) and a namespace, ready for `copy_n`. The emulator (`"emu…"`) is opened for GPU
/// threads (`host::gpu_reach()`), so its BAR takes GPU doorbell stores and its DMA reaches GPU
/// memory.
///
/// Buffers: `copy_n` maps a GPU buffer's pages for the controller and builds their page table
/// once, then keeps both: buffers given to `register_buffer` until `deregister_buffer`, others
/// in a cache of `device_options::cached_buffers` entries. The rule is cuFile's: deregister a
/// buffer before freeing it, and free no buffer a copy still uses. A registered buffer found
/// freed makes the copy throw `host::error`; a cached one is mapped afresh (the driver's buffer
/// ID tells a new allocation at the same address from the old one). Mapping a buffer the first
/// time allocates pinned memory for its page table, which CUDA may hold until other work on the
/// GPU is done: register buffers up front, before copies are in flight, as with cuFile.
///
/// A copy that timed out (a command the controller did not complete in time) may still be
/// written by the controller: its buffer stays mapped — quarantined — until recovery, which
/// runs once no copy is in flight (at the next `copy_n`, `copies_in_flight()` or `recover()`):
/// the library's one timeout policy (Abort for each timed-out command; where one does not
/// abort, the controller stopped), then, this device owning the controller, `controller::reset()`
/// where the policy stopped it (queues re-created). The mapping is released once the aborted
/// commands' completions are in, or after the reset. While copies keep running the recovery
/// waits. Keep such a buffer allocated until `quarantined_buffers()` is 0, and run no kernel of
/// your own on the device's queues meanwhile (Abort names commands by CID); a reset
/// also ends the commands of any other queue pair of `controller()`.
///
/// The destructor waits for the copies still in flight (their streams must be able to reach
/// them), deletes the queues (which ends their commands), then unmaps every buffer.
///
/// GPUs: a device serves one GPU (`device_options::gpu`, by default the one current on the
/// constructing thread; `gpu()`): its queue pairs, kernels and buffers are that GPU's. Several
/// GPUs share a controller through one device each over it (`shared_controller()`).
///
/// Threads: a device's calls may come from any thread, one that never made a CUDA call
/// included: each makes its GPU's context current for its duration (`make_current()`,
/// `host::gpu_context_scope`) and leaves the thread's own as it found it.
class device {
 public:
  using queue_bundle = queue_policies<slots::warp_aggregated, completion::cooperative>;
  using reader = block_reader<queue_bundle, prp::page_list, doorbell::coalescing<doorbell::mmio>>;
  using writer = block_writer<queue_bundle, prp::page_list, doorbell::coalescing<doorbell::mmio>>;
  static constexpr std::uint32_t max_queues = copy_tuning::max_queues;

  /// A kernel argument: the queue pairs and the namespace; warp w reads or writes with `at(w)`.
  template <class Io>
  struct io_set {
    queue_view views[max_queues];
    namespace_view ns;
    std::uint32_t count;
    [[nodiscard]] __device__ Io at(std::uint64_t warp) const { return Io(views[warp % count], ns); }
  };

  explicit device(std::string_view uri = "emu", device_options options = {}) : device(open_for(uri, options), std::move(options)) {}

  /// Over a controller opened for GPU threads (`host::open(uri, options, host::gpu_reach())`, or
  /// an emulator configured with `gpu_reach().configure`); `options.controller` is not used.
  /// The controller may serve other devices too — one per GPU, say (`shared_controller()` of
  /// one of them): each device has queue pairs of its own on it, made on its GPU, and maps its
  /// GPU's buffers for it; the controller is shut down when the last of them goes.
  explicit device(std::shared_ptr<host::controller> ctrl, device_options options = {})
      : gpu_(resolve_gpu(options.gpu, ctrl ? ctrl->name() : std::string("cunvme::device"))),
        ctrl_(present(std::move(ctrl))),
        tuning_(options.tuning ? *options.tuning : tuning_for(gpu_)),
        pool_(std::make_shared<detail::pinned_pool>(ctrl_->name())),
        cache_(options.cached_buffers, gpu_page, ctrl_->name()),
        timeout_(options.timeout) {
    if (!tuning_.valid()) {
      throw host::error("Open", ctrl_->name(), "device_options::tuning: warps_per_block must be 1.." + std::to_string(copy_tuning::max_warps_per_block) +
                                                      ", commands_per_warp at least 1, queues 1.." + std::to_string(max_queues));
    }
    // Queues, bookkeeping and mappings are made in the GPU's own context: GPU memory lands on it.
    const host::gpu_context_scope scope(gpu_, ctrl_->name());
    // GPU memory through the kernel module: a dma-buf where the module imports them (NVIDIA's
    // open kernel modules), else its nvidia_p2p pins; other backends refuse GPU memory, saying which can.
    (void)host::use_gpu_dma_buf(*ctrl_);
    const std::uint32_t entries = std::min<std::uint32_t>(options.queue_entries, ctrl_->cap().max_queue_entries());
    for (std::uint32_t q = 0; q < tuning_.queues; ++q) {
      queues_.push_back(host::make_gpu_queue(*ctrl_, entries, host::tier::host_queues_gpu_data, options.timeout));
    }
    ns_ = queues_.front()->namespace_view(options.nsid);
  }
  device(const device&) = delete;
  device& operator=(const device&) = delete;
  ~device() {
    const host::gpu_context_scope scope(gpu_, ctrl_->name(), std::nothrow);
    const std::lock_guard lock(mutex_);
    for (const in_flight& f : in_flight_) (void)cudaEventSynchronize(f.state->done);
    // The queues first: deleting them ends their commands (or stops the controller, see
    // ~queue_pair), so no buffer is unmapped while a timed-out command may still write it.
    queues_.clear();
    in_flight_.clear();
    cache_.clear();
  }

  /// The GPU (CUDA ordinal) the device serves.
  [[nodiscard]] int gpu() const noexcept { return gpu_; }
  /// Makes the device's GPU's context current on the calling thread until the scope ends: for
  /// code of the caller's own (or the loader's) that calls CUDA for this device from any thread.
  [[nodiscard]] host::gpu_context_scope make_current() const { return host::gpu_context_scope(gpu_, ctrl_->name()); }

  [[nodiscard]] host::controller& controller() noexcept { return *ctrl_; }
  /// The controller, to open a device for another GPU on it (`device(dev.shared_controller(), {.gpu = 1})`).
  [[nodiscard]] std::shared_ptr<host::controller> shared_controller() const noexcept { return ctrl_; }
  /// The first queue pair (examples that launch their own kernels use this one).
  [[nodiscard]] host::io_queue& queue() noexcept { return *queues_.front(); }
  [[nodiscard]] std::uint32_t queue_count() const noexcept { return static_cast<std::uint32_t>(queues_.size()); }
  [[nodiscard]] const namespace_view& ns() const noexcept { return ns_; }
  [[nodiscard]] const copy_tuning& tuning() const noexcept { return tuning_; }
  /// How long a command is waited for (`device_options::timeout`).
  [[nodiscard]] std::chrono::nanoseconds timeout() const noexcept { return timeout_; }
  /// Bytes per block in the caller's buffer: data, and with extended LBAs the block's metadata.
  [[nodiscard]] std::uint64_t block_bytes() const noexcept { return ns_.block_bytes(); }
  [[nodiscard]] reader make_reader() const { return reader(queues_.front()->view(), ns_); }
  [[nodiscard]] io_set<reader> readers() const { return make_set<reader>(); }
  [[nodiscard]] io_set<writer> writers() const { return make_set<writer>(); }

  /// Maps `bytes` of GPU memory at `gpu` (inside one allocation) for the controller and keeps
  /// them mapped until `deregister_buffer(gpu)`: copies within them map nothing. Throws
  /// `host::error` for memory outside one GPU allocation or a `gpu` registered already.
  void register_buffer(const void* gpu, std::size_t bytes) {
    const host::gpu_context_scope scope = make_current();
    const gpu_allocation a = detail::gpu_allocation_of(gpu, ctrl_->name());
    const std::lock_guard lock(mutex_);
    cache_.register_buffer(a, reinterpret_cast<std::uintptr_t>(gpu), bytes, [this](const host::gpu_window& w) { return map(w); });
  }

  /// Ends the registration made at `gpu`; copies in flight keep the mapping until they are
  /// done. Throws `host::error` when no buffer is registered there.
  void deregister_buffer(const void* gpu) {
    const host::gpu_context_scope scope = make_current();
    const std::lock_guard lock(mutex_);
    if (!cache_.deregister_buffer(reinterpret_cast<std::uintptr_t>(gpu))) {
      throw host::error("Deregister a buffer", ctrl_->name(), "no buffer is registered at GPU address " + std::to_string(reinterpret_cast<std::uintptr_t>(gpu)));
    }
  }

  /// Buffers registered, and buffers kept mapped by the cache (at most `cached_buffers`).
  [[nodiscard]] std::size_t registered_buffers() const {
    const std::lock_guard lock(mutex_);
    return cache_.registered_count();
  }
  [[nodiscard]] std::size_t cached_buffers() const {
    const std::lock_guard lock(mutex_);
    return cache_.cached_count();
  }
  /// Buffers mapped for the controller so far: one per registration and per cache miss.
  [[nodiscard]] std::uint64_t mappings_made() const {
    const std::lock_guard lock(mutex_);
    return mappings_made_;
  }
  /// Copies enqueued whose streams had not reached their end when last looked at. Runs the
  /// recovery of timed-out copies where it is due (see above): may take an Abort's or a reset's
  /// time, and throws `host::error` where a reset fails.
  [[nodiscard]] std::size_t copies_in_flight() {
    const host::gpu_context_scope scope = make_current();
    const std::lock_guard lock(mutex_);
    reap();
    return in_flight_.size();
  }

  /// Buffers of timed-out copies kept mapped until their commands are aborted (see above).
  [[nodiscard]] std::size_t quarantined_buffers() const {
    const std::lock_guard lock(mutex_);
    return quarantine_.size();
  }

  /// Runs the recovery of timed-out copies now, if no copy is in flight; returns the buffers
  /// still quarantined. Throws `host::error` when the controller had to be reset and could not be.
  std::size_t recover() {
    const host::gpu_context_scope scope = make_current();
    const std::lock_guard lock(mutex_);
    reap();
    return quarantine_.size();
  }

  /// `to_string(r)`, and for an outcome of waiting out the timeout (a completion, a submission
  /// slot or a command ID that did not come) what the controller's backend saw in that time
  /// that may explain it (the emulator's copies held up in the CUDA driver): the text of errors
  /// about a copy, made as soon as it is waited for.
  [[nodiscard]] std::string describe(const io_result& r) const {
    std::string text = to_string(r);
    if (!waited_out(r.error)) return text;
    const std::string cause = timeout_cause(*ctrl_, timeout_);
    return cause.empty() ? text : text + " (" + cause + ")";
  }

  /// What `ctrl`'s backend saw that may explain a copy of a device with command timeout
  /// `timeout` waiting one out (`describe`'s cause; for callers that keep the controller, not
  /// the device). It looks two timeouts back: a copy's warp may wait out one command's timeout
  /// after another's.
  [[nodiscard]] static std::string timeout_cause(host::controller& ctrl, std::chrono::nanoseconds timeout) {
    return ctrl.backend().timeout_cause(2 * timeout);
  }

  /// Runs `f()` on the device's GPU once every copy enqueued on the device has run, and
  /// enqueues none until it returns: for CUDA calls that allocate or free memory (cudaMalloc,
  /// cudaFree, cudaHostAlloc, cudaFreeHost), as the loader's buffers and the device's pinned
  /// memory are made. CUDA orders those against every stream (implicit synchronization): GPU
  /// work issued after one does not run beside a kernel launched before it. A copy's kernel waits
  /// for its controller, and the emulator's controller moves data with CUDA copies of its own:
  /// issued after another thread's allocation, they waited for the kernel, and its commands
  /// timed out. Copies of other devices, and kernels of the caller's own, are the caller's to
  /// keep apart from allocations. Returns what `f` returns; throws `host::error` where the
  /// recovery of timed-out copies (see above) fails.
  template <class F>
  decltype(auto) between_copies(F&& f) {
    const host::gpu_context_scope scope = make_current();
    const std::lock_guard lock(mutex_);
    settle();
    return std::forward<F>(f)();
  }

  /// Enqueues `launch(pages, offset, results)` on `stream` for `bytes` of GPU memory at `gpu`:
  /// the buffer's mapping, `warps` result slots and an event after the launch, all kept until
  /// the stream has passed it. For `copy_n`.
  template <class Launch>
  [[nodiscard]] pending_copy enqueue(void* gpu, std::size_t bytes, std::uint64_t warps, cudaStream_t stream, const char* operation, Launch&& launch) {
    const std::string& name = ctrl_->name();
    // A stopped controller runs nothing: its kernel would wait out every command's timeout.
    ctrl_->require_running(operation);
    // The launch, events and the driver's look-ups below, on the device's GPU whichever thread
    // calls (one that never made a CUDA call has no context at all).
    const host::gpu_context_scope scope = make_current();
    const gpu_allocation a = detail::gpu_allocation_of(gpu, name);
    const auto address = reinterpret_cast<std::uintptr_t>(gpu);
    const std::lock_guard lock(mutex_);
    reap();
    std::shared_ptr<const detail::gpu_for_controller_mapping> mapping = cache_.find(a, address, bytes, [this](const host::gpu_window& w) { return map(w); });
    auto state = std::make_shared<detail::copy_state>(name, operation);
    state->gpu = gpu_;
    state->results = pool_->take(warps * sizeof(io_result), [this] { settle(); });
    state->warps = warps;
    check(cudaEventCreateWithFlags(&state->done, cudaEventDisableTiming), "Create an event");
    // An error left by the caller's earlier CUDA calls would read as this launch's and free
    // its results and mapping under a running kernel: report it now, before anything runs.
    if (const cudaError_t earlier = cudaGetLastError(); earlier != cudaSuccess) {
      throw host::cuda_error(earlier, operation, name, "nothing was enqueued: an earlier CUDA call left an error unchecked");
    }
    launch(mapping->pages(), mapping->offset_of(address), state->results.as<io_result>());
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
      // Whether or not the kernel was queued, nothing it may touch is given back before the
      // stream has drained.
      (void)cudaStreamSynchronize(stream);
      check(e, operation);
    }
    if (const cudaError_t e = cudaEventRecord(state->done, stream); e != cudaSuccess) {
      // The kernel is queued but cannot be tracked: let it finish before its results and
      // mapping are given back.
      (void)cudaStreamSynchronize(stream);
      check(e, "Record an event");
    }
    in_flight_.push_back(in_flight{state, std::move(mapping)});
    return pending_copy(std::move(state));
  }

 private:
  static constexpr std::size_t gpu_page = 64 * 1024;

  struct in_flight {
    std::shared_ptr<detail::copy_state> state;
    std::shared_ptr<const detail::gpu_for_controller_mapping> mapping;
  };

  [[nodiscard]] static std::shared_ptr<host::controller> present(std::shared_ptr<host::controller> ctrl) {
    if (ctrl == nullptr) throw host::error("Open", "cunvme::device", "no controller given");
    return ctrl;
  }

  /// `gpu`, checked against the GPUs this process sees; -1: the thread's current GPU.
  [[nodiscard]] static int resolve_gpu(int gpu, const std::string& name) {
    if (gpu == -1) return host::gpu_context_scope::current_gpu();
    int count = 0;
    if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) host::cuda_check(e, "Find GPU " + std::to_string(gpu), name);
    if (gpu < 0 || gpu >= count) {
      throw host::error("Open", name, "device_options::gpu = " + std::to_string(gpu) + ": this process sees " + std::to_string(count) +
                                          " GPU(s), ordinals 0.." + std::to_string(count - 1) + " (CUDA_VISIBLE_DEVICES applies), or -1 for the current one");
    }
    return gpu;
  }

  /// The emulator (or a real controller's registrations) opened in `options.gpu`'s context.
  [[nodiscard]] static std::shared_ptr<host::controller> open_for(std::string_view uri, const device_options& options) {
    const std::string name(uri);
    const host::gpu_context_scope scope(resolve_gpu(options.gpu, name), name);
    return host::open(uri, options.controller, host::gpu_reach());
  }

  [[nodiscard]] static copy_tuning tuning_for(int gpu) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, gpu) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, gpu) != cudaSuccess) {
      (void)cudaGetLastError();
      return copy_tuning_for(0);
    }
    return copy_tuning_for(major * 10 + minor);
  }

  void check(cudaError_t e, const char* what) const { host::cuda_check(e, what, ctrl_->name()); }

  /// Waits until every copy enqueued so far has run, then drops them (`reap`). Under `mutex_`,
  /// so no copy is enqueued meanwhile: what follows allocates or frees CUDA memory (see
  /// `between_copies`). A failed kernel counts as run (its error is its own wait's to report).
  void settle() {
    for (const in_flight& f : in_flight_) (void)cudaEventSynchronize(f.state->done);
    reap();
  }

  /// Drops the copies the streams have passed: their mappings may be unmapped now, except
  /// those of copies with a timed-out command, which wait in the quarantine for `recover_timed_out`.
  void reap() {
    // Room first: the moves below cannot throw, so no entry is left half moved.
    std::vector<in_flight> running;
    running.reserve(in_flight_.size());
    quarantine_.reserve(quarantine_.size() + in_flight_.size());
    for (in_flight& f : in_flight_) {
      if (!f.state->reached()) {
        running.push_back(std::move(f));
      } else if (f.state->timed_out()) {
        quarantine_.push_back(std::move(f.mapping));
      }
    }
    in_flight_ = std::move(running);
    if (!quarantine_.empty() && in_flight_.empty()) recover_timed_out();
  }

  /// The library's one recovery (host/controller/recovery.cuh) for timed-out copies, run while no copy is
  /// in flight (Abort names a command by SQ and CID, and a CID of a finished copy may be reused
  /// by a running one): the timeout policy on every queue pair (Abort, waiting for the aborted
  /// commands' completions; where one does not come, the controller stopped), then, as the owner
  /// of the controller, `controller::reset()` where the policy left it stopped or fatal. A reset
  /// that failed is tried again first.
  void recover_timed_out() {
    if (!reset_due_) {
      host::timeout_outcome outcome;
      for (const auto& q : queues_) outcome += q->abort_timed_out();
      reset_due_ = outcome.needs_reset();
    }
    if (reset_due_) {
      // A reset re-creates every queue pair of the controller, and ends the commands of each:
      // only safe while none runs, which a device knows of its own queues only.
      if (ctrl_.use_count() > 1) {
        throw host::error("Recover timed-out copies", ctrl_->name(),
                          "a command did not abort and the controller was stopped; it is shared with " + std::to_string(ctrl_.use_count() - 1) +
                              " other owner(s) (devices of other GPUs): call controller().reset() once none of them runs I/O");
      }
      ctrl_->reset();  // throws, leaving reset_due_ set, where the controller cannot be brought back
      reset_due_ = false;
      quarantine_.clear();
      return;
    }
    // abort_on_timeout off: the buffers wait for their commands' late completions.
    std::uint32_t left = 0;
    for (const auto& q : queues_) left += q->abandoned_commands();
    if (left == 0) quarantine_.clear();
  }

  /// Maps `w` for the controller: only pages of the allocation (a GPU page below it, or past its
  /// end, may belong to another one, and peer-to-peer pinning of it fails or pins someone
  /// else's memory).
  [[nodiscard]] std::shared_ptr<const detail::gpu_for_controller_mapping> map(const host::gpu_window& w) {
    auto m = std::make_shared<detail::gpu_for_controller_mapping>();
    ++mappings_made_;
    m->mapped = ctrl_->memory().map_gpu_range(reinterpret_cast<void*>(w.start), w.bytes);
    const host::gpu_page_table t = host::gpu_page_table::of(m->mapped, w, w.start, ctrl_->name());
    m->table = pool_->take(t.pages.size() * sizeof(std::uint64_t), [this] { settle(); });
    std::copy(t.pages.begin(), t.pages.end(), m->table.as<std::uint64_t>());
    m->page_shift = t.page_shift;
    m->start = w.start;
    m->lead = t.offset;
    return m;
  }

  template <class Io>
  [[nodiscard]] io_set<Io> make_set() const {
    io_set<Io> set{};
    for (std::uint32_t q = 0; q < queues_.size(); ++q) set.views[q] = queues_[q]->view();
    set.ns = ns_;
    set.count = static_cast<std::uint32_t>(queues_.size());
    return set;
  }

  int gpu_;  // first: its initializer reads the controller argument before ctrl_ takes it
  // Declared before the rest, destroyed after them: mappings unmap through the controller.
  std::shared_ptr<host::controller> ctrl_;
  // Before the queues, so destroyed after them: deleting a queue ends its commands (or stops
  // the controller) before a quarantined buffer is unmapped.
  std::vector<std::shared_ptr<const detail::gpu_for_controller_mapping>> quarantine_;
  bool reset_due_ = false;  ///< a recovery needs a reset (one not aborted, or a reset that failed)
  copy_tuning tuning_;
  std::vector<std::unique_ptr<host::io_queue>> queues_;
  namespace_view ns_{};
  std::shared_ptr<detail::pinned_pool> pool_;
  mutable std::mutex mutex_;
  registration_cache<detail::gpu_for_controller_mapping> cache_;
  std::chrono::nanoseconds timeout_;  ///< each command's (`device_options::timeout`)
  std::vector<in_flight> in_flight_;
  std::uint64_t mappings_made_ = 0;
};

CUNVME_NAMESPACE_END
