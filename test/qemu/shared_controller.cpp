// Several processes on QEMU's controller, inside the guest: this process owns the admin queue
// (host::open(URI), sharing::controller_owner), three processes attach (this program run again
// with --child) and each drives two queue pairs of its own from two CPU threads, writing and
// verifying its own megabytes; one is killed (SIGKILL) mid-run. The owner then checks that
// the killed one's queues were deleted and its identifiers can be taken again, reads back
// what the survivors wrote, and seals the rest of the region, so that check_image.py can check
// the disk image on the host: the region holds test::word_at(o, seed), the rest the pattern.
//
//   shared_controller URI [--seed N --region OFFSET_MIB:SIZE_MIB]
//
// Prints "PASS name" / "FAIL name: why" per case and a summary; exits 0 when all passed.
#include <cunvme/host/open.cuh>
#include <cunvme/host/queue/queue_pair.cuh>
#include <cunvme/host/sharing/controller_owner.cuh>

#include "../child_processes.hpp"
#include "../guest_checks.hpp"
#include "../pattern.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace host = cunvme::host;
namespace spec = cunvme::spec;
using namespace std::chrono_literals;

namespace {

using test::expect;

constexpr unsigned processes = 3, victim = 1, threads_per_process = 2;
constexpr std::uint64_t mib = 1 << 20;
constexpr std::uint64_t chunk_bytes = 256 * 1024;  // one command's worth per write (below QEMU's MDTS)

struct layout {
  std::uint64_t region_offset = 8 * mib, region_bytes = 8 * mib, seed = 7;
  std::uint32_t block = 512;
  /// Each (process, thread) owns one MiB of the region.
  [[nodiscard]] std::uint64_t first_byte(unsigned process, unsigned thread) const {
    return region_offset + (std::uint64_t{process} * threads_per_process + thread) * mib;
  }
};

/// Words of `bytes` at byte `offset`: round `round`'s scratch, or the sealed words on the last.
void fill(std::byte* p, std::uint64_t offset, std::uint64_t bytes, std::uint64_t word_round) {
  auto* w = reinterpret_cast<std::uint64_t*>(p);
  for (std::uint64_t i = 0; i < bytes / 8; ++i) w[i] = test::word_at(offset + 8 * i, word_round);
}

/// One attached process: its threads write every chunk of their MiB `rounds` times (the last
/// round with the sealed words), each write read back and compared.
int run_child(const std::string& socket, unsigned index, unsigned rounds, const std::string& progress, const layout& l) {
  auto ctrl = host::open("attach:" + socket);
  const std::uint32_t nsid = ctrl->namespaces().front().nsid;
  std::vector<std::unique_ptr<host::queue_pair>> queues;
  for (unsigned t = 0; t < threads_per_process; ++t) queues.push_back(ctrl->create_queue_pair(32));
  std::atomic<unsigned> failures{0}, first_rounds{0};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < threads_per_process; ++t) {
    threads.emplace_back([&, t] {
      host::dma_buffer out = ctrl->memory().allocate(chunk_bytes);
      host::dma_buffer in = ctrl->memory().allocate(chunk_bytes);
      for (unsigned round = 0; round < rounds; ++round) {
        const std::uint64_t word_round = round + 1 == rounds ? l.seed : 1000 + round;
        for (std::uint64_t at = 0; at < mib; at += chunk_bytes) {
          const std::uint64_t offset = l.first_byte(index, t) + at;
          fill(out.data(), offset, chunk_bytes, word_round);
          if (queues[t]->write(nsid, offset / l.block, chunk_bytes / l.block, out) != spec::status::successful_completion) ++failures;
          std::memset(in.data(), 0, chunk_bytes);
          if (queues[t]->read(nsid, offset / l.block, chunk_bytes / l.block, in) != spec::status::successful_completion) ++failures;
          if (std::memcmp(in.data(), out.data(), chunk_bytes) != 0) ++failures;
        }
        if (round == 0 && ++first_rounds == threads_per_process) std::ofstream(progress) << "running\n";
      }
    });
  }
  for (auto& th : threads) th.join();
  if (failures != 0) std::fprintf(stderr, "child %u: %u failed or mismatched commands\n", index, failures.load());
  return failures == 0 ? 0 : 1;
}

pid_t spawn_child(const std::string& socket, unsigned index, unsigned rounds, const std::string& progress, const layout& l) {
  const pid_t pid = test::spawn_self({"--child", socket, std::to_string(index), std::to_string(rounds), progress, std::to_string(l.seed),
                                      std::to_string(l.region_offset / mib) + ":" + std::to_string(l.region_bytes / mib)});
  if (pid <= 0) throw test::failure{"posix_spawn failed"};
  return pid;
}

bool parse_region(const std::string& text, layout& l) {
  const auto colon = text.find(':');
  if (colon == std::string::npos) return false;
  l.region_offset = std::stoull(text.substr(0, colon)) * mib;
  l.region_bytes = std::stoull(text.substr(colon + 1)) * mib;
  return l.region_bytes >= std::uint64_t{processes} * threads_per_process * mib;
}

}  // namespace

int main(int argc, char** argv) {
  layout l;
  if (argc == 8 && std::string(argv[1]) == "--child") {
    l.seed = std::stoull(argv[6]);
    if (!parse_region(argv[7], l)) return 2;
    try {
      return run_child(argv[2], static_cast<unsigned>(std::stoul(argv[3])), static_cast<unsigned>(std::stoul(argv[4])), argv[5], l);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %s: %s\n", argv[3], e.what());
      return 1;
    }
  }
  if (argc != 2 && argc != 6) {
    std::fprintf(stderr, "usage: %s URI [--seed N --region OFFSET_MIB:SIZE_MIB]\n", argv[0]);
    return 2;
  }
  if (argc == 6) {
    l.seed = std::stoull(argv[3]);
    if (std::string(argv[2]) != "--seed" || std::string(argv[4]) != "--region" || !parse_region(argv[5], l)) {
      std::fprintf(stderr, "usage: %s URI [--seed N --region OFFSET_MIB:SIZE_MIB] (the region holds at least %u MiB)\n", argv[0],
                   processes * threads_per_process);
      return 2;
    }
  }
  const std::string uri = argv[1];
  const std::string socket = "/tmp/cunvme-shared-" + std::to_string(::getpid()) + ".sock";
  test::tally results;
  std::unique_ptr<host::controller> ctrl;
  results.run("the owner brings the controller up and serves it", [&] {
    host::controller_options options;
    options.shadow_doorbells = false;  // they would live in the owner's memory
    // Eight pairs: through sysfs every DMA buffer of an attached process is a 2 MiB huge page,
    // and the check below takes every pair.
    options.io_queue_pairs = 8;
    ctrl = host::open(uri, options);
    l.block = ctrl->namespaces().front().lba_size;
  });
  if (!ctrl) return results.summary("shared_controller");
  host::sharing::controller_owner owner(*ctrl, socket);
  results.run("three processes drive their own queue pairs; one killed mid-run is reclaimed, the others finish verified", [&] {
    const unsigned rounds = 4;
    std::vector<pid_t> pids;
    std::vector<std::string> progress;
    for (unsigned i = 0; i < processes; ++i) {
      progress.push_back(socket + ".progress" + std::to_string(i));
      pids.push_back(spawn_child(socket, i, i == victim ? 1000000 : rounds, progress.back(), l));
    }
    struct stat st{};
    const auto until = std::chrono::steady_clock::now() + 120s;
    int early = 0;  // a process that ended before the kill (it failed)
    while (::stat(progress[victim].c_str(), &st) != 0 && std::chrono::steady_clock::now() < until) {
      if (::waitpid(pids[victim], &early, WNOHANG) == pids[victim]) throw test::failure{"the process to be killed ended first, status " + std::to_string(early)};
      std::this_thread::sleep_for(10ms);
    }
    expect(::stat(progress[victim].c_str(), &st) == 0, "the process to be killed never finished a round");
    expect(::kill(pids[victim], SIGKILL) == 0, "kill");
    for (unsigned i = 0; i < processes; ++i) {
      const int status = test::wait_bounded(pids[i], 300s);
      if (i == victim) {
        expect(status != -1 && WIFSIGNALED(status), "the killed process did not end by its signal");
      } else {
        expect(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0, "process " + std::to_string(i) + " failed (status " + std::to_string(status) + ")");
      }
    }
    for (const auto& p : progress) ::unlink(p.c_str());
    const auto reclaimed_by = std::chrono::steady_clock::now() + 30s;
    while (owner.processes_reclaimed() < processes && std::chrono::steady_clock::now() < reclaimed_by) std::this_thread::sleep_for(10ms);
    expect(owner.processes_reclaimed() == processes, "not every process was reclaimed");
    expect(owner.queues_reclaimed() == 2 * threads_per_process,
           "the owner deleted " + std::to_string(owner.queues_reclaimed()) + " queues, not the killed process's two SQs and two CQs");
    expect(owner.queue_ids_held() == 0, "queue identifiers still held after every process went");
  });
  results.run("the killed process's queue identifiers are taken again, and the survivors' data is on the disk", [&] {
    auto again = host::open("attach:" + socket);
    std::vector<std::unique_ptr<host::queue_pair>> all;
    for (std::uint16_t n = 0; n < ctrl->io_queue_pairs_granted(); ++n) all.push_back(again->create_queue_pair(16));
    all.clear();
    again.reset();
    auto q = ctrl->create_queue_pair(32);
    host::dma_buffer in = ctrl->memory().allocate(chunk_bytes);
    std::vector<std::byte> want(chunk_bytes);
    const std::uint32_t nsid = ctrl->namespaces().front().nsid;
    for (unsigned i = 0; i < processes; ++i) {
      if (i == victim) continue;
      for (unsigned t = 0; t < threads_per_process; ++t) {
        for (std::uint64_t at = 0; at < mib; at += chunk_bytes) {
          const std::uint64_t offset = l.first_byte(i, t) + at;
          expect(q->read(nsid, offset / l.block, chunk_bytes / l.block, in) == spec::status::successful_completion, "read back");
          fill(want.data(), offset, chunk_bytes, l.seed);
          expect(std::memcmp(in.data(), want.data(), chunk_bytes) == 0, "process " + std::to_string(i) + "'s data at " + std::to_string(offset) + " is not what it wrote");
        }
      }
    }
    // The killed process's megabytes and the region's unused rest get the sealed words too.
    host::dma_buffer out = ctrl->memory().allocate(chunk_bytes);
    for (std::uint64_t offset = l.region_offset; offset < l.region_offset + l.region_bytes; offset += chunk_bytes) {
      const std::uint64_t slot = (offset - l.region_offset) / mib;
      if (slot < std::uint64_t{processes} * threads_per_process && slot / threads_per_process != victim) continue;
      fill(out.data(), offset, chunk_bytes, l.seed);
      expect(q->write(nsid, offset / l.block, chunk_bytes / l.block, out) == spec::status::successful_completion, "seal the region");
    }
    expect(q->execute(spec::make_flush(nsid), "Flush").status() == spec::status::successful_completion, "flush");
  });
  return results.summary("shared_controller");
}
