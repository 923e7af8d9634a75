// The VFIO backend where things go wrong, inside the QEMU guest (run_guest.sh --vfio): DMA
// the IOMMU must stop, a group already open, a controller not bound to vfio-pci, buffers that
// outlive their controller, host memory whose map_host buffer is gone.
//
//   vfio_negative BDF
//
// Needs root (it reads and clears the kernel log, and unbinds and rebinds the controller), the
// controller bound to vfio-pci, nobody else holding its group. Prints "PASS name" /
// "FAIL name: why" per case and a summary; exits 0 when all passed. It clears the kernel log
// after checking that the only IOMMU faults in it are the one it caused, so the harness's
// later check for faults covers everything else.
#include <cunvme/host/open.cuh>

#include "../guest_checks.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <sys/klog.h>
#include <sys/mman.h>

namespace host = cunvme::host;
namespace spec = cunvme::spec;

namespace {

using test::expect;
using test::failure;

std::string bdf;

/// The kernel log as `dmesg` shows it (SYSLOG_ACTION_READ_ALL).
std::string kernel_log() {
  const int size = ::klogctl(10 /* SYSLOG_ACTION_SIZE_BUFFER */, nullptr, 0);
  expect(size > 0, std::string("cannot size the kernel log: ") + std::strerror(errno));
  std::string text(static_cast<std::size_t>(size), '\0');
  const int n = ::klogctl(3 /* SYSLOG_ACTION_READ_ALL */, text.data(), size);
  expect(n >= 0, std::string("cannot read the kernel log: ") + std::strerror(errno));
  text.resize(static_cast<std::size_t>(n));
  return text;
}

/// The Intel IOMMU's fault reports in the kernel log ("DMAR: [DMA Write NO_PASID] Request device
/// [00:01.0] fault addr 0x1000 ...").
std::vector<std::string> iommu_faults() {
  std::vector<std::string> faults;
  const std::string log = kernel_log();
  for (std::size_t at = 0; at < log.size();) {
    const std::size_t end = std::min(log.find('\n', at), log.size());
    const std::string line = log.substr(at, end - at);
    if (line.find("DMAR") != std::string::npos && line.find("fault addr") != std::string::npos) faults.push_back(line);
    at = end + 1;
  }
  return faults;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  expect(static_cast<bool>(out), "cannot write '" + text + "' to " + path);
}

using case_fn = std::function<void()>;

const std::vector<std::pair<std::string, case_fn>>& cases() {
  static const std::vector<std::pair<std::string, case_fn>> all = {
      {"DMA to an IOVA that was never mapped is stopped by the IOMMU, which reports it for the controller",
       [] {
         if (const auto before = iommu_faults(); !before.empty()) throw failure{"IOMMU faults before this case: " + before.front()};
         auto ctrl = host::open("vfio:" + bdf);
         auto qp = ctrl->create_queue_pair(4);
         // IOVAs below 1 MiB are never handed out (iova_space), so 0x1000 is mapped to nothing.
         // QEMU completes the command with Success whatever the IOMMU did (shared/QEMU.md): the
         // IOMMU's fault report is what tells.
         (void)qp->execute(spec::make_rw(spec::nvm_opcode::read, 1, 0, 1, 0x1000), "Read to IOVA 0x1000");
         // The fault is reported through an interrupt: bounded wait for it to reach the log.
         std::vector<std::string> faults;
         for (int i = 0; i < 100 && faults.empty(); ++i) {
           faults = iommu_faults();
           if (faults.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
         }
         expect(!faults.empty(), "no IOMMU fault was reported for a read aimed at IOVA 0x1000");
         for (const auto& f : faults) {
           expect(f.find("fault addr 0x1000 ") != std::string::npos, "an IOMMU fault other than the one caused here: " + f);
           expect(f.find("[" + bdf.substr(5) + "]") != std::string::npos, "the fault does not name " + bdf + ": " + f);
         }
         // The mapped buffers still work after the fault.
         auto buf = ctrl->memory().allocate(4096);
         expect(qp->read(1, 0, 1, buf) == spec::status::successful_completion, "a read into a mapped buffer failed after the fault");
         expect(::klogctl(5 /* SYSLOG_ACTION_CLEAR */, nullptr, 0) == 0, std::string("cannot clear the kernel log: ") + std::strerror(errno));
       }},
      {"host memory mapped with map_host is gone from the IOMMU with its buffer: a read aimed at its IOVAs faults there and leaves the memory alone",
       [] {
         if (const auto before = iommu_faults(); !before.empty()) throw failure{"IOMMU faults before this case: " + before.front()};
         auto ctrl = host::open("vfio:" + bdf);
         auto qp = ctrl->create_queue_pair(4);
         // Memory no allocator of this controller handed out (a second controller's buffer, say).
         void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
         expect(p != MAP_FAILED, "mmap failed");
         auto* memory = static_cast<std::byte*>(p);
         std::uint64_t stale = 0;
         {
           auto mapped = ctrl->memory().map_host(memory, 4096);
           stale = mapped.bus();
           expect(qp->read(1, 0, 8, mapped) == spec::status::successful_completion, "a read into the mapped memory failed");
         }
         std::memset(memory, 0x5a, 4096);
         (void)qp->execute(spec::make_rw(spec::nvm_opcode::read, 1, 0, 8, stale), "Read to a released map_host IOVA");
         std::vector<std::string> faults;
         for (int i = 0; i < 100 && faults.empty(); ++i) {
           faults = iommu_faults();
           if (faults.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
         }
         char want[64];
         std::snprintf(want, sizeof want, "fault addr 0x%llx ", static_cast<unsigned long long>(stale));
         expect(!faults.empty(), std::string("no IOMMU fault was reported for a read aimed at the released IOVA (") + want + ")");
         for (const auto& f : faults) expect(f.find(want) != std::string::npos, "an IOMMU fault other than the one caused here: " + f);
         bool untouched = true;
         for (std::size_t i = 0; i < 4096; ++i) untouched = untouched && memory[i] == std::byte{0x5a};
         ::munmap(p, 4096);
         expect(untouched, "the read reached the memory after its mapping was released");
         expect(::klogctl(5 /* SYSLOG_ACTION_CLEAR */, nullptr, 0) == 0, std::string("cannot clear the kernel log: ") + std::strerror(errno));
       }},
      {"a second open of a controller whose group is held is refused, naming the group",
       [] {
         auto first = host::open("vfio:" + bdf);
         try {
           auto second = host::open("vfio:" + bdf);
         } catch (const host::error& e) {
           const std::string what = e.what();
           expect(what.find("/dev/vfio/") != std::string::npos && what.find("is open already") != std::string::npos, "wrong error: " + what);
           return;
         }
         throw failure{"the controller was opened twice at once"};
       }},
      {"DMA buffers that outlive their controller are released, and the controller opens again",
       [] {
         std::vector<host::dma_buffer> kept;
         {
           auto ctrl = host::open("vfio:" + bdf);
           for (int i = 0; i < 4; ++i) kept.push_back(ctrl->memory().allocate(64 * 1024));
         }
         kept.clear();
         auto ctrl = host::open("vfio:" + bdf);
         auto qp = ctrl->create_queue_pair(4);
         auto buf = ctrl->memory().allocate(4096);
         expect(qp->read(1, 0, 8, buf) == spec::status::successful_completion, "a read after reopening failed");
       }},
      {"a controller not bound to vfio-pci is refused with how to bind it",
       [] {
         const std::string dev = "/sys/bus/pci/devices/" + bdf;
         write_file("/sys/bus/pci/drivers/vfio-pci/unbind", bdf);
         std::string what;
         try {
           auto ctrl = host::open("vfio:" + bdf);
         } catch (const host::error& e) {
           what = e.what();
         }
         // Bound again (driver_override still names vfio-pci) before judging, for the cases after.
         write_file("/sys/bus/pci/drivers_probe", bdf);
         expect(!what.empty(), "an unbound controller was opened through VFIO");
         expect(what.find("not bound to vfio-pci") != std::string::npos && what.find("driver_override") != std::string::npos, "wrong error: " + what);
         auto ctrl = host::open("vfio:" + bdf);
         expect(ctrl->csts().rdy(), "not ready after rebinding");
       }},
  };
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || !host::valid_bdf(argv[1])) {
    std::fprintf(stderr, "usage: %s BDF (bound to vfio-pci)\n", argv[0]);
    return 2;
  }
  bdf = argv[1];
  test::tally results;
  for (const auto& [name, run] : cases()) results.run(name, run);
  return results.summary("vfio_negative");
}
