// Fault injection through the URI: `emu:fault=RULE[+RULE…],fault_seed=N` configures the
// emulator's fault rules (emu/fault_injection.cuh) without C++, so the host path, Python and the
// benchmarks can test their error handling; a malformed rule is a host::error naming the URI.
#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/backend/emu_backend.cuh>
#include <cunvme/host/open.cuh>

#include <doctest/doctest.h>

#include "uri_refusal.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace host = cunvme::host;
namespace emu = cunvme::emu;
namespace spec = cunvme::spec;

namespace {

using uri_test::emulator;
using uri_test::refused_naming;

/// The statuses of `reads` one-block reads of LBA `lba` on a fresh queue pair.
std::vector<spec::status> read_statuses(host::controller& c, int reads, std::uint64_t lba = 0) {
  auto q = c.create_queue_pair(8);
  auto buf = c.memory().allocate(4096);
  std::vector<spec::status> got;
  for (int i = 0; i < reads; ++i) got.push_back(q->read(1, lba, 1, buf));
  return got;
}

}  // namespace

TEST_CASE("emu:fault=read:status=0x281:nth=3 fails the third Read, and only it, with Unrecovered Read Error") {
  auto c = host::open("emu:blocks=64,fault=read:status=0x281:nth=3");
  const auto got = read_statuses(*c, 5);
  CHECK(got[0] == spec::status::successful_completion);
  CHECK(got[1] == spec::status::successful_completion);
  CHECK(got[2] == spec::status::unrecovered_read_error);
  CHECK(got[3] == spec::status::successful_completion);
  CHECK(got[4] == spec::status::successful_completion);
  CHECK(emulator(c).injected_faults().statuses == 1);
}

TEST_CASE("a fault rule matches only its opcode: Writes pass a rule on Reads") {
  auto c = host::open("emu:blocks=64,fault=read:status=0x281:nth=1");
  auto q = c->create_queue_pair(8);
  auto buf = c->memory().allocate(4096);
  CHECK(q->write(1, 0, 1, buf) == spec::status::successful_completion);
  CHECK(q->read(1, 0, 1, buf) == spec::status::unrecovered_read_error);
}

TEST_CASE("fraction=1 with max=2 fires on exactly two commands; fraction draws follow fault_seed") {
  auto c = host::open("emu:blocks=64,fault=read:status=0x281:fraction=1:max=2");
  const auto got = read_statuses(*c, 4);
  CHECK(got[0] == spec::status::unrecovered_read_error);
  CHECK(got[1] == spec::status::unrecovered_read_error);
  CHECK(got[2] == spec::status::successful_completion);
  CHECK(got[3] == spec::status::successful_completion);
  // The same seed draws the same faults on the same command stream.
  auto a = host::open("emu:blocks=64,fault=read:status=0x281:fraction=0.5,fault_seed=7");
  auto b = host::open("emu:blocks=64,fault=read:status=0x281:fraction=0.5,fault_seed=7");
  CHECK(read_statuses(*a, 64) == read_statuses(*b, 64));
  CHECK(emulator(a).injected_faults().statuses > 0);
  CHECK(emulator(a).injected_faults().statuses < 64);
}

TEST_CASE("lba=A-B narrows a rule to commands meeting that range") {
  auto c = host::open("emu:blocks=64,fault=io:status=0x281:fraction=1:lba=10-19");
  CHECK(read_statuses(*c, 1, 9).front() == spec::status::successful_completion);
  CHECK(read_statuses(*c, 1, 10).front() == spec::status::unrecovered_read_error);
  CHECK(read_statuses(*c, 1, 19).front() == spec::status::unrecovered_read_error);
  CHECK(read_statuses(*c, 1, 20).front() == spec::status::successful_completion);
}

TEST_CASE("dnr=0 posts the injected status without Do Not Retry; several rules join with '+'") {
  auto c = host::open("emu:blocks=64,fault=read:status=0x281:nth=1:dnr=0+write:status=0x280:nth=1");
  auto q = c->create_queue_pair(8);
  auto buf = c->memory().allocate(4096);
  CHECK(q->read(1, 0, 1, buf) == spec::status::unrecovered_read_error);
  CHECK(q->write(1, 0, 1, buf) == spec::status::write_fault);
  CHECK(emulator(c).injected_faults().statuses == 2);
}

TEST_CASE("lose drops a completion: the host's read times out naming the operation") {
  host::controller_options options;
  options.command_timeout = std::chrono::milliseconds(200);
  options.admin_timeout = std::chrono::seconds(10);
  auto c = host::open("emu:blocks=64,fault=read:lose:nth=1", options);
  auto q = c->create_queue_pair(8);
  auto buf = c->memory().allocate(4096);
  CHECK_THROWS_WITH_AS((void)q->read(1, 0, 1, buf), doctest::Contains("no completion within 200 ms"), host::error);
  CHECK(emulator(c).injected_faults().lost_completions == 1);
}

TEST_CASE("delay_us delays a completion; fatal sets CSTS.CFS") {
  auto slow = host::open("emu:blocks=64,fault=read:delay_us=20000:nth=1");
  const auto start = std::chrono::steady_clock::now();
  CHECK(read_statuses(*slow, 1).front() == spec::status::successful_completion);
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(20));
  CHECK(emulator(slow).injected_faults().delays == 1);

  host::controller_options options;
  options.command_timeout = std::chrono::milliseconds(200);
  options.admin_timeout = std::chrono::seconds(10);  // queue creation is not what this times out
  options.abort_on_timeout = false;
  auto fatal = host::open("emu:blocks=64,fault=read:fatal:nth=1", options);
  auto q = fatal->create_queue_pair(8);
  auto buf = fatal->memory().allocate(4096);
  CHECK_THROWS_AS((void)q->read(1, 0, 1, buf), host::error);
  CHECK(fatal->csts().cfs());
  CHECK(emulator(fatal).injected_faults().controller_fatals == 1);
}

TEST_CASE("admin:opcode=N rules reach admin commands (Get Log Page here)") {
  auto c = host::open("emu:blocks=64,fault=admin:opcode=0x02:status=0x002:nth=1");
  CHECK(emulator(c).injected_faults().statuses == 0);
  CHECK_THROWS_WITH_AS((void)c->log_page(spec::log_page_id::smart_health_information, 512), doctest::Contains("Invalid Field in Command"), host::error);
  CHECK(emulator(c).injected_faults().statuses == 1);
}

TEST_CASE("malformed fault rules are refused with a host::error naming the URI, the rule and what is wrong") {
  CHECK(refused_naming("emu:fault=", "fault", "needs a value"));
  CHECK(refused_naming("emu:fault=read", "fault=read", "needs an action"));
  CHECK(refused_naming("emu:fault=read:status=0x281", "nth", "fraction"));
  CHECK(refused_naming("emu:fault=reed:status=0x281:nth=1", "'reed'", "read, write"));
  CHECK(refused_naming("emu:fault=read:status=0x281:nth=1:nth=2", "'nth' is given twice"));
  CHECK(refused_naming("emu:fault=read:status=0x281:lose:nth=1", "one action"));
  CHECK(refused_naming("emu:fault=read:status=0x281:nth=1:fraction=0.5", "both nth"));
  CHECK(refused_naming("emu:fault=read:status=0:nth=1", "Successful Completion"));
  CHECK(refused_naming("emu:fault=read:status=0x1ff:nth=1", "0x1ff", "not a status"));
  CHECK(refused_naming("emu:fault=read:status=0x800:nth=1", "0x800"));
  CHECK(refused_naming("emu:fault=read:status=unrecovered:nth=1", "'status'", "number"));
  CHECK(refused_naming("emu:fault=read:status=0x281:nth=0", "'nth'", "1.."));
  CHECK(refused_naming("emu:fault=read:status=0x281:fraction=1.5", "fraction", "[0, 1]"));
  CHECK(refused_naming("emu:fault=read:status=0x281:fraction=nan", "fraction"));
  CHECK(refused_naming("emu:fault=read:status=0x281:fraction=half", "fraction"));
  CHECK(refused_naming("emu:fault=read:status=0x281:nth=1:lba=9-3", "lba_first 9 above lba_last 3"));
  CHECK(refused_naming("emu:fault=read:status=0x281:nth=1:lba=x", "'lba'"));
  CHECK(refused_naming("emu:fault=admin:status=0x281:nth=1:lba=0-3", "admin"));
  CHECK(refused_naming("emu:fault=read:opcode=2:status=0x281:nth=1", "'opcode'", "io or admin"));
  CHECK(refused_naming("emu:fault=read:delay_us=0:nth=1", "'delay_us'"));
  CHECK(refused_naming("emu:fault=read:lose:dnr=0:nth=1", "'dnr'", "status"));
  CHECK(refused_naming("emu:fault=read:status=0x281:nth=1:color=red", "unknown", "'color'"));
  CHECK(refused_naming("emu:fault=read:status=0x281:nth=1+", "empty rule"));
  CHECK(refused_naming("emu:fault=read:status=0x281:nth=1:max=0", "'max'"));
  CHECK(refused_naming("emu:fault_seed=x", "fault_seed"));
  CHECK(refused_naming("emu:fault_seed=3", "'fault_seed'", "fault"));
}
