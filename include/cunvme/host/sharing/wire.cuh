// The messages between the owner of a shared controller's admin queue and the processes attached
// to it, over a Unix SOCK_SEQPACKET socket: one request, one reply, a file descriptor riding
// along where memory changes hands (SCM_RIGHTS). The socket is also how the owner learns that a
// process is gone: its end closes when the process exits or is killed, whatever the cause.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/spec/queue_entry.cuh>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

CUNVME_NAMESPACE_BEGIN
namespace host::sharing {

/// Bumped whenever a message changes: an owner refuses a process speaking another version.
inline constexpr std::uint32_t wire_version = 1;

enum class request_kind : std::uint32_t {
  hello = 1,         ///< version in `a`; reply: BAR0's size in `a`; in `b` granted pairs (bits 0-15), page shift (16-23),
                     ///< BAR0 is MMIO (24), memory must be 2 MiB huge pages (25), the owner's pid (32-63); BAR0's file
                     ///< (at offset `c`)
  map_memory = 2,    ///< with a memory file: `a` bytes, bus alignment `b`; reply: the bus address in `a`, or (not one bus
                     ///< range) a file of `b` page addresses of `c` bytes each
  unmap_memory = 3,  ///< the region at bus address `a` leaves the controller's reach
  take_queue_id = 4,     ///< reply: the identifier in `a`
  release_queue_id = 5,  ///< identifier `a`, its queues deleted
  admin = 6,         ///< `sqe`; reply: the completion in `cqe`
  map_gpu = 7,       ///< GPU memory exported in `handle` (`a` bytes at offset `b` into it); reply: bus address in `a`
};

struct request {
  request_kind kind{};
  std::uint32_t reserved = 0;
  std::uint64_t a = 0, b = 0;
  spec::submission_entry sqe{};
  std::byte handle[64]{};  ///< a GPU memory export (cudaIpcMemHandle_t)
};

struct reply {
  std::int32_t failed = 0;  ///< 0: done; else `text` says why
  std::uint32_t reserved = 0;
  std::uint64_t a = 0, b = 0, c = 0;
  spec::completion_entry cqe{};
  char text[400]{};

  [[nodiscard]] static reply refusal(std::string_view why) {
    reply r;
    r.failed = 1;
    const std::size_t n = std::min(why.size(), sizeof r.text - 1);
    std::memcpy(r.text, why.data(), n);
    return r;
  }
};

/// Sends `message` (and `fd`, where >= 0). False when the peer is gone.
template <class Message>
[[nodiscard]] inline bool send_message(int socket, const Message& message, int fd = -1) noexcept {
  iovec io{const_cast<Message*>(&message), sizeof message};
  msghdr m{};
  m.msg_iov = &io;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))]{};
  if (fd >= 0) {
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  for (;;) {
    const ssize_t n = ::sendmsg(socket, &m, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(sizeof message)) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

enum class receive_status { message, closed, timed_out, malformed };

/// Receives one `Message` (and the descriptor riding with it into `fd`, else -1). A message of
/// another size, or one with more than one descriptor, is `malformed` (its descriptors closed).
template <class Message>
[[nodiscard]] inline receive_status receive_message(int socket, Message& message, int& fd) noexcept {
  fd = -1;
  iovec io{&message, sizeof message};
  msghdr m{};
  m.msg_iov = &io;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)]{};
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  ssize_t n = 0;
  for (;;) {
    n = ::recvmsg(socket, &m, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return receive_status::timed_out;
  if (n < 0) return receive_status::closed;
  // Descriptors are taken (and those beyond the first closed) before anything else is looked
  // at: an empty message may carry some too, which would otherwise stay open here.
  int received = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int one = -1;
      std::memcpy(&one, CMSG_DATA(c) + i * sizeof(int), sizeof one);
      if (received++ == 0) {
        fd = one;
      } else {
        ::close(one);
      }
    }
  }
  if (n == 0 && received == 0) return receive_status::closed;
  if (n != static_cast<ssize_t>(sizeof message) || received > 1 || (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
    if (fd >= 0) ::close(fd);
    fd = -1;
    return receive_status::malformed;
  }
  return receive_status::message;
}

/// A Unix socket address for `path`; throws where the path does not fit.
[[nodiscard]] inline sockaddr_un socket_address(const std::string& path, const std::string& operation) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof address.sun_path) {
    throw error(operation, path, "a socket path is 1.." + std::to_string(sizeof address.sun_path - 1) + " bytes long");
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  return address;
}

}  // namespace host::sharing
CUNVME_NAMESPACE_END
