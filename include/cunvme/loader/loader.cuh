// Safetensors files on a `cunvme::device`, into GPU memory: named tensors all at once, or one
// layer at a time with the next layer's reads running while the caller computes on the current
// one (and the one before it). CUDA host code: include from .cu.
//
// Where the bytes go: every tensor is read, with the whole blocks around it, into GPU memory
// laid out like the file (runs of touching blocks, each run on 4 KiB), and handed out at its
// offset there. So the SSD's (or the emulator's) DMA lands in the memory the tensor is used
// from and nothing is copied afterwards, whatever the tensor's alignment; the cost is at most
// two blocks per run read that belong to neighbours. Reading into memory of the caller's
// choosing would need tensors that start and end on blocks (or a staging copy): not offered.
//
// Usage: examples/snippets/facade.cu, `load`.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/facade/copy.cuh>
#include <cunvme/facade/device.cuh>
#include <cunvme/facade/pending_copy.cuh>
#include <cunvme/host/cuda_error.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/gpu/gpu_context.cuh>
#include <cunvme/io/io_result.cuh>
#include <cunvme/loader/layers.cuh>
#include <cunvme/loader/placement.cuh>
#include <cunvme/loader/safetensors.cuh>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace loader {

namespace detail {

/// A CUDA stream or event owned by the object holding it: destroyed with it, however the
/// object goes — a constructor that throws after creating some releases exactly those.
/// (Destroying a stream or event with work pending is allowed: the driver releases it once
/// the work is done.)
struct stream_destroyer {
  void operator()(cudaStream_t s) const noexcept { (void)cudaStreamDestroy(s); }
};
struct event_destroyer {
  void operator()(cudaEvent_t e) const noexcept { (void)cudaEventDestroy(e); }
};
using owned_stream = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, stream_destroyer>;
using owned_event = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, event_destroyer>;

/// A non-blocking stream, or `host::error` naming `what` and `source`.
[[nodiscard]] inline owned_stream make_stream(const char* what, const std::string& source) {
  cudaStream_t s = nullptr;
  host::cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), what, source);
  return owned_stream(s);
}
/// An event without timing, or `host::error` naming `what` and `source`.
[[nodiscard]] inline owned_event make_event(const char* what, const std::string& source) {
  cudaEvent_t e = nullptr;
  host::cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), what, source);
  return owned_event(e);
}

/// GPU memory registered with the device for as long as it lives (copies into it map nothing).
/// Its owner waits for the copies into it before it goes.
class gpu_buffer {
 public:
  gpu_buffer(device& dev, std::size_t bytes, const std::string& source) : dev_(dev), bytes_(bytes) {
    if (bytes_ == 0) return;
    // On the device's GPU from any thread (between_copies and register_buffer make its context
    // current), and between the device's copies: an allocation while another thread's copy runs would keep
    // the emulator's data copies from that copy's kernel (device::between_copies).
    dev_.between_copies([&] { host::cuda_check(cudaMalloc(&data_, bytes_), "Allocate GPU memory for tensors", source); });
    try {
      dev_.register_buffer(data_, bytes_);
    } catch (...) {
      free_memory();
      throw;
    }
  }
  gpu_buffer(const gpu_buffer&) = delete;
  gpu_buffer& operator=(const gpu_buffer&) = delete;
  ~gpu_buffer() {
    if (data_ == nullptr) return;
    const host::gpu_context_scope scope(dev_.gpu(), dev_.controller().name(), std::nothrow);
    try {
      dev_.deregister_buffer(data_);
    } catch (...) {
      // Registered in the constructor; nothing else deregisters it.
    }
    free_memory();
  }
  [[nodiscard]] std::byte* data() const noexcept { return static_cast<std::byte*>(data_); }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] device& dev() const noexcept { return dev_; }

 private:
  /// cudaFree waits for the whole GPU: between the device's copies, as the allocation was made.
  /// Where the device cannot say (its recovery failed), freed all the same.
  void free_memory() noexcept {
    try {
      dev_.between_copies([this] { (void)cudaFree(data_); });
    } catch (...) {
      (void)cudaFree(data_);
    }
  }

  device& dev_;
  std::size_t bytes_;
  void* data_ = nullptr;
};

/// Enqueues `plan`'s reads into `buffer` on `stream`.
inline std::vector<pending_copy> enqueue_reads(device& dev, const read_plan& plan, std::byte* buffer, cudaStream_t stream) {
  std::vector<pending_copy> copies;
  copies.reserve(plan.reads.size());
  for (const block_read& r : plan.reads) copies.push_back(copy_n(dev, r.lba, r.blocks, buffer + r.buffer_offset, stream));
  return copies;
}

/// Waits for every copy; throws `host::error` naming the first failure (by LBA).
inline void wait_all(const device& dev, std::vector<pending_copy>& copies, const std::string& what, const std::string& source) {
  std::optional<io_result> failed;
  for (pending_copy& c : copies) {
    const io_result r = c.wait();
    if (!r.ok() && (!failed || r.lba < failed->lba)) failed = r;
  }
  copies.clear();
  if (failed) throw host::error(what, source, dev.describe(*failed));
}

}  // namespace detail

/// One tensor in GPU memory: its header entry and its first byte. `aligned()` says whether
/// that byte sits on a multiple of the element size (always, for files whose writer aligned
/// its tensors, as the reference writer does); kernels must not load a misaligned tensor's
/// elements directly.
struct gpu_tensor {
  const tensor_info* info = nullptr;
  std::byte* data = nullptr;
  [[nodiscard]] bool aligned() const noexcept { return reinterpret_cast<std::uintptr_t>(data) % element_bytes(info->type) == 0; }
  template <class T>
  [[nodiscard]] T* as() const noexcept {
    return reinterpret_cast<T*>(data);
  }
};

/// Finds `name` among `tensors`, or nullptr.
[[nodiscard]] inline const gpu_tensor* find_tensor(const std::vector<gpu_tensor>& tensors, std::string_view name) {
  for (const gpu_tensor& t : tensors) {
    if (t.info->name == name) return &t;
  }
  return nullptr;
}

/// Tensors read into one GPU buffer they share. The reads are enqueued; `wait()` blocks until
/// they are done and throws `host::error` for a failed one. Destroying it waits for the reads.
class loaded_tensors {
 public:
  loaded_tensors(std::unique_ptr<detail::gpu_buffer> buffer, std::vector<gpu_tensor> tensors, std::vector<pending_copy> copies, std::string source,
                 std::uint64_t bytes_read)
      : buffer_(std::move(buffer)), tensors_(std::move(tensors)), copies_(std::move(copies)), source_(std::move(source)), bytes_read_(bytes_read) {}
  loaded_tensors(loaded_tensors&&) noexcept = default;
  // No move assignment: it would free the old buffer without waiting for its reads.
  loaded_tensors& operator=(loaded_tensors&&) = delete;
  ~loaded_tensors() {
    for (pending_copy& c : copies_) (void)c.wait();  // the buffer is freed only after its copies
  }

  void wait() {
    if (copies_.empty()) return;  // waited for already, or moved from (no buffer then)
    detail::wait_all(buffer_->dev(), copies_, "Load tensors", source_);
  }
  [[nodiscard]] const std::vector<gpu_tensor>& tensors() const noexcept { return tensors_; }
  [[nodiscard]] const gpu_tensor* find(std::string_view name) const { return find_tensor(tensors_, name); }
  /// Whole blocks read (tensors' bytes and the block ends around them).
  [[nodiscard]] std::uint64_t bytes_read() const noexcept { return bytes_read_; }

 private:
  std::unique_ptr<detail::gpu_buffer> buffer_;
  std::vector<gpu_tensor> tensors_;
  std::vector<pending_copy> copies_;
  std::string source_;
  std::uint64_t bytes_read_ = 0;
};

/// A safetensors file on a device: the header read through `dev` (into GPU memory with
/// `copy_n`, then to the host) and checked by `parse_header`. Throws `host::error` naming
/// `source` for a refused file or a failed read. Its calls (and the streamer's) may come from any
/// thread: each runs in the device's GPU's context (`device::make_current`).
class safetensors_file {
 public:
  safetensors_file(device& dev, file_placement where, std::string source = "safetensors file")
      : dev_(dev), where_(std::move(where)), source_(std::move(source)) {
    if (where_.block_bytes() != dev_.block_bytes()) {
      throw host::error("Open a safetensors file", source_, "the placement has " + std::to_string(where_.block_bytes()) +
                                                               "-byte blocks, the device " + std::to_string(dev_.block_bytes()));
    }
    const host::gpu_context_scope scope = dev_.make_current();
    const std::vector<std::byte> first8 = read_to_host(0, 8);
    const std::uint64_t n = header_length(first8.data(), where_.file_bytes(), source_);
    const std::vector<std::byte> json = read_to_host(8, n);
    header_ = parse_header(std::string_view(reinterpret_cast<const char*>(json.data()), json.size()), where_.file_bytes(), source_);
  }

  [[nodiscard]] const safetensors_header& header() const noexcept { return header_; }
  [[nodiscard]] const file_placement& placement() const noexcept { return where_; }
  [[nodiscard]] device& dev() const noexcept { return dev_; }
  [[nodiscard]] const std::string& source() const noexcept { return source_; }

  /// The read plan for tensors `indices` (into `header().tensors`), in that order.
  [[nodiscard]] read_plan plan(const std::vector<std::size_t>& indices) const {
    std::vector<byte_range> ranges;
    ranges.reserve(indices.size());
    for (std::size_t i : indices) ranges.push_back({header_.file_offset(header_.tensors[i]), header_.tensors[i].bytes()});
    return plan_reads(where_, ranges);
  }

  /// Enqueues reads of `names` (every tensor when empty) into one new GPU buffer on `stream`.
  /// Throws `host::error` for a name the file lacks or a read that cannot be enqueued. The
  /// buffer is registered with the device (its page table allocated) here: as with
  /// `device::register_buffer`, best before other copies are in flight. Threads that load at
  /// once through the emulator give each load a non-blocking stream of its own, not the legacy
  /// default stream (`nullptr`): see "Threads" at `emu::cuda_memory`.
  [[nodiscard]] loaded_tensors load(const std::vector<std::string>& names = {}, cudaStream_t stream = nullptr) {
    std::vector<std::size_t> indices;
    if (names.empty()) {
      for (std::size_t i = 0; i < header_.tensors.size(); ++i) indices.push_back(i);
    }
    for (const std::string& n : names) {
      const tensor_info* t = header_.find(n);
      if (t == nullptr) throw host::error("Load tensors", source_, "no tensor '" + n + "' in the file");
      indices.push_back(static_cast<std::size_t>(t - header_.tensors.data()));
    }
    const read_plan p = plan(indices);
    const host::gpu_context_scope scope = dev_.make_current();
    auto buffer = std::make_unique<detail::gpu_buffer>(dev_, static_cast<std::size_t>(p.buffer_bytes), source_);
    std::vector<pending_copy> copies = detail::enqueue_reads(dev_, p, buffer->data(), stream);
    std::vector<gpu_tensor> tensors;
    for (std::size_t k = 0; k < indices.size(); ++k) tensors.push_back({&header_.tensors[indices[k]], buffer->data() + p.offsets[k]});
    std::uint64_t bytes = 0;
    for (const block_read& r : p.reads) bytes += r.blocks * where_.block_bytes();
    return loaded_tensors(std::move(buffer), std::move(tensors), std::move(copies), source_, bytes);
  }

 private:
  /// File bytes [offset, offset + length) on the host, through GPU memory.
  [[nodiscard]] std::vector<std::byte> read_to_host(std::uint64_t offset, std::uint64_t length) {
    const read_plan p = plan_reads(where_, {{offset, length}});
    detail::gpu_buffer scratch(dev_, static_cast<std::size_t>(p.buffer_bytes), source_);
    // A stream of its own, not the legacy default stream: a synchronous copy there waits for
    // every other thread's kernel on it, holding a driver lock that the emulator's data copies
    // for those kernels need (test/gpu/loader_test.cu, two threads opening one file).
    const detail::owned_stream stream = detail::make_stream("Read the safetensors header", source_);
    std::vector<pending_copy> copies = detail::enqueue_reads(dev_, p, scratch.data(), stream.get());
    detail::wait_all(dev_, copies, "Read the safetensors header", source_);
    std::vector<std::byte> out(static_cast<std::size_t>(length));
    host::cuda_check(cudaMemcpyAsync(out.data(), scratch.data() + p.offsets[0], out.size(), cudaMemcpyDeviceToHost, stream.get()),
                     "Copy the header to the host", source_);
    host::cuda_check(cudaStreamSynchronize(stream.get()), "Copy the header to the host", source_);
    return out;
  }

  device& dev_;
  file_placement where_;
  std::string source_;
  safetensors_header header_;
};

/// One layer handed out by `layer_streamer::next`.
struct layer {
  std::string_view key;
  std::size_t index = 0;
  std::vector<gpu_tensor> tensors;
  [[nodiscard]] const gpu_tensor* find(std::string_view name) const { return find_tensor(tensors, name); }
};

/// A file's layers (`group_by_layer`), each read while the caller computes on the one before.
/// A layer's tensors are valid until `next` has been called twice more: while layer k + 1 is
/// the current one, layer k is intact, so work on k may still run under k + 1's.
///
/// Three GPU buffers the size of the largest layer, taken in turn: the current layer's, the one
/// before it (still valid) and the one being read. `next` returning layer k enqueues layer
/// k + 1's reads on the streamer's own load stream into the buffer of layer k - 2, which the
/// caller has just moved two layers past; they wait for an event recorded then on the stream
/// given to the `next` that returned layer k - 2, so everything enqueued on it by then is done
/// first. With two buffers the promise would cost the overlap: layer k + 1 could only be read
/// into layer k - 1's buffer once the caller let go of k - 1, i.e. after asking for k + 1.
///
/// So work on a layer must be enqueued on the stream given to the `next` that returned it (or
/// one ordered before its next use by it), and that stream must stay valid until `next` has
/// been called twice more. The destructor waits for the reads in flight.
class layer_streamer {
 public:
  /// Buffers taken in turn (see above).
  static constexpr std::size_t buffers = 3;

  explicit layer_streamer(safetensors_file& file, const std::function<std::string(std::string_view)>& key = default_layer_key)
      : file_(file), groups_(group_by_layer(file.header(), key)) {
    std::uint64_t largest = 0;
    for (const layer_group& g : groups_) {
      plans_.push_back(file_.plan(g.tensors));
      largest = std::max(largest, plans_.back().buffer_bytes);
    }
    // Every handle is owned by a member as soon as it exists: a throw part-way (no GPU memory
    // for the last buffer, say) releases what was made, as members are destroyed.
    const std::string& source = file_.source();
    const host::gpu_context_scope scope = file_.dev().make_current();
    load_ = detail::make_stream("Create the load stream", source);
    for (slot& s : slots_) {
      s.buffer = std::make_unique<detail::gpu_buffer>(file_.dev(), static_cast<std::size_t>(largest), source);
      s.loaded = detail::make_event("Create an event", source);
      s.released = detail::make_event("Create an event", source);
    }
  }
  layer_streamer(const layer_streamer&) = delete;
  layer_streamer& operator=(const layer_streamer&) = delete;
  /// Waits for the reads in flight, so the buffers are not freed under them; the members then
  /// release the stream, events and buffers.
  ~layer_streamer() {
    const host::gpu_context_scope scope(file_.dev().gpu(), file_.source(), std::nothrow);
    for (slot& s : slots_) {
      for (pending_copy& c : s.copies) (void)c.wait();
    }
    if (load_) (void)cudaStreamSynchronize(load_.get());
  }

  [[nodiscard]] std::size_t size() const noexcept { return groups_.size(); }
  [[nodiscard]] const std::vector<layer_group>& groups() const noexcept { return groups_; }
  /// Whole blocks read so far.
  [[nodiscard]] std::uint64_t bytes_read() const noexcept { return bytes_read_; }

  /// The next layer, or nothing past the last: enqueues the reads of the layer after it, waits
  /// (on the host) for its own reads, and makes `compute` wait for them. Throws `host::error`
  /// for a failed read.
  [[nodiscard]] std::optional<layer> next(cudaStream_t compute = nullptr) {
    if (next_ >= groups_.size()) return std::nullopt;
    const std::string& source = file_.source();
    const host::gpu_context_scope scope = file_.dev().make_current();
    if (next_ == 0) enqueue(0);
    if (next_ + 1 < groups_.size()) enqueue(next_ + 1);
    slot& s = slots_[next_ % buffers];
    detail::wait_all(file_.dev(), s.copies, "Load layer '" + groups_[next_].key + "'", source);
    host::cuda_check(cudaStreamWaitEvent(compute, s.loaded.get(), 0), "Order the compute stream after the load", source);
    s.compute = compute;
    s.handed_out = true;
    layer l{groups_[next_].key, next_, {}};
    const read_plan& p = plans_[next_];
    for (std::size_t k = 0; k < groups_[next_].tensors.size(); ++k) {
      l.tensors.push_back({&file_.header().tensors[groups_[next_].tensors[k]], s.buffer->data() + p.offsets[k]});
    }
    ++next_;
    return l;
  }

 private:
  struct slot {
    std::unique_ptr<detail::gpu_buffer> buffer;
    std::vector<pending_copy> copies;
    detail::owned_event loaded;    ///< on the load stream, after the layer's reads
    detail::owned_event released;  ///< on the caller's stream, after its work on the layer
    cudaStream_t compute = nullptr;  ///< the stream the buffer's layer was handed out for
    bool handed_out = false;
  };

  void enqueue(std::size_t k) {
    slot& s = slots_[k % buffers];
    const std::string& source = file_.source();
    if (s.handed_out) {
      // Everything the caller enqueued on the buffer's previous layer is on its stream now.
      host::cuda_check(cudaEventRecord(s.released.get(), s.compute), "Record an event", source);
      host::cuda_check(cudaStreamWaitEvent(load_.get(), s.released.get(), 0), "Order the load after the compute", source);
      s.handed_out = false;
    }
    s.copies = detail::enqueue_reads(file_.dev(), plans_[k], s.buffer->data(), load_.get());
    host::cuda_check(cudaEventRecord(s.loaded.get(), load_.get()), "Record an event", source);
    for (const block_read& r : plans_[k].reads) bytes_read_ += r.blocks * file_.placement().block_bytes();
  }

  safetensors_file& file_;
  std::vector<layer_group> groups_;
  std::vector<read_plan> plans_;
  // Destroyed in reverse: the load stream first, then the slots' events and buffers (the
  // destructor has waited for the stream, so nothing on it still uses them).
  slot slots_[buffers];
  detail::owned_stream load_;
  std::size_t next_ = 0;
  std::uint64_t bytes_read_ = 0;
};

}  // namespace loader
CUNVME_NAMESPACE_END
