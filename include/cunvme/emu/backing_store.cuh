// The bytes of one emulated namespace: anonymous memory, or a user's file mapped into memory
// (so a model or a dataset on disk can be read from the GPU through the emulator).
#pragma once

#include <cunvme/config.cuh>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

CUNVME_NAMESPACE_BEGIN
namespace emu {

/// A namespace's storage.
///
/// Several worker threads may touch the same blocks at once (NVMe lets commands on different
/// queues overlap; the result is undefined, but it must not be a data race), so accesses take
/// striped reader/writer locks: the store is cut into 64 KiB chunks, chunk i is guarded by
/// stripe i % 256, and an access locks its distinct stripes in ascending order, after the
/// store-wide lock in shared mode. An access of more than 16 chunks (1 MiB; larger than any
/// one command moves) takes the store-wide lock alone, exclusively, so no thread ever holds
/// more than 17 locks.
///
/// ```
/// auto ram  = emu::backing_store::in_memory(1ull << 30);
/// auto disk = emu::backing_store::from_file("model.bin");      // its size
/// disk.read(4096, buffer, 512);
/// ```
class backing_store {
 public:
  /// `bytes` of zeroed memory, reserved lazily (MAP_NORESERVE), so large sparse namespaces
  /// cost only what is written.
  [[nodiscard]] static backing_store in_memory(std::uint64_t bytes) {
    if (bytes == 0) throw std::invalid_argument("backing_store::in_memory: size 0");
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::system_error(errno, std::generic_category(), "backing_store: mapping " + std::to_string(bytes) + " bytes");
    return backing_store(static_cast<std::byte*>(p), bytes, -1, "", false);
  }

  /// The file at `path`, mapped shared so writes reach it. `bytes == 0`: the file's size;
  /// larger than the file: the file is extended (not when `read_only`); a missing file is
  /// created only when `bytes` is given.
  [[nodiscard]] static backing_store from_file(const std::string& path, std::uint64_t bytes = 0, bool read_only = false) {
    const int flags = read_only ? O_RDONLY : (bytes > 0 ? O_RDWR | O_CREAT : O_RDWR);
    const int fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
    if (fd < 0) throw std::system_error(errno, std::generic_category(), "backing_store: open '" + path + "'");
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      throw std::system_error(e, std::generic_category(), "backing_store: stat '" + path + "'");
    }
    const auto file_size = static_cast<std::uint64_t>(st.st_size);
    const std::uint64_t size = bytes == 0 ? file_size : bytes;
    if (size == 0) {
      ::close(fd);
      throw std::invalid_argument("backing_store: '" + path + "' is empty");
    }
    if (size > file_size) {
      if (read_only) {
        ::close(fd);
        throw std::invalid_argument("backing_store: '" + path + "' has " + std::to_string(file_size) + " bytes, " +
                                    std::to_string(size) + " asked for, and it is read-only");
      }
      if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
        const int e = errno;
        ::close(fd);
        throw std::system_error(e, std::generic_category(), "backing_store: extending '" + path + "'");
      }
    }
    void* p = ::mmap(nullptr, size, read_only ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      throw std::system_error(e, std::generic_category(), "backing_store: mapping '" + path + "'");
    }
    return backing_store(static_cast<std::byte*>(p), size, fd, path, read_only);
  }

  backing_store(backing_store&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        fd_(std::exchange(other.fd_, -1)),
        path_(std::move(other.path_)),
        read_only_(other.read_only_),
        stripes_(std::move(other.stripes_)) {}
  backing_store& operator=(backing_store&& other) noexcept {
    if (this != &other) {
      unmap();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      fd_ = std::exchange(other.fd_, -1);
      path_ = std::move(other.path_);
      read_only_ = other.read_only_;
      stripes_ = std::move(other.stripes_);
    }
    return *this;
  }
  backing_store(const backing_store&) = delete;
  backing_store& operator=(const backing_store&) = delete;
  ~backing_store() { unmap(); }

  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }
  [[nodiscard]] bool read_only() const noexcept { return read_only_; }
  [[nodiscard]] bool file_backed() const noexcept { return fd_ >= 0; }

  void read(std::uint64_t offset, void* dst, std::uint64_t len) const {
    with_read_access(offset, len, [&](const std::byte* p) { std::memcpy(dst, p, len); });
  }
  void write(std::uint64_t offset, const void* src, std::uint64_t len) {
    with_write_access(offset, len, [&](std::byte* p) { std::memcpy(p, src, len); });
  }

  /// Afterwards the range reads as zeros (Write Zeroes, deallocation).
  void zero(std::uint64_t offset, std::uint64_t len) {
    with_write_access(offset, len, [&](std::byte* p) {
      // Whole pages go back to the system (a hole in a file, fresh zero pages in RAM);
      // the partial pages at either end are cleared by hand.
      const std::uint64_t page = 4096;
      const std::uint64_t first = std::min(offset + len, (offset + page - 1) / page * page);
      const std::uint64_t last = std::max(first, (offset + len) / page * page);
      std::memset(p, 0, first - offset);
      std::memset(p + (last - offset), 0, offset + len - last);
      if (last > first && !release_pages(first, last - first)) std::memset(p + (first - offset), 0, last - first);
    });
  }

  /// Makes written data durable: msync for files, nothing for RAM.
  void flush() {
    if (fd_ < 0 || read_only_) return;
    if (::msync(data_, size_, MS_SYNC) != 0) {
      throw std::system_error(errno, std::generic_category(), "backing_store: msync '" + path_ + "'");
    }
  }

  /// Calls `f(const std::byte*)` with the range's bytes, under shared locks.
  template <class F>
  void with_read_access(std::uint64_t offset, std::uint64_t len, F&& f) const {
    check(offset, len, "read");
    stripe_lock<true> lock(*stripes_, offset, len);
    f(static_cast<const std::byte*>(data_ + offset));
  }

  /// Calls `f(std::byte*)` with the range's bytes, under exclusive locks.
  template <class F>
  void with_write_access(std::uint64_t offset, std::uint64_t len, F&& f) {
    check(offset, len, "write");
    if (read_only_) throw std::logic_error("backing_store: '" + path_ + "' is read-only");
    stripe_lock<false> lock(*stripes_, offset, len);
    f(data_ + offset);
  }

 private:
  static constexpr std::uint64_t chunk_bytes = 64 * 1024;
  static constexpr std::size_t stripe_count = 256;
  static constexpr std::uint64_t max_striped_chunks = 16;
  struct locks {
    std::shared_mutex whole;
    std::array<std::shared_mutex, stripe_count> stripes;
  };

  /// Locks the distinct stripes of [offset, offset + len) in ascending order.
  template <bool Shared>
  class stripe_lock {
   public:
    stripe_lock(locks& l, std::uint64_t offset, std::uint64_t len) : locks_(l) {
      const std::uint64_t first = offset / chunk_bytes;
      const std::uint64_t last = len == 0 ? first : (offset + len - 1) / chunk_bytes;
      if (last - first + 1 > max_striped_chunks) {
        whole_only_ = true;
        locks_.whole.lock();
        return;
      }
      locks_.whole.lock_shared();
      first_ = static_cast<std::size_t>(first % stripe_count);
      count_ = static_cast<std::size_t>(last - first + 1);
      // Stripes are taken in ascending index order; a range that wraps past the last
      // stripe takes the low indices first.
      for_each([](std::shared_mutex& m) { Shared ? m.lock_shared() : m.lock(); });
    }
    ~stripe_lock() {
      if (whole_only_) {
        locks_.whole.unlock();
        return;
      }
      for_each([](std::shared_mutex& m) { Shared ? m.unlock_shared() : m.unlock(); });
      locks_.whole.unlock_shared();
    }
    stripe_lock(const stripe_lock&) = delete;
    stripe_lock& operator=(const stripe_lock&) = delete;

   private:
    template <class Op>
    void for_each(Op op) {
      const std::size_t end = first_ + count_;
      if (end > stripe_count) {
        for (std::size_t i = 0; i < end - stripe_count; ++i) op(locks_.stripes[i]);
        for (std::size_t i = first_; i < stripe_count; ++i) op(locks_.stripes[i]);
      } else {
        for (std::size_t i = first_; i < end; ++i) op(locks_.stripes[i]);
      }
    }
    locks& locks_;
    bool whole_only_ = false;
    std::size_t first_ = 0;
    std::size_t count_ = 0;
  };

  backing_store(std::byte* data, std::uint64_t size, int fd, std::string path, bool read_only)
      : data_(data), size_(size), fd_(fd), path_(std::move(path)), read_only_(read_only), stripes_(std::make_unique<locks>()) {}

  void check(std::uint64_t offset, std::uint64_t len, const char* what) const {
    if (offset > size_ || len > size_ - offset) {
      throw std::out_of_range(std::string("backing_store: ") + what + " of " + std::to_string(len) + " bytes at " +
                              std::to_string(offset) + " is outside the store's " + std::to_string(size_) + " bytes");
    }
  }

  [[nodiscard]] bool release_pages(std::uint64_t offset, std::uint64_t len) {
    if (fd_ >= 0) {
      return ::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset), static_cast<off_t>(len)) == 0;
    }
    return ::madvise(data_ + offset, len, MADV_DONTNEED) == 0;
  }

  void unmap() noexcept {
    if (data_ != nullptr) ::munmap(data_, size_);
    if (fd_ >= 0) ::close(fd_);
    data_ = nullptr;
    fd_ = -1;
  }

  std::byte* data_ = nullptr;
  std::uint64_t size_ = 0;
  int fd_ = -1;
  std::string path_;
  bool read_only_ = false;
  std::unique_ptr<locks> stripes_;
};

}  // namespace emu
CUNVME_NAMESPACE_END
