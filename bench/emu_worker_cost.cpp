// emu_worker_cost: the emulator's own CPU per command, without a GPU. One CPU thread keeps
// --qd reads in flight on one queue pair through the library's reader (submit_read/test);
// the emulator's threads' CPU time (the process's, less the submitter's) over the commands
// they completed is what a command costs the emulator at most (the polls between commands
// count too). With `nodata` it is the command path alone (fetch, checks, completion); with data
// it adds the copy into host memory.
//
// Why it exists: P2e's CPU-s per command on the GPU machine counts workers that spin while
// they wait (emu::idle_policy), so it cannot tell work from waiting; this does (bench/RESULTS.md).
//
//   emu_worker_cost --device emu:workers=1,nodata --qd 32 --time 3
#include <cunvme/host/queue/io_queue.cuh>
#include <cunvme/host/open.cuh>
#include <cunvme/io/reader.cuh>

#include "command_line.hpp"
#include "json_record.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <exception>
#include <string>
#include <vector>

namespace cb = cunvme::bench;
namespace host = cunvme::host;

namespace {

struct options {
  std::string device = "emu:workers=1,nodata";
  unsigned qd = 32;
  std::uint64_t bs = 4096;
  double time = 2;
  bool json = false;
};

[[nodiscard]] double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

int run(const options& o) {
  if (o.device.rfind("emu:", 0) != 0 && o.device != "emu") throw cb::usage_error("--device must be an emu: URI: only the emulator's threads are measured");
  auto ctrl = host::open(o.device);
  const auto& ns = ctrl->namespaces().at(0);
  if (ns.separate_metadata()) throw cb::usage_error("namespace " + std::to_string(ns.nsid) + " has separate metadata, which these reads do not carry: use mset=1");
  const std::uint64_t block_bytes = ns.block_bytes();
  if (o.bs % block_bytes != 0 || o.bs / block_bytes > ns.lba_count || o.bs > ctrl->max_transfer_bytes()) {
    throw cb::usage_error("--bs " + std::to_string(o.bs) + " is not a whole number of the namespace's " + std::to_string(block_bytes) +
                          "-byte blocks within one command (MDTS " + std::to_string(ctrl->max_transfer_bytes()) + " bytes) and the namespace");
  }
  const auto blocks = static_cast<std::uint32_t>(o.bs / block_bytes);
  host::io_queue q(*ctrl, 1024);
  using queue = cunvme::queue_policies<cunvme::slots::exclusive, cunvme::completion::cooperative>;
  cunvme::block_reader<queue, cunvme::prp::contiguous, cunvme::doorbell::mmio> reader(q.view(), q.namespace_view(ns.nsid));
  host::dma_buffer buffer = ctrl->memory().allocate(std::size_t{o.qd} * o.bs);
  const cunvme::prp::contiguous dst{buffer.bus()};
  const std::uint64_t last_start = ns.lba_count - blocks;
  std::uint64_t lba = 0, done = 0, failed = 0;
  std::string first_failure;
  std::vector<cunvme::io_handle> handles(o.qd);
  const auto submit = [&](unsigned i) {
    handles[i] = reader.submit_read(lba, blocks, dst, std::uint64_t{i} * o.bs);
    lba = lba + blocks > last_start ? 0 : lba + blocks;
  };
  const double process_before = cb::process_cpu_seconds(), submitter_before = thread_cpu_seconds();
  const auto start = std::chrono::steady_clock::now();
  const auto seconds = [&start] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  for (unsigned i = 0; i < o.qd; ++i) submit(i);
  while (seconds() < o.time) {
    for (unsigned i = 0; i < o.qd; ++i) {
      if (!reader.test(handles[i])) continue;
      if (!handles[i].result.ok()) {
        if (failed++ == 0) first_failure = cunvme::to_string(handles[i].result);
      } else {
        ++done;
      }
      submit(i);
    }
  }
  for (auto& h : handles) {
    if (const cunvme::io_result r = reader.wait(h); !r.ok() && failed++ == 0) first_failure = cunvme::to_string(r);
  }
  const double wall = seconds();
  const double submitter = thread_cpu_seconds() - submitter_before;
  const double emulator = cb::process_cpu_seconds() - process_before - submitter;

  cb::json record;
  record["tool"] = "emu_worker_cost";
  record["date"] = cb::now_text();
  record["device"] = o.device;
  record["qd"] = o.qd;
  record["bs"] = o.bs;
  record["seconds"] = cb::rounded(wall, 3);
  record["commands"] = done;
  record["failed"] = failed;
  if (failed != 0) {
    record["error"] = first_failure;  // no figure from a run with failed commands
  } else {
    record["commands_per_s"] = cb::rounded(static_cast<double>(done) / wall, 0);
    record["submitter_cpu_s"] = cb::rounded(submitter, 3);
    record["emulator_cpu_s"] = cb::rounded(emulator, 3);
    record["emulator_cpu_us_per_command"] = cb::rounded(done != 0 ? 1e6 * emulator / static_cast<double>(done) : 0.0, 3);
    record["emulator_cores_busy"] = cb::rounded(emulator / wall, 2);
  }
  if (o.json) {
    std::printf("%s\n", cb::one_line(record).c_str());
  } else if (failed != 0) {
    std::fprintf(stderr, "emu_worker_cost: %llu of the reads failed (%s): no figure\n", static_cast<unsigned long long>(failed), first_failure.c_str());
  } else {
    std::printf("%s, QD %u, %llu-byte reads: %.0f commands/s over %.2f s; emulator threads %.3f CPU-s (%.2f cores) = %.3f us per command; submitter %.3f CPU-s\n",
                o.device.c_str(), o.qd, static_cast<unsigned long long>(o.bs), static_cast<double>(done) / wall, wall, emulator, emulator / wall,
                done != 0 ? 1e6 * emulator / static_cast<double>(done) : 0.0, submitter);
  }
  return failed != 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app("The emulator's CPU per command, driven by one CPU thread through the library's reader (no GPU).", "emu_worker_cost");
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--device", o.device, "an emu: URI (nodata: the command path alone)")->capture_default_str();
  app.add_option("--qd", o.qd, "reads kept in flight (the queue has 1024 entries)")->transform(cb::whole_number(1, 1023))->capture_default_str();
  app.add_option("--bs", o.bs, "bytes per read (k, m, g: powers of 1024)")->transform(cb::size_in_bytes(512))->capture_default_str();
  app.add_option("--time", o.time, "seconds to run")->check(cb::seconds_up_to(3600))->capture_default_str();
  app.add_flag("--json", o.json, "print one JSON object");
  if (const auto exit_code = cb::parse_command_line(app, argc, argv)) return *exit_code;
  try {
    return run(o);
  } catch (const cb::usage_error& e) {
    std::fprintf(stderr, "emu_worker_cost: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "emu_worker_cost: %s\n", e.what());
    return 1;
  }
}
