// decode — print NVMe register values and completion statuses field by field.
//
//   build/examples/decode                     decode a sample (QEMU 7.2's registers)
//   build/examples/decode cap 0x004018200f0107ff csts 0x1 status 0x8101
//
// Useful when reading a driver log: every field is decoded with cunvme's spec headers, the
// same ones the emulator and the device-side readers use.
#include <cunvme/spec/registers.cuh>
#include <cunvme/spec/status.cuh>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace spec = cunvme::spec;

namespace {

void print_cap(std::uint64_t raw) {
  const spec::cap_register cap{raw};
  std::printf("CAP    0x%016llx\n", static_cast<unsigned long long>(raw));
  std::printf("  MQES   %u (queues of up to %u entries)\n", cap.mqes(), cap.max_queue_entries());
  std::printf("  CQR    %d (physically contiguous queues %s)\n", cap.cqr(), cap.cqr() ? "required" : "not required");
  std::printf("  AMS    0x%x\n", cap.ams());
  std::printf("  TO     %u (%u ms for CSTS.RDY to follow CC.EN)\n", cap.to(), cap.timeout_ms());
  std::printf("  DSTRD  %u (doorbells %u bytes apart)\n", cap.dstrd(), cap.doorbell_stride());
  std::printf("  NSSRS  %d\n", cap.nssrs());
  std::printf("  CSS    0x%02x (NVM command set %s)\n", cap.css(), cap.supports(spec::cap_css::nvm_command_set) ? "yes" : "no");
  std::printf("  BPS    %d\n", cap.bps());
  std::printf("  MPSMIN %u (%llu bytes)\n", cap.mpsmin(), static_cast<unsigned long long>(cap.min_page_size()));
  std::printf("  MPSMAX %u (%llu bytes)\n", cap.mpsmax(), static_cast<unsigned long long>(cap.max_page_size()));
  std::printf("  PMRS   %d\n", cap.pmrs());
  std::printf("  CMBS   %d\n", cap.cmbs());
}

void print_vs(std::uint64_t raw) {
  const spec::version_register vs{static_cast<std::uint32_t>(raw)};
  std::printf("VS     0x%08x (NVMe %u.%u.%u)\n", vs.raw, vs.mjr(), vs.mnr(), vs.ter());
}

void print_cc(std::uint64_t raw) {
  const spec::cc_register cc{static_cast<std::uint32_t>(raw)};
  std::printf("CC     0x%08x\n", cc.raw);
  std::printf("  EN     %d\n  CSS    %u\n  MPS    %u (%llu-byte pages)\n  AMS    %u\n  SHN    %u\n"
              "  IOSQES %u (%u bytes)\n  IOCQES %u (%u bytes)\n  CRIME  %d\n",
              cc.en(), static_cast<unsigned>(cc.css()), cc.mps(), static_cast<unsigned long long>(cc.page_size()),
              static_cast<unsigned>(cc.ams()), static_cast<unsigned>(cc.shn()), cc.iosqes(), 1u << cc.iosqes(),
              cc.iocqes(), 1u << cc.iocqes(), cc.crime());
}

void print_csts(std::uint64_t raw) {
  const spec::csts_register csts{static_cast<std::uint32_t>(raw)};
  std::printf("CSTS   0x%08x\n  RDY    %d\n  CFS    %d%s\n  SHST   %u\n  NSSRO  %d\n  PP     %d\n", csts.raw, csts.rdy(),
              csts.cfs(), csts.cfs() ? " (controller fatal status: reset it)" : "", static_cast<unsigned>(csts.shst()),
              csts.nssro(), csts.pp());
}

void print_aqa(std::uint64_t raw) {
  const spec::aqa_register aqa{static_cast<std::uint32_t>(raw)};
  std::printf("AQA    0x%08x (admin SQ %u entries, admin CQ %u entries)\n", aqa.raw, aqa.asqs() + 1u, aqa.acqs() + 1u);
}

void print_status(std::uint64_t raw) {
  const auto word = static_cast<std::uint16_t>(raw);
  std::printf("status 0x%04x: %s, phase %d, DNR %d, M %d, CRD %u\n", word,
              spec::to_string(spec::cqe_status::status_of(word)).c_str(), spec::cqe_status::phase(word),
              spec::cqe_status::dnr(word), spec::cqe_status::more(word), spec::cqe_status::crd(word));
}

struct decoder {
  std::string_view name;
  void (*print)(std::uint64_t);
};
constexpr decoder decoders[] = {
    {"cap", print_cap}, {"vs", print_vs}, {"cc", print_cc}, {"csts", print_csts}, {"aqa", print_aqa}, {"status", print_status},
};

int usage(const char* self) {
  std::fprintf(stderr, "usage: %s [cap|vs|cc|csts|aqa|status VALUE]...\n", self);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 1) {
    std::puts("QEMU 7.2's NVMe controller after Linux enabled it:");
    print_cap(0x004018200f0107ffull);
    print_vs(0x00010400);
    print_cc(0x00460001);
    print_csts(0x1);
    print_aqa(0x001f001f);
    std::puts("A read past the end of the namespace completes with:");
    print_status(0x8101);
    return 0;
  }
  if (argc % 2 != 1) return usage(argv[0]);
  for (int i = 1; i < argc; i += 2) {
    const std::string_view what = argv[i];
    char* end = nullptr;
    const unsigned long long value = std::strtoull(argv[i + 1], &end, 0);
    if (end == argv[i + 1] || *end != '\0') {
      std::fprintf(stderr, "%s: '%s' is not a number\n", argv[0], argv[i + 1]);
      return 2;
    }
    bool known = false;
    for (const auto& d : decoders) {
      if (d.name == what) {
        d.print(value);
        known = true;
      }
    }
    if (!known) {
      std::fprintf(stderr, "%s: unknown register '%s'\n", argv[0], argv[i]);
      return usage(argv[0]);
    }
  }
  return 0;
}
