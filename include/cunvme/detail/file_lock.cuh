// One owner of a device or file at a time, across processes: an flock on a file the owner
// keeps open, which the kernel drops when the descriptor closes — on close and on process
// death alike. Host code (POSIX), for the backends that own a controller (sysfs: its
// resource0) and the emulator's file-backed namespaces.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/file_descriptor.cuh>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <string>

#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

CUNVME_NAMESPACE_BEGIN
namespace detail {

/// Who holds an flock on the file `st` describes, as /proc/locks tells: "process PID (COMM)",
/// or empty where no line names it (no /proc, another PID namespace).
[[nodiscard]] inline std::string flock_holder(const struct stat& st) {
  std::ifstream locks("/proc/locks");
  std::ostringstream wanted;
  wanted << std::hex;
  wanted.width(2);
  wanted.fill('0');
  wanted << major(st.st_dev) << ':';
  wanted.width(2);
  wanted << minor(st.st_dev) << ':' << std::dec << st.st_ino;
  std::string line;
  while (std::getline(locks, line)) {
    // "1: FLOCK  ADVISORY  WRITE 1234 00:14:5678 0 EOF"; a waiter's line has "->" after the number.
    std::istringstream fields(line);
    std::string number, kind, mode, access, pid, file;
    fields >> number >> kind;
    if (kind == "->") fields >> kind;
    if (!(fields >> mode >> access >> pid >> file) || kind != "FLOCK" || file != wanted.str()) continue;
    std::ifstream comm("/proc/" + pid + "/comm");
    std::string name;
    std::getline(comm, name);
    return "process " + pid + (name.empty() ? "" : " (" + name + ")");
  }
  return {};
}

/// What `try_lock_file` found.
enum class lock_outcome { taken, held_elsewhere, failed };

/// Takes an flock on `fd` without waiting: exclusive for an owner that writes, shared for one
/// that only reads (readers may share, never with a writer). Where another descriptor — in
/// this process or another — holds a conflicting lock, says so and names the holder in
/// `holder` when /proc/locks does; `failed` (errno set) for any other refusal.
[[nodiscard]] inline lock_outcome try_lock_file(int fd, bool exclusive, std::string& holder) {
  if (::flock(fd, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) == 0) return lock_outcome::taken;
  if (errno != EWOULDBLOCK) return lock_outcome::failed;
  struct stat st {};
  holder = ::fstat(fd, &st) == 0 ? flock_holder(st) : std::string{};
  return lock_outcome::held_elsewhere;
}

/// An flock held for an owner's lifetime on a descriptor of its own: released when it goes
/// (and on process death). Move-only.
class file_claim {
 public:
  file_claim() = default;
  /// Adopts `fd`, on which `try_lock_file` took the lock.
  explicit file_claim(int fd) noexcept : fd_(fd) {}

  [[nodiscard]] int fd() const noexcept { return fd_.get(); }

 private:
  file_descriptor fd_;  // closing it releases the lock
};

}  // namespace detail
CUNVME_NAMESPACE_END
