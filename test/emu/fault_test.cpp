// Conformance: fault injection and the timing model, as seen through the queues.
#include "test_host.hpp"

using namespace test;

namespace {

struct faulty {
  explicit faulty(std::vector<emu::fault_rule> rules, emu::timing_model timing = emu::timing_model::none()) : ctrl(make(std::move(rules), timing)), host(ctrl) {
    REQUIRE(host.enable());
    q = host.create_pair(1, 32);
  }
  static emu::controller_config make(std::vector<emu::fault_rule> rules, emu::timing_model timing) {
    emu::controller_config config;
    config.faults = std::move(rules);
    config.timing = timing;
    return config;
  }
  emu::controller ctrl;
  test_host host;
  std::unique_ptr<queue_pair> q;
};

emu::fault_rule on_nth_read(std::uint64_t nth, emu::fault_action action) {
  emu::fault_rule rule;
  rule.action = action;
  rule.opcode = static_cast<std::uint8_t>(spec::nvm_opcode::read);
  rule.nth = nth;
  return rule;
}

}  // namespace

TEST_CASE("an injected status reaches the issuing command, with the rule's DNR bit") {
  auto rule = on_nth_read(3, emu::fault_action::complete_with_status);
  rule.status = spec::status::unrecovered_read_error;
  rule.dnr = false;
  faulty f({rule});
  dma_buffer buf(f.ctrl, 4096);
  for (int i = 1; i <= 5; ++i) {
    const auto cqe = f.host.run(*f.q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, buf.bus));
    if (i == 3) {
      CHECK(cqe.status() == spec::status::unrecovered_read_error);
      CHECK_FALSE(cqe.dnr());
    } else {
      CHECK(cqe.status() == spec::status::successful_completion);
    }
  }
  CHECK(f.ctrl.injected_faults().statuses == 1);
}

TEST_CASE("injected faults can be limited to an LBA range") {
  emu::fault_rule rule;
  rule.status = spec::status::write_fault;
  rule.opcode = static_cast<std::uint8_t>(spec::nvm_opcode::write);
  rule.lba_first = 100;
  rule.lba_last = 199;
  rule.fraction = 1.0;
  faulty f({rule});
  dma_buffer buf(f.ctrl, 4096);
  CHECK(f.host.run(*f.q, spec::make_rw(spec::nvm_opcode::write, 1, 0, 8, buf.bus)).status() == spec::status::successful_completion);
  CHECK(f.host.run(*f.q, spec::make_rw(spec::nvm_opcode::write, 1, 96, 8, buf.bus)).status() == spec::status::write_fault);
  CHECK(f.host.run(*f.q, spec::make_rw(spec::nvm_opcode::write, 1, 150, 1, buf.bus)).status() == spec::status::write_fault);
  CHECK(f.host.run(*f.q, spec::make_rw(spec::nvm_opcode::write, 1, 200, 8, buf.bus)).status() == spec::status::successful_completion);
  CHECK(f.host.run(*f.q, spec::make_rw(spec::nvm_opcode::read, 1, 150, 1, buf.bus)).status() == spec::status::successful_completion);
}

TEST_CASE("a lost completion never arrives, and later commands still complete") {
  faulty f({on_nth_read(2, emu::fault_action::lose_completion)});
  dma_buffer buf(f.ctrl, 4096);
  CHECK(f.host.run(*f.q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, buf.bus)).status() == spec::status::successful_completion);
  const std::uint16_t lost = f.host.place(*f.q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, buf.bus));
  f.host.ring_sq(*f.q);
  CHECK_FALSE(f.host.next_completion(*f.q, std::chrono::milliseconds(200)).has_value());
  const auto next = f.host.run(*f.q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, buf.bus));
  CHECK(next.cid != lost);
  CHECK(next.sqhd == 3);  // the lost command's slot was consumed all the same
  CHECK(f.ctrl.injected_faults().lost_completions == 1);
  CHECK(f.ctrl.stats().completions_dropped == 1);
}

TEST_CASE("an injected controller fatal status sets CSTS.CFS and stops processing until reset") {
  faulty f({on_nth_read(1, emu::fault_action::controller_fatal)});
  dma_buffer buf(f.ctrl, 4096);
  f.host.place(*f.q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, buf.bus));
  f.host.ring_sq(*f.q);
  CHECK(test_host::eventually([&] { return f.host.csts().cfs(); }));
  CHECK_FALSE(f.host.next_completion(*f.q, std::chrono::milliseconds(100)).has_value());
  CHECK(f.ctrl.injected_faults().controller_fatals == 1);
  REQUIRE(f.host.disable());
  CHECK(test_host::eventually([&] { return !f.host.csts().cfs(); }));
  REQUIRE(f.host.enable());
}

TEST_CASE("an injected delay holds the completion back at least that long") {
  auto rule = on_nth_read(1, emu::fault_action::add_delay);
  rule.delay_ns = 100'000'000;
  faulty f({rule});
  dma_buffer buf(f.ctrl, 4096);
  const auto start = std::chrono::steady_clock::now();
  CHECK(f.host.run(*f.q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, buf.bus)).status() == spec::status::successful_completion);
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(100));
  CHECK(f.ctrl.injected_faults().delays == 1);
}

TEST_CASE("faults on admin commands apply only to admin rules") {
  emu::fault_rule rule;
  rule.admin = true;
  rule.opcode = static_cast<std::uint8_t>(spec::admin_opcode::identify);
  rule.status = spec::status::internal_error;
  rule.nth = 1;
  faulty f({rule});
  dma_buffer page(f.ctrl, 4096);
  CHECK(f.host.admin_status(spec::make_identify(spec::identify_cns::controller, 0, page.bus)) == spec::status::internal_error);
  CHECK(f.host.admin_status(spec::make_identify(spec::identify_cns::controller, 0, page.bus)) == spec::status::successful_completion);
}

TEST_CASE("the timing model holds each completion back by the modelled latency") {
  emu::timing_model timing;
  timing.read_latency_ns = 30'000'000;  // 30 ms
  faulty f({}, timing);
  dma_buffer buf(f.ctrl, 4096);
  const auto start = std::chrono::steady_clock::now();
  CHECK(f.host.run(*f.q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, buf.bus)).status() == spec::status::successful_completion);
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(30));
}
