// The bytes of one emulated namespace: anonymous memory, or a user's file mapped into memory
// (so a model or a dataset on disk can be read from the GPU through the emulator).
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/emu/range_lock.cuh>

#include <algorithm>
#include <cerrno>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

CUNVME_NAMESPACE_BEGIN
namespace emu {

/// A namespace's storage: zero-filled memory, or a file mapped shared so that writes reach it.
///
/// Several worker threads touch the store at once, sometimes the same blocks (NVMe lets
/// commands on different queues overlap; the result is undefined but must not be a C++ data
/// race). Every access therefore holds reader/writer locks over its bytes; see `with_read_access`.
/// A store moves but does not copy; a moved-from store may only be assigned to or destroyed.
///
/// Usage: examples/snippets/emu.cpp, `backing_stores`.
class backing_store {
 public:
  /// `bytes` of zeroed memory. The mapping is MAP_NORESERVE and pages appear on first write, so
  /// a huge, sparsely written namespace costs only what is written. Throws
  /// std::invalid_argument for 0 bytes and std::system_error when the mapping fails.
  [[nodiscard]] static backing_store in_memory(std::uint64_t bytes) {
    if (bytes == 0) throw std::invalid_argument("backing_store::in_memory: a store of 0 bytes");
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) os_error("mmap ", bytes, " bytes of memory");
    return backing_store(static_cast<std::byte*>(p), bytes, bytes, -1, std::string(), false);
  }

  /// The file at `path`, mapped MAP_SHARED so writes land in the file (durably after `flush`).
  ///
  /// `bytes == 0`: the store is the whole file, which must not be empty, its size rounded up
  /// to a multiple of `whole` (a namespace's block): the bytes after the file's end, fewer
  /// than `whole`, read as zeros and are not the file's (`file_bytes`): `write` and
  /// `with_write_access` refuse them and `zero` leaves them be, so the file is never
  /// extended or changed by a store that merely covers it. `bytes` below the file's size: the
  /// store is the file's first `bytes`. Above it: the file is extended with zeros
  /// (std::invalid_argument instead when `read_only`). A missing file is created only when
  /// `bytes` is given and the store is writable. The file must not shrink while mapped
  /// (another process truncating it makes accesses fault with SIGBUS).
  [[nodiscard]] static backing_store from_file(const std::string& path, std::uint64_t bytes = 0,
                                               bool read_only = false, std::uint64_t whole = 1) {
    if (whole == 0) throw std::invalid_argument("backing_store: '" + path + "' rounded up to a multiple of 0 bytes");
    if (bytes > static_cast<std::uint64_t>(std::numeric_limits<off_t>::max())) {
      throw std::invalid_argument("backing_store: " + std::to_string(bytes) + " bytes for '" + path +
                                  "' exceed the largest file offset");
    }
    const int flags = read_only ? O_RDONLY : (bytes > 0 ? O_RDWR | O_CREAT : O_RDWR);
    const int fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
    if (fd < 0) os_error("open '", path, "'");
    // Closes the descriptor on every failure below; released once the store owns it.
    struct fd_guard {
      int fd;
      ~fd_guard() {
        if (fd >= 0) ::close(fd);
      }
    } guard{fd};

    struct stat st {};
    if (::fstat(fd, &st) != 0) os_error("stat '", path, "'");
    // A directory opens read-only, and a device's st_size is 0: neither can be sized or mapped.
    if (!S_ISREG(st.st_mode)) throw std::invalid_argument("backing_store: '" + path + "' is not a regular file");
    const auto file_size = static_cast<std::uint64_t>(st.st_size);
    if (bytes == 0 && file_size == 0) throw std::invalid_argument("backing_store: '" + path + "' is empty and no size was given");
    const std::uint64_t padding = file_size % whole == 0 ? 0 : whole - file_size % whole;
    if (bytes == 0 && padding > std::numeric_limits<std::uint64_t>::max() - file_size) {
      throw std::invalid_argument("backing_store: '" + path + "' rounded up to a multiple of " + std::to_string(whole) + " bytes exceeds 2^64 bytes");
    }
    const std::uint64_t size = bytes == 0 ? file_size + padding : bytes;
    const std::uint64_t backed = std::min(size, std::max(bytes, file_size));
    if (bytes > file_size) {  // not for padding: that is never the file's
      if (read_only) {
        throw std::invalid_argument("backing_store: '" + path + "' has " + std::to_string(file_size) + " bytes, " +
                                    std::to_string(size) + " were asked for, and a read-only store cannot extend it");
      }
      // Accesses past the end of a mapped file fault (SIGBUS), so the file grows first.
      if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
        os_error("extend '", path, "' from ", file_size, " to ", size, " bytes");
      }
    }
    const int protection = read_only ? PROT_READ : PROT_READ | PROT_WRITE;
    const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE) > 0 ? ::sysconf(_SC_PAGESIZE) : 4096);
    const std::uint64_t file_pages = (backed + page - 1) / page * page;
    void* p = nullptr;
    if ((size + page - 1) / page * page <= file_pages) {
      // The padding lies in the file's last page: past the end of a file, mapped memory in
      // that page reads as zeros (mmap(2)).
      p = ::mmap(nullptr, size, protection, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) os_error("mmap '", path, "' (", size, " bytes)");
    } else {
      // The padding reaches pages past the file's last, which fault (SIGBUS) in a mapping of
      // the file: reserve zero pages for the whole store and map the file over its start.
      p = ::mmap(nullptr, size, protection, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) os_error("mmap ", size, " bytes for '", path, "'");
      if (::mmap(p, file_pages, protection, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        const int error = errno;
        ::munmap(p, size);
        errno = error;
        os_error("mmap '", path, "' (", backed, " bytes)");
      }
    }
    guard.fd = -1;
    return backing_store(static_cast<std::byte*>(p), size, backed, fd, path, read_only);
  }

  backing_store(backing_store&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        file_bytes_(std::exchange(other.file_bytes_, 0)),
        fd_(std::exchange(other.fd_, -1)),
        page_bytes_(other.page_bytes_),
        read_only_(other.read_only_),
        path_(std::move(other.path_)),
        locks_(std::move(other.locks_)) {}

  backing_store& operator=(backing_store&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      file_bytes_ = std::exchange(other.file_bytes_, 0);
      fd_ = std::exchange(other.fd_, -1);
      page_bytes_ = other.page_bytes_;
      read_only_ = other.read_only_;
      path_ = std::move(other.path_);
      locks_ = std::move(other.locks_);
    }
    return *this;
  }

  backing_store(const backing_store&) = delete;
  backing_store& operator=(const backing_store&) = delete;
  ~backing_store() { release(); }

  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }
  /// The bytes at the store's start that can be written: all of them, but for a file that
  /// `from_file` rounded up to whole blocks, whose bytes from its end to `size()` read as
  /// zeros and are refused to writers (a write there would not reach the file).
  [[nodiscard]] std::uint64_t file_bytes() const noexcept { return file_bytes_; }
  [[nodiscard]] bool read_only() const noexcept { return read_only_; }
  [[nodiscard]] bool file_backed() const noexcept { return fd_ >= 0; }

  /// The whole mapping (page aligned, `size()` bytes), for registering it with something
  /// that DMAs to and from it, such as cudaHostRegister. Bytes are read and written through
  /// the functions below, which lock; this pointer is not for that.
  [[nodiscard]] std::byte* mapping() const noexcept { return data_; }

  /// Copies [offset, offset + len) to `dst`. Throws std::out_of_range outside the store.
  void read(std::uint64_t offset, void* dst, std::uint64_t len) const {
    check_range(offset, len, "read");
    auto* out = static_cast<std::byte*>(dst);
    for_each_piece(offset, len, [&](std::uint64_t at, std::uint64_t n) {
      range_lock<lock_mode::shared> lock(locks_.get(), at, n);
      std::memcpy(out + (at - offset), data_ + at, n);
    });
  }

  /// Copies `len` bytes from `src` to [offset, offset + len). Throws std::logic_error on a
  /// read-only store and std::out_of_range outside the store's `file_bytes()`.
  void write(std::uint64_t offset, const void* src, std::uint64_t len) {
    check_writable("write");
    check_write_range(offset, len, "write");
    const auto* in = static_cast<const std::byte*>(src);
    for_each_piece(offset, len, [&](std::uint64_t at, std::uint64_t n) {
      range_lock<lock_mode::exclusive> lock(locks_.get(), at, n);
      std::memcpy(data_ + at, in + (at - offset), n);
    });
  }

  /// Afterwards [offset, offset + len) reads as zeros (Write Zeroes, Deallocate). Whole pages
  /// are handed back — a hole punched in a file, fresh zero pages in RAM — so deallocating
  /// a large range frees space instead of writing zeros over it; the partial pages at either
  /// end are cleared by hand, and all of it when `pages_stay` (pages pinned for DMA: a pinned
  /// page dropped from the mapping stays where the DMA engine reads and writes while the
  /// mapping faults in a fresh one, and the two would no longer agree). Bytes past
  /// `file_bytes()` read as zeros already and are left alone. Throws std::logic_error on a
  /// read-only store and std::out_of_range outside the store.
  void zero(std::uint64_t offset, std::uint64_t len, bool pages_stay = false) {
    check_writable("zero");
    check_range(offset, len, "zero");
    if (offset >= file_bytes_) return;
    len = std::min(len, file_bytes_ - offset);
    for_each_piece(offset, len, [&](std::uint64_t at, std::uint64_t n) {
      range_lock<lock_mode::exclusive> lock(locks_.get(), at, n);
      clear(at, n, pages_stay);
    });
  }

  /// Makes written data durable: msync(MS_SYNC) for a file, nothing for RAM or a read-only
  /// store. Throws std::system_error naming the file.
  void flush() {
    if (fd_ < 0 || read_only_) return;
    if (::msync(data_, file_bytes_, MS_SYNC) != 0) os_error("msync '", path_, "'");
  }

  /// Calls `f(const std::byte* p)`, `p` pointing at byte `offset`, while no writer can touch
  /// [offset, offset + len): the emulator copies straight between the store and GPU or host
  /// memory, with no bounce buffer. `f` must stay inside the range and must not call back
  /// into the store. Throws std::out_of_range outside the store.
  ///
  /// Locking: the store is cut into 64 KiB chunks and chunk i is guarded by stripe i % 256 of
  /// an array of std::shared_mutex. An access locks its chunks' stripes in ascending stripe
  /// order (one global order, so no deadlock), shared to read and exclusive to write; accesses
  /// to different chunks rarely share a stripe, and distinct stripes never share a cache line. An access of
  /// more than 32 chunks (about 2 MiB, beyond a default command's 512 KiB) instead locks
  /// the whole store; see `detail::range_lock` (emu/range_lock.cuh) for why.
  template <class F>
    requires std::invocable<F&, const std::byte*>
  void with_read_access(std::uint64_t offset, std::uint64_t len, F&& f) const {
    check_range(offset, len, "read");
    range_lock<lock_mode::shared> lock(locks_.get(), offset, len);
    f(static_cast<const std::byte*>(data_ + offset));
  }

  /// As `with_read_access`, calling `f(std::byte* p)` while no other access can touch the
  /// range. Throws std::logic_error on a read-only store and std::out_of_range outside
  /// `file_bytes()`.
  template <class F>
    requires std::invocable<F&, std::byte*>
  void with_write_access(std::uint64_t offset, std::uint64_t len, F&& f) {
    check_writable("write");
    check_write_range(offset, len, "write");
    range_lock<lock_mode::exclusive> lock(locks_.get(), offset, len);
    f(data_ + offset);
  }

  /// As `with_read_access` over two ranges under one lock, calling `f(p, p2)` (`p2` at
  /// `offset2`): a command's data and its separate metadata, which a writer must change
  /// together as seen by readers (no read returns one write's data with another's metadata).
  template <class F>
    requires std::invocable<F&, const std::byte*, const std::byte*>
  void with_read_access(std::uint64_t offset, std::uint64_t len, std::uint64_t offset2, std::uint64_t len2, F&& f) const {
    check_range(offset, len, "read");
    check_range(offset2, len2, "read");
    range_lock<lock_mode::shared> lock(locks_.get(), offset, len, offset2, len2);
    f(static_cast<const std::byte*>(data_ + offset), static_cast<const std::byte*>(data_ + offset2));
  }

  /// As `with_write_access` over two ranges under one lock (see the two-range `with_read_access`).
  template <class F>
    requires std::invocable<F&, std::byte*, std::byte*>
  void with_write_access(std::uint64_t offset, std::uint64_t len, std::uint64_t offset2, std::uint64_t len2, F&& f) {
    check_writable("write");
    check_write_range(offset, len, "write");
    check_write_range(offset2, len2, "write");
    range_lock<lock_mode::exclusive> lock(locks_.get(), offset, len, offset2, len2);
    f(data_ + offset, data_ + offset2);
  }

 private:
  using lock_table = detail::lock_table;
  using lock_mode = detail::lock_mode;
  using try_only_t = detail::try_only_t;
  template <lock_mode Mode>
  using range_lock = detail::range_lock<Mode>;
  static constexpr std::uint64_t chunk_bytes = detail::chunk_bytes;
  static constexpr std::uint64_t max_striped_chunks = detail::max_striped_chunks;

 public:
  /// A shared lock on a range that outlives the call that took it (`try_hold_for_read`):
  /// the emulator keeps one while copies out of the range into GPU memory are in flight.
  class read_hold {
   public:
    read_hold() = default;
    /// The store's bytes at the held range's start.
    [[nodiscard]] const std::byte* data() const noexcept { return data_; }
    /// The store's bytes at the second range's start (`try_hold_for_read` of two ranges).
    [[nodiscard]] const std::byte* data2() const noexcept { return data2_; }
    /// Mutexes it holds (ThreadSanitizer allows a thread 64 at once).
    [[nodiscard]] std::size_t locks_held() const noexcept { return lock_ ? lock_->locks_held() : 0; }

   private:
    friend class backing_store;
    std::unique_ptr<range_lock<lock_mode::shared>> lock_;
    const std::byte* data_ = nullptr;
    const std::byte* data2_ = nullptr;
  };

  /// Holds [offset, offset + len) against writers until the returned hold is destroyed, if
  /// that needs no waiting (see `range_lock`'s try form); std::nullopt otherwise. A caller that
  /// keeps holds must not wait for any other access while it does (that could deadlock with a
  /// writer waiting for its range): it tries, and lets its holds go before waiting. Throws
  /// std::out_of_range outside the store.
  [[nodiscard]] std::optional<read_hold> try_hold_for_read(std::uint64_t offset, std::uint64_t len) const {
    check_range(offset, len, "read");
    auto lock = std::make_unique<range_lock<lock_mode::shared>>(locks_.get(), offset, len, try_only_t{});
    if (!lock->owns()) return std::nullopt;
    read_hold hold;
    hold.lock_ = std::move(lock);
    hold.data_ = data_ + offset;
    return hold;
  }

  /// As above, holding two ranges under one lock (a command's data and separate metadata).
  [[nodiscard]] std::optional<read_hold> try_hold_for_read(std::uint64_t offset, std::uint64_t len, std::uint64_t offset2,
                                                          std::uint64_t len2) const {
    check_range(offset, len, "read");
    check_range(offset2, len2, "read");
    auto lock = std::make_unique<range_lock<lock_mode::shared>>(locks_.get(), offset, len, offset2, len2, try_only_t{});
    if (!lock->owns()) return std::nullopt;
    read_hold hold;
    hold.lock_ = std::move(lock);
    hold.data_ = data_ + offset;
    hold.data2_ = data_ + offset2;
    return hold;
  }

 private:
  backing_store(std::byte* data, std::uint64_t size, std::uint64_t file_bytes, int fd, std::string path, bool read_only)
      : data_(data),
        size_(size),
        file_bytes_(file_bytes),
        fd_(fd),
        page_bytes_(::sysconf(_SC_PAGESIZE) > 0 ? static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)) : 4096),
        read_only_(read_only),
        path_(std::move(path)),
        locks_(std::make_unique<lock_table>()) {}

  /// Throws the failure of the system call that just set errno, with "backing_store: " and
  /// `parts` (text and numbers) as its message. The parts are references to finished values
  /// and errno is read before the message is built: allocating it could change errno.
  template <class... Parts>
  [[noreturn]] static void os_error(const Parts&... parts) {
    const int error = errno;
    std::string what = "backing_store: ";
    (append(what, parts), ...);
    throw std::system_error(error, std::generic_category(), what);
  }
  static void append(std::string& text, std::string_view part) { text += part; }
  static void append(std::string& text, std::uint64_t number) { text += std::to_string(number); }

  /// "the store's 4096 bytes" or "'model.bin' (4096 bytes)", for messages.
  [[nodiscard]] std::string describe() const {
    return path_.empty() ? "the store's " + std::to_string(size_) + " bytes"
                         : "'" + path_ + "' (" + std::to_string(size_) + " bytes)";
  }

  void check_range(std::uint64_t offset, std::uint64_t len, const char* operation) const {
    // Written so that offset + len cannot overflow.
    if (offset > size_ || len > size_ - offset) {
      throw std::out_of_range(std::string("backing_store: ") + operation + " of " + std::to_string(len) +
                              " bytes at offset " + std::to_string(offset) + " is outside " + describe());
    }
  }

  /// As `check_range`, and the range must lie in `file_bytes()`.
  void check_write_range(std::uint64_t offset, std::uint64_t len, const char* operation) const {
    check_range(offset, len, operation);
    if (offset > file_bytes_ || len > file_bytes_ - offset) {
      throw std::out_of_range(std::string("backing_store: ") + operation + " of " + std::to_string(len) + " bytes at offset " +
                              std::to_string(offset) + " reaches past the end of " + describe() + ", which holds " +
                              std::to_string(file_bytes_) + " (the rest reads as zeros and cannot be written)");
    }
  }

  void check_writable(const char* operation) const {
    if (read_only_) throw std::logic_error(std::string("backing_store: ") + operation + " to read-only " + describe());
  }

  /// Calls `op(at, n)` for consecutive pieces of [offset, offset + len) that each span at
  /// most 32 chunks. read, write and zero need no single pointer to the whole range, so a
  /// long one goes piece by piece instead of stopping every other access while it runs.
  template <class Op>
  static void for_each_piece(std::uint64_t offset, std::uint64_t len, Op op) {
    const std::uint64_t end = offset + len;
    while (offset < end) {
      const std::uint64_t piece_end = std::min(end, (offset / chunk_bytes + max_striped_chunks) * chunk_bytes);
      op(offset, piece_end - offset);
      offset = piece_end;
    }
  }

  /// Zeroes [offset, offset + len); the caller holds it exclusively.
  void clear(std::uint64_t offset, std::uint64_t len, bool pages_stay) {
    // `data_` is page aligned (mmap of file offset 0), so store offsets align as addresses do.
    const std::uint64_t end = offset + len;
    const std::uint64_t pages_begin = (offset + page_bytes_ - 1) / page_bytes_ * page_bytes_;
    const std::uint64_t pages_end = end / page_bytes_ * page_bytes_;
    if (pages_begin >= pages_end) {
      std::memset(data_ + offset, 0, len);
      return;
    }
    std::memset(data_ + offset, 0, pages_begin - offset);
    std::memset(data_ + pages_end, 0, end - pages_end);
    if (pages_stay || !release_pages(pages_begin, pages_end - pages_begin)) {
      std::memset(data_ + pages_begin, 0, pages_end - pages_begin);
    }
  }

  /// Hands whole pages back so they read as zeros; false where the system cannot (a file
  /// system without hole punching), and the caller writes zeros instead.
  [[nodiscard]] bool release_pages(std::uint64_t offset, std::uint64_t len) noexcept {
    if (fd_ >= 0) {
      // Punching a hole also drops the pages from every mapping of the file, ours included.
      return ::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                         static_cast<off_t>(len)) == 0;
    }
    // Private anonymous pages read as zero-filled after MADV_DONTNEED.
    return ::madvise(data_ + offset, len, MADV_DONTNEED) == 0;
  }

  void release() noexcept {
    if (data_ != nullptr) ::munmap(data_, size_);
    if (fd_ >= 0) ::close(fd_);
    data_ = nullptr;
    fd_ = -1;
  }

  std::byte* data_ = nullptr;
  std::uint64_t size_ = 0;
  std::uint64_t file_bytes_ = 0;  // <= size_: see file_bytes()
  int fd_ = -1;
  std::uint64_t page_bytes_ = 4096;
  bool read_only_ = false;
  std::string path_;
  std::unique_ptr<lock_table> locks_;
};

}  // namespace emu
CUNVME_NAMESPACE_END
