// What a controller asks of the process that owns its admin queue, when that is another one:
// a controller shared by several processes has exactly one owner of the admin queue (DESIGN.md
// "Several GPUs, several processes"); the others attach and ask it for queue identifiers and
// for the admin commands on their own queues. host/sharing/ implements it over a socket.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/spec/queue_entry.cuh>

#include <cstdint>
#include <string>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// The way to the owner of a controller's admin queue. Every call throws `host::error` naming
/// the operation when the owner refuses, fails, or is gone.
class admin_link {
 public:
  virtual ~admin_link() = default;

  /// Who owns the admin queue, for messages: "process 4242 at /run/cunvme.sock".
  [[nodiscard]] virtual std::string owner() const = 0;
  /// I/O queue pairs the controller granted to all processes together.
  [[nodiscard]] virtual std::uint16_t queue_pairs_granted() const = 0;
  /// CC.MPS as the owner set it: the page size of every queue and PRP.
  [[nodiscard]] virtual unsigned page_shift() const = 0;
  /// Runs an admin command on the owner's admin queue and returns its completion, whatever
  /// its status. The owner runs only those on this process's own queues and those that read
  /// (Identify, Get Features, Get Log Page), with data in memory this process gave it.
  [[nodiscard]] virtual spec::completion_entry admin(const spec::submission_entry& sqe, const std::string& operation) = 0;
  /// A queue identifier for this process's next queue pair; the error says how many are left.
  [[nodiscard]] virtual std::uint16_t take_queue_id(const std::string& operation) = 0;
  /// Gives a queue identifier back once its queues are deleted.
  virtual void release_queue_id(std::uint16_t qid) noexcept = 0;
};

}  // namespace host
CUNVME_NAMESPACE_END
