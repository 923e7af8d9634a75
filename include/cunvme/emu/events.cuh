// The emulated controller's Error Information log and Asynchronous Event Requests (NVMe 2.0
// base specification 5.2 Asynchronous Event Request, 5.16.1.2 Error Information): the state
// and its locks. Completing an AER is the queues' job (emu/queues.cuh): these classes say
// which AER to complete and with what, and never post anything themselves.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/spec/command_fields.cuh>
#include <cunvme/spec/log_page.cuh>
#include <cunvme/spec/status.cuh>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace emu::detail {

/// Asynchronous Event Information for the Error status type (Figure 146).
enum class async_error_info : std::uint8_t {
  invalid_doorbell_register = 0x00,
  invalid_doorbell_write_value = 0x01,
};

/// A bad doorbell write, noted where it is found and reported later by the admin thread.
struct doorbell_fault {
  std::uint16_t qid;
  std::uint32_t value;
  async_error_info info;
};

/// Doorbell errors are found while queue and CQ locks are held (even CQ 0's, whose AER
/// completion they may cause), so they are only noted here; the admin thread logs and
/// reports them with no lock held (`queues::report_doorbell_errors`).
class doorbell_fault_inbox {
 public:
  void note(const doorbell_fault& f) {
    std::scoped_lock lock(mutex_);
    if (faults_.size() < 1024) faults_.push_back(f);
  }
  [[nodiscard]] std::vector<doorbell_fault> take() {
    std::vector<doorbell_fault> faults;
    {
      std::scoped_lock lock(mutex_);
      faults.swap(faults_);
    }
    return faults;
  }

 private:
  std::mutex mutex_;
  std::vector<doorbell_fault> faults_;
};

/// The Error Information log page (Log Identifier 01h): the newest `capacity` entries, newest
/// first, each numbered by the count of errors ever logged.
class error_log {
 public:
  explicit error_log(std::uint32_t capacity) noexcept : capacity_(capacity) {}

  /// An error a command completed with, for the command's SQ and CID.
  void log_command(std::uint16_t sqid, std::uint16_t cid, spec::status status, std::uint64_t lba, std::uint32_t nsid) {
    spec::error_information_log_entry entry{};
    entry.sqid = sqid;
    entry.cid = cid;
    entry.status_field = spec::cqe_status::make_status_field(status, false, true);
    entry.parameter_error_location = 0xffff;
    entry.lba = lba;
    entry.nsid = nsid;
    append(entry);
  }

  /// A bad doorbell write: no command to name (CID FFFFh), the value written as command
  /// specific information.
  void log_doorbell(const doorbell_fault& f) {
    spec::error_information_log_entry entry{};
    entry.sqid = f.qid;
    entry.cid = 0xffff;
    entry.parameter_error_location = 0xffff;
    entry.command_specific_information = f.value;
    append(entry);
  }

  void append(spec::error_information_log_entry entry) {
    std::scoped_lock lock(mutex_);
    entry.error_count = count_.fetch_add(1, std::memory_order_relaxed) + 1;
    entries_.push_front(entry);
    if (entries_.size() > capacity_) entries_.pop_back();
  }

  /// The log page as Get Log Page returns it: `capacity` entries, unused ones zero.
  void copy_page(std::vector<std::byte>& page) const {
    std::scoped_lock lock(mutex_);
    page.resize(std::size_t{capacity_} * sizeof(spec::error_information_log_entry));
    std::size_t i = 0;
    for (const auto& entry : entries_) std::memcpy(page.data() + sizeof entry * i++, &entry, sizeof entry);
  }

  /// Errors logged since the controller was made (SMART's Number of Error Information Log Entries).
  [[nodiscard]] std::uint64_t count() const noexcept { return count_.load(std::memory_order_relaxed); }

 private:
  mutable std::mutex mutex_;
  std::deque<spec::error_information_log_entry> entries_;
  std::atomic<std::uint64_t> count_{0};
  std::uint32_t capacity_;
};

/// Outstanding Asynchronous Event Requests and the events waiting for one.
class async_events {
 public:
  /// DW0 of an AER completion for an error event: event type 000b (error status), the
  /// information, log page 01h.
  [[nodiscard]] static constexpr std::uint32_t error_event_dw0(async_error_info info) noexcept {
    using fields = spec::async_event_fields;
    std::uint32_t dw0 = fields::aet::set(0, spec::async_event_type::error_status);
    dw0 = fields::aei::set(dw0, static_cast<std::uint8_t>(info));
    return fields::lid::set(dw0, spec::log_page_id::error_information);
  }

  /// An event happened: the CID of the AER to complete with `dw0` now, if one is outstanding
  /// and error events are not masked; otherwise it waits (up to 16 events) or is dropped.
  [[nodiscard]] std::optional<std::uint16_t> raise(std::uint32_t dw0) {
    std::scoped_lock lock(mutex_);
    // An error event stays masked until the host reads the Error Information log (5.2).
    if (masked_) return std::nullopt;
    if (outstanding_.empty()) {
      if (pending_.size() < 16) pending_.push_back(dw0);
      return std::nullopt;
    }
    const std::uint16_t cid = outstanding_.front();
    outstanding_.pop_front();
    masked_ = true;
    return cid;
  }

  enum class request_result { limit_exceeded, completed, deferred };

  /// An Asynchronous Event Request with `cid`: completed at once (`dw0` set) when an event
  /// is waiting, else outstanding until one is raised.
  [[nodiscard]] request_result request(std::uint16_t cid, std::uint32_t limit, std::uint32_t& dw0) {
    std::scoped_lock lock(mutex_);
    if (outstanding_.size() > limit) return request_result::limit_exceeded;
    if (!pending_.empty() && !masked_) {
      dw0 = pending_.front();
      pending_.pop_front();
      masked_ = true;
      return request_result::completed;
    }
    outstanding_.push_back(cid);
    return request_result::deferred;
  }

  /// Reading the Error Information log re-arms error events (5.2).
  void rearm() {
    std::scoped_lock lock(mutex_);
    masked_ = false;
  }

  /// A controller reset: outstanding requests and waiting events are gone.
  void reset() {
    std::scoped_lock lock(mutex_);
    outstanding_.clear();
    pending_.clear();
    masked_ = false;
  }

 private:
  std::mutex mutex_;
  std::deque<std::uint16_t> outstanding_;
  std::deque<std::uint32_t> pending_;
  bool masked_ = false;
};

}  // namespace emu::detail
CUNVME_NAMESPACE_END
