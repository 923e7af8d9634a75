// What a device-side read, write or flush returns: success, the NVMe status of the command
// that failed and the LBA range it covered, or why no command could be completed.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/spec/status.cuh>

#include <cuda/std/cstdint>

#include <string>

CUNVME_NAMESPACE_BEGIN

enum class io_error : cuda::std::uint8_t {
  none = 0,                 ///< every command completed successfully
  nvme_status,              ///< a command completed with an error status: see `status`; also a range past the
                            ///< namespace's end, refused before any command with the status the controller gives it
                            ///< (LBA Out of Range) for the command that crosses the end
  timeout,                  ///< no completion within the queue's timeout; the command is abandoned (its CID stays
                            ///< reserved until a completion arrives) and its buffer may still be written
  no_submission_slot,       ///< the SQ had no room within the timeout: the controller stopped fetching
  no_command_id,            ///< every CID stayed in use for the whole timeout (asynchronous submit: was in use,
                            ///< nothing was submitted, and the caller must retry)
  invalid_request,          ///< the planner refused it (`plan_error`): zero blocks, an LBA range that wraps, a byte count
                            ///< that overflows, MDTS below one block, no dword-aligned split; or (async) more than one command's worth
  unaligned_buffer,         ///< the buffer offset is not dword aligned (PRP1)
  buffer_pages_misaligned,  ///< the buffer's pages are smaller than, or not aligned to, the controller's pages
  prp_list_too_small,       ///< the queue's per-command PRP lists cannot describe this much data
  doorbell_unusable,        ///< the doorbell policy needs what the queue lacks (shadow doorbell slots)
  metadata_unsupported,     ///< the namespace keeps metadata in a separate buffer (MPTR), which readers and writers do not
                            ///< supply, or has end-to-end protection information enabled: use host::queue_pair's metadata overloads
  cache_full,               ///< a page cache found no slot it could take within the timeout: every slot stayed held
                            ///< (referenced, or being filled) — hold fewer pages at once or give the cache more slots
};

/// Names for `io_error`, for messages.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr const char* to_string(io_error e) noexcept {
  switch (e) {
    case io_error::none: return "success";
    case io_error::nvme_status: return "NVMe error status";
    case io_error::timeout: return "completion timeout";
    case io_error::no_submission_slot: return "no submission queue slot within the timeout";
    case io_error::no_command_id: return "no free command identifier within the timeout";
    case io_error::invalid_request: return "invalid request";
    case io_error::unaligned_buffer: return "buffer offset not dword aligned";
    case io_error::buffer_pages_misaligned: return "buffer pages do not line up with the controller's pages";
    case io_error::prp_list_too_small: return "PRP list memory too small";
    case io_error::doorbell_unusable: return "doorbell policy unusable on this queue";
    case io_error::metadata_unsupported: return "namespace needs a separate metadata buffer or protection information handling";
    case io_error::cache_full: return "no page cache slot could be taken within the timeout (every slot held)";
  }
  return "unknown io_error";
}

/// Whether `e` ends a wait that ran out its timeout: a completion, a submission slot or a
/// command ID that did not come (a cache slot that stayed held is the caller's to free).
[[nodiscard]] CUNVME_HOST_DEVICE constexpr bool waited_out(io_error e) noexcept {
  return e == io_error::timeout || e == io_error::no_submission_slot || e == io_error::no_command_id;
}

/// The outcome of one request. For a request split into several commands, the first failing
/// command by LBA: its status and the LBA range it covered.
/// Usage: examples/snippets/host.cpp, `read_with_a_reader`.
struct io_result {
  io_error error = io_error::none;
  spec::status status = spec::status::successful_completion;
  cuda::std::uint32_t blocks = 0;  ///< of the failing command (0 on success)
  cuda::std::uint64_t lba = 0;     ///< first LBA of the failing command

  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool ok() const noexcept { return error == io_error::none; }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr explicit operator bool() const noexcept { return ok(); }

  [[nodiscard]] CUNVME_HOST_DEVICE static constexpr io_result failure(io_error e, cuda::std::uint64_t lba, cuda::std::uint32_t blocks,
                                                                      spec::status s = spec::status::successful_completion) noexcept {
    return io_result{e, s, blocks, lba};
  }
};

/// An outcome for messages: "success", or why, the NVMe status where a command failed, and the
/// failing command's range, e.g. "NVMe error status: LBA Out of Range (0/0x80) at LBA 65530 (64 blocks)".
[[nodiscard]] inline std::string to_string(const io_result& r) {
  if (r.ok()) return to_string(r.error);
  std::string s = to_string(r.error);
  if (r.error == io_error::nvme_status) s += ": " + spec::to_string(r.status);
  return s + " at LBA " + std::to_string(r.lba) + " (" + std::to_string(r.blocks) + " blocks)";
}

CUNVME_NAMESPACE_END
