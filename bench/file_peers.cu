// file_peers (figure P5): a whole file into one GPU buffer, by cunvme and by the ways a CUDA
// program would otherwise do it, in one run on one file:
//
//   cunvme  the embedded emulator backed by the file ("emu:file=PATH,workers=N"); the GPU reads
//           it with one cunvme::copy_n over the whole file (each warp keeps 32 commands in flight)
//   cufile  NVIDIA GPUDirect Storage: cuFileRead of 16 MiB pieces from --threads threads (an
//           O_DIRECT descriptor when the file system takes one); optional at build time
//   pread   the CPU pipeline to beat: --threads threads take --chunk pieces in turn, each thread
//           with two pinned staging buffers and its own stream, reading one while the other copies
//   mmap    the file mapped, copied to the GPU with cudaMemcpy 64 MiB at a time
//   pin     --threads threads pin 64 MiB granules of the mapped file (cudaHostRegister) and copy
//           each: the ceiling of the emulator's own path, a GPU reading the page cache in place
//
// The file is read through once first (untimed), so every method reads from the page cache
// (cuFile with O_DIRECT bypasses it: that is what GDS does). Each timing covers the transfer and
// a final cudaDeviceSynchronize; setup (opening, registering, allocating) is reported apart. The
// buffer is filled with a poison value before each run and checksummed on the GPU after it; every
// checksum must equal the file's (computed on the host during the first pass).
//
//   build/bench/file_peers --file /data/big.bin --create-size 4G                 a table
//   build/bench/file_peers --file /data/big.bin --create-size 4G --json --repeat 5
//   build/bench/file_peers --file /data/big.bin --methods cufile --cufile-trace /tmp/cufile-trace
//
// --cufile-trace DIR writes DIR/cufile.json (TRACE logging into DIR, compat mode allowed) and
// points cuFile at it; on a cuFile failure the program prints the error, what it knows about the
// file's device and the end of the cuFile log. --cufile-buffered skips O_DIRECT, so cuFile's
// compat mode reads from the page cache like the others. A cuFile that cannot run is reported
// ("failed: …") without failing the run. Exits 0; 1 when a checksum differs or another method
// fails, and then prints no figure (its --json object holds "error" instead); 2 for bad
// arguments; 77 (Meson's "skipped") without a CUDA GPU. The options: file_peers_options.hpp; the
// record: file_peers_report.hpp.
#include <cunvme/facade/copy.cuh>
#include <cunvme/host/cuda_error.cuh>

#include "file_peers_options.hpp"
#include "file_peers_report.hpp"

#ifdef FILE_PEERS_WITH_CUFILE
#include <cufile.h>
#endif

#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <cuda/std/cstdint>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

namespace bench = cunvme::bench;
using bench::usage_error;
using bench::file_peers::all_methods;
using bench::file_peers::hex;
using bench::file_peers::options;
using bench::file_peers::outcome;

// ---- the checksum (the one examples/file_to_gpu.cu uses) ------------------------------------------

/// splitmix64's finaliser: a cheap, well-mixed 64-bit hash (also the generator of created files).
__host__ __device__ constexpr cuda::std::uint64_t mix(cuda::std::uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// A sum of one term per little-endian 64-bit word keyed by the word's index: any order of
/// adding works (threads, chunks), and the key notices words that trade places.
__host__ __device__ constexpr cuda::std::uint64_t term(cuda::std::uint64_t word, cuda::std::uint64_t index) {
  return mix(word ^ (index * 0x9e3779b97f4a7c15ull));
}

__global__ void checksum_kernel(const cuda::std::uint64_t* data, cuda::std::uint64_t bytes, unsigned long long* sum) {
  const cuda::std::uint64_t words = (bytes + 7) / 8;
  unsigned long long local = 0;
  for (cuda::std::uint64_t i = cuda::std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < words;
       i += cuda::std::uint64_t{gridDim.x} * blockDim.x) {
    cuda::std::uint64_t w = data[i];
    if (const cuda::std::uint64_t kept = bytes - i * 8; kept < 8) w &= (cuda::std::uint64_t{1} << (kept * 8)) - 1;  // past the end: zeros
    local += term(w, i);
  }
  for (int lanes = 16; lanes > 0; lanes /= 2) local += __shfl_down_sync(0xffffffffu, local, lanes);
  if (threadIdx.x % 32 == 0) atomicAdd(sum, local);
}

/// The checksum of bytes [0, size) of a host buffer that starts at file offset `at` (a multiple of 8).
std::uint64_t host_checksum(const unsigned char* data, std::size_t size, std::uint64_t at) {
  std::uint64_t sum = 0;
  for (std::size_t o = 0; o < size; o += 8) {
    std::uint64_t w = 0;
    std::memcpy(&w, data + o, std::min<std::size_t>(8, size - o));
    sum += term(w, (at + o) / 8);
  }
  return sum;
}

// ---- small tools ------------------------------------------------------------------------------------

/// A method left bytes in GPU memory that are not the file's: always an error.
struct wrong_bytes : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(cudaError_t e, const std::string& what) { cunvme::host::cuda_check(e, what, "the GPU"); }

[[noreturn]] void fail_errno(const std::string& what) { throw std::runtime_error(what + ": " + std::strerror(errno)); }

/// A file descriptor closed when it goes out of scope.
class unique_fd {
 public:
  explicit unique_fd(int fd = -1) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  unique_fd& operator=(unique_fd&&) = delete;
  ~unique_fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] explicit operator bool() const noexcept { return fd_ >= 0; }

 private:
  int fd_;
};

unique_fd open_or_throw(const std::string& path, int flags) {
  unique_fd fd(::open(path.c_str(), flags | O_CLOEXEC, 0644));
  if (!fd) fail_errno("open '" + path + "'");
  return fd;
}

/// Reads `size` bytes at `at` unless the file ends first; returns how many it read.
std::size_t pread_full(int fd, void* into, std::size_t size, std::uint64_t at) {
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, static_cast<char*>(into) + done, size - done, static_cast<off_t>(at + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_errno("pread at " + std::to_string(at + done));
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  return done;
}

/// Pieces of [0, end) handed out in turn to the threads that ask, until the end or a stop.
class piece_queue {
 public:
  piece_queue(std::uint64_t end, std::uint64_t piece) : end_(end), piece_(piece) {}
  struct piece {
    std::uint64_t at, size;
  };
  [[nodiscard]] std::optional<piece> take() {
    if (stopped_.load(std::memory_order_relaxed)) return std::nullopt;
    const std::uint64_t at = next_.fetch_add(piece_, std::memory_order_relaxed);
    if (at >= end_) return std::nullopt;
    return piece{at, std::min(piece_, end_ - at)};
  }
  void stop() noexcept { stopped_.store(true, std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> next_{0};
  std::atomic<bool> stopped_{false};
  std::uint64_t end_, piece_;
};

/// Runs `body(thread index)` on `count` threads; the first exception stops the queue and is rethrown.
void run_threads(unsigned count, piece_queue& queue, const std::function<void(unsigned)>& body) {
  std::vector<std::exception_ptr> errors(count);
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < count; ++t) {
    threads.emplace_back([&, t] {
      try {
        body(t);
      } catch (...) {
        errors[t] = std::current_exception();
        queue.stop();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// ---- the file and the page cache ----------------------------------------------------------------------

/// Writes `bytes` of seeded pseudo-random words at `path` unless a file of that size is there;
/// through a temporary name, so an interrupted run never leaves a file of the right size behind.
void create_file(const std::string& path, std::uint64_t bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && static_cast<std::uint64_t>(st.st_size) == bytes) return;
  std::fprintf(stderr, "file_peers: writing %llu bytes to '%s'\n", static_cast<unsigned long long>(bytes), path.c_str());
  const std::string partial = path + ".partial";
  {
    const unique_fd fd = open_or_throw(partial, O_WRONLY | O_CREAT | O_TRUNC);
    std::vector<std::uint64_t> words((8u << 20) / 8);
    for (std::uint64_t at = 0; at < bytes; at += words.size() * 8) {
      for (std::size_t i = 0; i < words.size(); ++i) words[i] = mix(at / 8 + i + 0x5eed);
      const std::size_t size = static_cast<std::size_t>(std::min<std::uint64_t>(words.size() * 8, bytes - at));
      for (std::size_t done = 0; done < size;) {
        const ssize_t n = ::pwrite(fd.get(), reinterpret_cast<const char*>(words.data()) + done, size - done, static_cast<off_t>(at + done));
        if (n < 0 && errno != EINTR) fail_errno("write '" + partial + "'");
        done += n > 0 ? static_cast<std::size_t>(n) : 0;
      }
    }
  }
  if (::rename(partial.c_str(), path.c_str()) != 0) fail_errno("rename '" + partial + "' to '" + path + "'");
}

/// Reads the whole file once with `threads` threads (bringing it into the page cache) and
/// returns its checksum.
std::uint64_t warm_page_cache(const std::string& path, std::uint64_t bytes, unsigned threads) {
  const unique_fd fd = open_or_throw(path, O_RDONLY);
  piece_queue queue(bytes, 8u << 20);  // a multiple of 8: words never straddle pieces
  std::vector<std::uint64_t> sums(threads, 0);
  run_threads(threads, queue, [&](unsigned t) {
    std::vector<unsigned char> buffer(8u << 20);
    while (const auto p = queue.take()) {
      if (pread_full(fd.get(), buffer.data(), p->size, p->at) != p->size) throw std::runtime_error("'" + path + "' ended early");
      sums[t] += host_checksum(buffer.data(), p->size, p->at);
    }
  });
  std::uint64_t sum = 0;
  for (const std::uint64_t s : sums) sum += s;
  return sum;
}

/// The fraction of the file's pages in the page cache (mincore on a mapping of it).
double resident_fraction(const std::string& path, std::uint64_t bytes) {
  const unique_fd fd = open_or_throw(path, O_RDONLY);
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (map == MAP_FAILED) fail_errno("mmap '" + path + "'");
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((bytes + page - 1) / page);
  const int rc = ::mincore(map, bytes, resident.data());
  ::munmap(map, bytes);
  if (rc != 0) fail_errno("mincore '" + path + "'");
  const auto in_cache = std::count_if(resident.begin(), resident.end(), [](unsigned char r) { return (r & 1) != 0; });
  return static_cast<double>(in_cache) / static_cast<double>(resident.size());
}

// ---- the methods --------------------------------------------------------------------------------------

/// One way of moving the file into GPU memory: the constructor does the untimed setup,
/// `transfer` the timed work (the caller synchronizes the device after it).
class method {
 public:
  virtual ~method() = default;
  virtual void transfer(unsigned char* gpu) = 0;
  /// Undoes what a transfer left for the next one (untimed, after the checksum).
  virtual void after_transfer() {}
  [[nodiscard]] virtual std::string note() const = 0;
};

/// Where a method's data goes: `bytes` of file in a buffer of `capacity` (whole 4 KiB pages).
struct target {
  std::string path;
  std::uint64_t bytes, capacity;
  unsigned char* gpu;
};

class cunvme_method final : public method {
 public:
  cunvme_method(const target& t, unsigned workers)
      : target_(t), workers_(workers), tail_file_(open_or_throw(t.path, O_RDONLY)), dev_(uri(t.path, workers)) {
    blocks_ = t.bytes / dev_.block_bytes();
    if (blocks_ > dev_.ns().lba_count) throw std::runtime_error("the emulator's namespace is smaller than the file");
  }

  void transfer(unsigned char* gpu) override {
    // The whole blocks in one call: copy_n gives every warp 32 × MDTS and keeps them all in flight.
    if (blocks_ != 0) {
      // A profiler range around it (no-op without a profiler): `ncu --replay-mode app-range
      // --methods cunvme` then sees the copy_n kernel and the emulator's copies as they ran.
      (void)cudaProfilerStart();
      const cunvme::io_result r = cunvme::copy_n_sync(dev_, 0, blocks_, gpu);
      (void)cudaProfilerStop();
      if (!r) {
        std::string why = cunvme::to_string(r.error);
        if (r.error == cunvme::io_error::nvme_status) why += ": " + cunvme::spec::to_string(r.status);
        throw std::runtime_error("copy_n: " + why + " at LBA " + std::to_string(r.lba));
      }
    }
    // A last partial block no command can address: the host copies it, as examples/file_to_gpu.cu does.
    if (const std::uint64_t done = blocks_ * dev_.block_bytes(); done < target_.bytes) {
      std::vector<unsigned char> tail(target_.bytes - done);
      pread_full(tail_file_.get(), tail.data(), tail.size(), done);
      check(cudaMemcpy(gpu + done, tail.data(), tail.size(), cudaMemcpyHostToDevice), "copy the last partial block");
    }
  }

  [[nodiscard]] std::string note() const override {
    return "emu:file, workers=" + std::to_string(workers_) + ", " + std::to_string(dev_.block_bytes()) + "-byte blocks, one copy_n of " +
           std::to_string(blocks_) + " blocks";
  }

 private:
  static std::string uri(const std::string& path, unsigned workers) {
    if (path.find(',') != std::string::npos) throw std::runtime_error("the emulator's URI separates options with ',': use a path without one");
    return "emu:file=" + path + ",readonly,workers=" + std::to_string(workers);
  }

  target target_;
  unsigned workers_;
  unique_fd tail_file_;
  cunvme::device dev_;
  std::uint64_t blocks_ = 0;
};

class pread_method final : public method {
 public:
  pread_method(const target& t, unsigned threads, std::uint64_t chunk) : target_(t), chunk_(chunk), file_(open_or_throw(t.path, O_RDONLY)) {
    lanes_.resize(threads);
    for (lane& l : lanes_) {
      check(cudaHostAlloc(&l.staging, 2 * chunk, cudaHostAllocDefault), "allocate pinned staging buffers");
      check(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking), "create a stream");
      for (cudaEvent_t& e : l.copied) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "create an event");
    }
  }
  ~pread_method() override {
    for (lane& l : lanes_) {
      for (cudaEvent_t e : l.copied) (void)cudaEventDestroy(e);
      (void)cudaStreamDestroy(l.stream);
      (void)cudaFreeHost(l.staging);
    }
  }
  pread_method(const pread_method&) = delete;
  pread_method& operator=(const pread_method&) = delete;

  void transfer(unsigned char* gpu) override {
    piece_queue queue(target_.bytes, chunk_);
    run_threads(static_cast<unsigned>(lanes_.size()), queue, [&](unsigned t) {
      lane& l = lanes_[t];
      bool in_use[2] = {false, false};
      for (unsigned b = 0; const auto p = queue.take(); b ^= 1) {
        unsigned char* staging = l.staging + b * chunk_;
        // This buffer's previous copy must be done before pread overwrites it; the other
        // buffer's copy keeps running meanwhile.
        if (in_use[b]) check(cudaEventSynchronize(l.copied[b]), "wait for a staging copy");
        if (pread_full(file_.get(), staging, p->size, p->at) != p->size) throw std::runtime_error("the file ended early");
        check(cudaMemcpyAsync(gpu + p->at, staging, p->size, cudaMemcpyHostToDevice, l.stream), "copy a chunk to the GPU");
        check(cudaEventRecord(l.copied[b], l.stream), "record a copy");
        in_use[b] = true;
      }
      check(cudaStreamSynchronize(l.stream), "finish the copies");
    });
  }

  [[nodiscard]] std::string note() const override {
    return std::to_string(lanes_.size()) + " threads x 2 pinned buffers of " + std::to_string(chunk_ >> 10) + " KiB, a stream each";
  }

 private:
  struct lane {
    unsigned char* staging = nullptr;  // two chunks
    cudaStream_t stream = nullptr;
    cudaEvent_t copied[2] = {nullptr, nullptr};
  };
  target target_;
  std::uint64_t chunk_;
  unique_fd file_;
  std::vector<lane> lanes_;
};

/// What a program that maps the file gets: cudaMemcpy from pageable memory, which the driver
/// stages through its own pinned buffers, page-faulting the mapping in (from the page cache) as
/// it goes. The mapping is made and unmapped inside the timing: it is part of the method.
class mmap_method final : public method {
 public:
  explicit mmap_method(const target& t) : target_(t), file_(open_or_throw(t.path, O_RDONLY)) {}

  void transfer(unsigned char* gpu) override {
    void* map = ::mmap(nullptr, target_.bytes, PROT_READ, MAP_SHARED, file_.get(), 0);
    if (map == MAP_FAILED) fail_errno("mmap '" + target_.path + "'");
    const std::unique_ptr<void, std::function<void(void*)>> unmap(map, [this](void* p) { ::munmap(p, target_.bytes); });
    constexpr std::uint64_t piece = 64u << 20;
    for (std::uint64_t at = 0; at < target_.bytes; at += piece) {
      check(cudaMemcpy(gpu + at, static_cast<const unsigned char*>(map) + at, std::min(piece, target_.bytes - at), cudaMemcpyHostToDevice),
            "copy from the mapping");
    }
  }

  [[nodiscard]] std::string note() const override { return "cudaMemcpy from the mapping, 64 MiB at a time"; }

 private:
  target target_;
  unique_fd file_;
};

/// The ceiling of a GPU reading the page cache where it lies: --threads threads take 64 MiB
/// granules of the mapped file in turn, pin each (cudaHostRegister, read-only) and copy it on
/// their own stream. This is what the emulator does with a file namespace, without NVMe
/// commands; pinning, not the copy, sets its rate (bench/RESULTS.md P9). The granules are
/// unpinned after each run, untimed, as the emulator unpins them when it closes.
class pin_method final : public method {
 public:
  pin_method(const target& t, unsigned threads) : target_(t), threads_(threads), file_(open_or_throw(t.path, O_RDONLY)) {}
  ~pin_method() override { after_transfer(); }
  pin_method(const pin_method&) = delete;
  pin_method& operator=(const pin_method&) = delete;

  void transfer(unsigned char* gpu) override {
    map_ = ::mmap(nullptr, target_.bytes, PROT_READ, MAP_SHARED, file_.get(), 0);
    if (map_ == MAP_FAILED) {
      map_ = nullptr;
      fail_errno("mmap '" + target_.path + "'");
    }
    const std::uint64_t granules = (target_.bytes + granule - 1) / granule;
    pinned_.assign(granules, 0);
    std::atomic<std::uint64_t> next{0};
    std::atomic<bool> failed{false};
    std::vector<std::string> errors(threads_);
    std::vector<std::thread> threads;
    const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE) > 0 ? ::sysconf(_SC_PAGESIZE) : 4096);
    const int gpu_ordinal = current_gpu();
    for (unsigned i = 0; i < threads_; ++i) {
      threads.emplace_back([&, i] {
        try {
          check(cudaSetDevice(gpu_ordinal), "select the GPU");
          cudaStream_t stream = nullptr;
          check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "create a stream");
          const std::unique_ptr<CUstream_st, cudaError_t (*)(cudaStream_t)> owned(stream, cudaStreamDestroy);
          for (std::uint64_t g = next++; g < granules && !failed.load(); g = next++) {
            auto* host = static_cast<unsigned char*>(map_) + g * granule;
            const std::uint64_t bytes = std::min(granule, target_.bytes - g * granule);
            // The last granule's page whole: the mapping covers it.
            check(cudaHostRegister(host, (bytes + page - 1) / page * page, cudaHostRegisterPortable | cudaHostRegisterReadOnly), "pin a granule");
            pinned_[g] = 1;
            check(cudaMemcpyAsync(gpu + g * granule, host, bytes, cudaMemcpyHostToDevice, stream), "copy a pinned granule");
          }
          check(cudaStreamSynchronize(stream), "finish the copies");
        } catch (const std::exception& e) {
          errors[i] = e.what();
          failed = true;  // the others stop taking granules
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (const std::string& e : errors) {
      if (!e.empty()) throw std::runtime_error(e);
    }
  }

  void after_transfer() override {
    if (map_ == nullptr) return;
    for (std::size_t g = 0; g < pinned_.size(); ++g) {
      if (pinned_[g]) (void)cudaHostUnregister(static_cast<unsigned char*>(map_) + g * granule);
    }
    (void)cudaGetLastError();
    ::munmap(map_, target_.bytes);
    map_ = nullptr;
    pinned_.clear();
  }

  [[nodiscard]] std::string note() const override {
    return std::to_string(threads_) + " threads pin 64 MiB granules of the mapping and copy each (the emulator's path without commands)";
  }

 private:
  static constexpr std::uint64_t granule = std::uint64_t{64} << 20;
  static int current_gpu() {
    int gpu = 0;
    check(cudaGetDevice(&gpu), "find the GPU");
    return gpu;
  }

  target target_;
  unsigned threads_;
  unique_fd file_;
  void* map_ = nullptr;
  std::vector<unsigned char> pinned_;  ///< a byte per granule, written by the thread that pinned it, read after the join
};

bool nvidia_fs_loaded() { return ::access("/proc/driver/nvidia-fs/stats", R_OK) == 0; }

#ifdef FILE_PEERS_WITH_CUFILE
std::string cufile_error_name(CUfileOpError e) {
  switch (e) {
#define CUFILE_OP(code, name, string) \
  case name:                          \
    return #name;
    CUFILEOP_STATUS_ENTRIES
#undef CUFILE_OP
    default:
      return "unknown cuFile error";
  }
}

/// "CU_FILE_HANDLE_NOT_REGISTERED (5027): file descriptor is not registered".
std::string describe(CUfileOpError e) { return cufile_error_name(e) + " (" + std::to_string(static_cast<int>(e)) + "): " + cufileop_status_error(e); }

std::string describe(CUfileError_t s) {
  std::string text = describe(s.err);
  if (IS_CUDA_ERR(s)) text += ", " + cunvme::host::driver_error_text(CU_FILE_CUDA_ERR(s));
  return text;
}

class cufile_method final : public method {
 public:
  cufile_method(const target& t, unsigned threads, bool buffered) : target_(t), threads_(threads), buffered_(buffered) {
    try {
      setup();
    } catch (...) {
      release();
      throw;
    }
  }
  ~cufile_method() override { release(); }
  cufile_method(const cufile_method&) = delete;
  cufile_method& operator=(const cufile_method&) = delete;

  void transfer(unsigned char* gpu) override {
    // Pieces cover whole 4 KiB pages of the buffer (O_DIRECT needs them); the last returns short.
    piece_queue queue(target_.capacity, 16u << 20);
    run_threads(threads_, queue, [&](unsigned) {
      while (const auto p = queue.take()) {
        const std::uint64_t expected = std::min(p->size, target_.bytes - p->at);
        for (std::uint64_t done = 0; done < expected;) {
          const ssize_t n = cuFileRead(handle_, gpu, p->size - done, static_cast<off_t>(p->at + done), static_cast<off_t>(p->at + done));
          if (n < 0) {
            throw std::runtime_error("cuFileRead at " + std::to_string(p->at + done) + ": " +
                                     (n == -1 ? std::string(std::strerror(errno)) : describe(static_cast<CUfileOpError>(-n))));
          }
          if (n == 0) throw std::runtime_error("cuFileRead at " + std::to_string(p->at + done) + ": the file ended early");
          done += static_cast<std::uint64_t>(n);
        }
      }
    });
  }

  [[nodiscard]] std::string note() const override {
    std::string s = std::to_string(threads_) + " threads, 16 MiB reads, " + (direct_ ? "O_DIRECT" : "buffered (no O_DIRECT)");
    s += ", nvidia-fs " + std::to_string(props_.nvfs.major_version) + "." + std::to_string(props_.nvfs.minor_version);
    if (!nvidia_fs_loaded()) s += " (module not loaded: compat mode, POSIX reads through bounce buffers)";
    return s + (buffer_registered_ ? ", buffer registered" : ", buffer not registered (" + buffer_error_ + ")");
  }

 private:
  void setup() {
    if (const CUfileError_t s = cuFileDriverOpen(); s.err != CU_FILE_SUCCESS) throw std::runtime_error("cuFileDriverOpen: " + describe(s));
    driver_open_ = true;
    if (const CUfileError_t s = cuFileDriverGetProperties(&props_); s.err != CU_FILE_SUCCESS) props_ = {};
    // GDS reads with O_DIRECT; a file system that refuses it (tmpfs, overlay) gets a buffered
    // descriptor, as does --cufile-buffered (compat mode then reads the page cache like the others).
    std::string direct_failure = "O_DIRECT not tried (--cufile-buffered)";
    if (!buffered_) {
      if (unique_fd fd(::open(target_.path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC)); !fd) {
        direct_failure = std::string("open with O_DIRECT: ") + std::strerror(errno);
      } else if (const CUfileError_t s = register_handle(fd); s.err != CU_FILE_SUCCESS) {
        direct_failure = "cuFileHandleRegister with O_DIRECT: " + describe(s);
      } else {
        direct_ = true;
      }
    }
    if (!direct_) {
      unique_fd fd = open_or_throw(target_.path, O_RDONLY);
      if (const CUfileError_t s = register_handle(fd); s.err != CU_FILE_SUCCESS) {
        throw std::runtime_error(direct_failure + "; cuFileHandleRegister without O_DIRECT: " + describe(s));
      }
    }
    // Optional: an unregistered buffer is read through cuFile's bounce buffers.
    if (const CUfileError_t s = cuFileBufRegister(target_.gpu, target_.capacity, 0); s.err == CU_FILE_SUCCESS) {
      buffer_registered_ = true;
    } else {
      buffer_error_ = "cuFileBufRegister: " + describe(s);
    }
  }

  CUfileError_t register_handle(unique_fd& fd) {
    CUfileDescr_t descr{};
    descr.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    descr.handle.fd = fd.get();
    const CUfileError_t s = cuFileHandleRegister(&handle_, &descr);
    if (s.err == CU_FILE_SUCCESS) file_.emplace(std::move(fd));
    return s;
  }

  void release() noexcept {
    if (buffer_registered_) (void)cuFileBufDeregister(target_.gpu);
    if (file_) cuFileHandleDeregister(handle_);
    file_.reset();
    if (driver_open_) (void)cuFileDriverClose();
    buffer_registered_ = driver_open_ = false;
  }

  target target_;
  unsigned threads_;
  bool buffered_;
  CUfileDrvProps_t props_{};
  CUfileHandle_t handle_ = nullptr;
  std::optional<unique_fd> file_;  // open while handle_ is registered
  bool driver_open_ = false, direct_ = false, buffer_registered_ = false;
  std::string buffer_error_;
};
#endif

// ---- cuFile diagnostics -------------------------------------------------------------------------------

/// Points cuFile at DIR/cufile.json (TRACE logging into DIR/cufile.log, compat mode allowed);
/// must run before cuFile initialises (cuFileDriverOpen), which reads these once.
void configure_cufile_trace(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!std::filesystem::is_directory(dir)) throw usage_error("--cufile-trace: cannot create directory '" + dir + "'");
  const std::string absolute = std::filesystem::absolute(dir).string();
  const std::string config = absolute + "/cufile.json";
  std::ofstream out(config);
  out << "{\n  \"logging\": { \"dir\": " << bench::one_line(bench::json(absolute)) << ", \"level\": \"TRACE\" },\n"
      << "  \"profile\": { \"cufile_stats\": 3 },\n"
      << "  \"properties\": { \"allow_compat_mode\": true, \"use_poll_mode\": false },\n"
      << "  \"fs\": { \"generic\": { \"posix_unaligned_writes\": false } }\n}\n";
  if (!out.flush()) throw usage_error("--cufile-trace: cannot write '" + config + "'");
  // CUFILE_LOGFILE_PATH overrides the log's place and name, so the log is found for sure.
  ::setenv("CUFILE_ENV_PATH_JSON", config.c_str(), 1);
  ::setenv("CUFILE_LOGFILE_PATH", (absolute + "/cufile.log").c_str(), 1);
  ::setenv("CUFILE_LOGGING_LEVEL", "TRACE", 1);
}

const char* file_system_name(unsigned long magic) {
  switch (magic) {
    case 0xEF53: return "ext2/3/4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs";
    case 0x794C7630: return "overlayfs";
    case 0x6969: return "nfs";
    case 0x65735546: return "fuse";
    default: return "other";
  }
}

/// What cuFile depends on, for finding out why it failed: the file's file system and block
/// device (cuFile asks udev about it) and the end of the cuFile log.
void print_cufile_diagnostics(const std::string& path, const std::string& trace_dir) {
  std::fprintf(stderr, "file_peers: cuFile diagnostics\n");
  struct statfs fs {};
  struct stat st {};
  if (::statfs(path.c_str(), &fs) == 0 && ::stat(path.c_str(), &st) == 0) {
    const unsigned major_id = major(st.st_dev), minor_id = minor(st.st_dev);
    const std::string udev = "/run/udev/data/b" + std::to_string(major_id) + ":" + std::to_string(minor_id);
    std::fprintf(stderr, "  file system: %s (magic 0x%lx), device %u:%u%s\n", file_system_name(static_cast<unsigned long>(fs.f_type)),
                 static_cast<unsigned long>(fs.f_type), major_id, minor_id,
                 major_id == 0 ? " (no block device: GDS needs a file on a local NVMe file system)" : "");
    std::fprintf(stderr, "  udev data for the device (%s): %s\n", udev.c_str(),
                 ::access(udev.c_str(), R_OK) == 0 ? "readable" : "missing (in a container: mount /run/udev read-only)");
  }
#ifdef FILE_PEERS_WITH_CUFILE
  if (int version = 0; cuFileGetVersion(&version).err == CU_FILE_SUCCESS) std::fprintf(stderr, "  cuFile library version: %d\n", version);
#endif
  std::fprintf(stderr, "  nvidia-fs module: %s\n", nvidia_fs_loaded() ? "loaded" : "not loaded (cuFile can only run in compat mode)");
  if (trace_dir.empty()) {
    std::fprintf(stderr, "  run again with --cufile-trace DIR for cuFile's TRACE log\n");
    return;
  }
  namespace fsys = std::filesystem;
  std::error_code ec;
  for (const auto& entry : fsys::directory_iterator(trace_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("cufile", 0) != 0 || entry.path().extension() != ".log") continue;
    std::ifstream log(entry.path());
    std::vector<std::string> lines;
    for (std::string line; std::getline(log, line);) {
      lines.push_back(line);
      if (lines.size() > 80) lines.erase(lines.begin(), lines.begin() + 40);
    }
    const std::size_t from = lines.size() > 40 ? lines.size() - 40 : 0;
    std::fprintf(stderr, "  %s, last %zu lines:\n", entry.path().c_str(), lines.size() - from);
    for (std::size_t i = from; i < lines.size(); ++i) std::fprintf(stderr, "    %s\n", lines[i].c_str());
  }
}

// ---- running and reporting ----------------------------------------------------------------------------

std::unique_ptr<method> make_method(const std::string& name, const target& t, const options& o) {
  if (name == "cunvme") return std::make_unique<cunvme_method>(t, o.workers);
  if (name == "pread") return std::make_unique<pread_method>(t, o.threads, o.chunk);
  if (name == "mmap") return std::make_unique<mmap_method>(t);
  if (name == "pin") return std::make_unique<pin_method>(t, o.threads);
#ifdef FILE_PEERS_WITH_CUFILE
  return std::make_unique<cufile_method>(t, o.threads, o.cufile_buffered);
#else
  return nullptr;
#endif
}

std::uint64_t gpu_checksum(const target& t, unsigned long long* sum) {
  check(cudaMemset(sum, 0, sizeof *sum), "clear the checksum");
  checksum_kernel<<<1024, 256>>>(reinterpret_cast<const cuda::std::uint64_t*>(t.gpu), t.bytes, sum);
  check(cudaGetLastError(), "launch the checksum");
  unsigned long long host = 0;
  check(cudaMemcpy(&host, sum, sizeof host, cudaMemcpyDeviceToHost), "read the checksum");
  return host;
}

outcome measure(const std::string& name, const target& t, const options& o, std::uint64_t expected, unsigned long long* sum) {
  outcome r;
  r.name = name;
  const auto clock = [] { return std::chrono::steady_clock::now(); };
  const auto setup_start = clock();
  const std::unique_ptr<method> m = make_method(name, t, o);
  if (!m) {
    r.status = "not built";
    r.reason = "built without cuFile (cufile.h and libcufile not found by Meson)";
    return r;
  }
  r.setup_s = std::chrono::duration<double>(clock() - setup_start).count();
  r.note = m->note();
  for (unsigned i = 0; i < o.repeat; ++i) {
    // Poison first: a method that moved nothing (or too little) cannot pass on the last one's bytes.
    check(cudaMemset(t.gpu, 0xA5, t.capacity), "poison the buffer");
    check(cudaDeviceSynchronize(), "poison the buffer");
    const auto start = clock();
    m->transfer(t.gpu);
    check(cudaDeviceSynchronize(), name + ": finish the transfer");
    r.runs.push_back(std::chrono::duration<double>(clock() - start).count());
    r.checksum = gpu_checksum(t, sum);
    m->after_transfer();
    if (r.checksum != expected) {
      throw wrong_bytes("checksum " + hex(r.checksum) + " on the GPU after run " + std::to_string(i + 1) + ", the file's is " + hex(expected));
    }
  }
  return r;
}

/// The table, or the JSON record; neither holds a figure when a method failed the run.
void print_report(const options& o, const bench::file_peers::run_context& ran, const std::vector<outcome>& results) {
  using bench::file_peers::best_s;
  using bench::file_peers::gb_per_s;
  using bench::file_peers::median_s;
  if (o.json) {
    std::printf("%s\n", bench::one_line(bench::file_peers::report(o, ran, results)).c_str());
    return;
  }
  const std::string failed = bench::file_peers::failure(results);
  std::printf("file_peers: '%s', %llu bytes, into %s\n", o.file.c_str(), static_cast<unsigned long long>(ran.bytes), ran.gpu.c_str());
  std::printf("page cache: warmed by one untimed pass; %.1f%% of the file resident%s\n", ran.resident * 100,
              ran.resident < 0.99 ? " (NOT all: the file may not fit in memory)" : "");
  if (!failed.empty()) {
    for (const outcome& r : results) std::printf("%-8s %s%s%s\n", r.name.c_str(), r.status.c_str(), r.reason.empty() ? "" : ": ", r.reason.c_str());
    return;  // main says why on stderr; the methods that ran report no figure beside a failed one
  }
  std::printf("timed: the transfer and a final cudaDeviceSynchronize (best and median of %u); setup apart, untimed\n\n", o.repeat);
  std::printf("%-8s %-8s %9s %9s %10s %12s  %-16s\n", "method", "status", "setup s", "best s", "best GB/s", "median GB/s", "checksum");
  for (const outcome& r : results) {
    if (r.status != "ok") {
      std::printf("%-8s %s: %s\n", r.name.c_str(), r.status.c_str(), r.reason.c_str());
      continue;
    }
    std::printf("%-8s %-8s %9.3f %9.3f %10.2f %12.2f  %s\n", r.name.c_str(), "ok", r.setup_s, best_s(r), gb_per_s(ran.bytes, best_s(r)),
                gb_per_s(ran.bytes, median_s(r.runs)), hex(r.checksum).c_str());
  }
  std::printf("\n");
  for (const outcome& r : results) {
    if (!r.note.empty()) std::printf("  %-7s %s\n", r.name.c_str(), r.note.c_str());
  }
  const outcome* best_peer = bench::file_peers::best_peer(results);
  const auto ours = std::find_if(results.begin(), results.end(), [](const outcome& r) { return r.name == "cunvme" && r.status == "ok"; });
  if (best_peer) {
    std::printf("best peer: %s at %.2f GB/s", best_peer->name.c_str(), gb_per_s(ran.bytes, best_s(*best_peer)));
    if (ours != results.end()) std::printf("; cunvme / best peer = %.2f", best_s(*best_peer) / best_s(*ours));
    std::printf("\n");
  }
}

int run(const options& o) {
  cudaDeviceProp props{};
  check(cudaGetDeviceProperties(&props, 0), "query GPU 0");
  if (!o.cufile_trace.empty()) configure_cufile_trace(o.cufile_trace);
  if (o.create_size) create_file(o.file, *o.create_size);
  struct stat st {};
  if (::stat(o.file.c_str(), &st) != 0) fail_errno("'" + o.file + "'");
  if (!S_ISREG(st.st_mode) || st.st_size == 0) throw std::runtime_error("'" + o.file + "' is empty or not a regular file");
  const auto bytes = static_cast<std::uint64_t>(st.st_size);

  std::fprintf(stderr, "file_peers: reading '%s' into the page cache (untimed)\n", o.file.c_str());
  const std::uint64_t expected = warm_page_cache(o.file, bytes, o.threads);
  const double resident = resident_fraction(o.file, bytes);

  target t{o.file, bytes, (bytes + 4095) / 4096 * 4096, nullptr};
  unsigned long long* sum = nullptr;
  check(cudaMalloc(&t.gpu, t.capacity), "allocate " + std::to_string(t.capacity) + " bytes of GPU memory");
  check(cudaMalloc(&sum, sizeof *sum), "allocate the checksum");

  std::vector<outcome> results;
  for (const std::string& name : all_methods) {
    if (std::find(o.methods.begin(), o.methods.end(), name) == o.methods.end()) continue;
    std::fprintf(stderr, "file_peers: %s\n", name.c_str());
    try {
      results.push_back(measure(name, t, o, expected, sum));
    } catch (const std::exception& e) {
      const bool wrong = dynamic_cast<const wrong_bytes*>(&e) != nullptr;
      outcome& failed = results.emplace_back();
      failed.name = name;
      failed.status = "failed";
      failed.reason = e.what();
      std::fprintf(stderr, "file_peers: %s failed: %s\n", name.c_str(), e.what());
      // cuFile may simply not work here: reported, not fatal. Wrong bytes are always fatal.
      failed.fails_the_run = name != "cufile" || wrong;
      if (!failed.fails_the_run) print_cufile_diagnostics(o.file, o.cufile_trace);
      (void)cudaGetLastError();
    }
  }
  if (!o.cufile_trace.empty() && std::find(o.methods.begin(), o.methods.end(), "cufile") != o.methods.end()) {
    std::fprintf(stderr, "file_peers: cuFile ran with TRACE logging: its timing is not representative\n");
  }
  print_report(o, bench::file_peers::run_context{bench::now_text(), props.name, bytes, resident}, results);
  (void)cudaFree(sum);
  (void)cudaFree(t.gpu);
  if (const std::string failed = bench::file_peers::failure(results); !failed.empty()) {
    std::fprintf(stderr, "file_peers: the run failed, no figures reported: %s\n", failed.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  cunvme::emu::prepare_cuda_environment();  // before any CUDA call: kernels wait for emulated I/O
  options o;
  if (const std::optional<int> exit_code = bench::parse_command_line(*bench::file_peers::make_app(o), argc, argv)) return *exit_code;
  // In --json mode every ending prints one object: sweep.py records the reason with the figure's row.
  const auto refuse = [&o](const std::string& why, int exit_code) {
    if (o.json) {
      std::printf("%s\n", bench::one_line(bench::file_peers::error_report(o, bench::now_text(), why)).c_str());
    } else {
      std::fprintf(stderr, "file_peers: %s\n", why.c_str());
    }
    return exit_code;
  };
  int gpus = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&gpus); e != cudaSuccess || gpus == 0) {
    return refuse(std::string("no CUDA GPU: file_peers needs one (") + (e != cudaSuccess ? cunvme::host::cuda_error_text(e) : "none found") + ")", 77);
  }
  try {
    return run(o);
  } catch (const usage_error& e) {
    return refuse(e.what(), 2);
  } catch (const std::exception& e) {
    return refuse(e.what(), 1);
  }
}
