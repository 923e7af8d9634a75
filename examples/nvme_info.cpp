// nvme_info — a controller's registers, identify data and namespaces, for any backend:
//
//   build/examples/nvme_info emu                      the embedded emulator
//   build/examples/nvme_info sysfs:0000:01:00.0       a controller unbound from the kernel
//   build/examples/nvme_info --doctor [BDF] [--gpu N]  which tier each backend can use here, and why
//
// Like `nvme show-regs`, `nvme id-ctrl` and `nvme id-ns` together, through cunvme's own
// bring-up (which resets the controller).
// The static build the QEMU guests run has no libpci (Debian ships no static libpci or
// libudev), so it leaves the doctor out.
#ifndef NVME_INFO_WITHOUT_DOCTOR
#include "doctor/doctor_cli.hpp"
#endif

#include <cunvme/host/open.cuh>

#include <cstdio>
#include <string_view>

namespace host = cunvme::host;
namespace spec = cunvme::spec;

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "--doctor") {
#ifndef NVME_INFO_WITHOUT_DOCTOR
    return cunvme_doctor::doctor_main(argc - 2, argv + 2);
#else
    std::fprintf(stderr, "nvme_info: this build has no --doctor (built static, without libpci); use build/examples/nvme_info\n");
    return 2;
#endif
  }
  const char* uri = argc > 1 ? argv[1] : "emu";
  std::unique_ptr<host::controller> ctrl;
  try {
    ctrl = host::open(uri);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nvme_info: %s\n", e.what());
    return 1;
  }
  auto& regs = ctrl->backend();
  const auto cap = ctrl->cap();
  const auto reg = [&](spec::register_offset r) { return regs.read32(spec::to_underlying(r)); };
  std::printf("controller %s\n", ctrl->name().c_str());
  std::printf("registers\n");
  std::printf("  CAP     0x%016llx  MQES %u  CQR %d  TO %u (%u ms)  DSTRD %u  CSS 0x%02x  MPSMIN %u  MPSMAX %u  CMBS %d  PMRS %d\n",
              static_cast<unsigned long long>(cap.raw), cap.mqes(), cap.cqr(), cap.to(), cap.timeout_ms(), cap.dstrd(), cap.css(),
              cap.mpsmin(), cap.mpsmax(), cap.cmbs(), cap.pmrs());
  const auto vs = ctrl->version();
  std::printf("  VS      0x%08x  NVMe %u.%u.%u\n", vs.raw, vs.mjr(), vs.mnr(), vs.ter());
  const spec::cc_register cc{reg(spec::register_offset::cc)};
  std::printf("  CC      0x%08x  EN %d  MPS %u  IOSQES %u  IOCQES %u  SHN %u\n", cc.raw, cc.en(), cc.mps(), cc.iosqes(), cc.iocqes(),
              static_cast<unsigned>(cc.shn()));
  const auto csts = ctrl->csts();
  std::printf("  CSTS    0x%08x  RDY %d  CFS %d  SHST %u\n", csts.raw, csts.rdy(), csts.cfs(), static_cast<unsigned>(csts.shst()));
  const spec::aqa_register aqa{reg(spec::register_offset::aqa)};
  std::printf("  AQA     0x%08x  ASQS %u  ACQS %u\n", aqa.raw, aqa.asqs() + 1u, aqa.acqs() + 1u);
  std::printf("  CMBLOC  0x%08x  CMBSZ 0x%08x\n", reg(spec::register_offset::cmbloc), reg(spec::register_offset::cmbsz));

  const auto& id = ctrl->identify();
  std::printf("identify controller\n");
  std::printf("  VID 0x%04x  SSVID 0x%04x  CNTLID %u\n", id.vid, id.ssvid, id.cntlid);
  std::printf("  SN  %s\n  MN  %s\n  FR  %s\n", spec::trimmed(id.sn).c_str(), spec::trimmed(id.mn).c_str(), spec::trimmed(id.fr).c_str());
  std::printf("  VER 0x%08x  MDTS %u (%llu bytes per command)\n", id.ver, id.mdts,
              static_cast<unsigned long long>(ctrl->max_transfer_bytes()));
  std::printf("  OACS 0x%04x (Doorbell Buffer Config %s)  ONCS 0x%04x (DSM %s, Write Zeroes %s)  VWC 0x%02x\n", id.oacs,
              id.supports_doorbell_buffer_config() ? "yes" : "no", id.oncs, id.supports_dataset_management() ? "yes" : "no",
              id.supports_write_zeroes() ? "yes" : "no", id.vwc);
  std::printf("  SQES 0x%02x  CQES 0x%02x  NN %u  SGLS 0x%08x  ACL %u  AERL %u  ELPE %u\n", id.sqes, id.cqes, id.nn, id.sgls, id.acl + 1u,
              id.aerl + 1u, id.elpe + 1u);
  std::printf("  SUBNQN %s\n", spec::trimmed(id.subnqn).c_str());
  std::printf("  I/O queue pairs granted: %u\n", ctrl->io_queue_pairs_granted());
  std::printf("namespaces\n");
  for (const auto& ns : ctrl->namespaces()) {
    std::printf("  nsid %u: %llu blocks of %u bytes (%.1f MiB)", ns.nsid, static_cast<unsigned long long>(ns.lba_count), ns.lba_size,
                static_cast<double>(ns.bytes()) / (1 << 20));
    if (ns.metadata_size != 0) {
      std::printf(", %u bytes of metadata per block (%s)", ns.metadata_size, ns.extended_lba ? "extended LBAs" : "separate buffer, MPTR");
    }
    if (ns.protection_type != 0) std::printf(", protection information type %u (not supported by cunvme)", ns.protection_type);
    std::printf("\n");
  }
  return 0;
}
