// The one error type of the host side: what was being done, on which device, and why — an
// NVMe status by its spec name, an OS error, or a plain reason.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/spec/status.cuh>

#include <cerrno>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// A failed host operation, e.g.
/// "Create I/O SQ 3 on 0000:01:00.0: Invalid Queue Size (1/0x02)".
///
/// Usage: examples/snippets/host.cpp, `refused_queue_size`.
class error : public std::runtime_error {
 public:
  /// The controller completed the command with a non-success status.
  error(std::string operation, std::string device, spec::status status)
      : std::runtime_error(operation + " on " + device + ": " + spec::to_string(status)),
        operation_(std::move(operation)), device_(std::move(device)), status_(status) {}

  /// The OS refused; `hint` says what is needed (permissions, a module, huge pages).
  error(std::string operation, std::string device, std::error_code os_error, const std::string& hint = {})
      : std::runtime_error(operation + " on " + device + ": " + os_error.message() + " (errno " + std::to_string(os_error.value()) +
                           ")" + (hint.empty() ? "" : "; " + hint)),
        operation_(std::move(operation)), device_(std::move(device)), os_error_(os_error) {}

  /// Anything else: a timeout, a fatal controller status, an unsupported request.
  error(std::string operation, std::string device, const std::string& reason)
      : std::runtime_error(operation + " on " + device + ": " + reason), operation_(std::move(operation)), device_(std::move(device)) {}

  [[nodiscard]] const std::string& operation() const noexcept { return operation_; }
  [[nodiscard]] const std::string& device() const noexcept { return device_; }
  [[nodiscard]] std::optional<spec::status> status() const noexcept { return status_; }
  [[nodiscard]] std::error_code os_error() const noexcept { return os_error_; }

 private:
  std::string operation_;
  std::string device_;
  std::optional<spec::status> status_;
  std::error_code os_error_;
};

/// An error carrying `errno` as it is now.
[[nodiscard]] inline error os_error(std::string operation, std::string device, const std::string& hint = {}) {
  return error(std::move(operation), std::move(device), std::error_code(errno, std::generic_category()), hint);
}

}  // namespace host
CUNVME_NAMESPACE_END
