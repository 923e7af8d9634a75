// Usage snippets of the emulator (include/cunvme/emu/), compiled and run by `meson test` (suite
// `snippets`) so they cannot drift from the headers. Each function is the snippet a header's
// comment points to by name; main runs them and checks what their comments promise.
#include "snippet_check.hpp"

#include <cunvme/emu/backing_store.cuh>
#include <cunvme/emu/controller.cuh>
#include <cunvme/emu/controller_config.cuh>
#include <cunvme/emu/dma_space.cuh>
#include <cunvme/emu/fault_injection.cuh>
#include <cunvme/emu/prp_walker.cuh>
#include <cunvme/emu/timing_model.cuh>
#include <cunvme/spec/opcodes.cuh>
#include <cunvme/spec/queue_entry.cuh>
#include <cunvme/spec/status.cuh>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace emu = cunvme::emu;
namespace spec = cunvme::spec;

namespace {

using snippet::expect;

/// `controller`: the default controller, its BAR and a buffer it may DMA to.
std::uint32_t controller_version() {
  emu::controller ctrl;                             // one 1 GiB RAM namespace, 512-byte LBAs
  std::byte* bar = ctrl.bar();                      // doorbells: plain stores, as GPU threads make them
  const std::uint32_t vs = ctrl.read_register(0x08);  // registers: through the register file (VS here)
  std::vector<std::byte> buffer(1 << 20);
  const std::uint64_t bus = ctrl.dma().map(buffer.data(), buffer.size());  // memory the controller may DMA to
  // … write AQA/ASQ/ACQ/CC, submit SQEs, ring doorbells, poll CQEs …
  ctrl.dma().unmap(bus);
  (void)bar;
  return vs;
}

/// `controller_config`: a file namespace on a modelled drive.
emu::controller_config file_on_a_gen4_drive(const std::string& path) {
  emu::controller_config config;
  config.namespaces = {emu::namespace_config::from_file(path)};
  config.timing = emu::timing_model::gen4_tlc();
  return config;
}

/// `backing_store`: RAM (reserved lazily) or a file.
bool backing_stores(const std::string& path) {
  auto ram = emu::backing_store::in_memory(1ull << 40);   // 1 TiB, costs what is written
  auto disk = emu::backing_store::from_file(path);        // the file's size
  std::byte buffer[512];
  disk.read(0, buffer, 512);
  std::byte page[4096];
  std::memset(page, 0x5a, sizeof page);
  ram.with_write_access(0, 4096, [&](std::byte* p) { std::memcpy(p, page, 4096); });
  ram.zero(0, 1 << 20);                                    // Write Zeroes / deallocate
  std::byte first{1};
  ram.read(0, &first, 1);
  return first == std::byte{0} && buffer[0] == std::byte{'c'};
}

/// `dma_space`: the emulated IOMMU hands out bus addresses for PRPs.
bool dma_space_round_trip() {
  emu::dma_space dma;
  std::vector<std::byte> buffer(1 << 20);
  const std::uint64_t bus = dma.map(buffer.data(), buffer.size());  // give this to PRPs
  const bool found = dma.find(bus, 4096).has_value();
  dma.unmap(bus);
  return found && !dma.find(bus, 4096).has_value();
}

/// `prp_walker`: the data segments a command's PRPs describe.
std::size_t walk_prps(const emu::dma_space& dma, const spec::submission_entry& sqe, std::uint64_t bytes) {
  emu::prp_walker walker;
  const auto status = walker.walk(dma.pin(), sqe.prp1, sqe.prp2, bytes, /*page_size=*/4096, /*allow_cmb_mixing=*/false);
  std::size_t segments = 0;
  if (status == spec::status::successful_completion) {
    for (const emu::data_segment& s : walker.segments()) segments += s.length != 0;
  }
  return segments;
}

/// `timing_model` and `timing_preset`: a preset by name, or a model of your own.
bool timing_models(const std::string& option) {
  emu::controller_config config;
  config.timing = emu::timing_model::gen4_tlc();  // or *emu::timing_preset("gen4-tlc")
  const emu::timing_model custom{.read_latency_ns = 50'000, .max_iops = 2e6};
  if (auto m = emu::timing_preset(option)) {
    config.timing = *m;
  } else {
    return false;  // reject(option)
  }
  return custom.read_latency_ns == 50'000;
}

/// `timing_scheduler`: when a 4 KiB read issued now completes.
std::uint64_t read_due_ns(std::uint64_t now_ns) {
  emu::timing_scheduler timing(emu::timing_model::datacenter_gen4());
  return timing.due_ns(now_ns, 4096, /*is_write=*/false);  // post the completion once the steady clock reaches it
}

/// `fault_rule`: about 1 % of reads fail, retryably (as the URI `emu:fault=read:status=0x281:fraction=0.01:dnr=0`).
emu::controller_config one_percent_of_reads_fail() {
  emu::fault_rule r;
  r.status = spec::status::unrecovered_read_error;
  r.dnr = false;
  r.opcode = static_cast<std::uint8_t>(spec::nvm_opcode::read);
  r.fraction = 0.01;
  emu::controller_config config;
  config.faults = {r};
  config.fault_seed = 42;
  return config;
}

/// `fault_injector`: the decision for one command.
bool third_read_fails() {
  emu::fault_rule fail_third_read{.opcode = 0x02, .nth = 3};
  fail_third_read.status = spec::status::unrecovered_read_error;
  emu::fault_injector faults({fail_third_read}, /*seed=*/42);
  bool failed_third = false;
  for (std::uint64_t i = 0; i < 4; ++i) {
    const auto d = faults.decide(emu::command_view{.sqid = 1, .cid = static_cast<std::uint16_t>(i), .opcode = 0x02, .sequence = i});
    if (d.status) failed_third = i == 2 && *d.status == spec::status::unrecovered_read_error && d.dnr;  // post_with(*d.status, d.dnr)
  }
  return failed_third && faults.counters().statuses == 1;
}

}  // namespace

int main() {
  expect(controller_version() == 0x00020000, "controller: VS 2.0");

  const std::string path = "/tmp/cunvme-snippet-emu-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    const std::string text(4096, 'c');
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  expect(backing_stores(path), "backing_store");
  {
    emu::controller drive(file_on_a_gen4_drive(path));
    expect(drive.config().namespaces.size() == 1, "controller_config");
  }
  std::remove(path.c_str());

  expect(dma_space_round_trip(), "dma_space");
  emu::dma_space dma;
  struct alignas(4096) page {
    std::byte bytes[4096];
  };
  std::vector<page> data(3);  // page-aligned: PRP1 at a page's start, so PRP2 is the second page, not a list
  const std::uint64_t bus = dma.map(data.data(), data.size() * sizeof(page));
  spec::submission_entry sqe{};
  sqe.prp1 = bus;
  sqe.prp2 = bus + 4096;
  expect(walk_prps(dma, sqe, 8192) >= 1, "prp_walker");
  expect(timing_models("datacenter-gen4") && !timing_models("warp-speed"), "timing_preset");
  expect(read_due_ns(1'000'000) >= 1'000'000 + 80'000, "timing_scheduler");
  {
    emu::controller flaky(one_percent_of_reads_fail());
    expect(flaky.injected_faults().statuses == 0, "fault_rule");
  }
  expect(third_read_fails(), "fault_injector");
  return snippet::finish("emu");
}
