// cunvme_share: owns a controller's admin queue and serves it to other processes until stopped
// (SIGINT, SIGTERM), for runs with one process per GPU that should not host the owner
// themselves (torchrun, say). Each process then opens `attach:SOCKET` (C++ `host::open`,
// `cunvme::device`, or Python's `cunvme.Device("attach:" + socket, gpu=local_rank)`).
//
//   cunvme_share URI SOCKET        e.g.  cunvme_share emu:shared,pattern /run/cunvme-0.sock
//                                        cunvme_share vfio:0000:01:00.0 /run/cunvme-0.sock
//
// Prints a line when it serves, and one per change in the processes attached.
#include <cunvme/host/open.cuh>
#include <cunvme/host/sharing/controller_owner.cuh>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>

#include <signal.h>

namespace {
volatile std::sig_atomic_t stop_requested = 0;
void request_stop(int) { stop_requested = 1; }
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s URI SOCKET  (e.g. emu:shared,pattern /run/cunvme-0.sock)\n", argv[0]);
    return 2;
  }
  try {
    auto ctrl = cunvme::host::open(argv[1]);
    cunvme::host::sharing::controller_owner owner(*ctrl, argv[2]);
    std::signal(SIGINT, request_stop);
    std::signal(SIGTERM, request_stop);
    std::printf("serving %s at %s (%u I/O queue pairs)\n", ctrl->name().c_str(), argv[2], static_cast<unsigned>(ctrl->io_queue_pairs_granted()));
    std::fflush(stdout);
    std::size_t attached = 0;
    std::uint64_t reclaimed = 0;
    while (stop_requested == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (owner.processes() != attached || owner.processes_reclaimed() != reclaimed) {
        attached = owner.processes();
        reclaimed = owner.processes_reclaimed();
        std::printf("%zu processes attached, %zu queue identifiers held, %llu gone and reclaimed\n", attached, owner.queue_ids_held(),
                    static_cast<unsigned long long>(reclaimed));
        std::fflush(stdout);
      }
    }
    std::puts("stopping: the processes still attached are let go");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cunvme_share: %s\n", e.what());
    return 1;
  }
  return 0;
}
