// Bring-up options of a `host::controller`, each checked against its range before the
// device is touched, and the bounded wait every bring-up step uses.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/spec/registers.cuh>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

CUNVME_NAMESPACE_BEGIN
namespace host {

using namespace std::chrono_literals;

/// Bring-up options; `controller` checks each against its range (`check`) before it touches
/// the device.
struct controller_options {
  std::uint32_t admin_queue_entries = 32;   ///< 2..4096 (and at most CAP.MQES + 1)
  std::uint16_t io_queue_pairs = 16;        ///< 1..65535, asked for with Set Features – Number of Queues
  bool shadow_doorbells = false;            ///< send Doorbell Buffer Config when OACS bit 8 says it is supported
  bool use_cmb = false;                     ///< map the controller memory buffer when CAP.CMBS says there is one
  std::chrono::milliseconds ready_timeout{0};     ///< 0: CAP.TO; else 1 ms..max_timeout
  std::chrono::milliseconds command_timeout{10'000};  ///< 1 ms..max_timeout
  /// Admin commands' own bound, as Linux keeps admin_timeout apart from io_timeout: a short I/O
  /// timeout need not make queue creation fail on a busy host. 0: `command_timeout`.
  std::chrono::milliseconds admin_timeout{0};  ///< 0 or 1 ms..max_timeout
  /// A host command (`queue_pair` I/O) that times out is aborted (Abort, 5.1) and its aborted
  /// completion waited for (bounded by its queue's timeout), so its buffer is the caller's again
  /// and its CID free; where the controller does not abort it, the controller is stopped
  /// (CC.EN = 0: no more DMA into that buffer) until `controller::reset()`. Off: the command is
  /// only abandoned, holding its CID until a late completion, and may still write its buffer.
  bool abort_on_timeout = true;

  /// The longest timeout taken: a deadline `now() + timeout` must not overflow the clock.
  static constexpr std::chrono::milliseconds max_timeout = std::chrono::hours(24);

  /// The bound of an admin command's wait.
  [[nodiscard]] std::chrono::milliseconds admin_command_timeout() const noexcept {
    return admin_timeout.count() != 0 ? admin_timeout : command_timeout;
  }

  /// Throws `host::error` naming the first option outside its range and its value.
  void check(const std::string& device) const {
    const auto bad = [&](const std::string& what, const std::string& range) {
      throw error("Check controller options", device, what + " is outside " + range);
    };
    if (admin_queue_entries < spec::min_admin_queue_entries || admin_queue_entries > spec::max_admin_queue_entries) {
      bad("admin_queue_entries = " + std::to_string(admin_queue_entries),
          std::to_string(spec::min_admin_queue_entries) + ".." + std::to_string(spec::max_admin_queue_entries));
    }
    // NSQR/NCQR are 0's based and FFFFh is reserved (Set Features – Number of Queues): 0 pairs
    // would be sent as FFFFh.
    if (io_queue_pairs == 0) bad("io_queue_pairs = 0", "1..65535");
    const auto max = std::to_string(max_timeout.count());
    if (ready_timeout.count() < 0 || ready_timeout > max_timeout) {
      bad("ready_timeout = " + std::to_string(ready_timeout.count()) + " ms", "0 (CAP.TO) or 1.." + max + " ms");
    }
    if (command_timeout.count() <= 0 || command_timeout > max_timeout) {
      bad("command_timeout = " + std::to_string(command_timeout.count()) + " ms", "1.." + max + " ms");
    }
    if (admin_timeout.count() < 0 || admin_timeout > max_timeout) {
      bad("admin_timeout = " + std::to_string(admin_timeout.count()) + " ms", "0 (command_timeout) or 1.." + max + " ms");
    }
  }
};

/// Polls a condition until it holds or `timeout` passes.
template <class Condition>
[[nodiscard]] bool wait_until(Condition done, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (unsigned spins = 0; !done(); ++spins) {
    if (std::chrono::steady_clock::now() >= until) return done();
    if (spins > 1000) std::this_thread::sleep_for(20us);
  }
  return true;
}


}  // namespace host
CUNVME_NAMESPACE_END
