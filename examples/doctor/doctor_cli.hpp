// `nvme_info --doctor [BDF] [--gpu N|BDF] [--root DIR]`: the command line of the doctor.
#pragma once

#include "report_print.hpp"

#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

namespace cunvme_doctor {

inline constexpr const char* doctor_usage =
    "usage: nvme_info --doctor [BDF] [--gpu N|BDF] [--root DIR]\n"
    "  Reports, for the NVMe controller at BDF (default: every one found) and an NVIDIA GPU, the IOMMU,\n"
    "  the PCIe path between them (switch, root complex, ACS redirect), link speeds, BAR sizes, the\n"
    "  controller's driver, huge pages, RLIMIT_MEMLOCK and the cunvme module, then which memory tier\n"
    "  each backend (sysfs, vfio, kmod) can use here and why. Run as root to see capabilities (ACS, links).\n"
    "  --gpu N     the Nth NVIDIA GPU in PCI bus order (default 0); that is CUDA's device N only with\n"
    "              CUDA_DEVICE_ORDER=PCI_BUS_ID. A BDF (0000:41:00.0) names one directly.\n"
    "  --root DIR  read DIR/sys and DIR/proc/meminfo instead of /sys and /proc (for tests: a fake tree)\n";

/// Runs the doctor on the arguments after `--doctor`; the process's exit status.
inline int doctor_main(int argc, char** argv) {
  doctor_request request;
  for (int i = 0; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const bool takes_value = arg == "--gpu" || arg == "--root";
    if (takes_value && i + 1 >= argc) {
      std::fprintf(stderr, "nvme_info --doctor: %s needs a value\n%s", argv[i], doctor_usage);
      return 2;
    }
    if (arg == "-h" || arg == "--help") {
      std::fputs(doctor_usage, stdout);
      return 0;
    } else if (arg == "--gpu") {
      request.gpu = argv[++i];
    } else if (arg == "--root") {
      request.root = argv[++i];
    } else if (!arg.empty() && arg[0] != '-' && !request.controller) {
      request.controller = std::string(arg);
    } else {
      std::fprintf(stderr, "nvme_info --doctor: unexpected argument '%s'\n%s", argv[i], doctor_usage);
      return 2;
    }
  }
  request.process = process_facts::of_this_process();
  try {
    print_answer(stdout, examine(request));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nvme_info --doctor: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace cunvme_doctor
