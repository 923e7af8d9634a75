// The P2P doctor (nvme_info --doctor) against fake sysfs trees: one topology per case, the
// facts it reads through libpci and sysfs, and the verdict per backend and tier.
#include "doctor/report_print.hpp"
#include "fake_machine.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <string>

namespace doc = cunvme_doctor;
using doc::backend;
using doc::outcome;
using doc::tier;

namespace {

constexpr std::uint64_t gib = std::uint64_t{1} << 30, mib = std::uint64_t{1} << 20;
constexpr const char* controller_bdf = "0000:03:00.0";
constexpr const char* gpu_bdf = "0000:04:00.0";

/// A root as root sees it: capabilities readable, pinning not charged to RLIMIT_MEMLOCK.
doc::process_facts privileged() { return {std::nullopt, true, true}; }

doc::doctor_answer examine(const fake::machine& m, std::optional<std::string> controller = std::nullopt,
                           std::optional<std::string> gpu = std::nullopt, doc::process_facts process = privileged()) {
  return doc::examine({m.root, std::move(controller), std::move(gpu), process});
}

bool mentions(const doc::verdict& v, const std::string& text) {
  for (const auto& reason : v.reasons) {
    if (reason.find(text) != std::string::npos) return true;
  }
  return false;
}

/// Topology 1: root port 00:01.0 -> switch (upstream 01:00.0, downstream 02:00.0 and 02:01.0)
/// with the controller (03:00.0) and the GPU (04:00.0, BAR1 `bar1`) below it; no IOMMU.
void switch_topology(fake::machine& m, std::uint64_t bar1 = 64 * gib, const std::string& controller_driver = "") {
  m.add("pci0000:00/0000:00:01.0", fake::port(PCI_EXP_TYPE_ROOT_PORT));
  m.add("pci0000:00/0000:00:01.0/0000:01:00.0", fake::port(PCI_EXP_TYPE_UPSTREAM));
  m.add("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0", fake::port(PCI_EXP_TYPE_DOWNSTREAM, 0));
  m.add("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0", fake::port(PCI_EXP_TYPE_DOWNSTREAM, 0));
  auto ssd = fake::nvme();
  ssd.driver = controller_driver;
  m.add("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0", ssd);
  m.add("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0", fake::gpu(bar1));
  m.hugepages(512, 500);
  m.module("nvidia");
}

}  // namespace

TEST_CASE("under one switch the path is a common switch with every function on the way listed") {
  fake::machine m;
  switch_topology(m);
  const auto answer = examine(m);
  REQUIRE(answer.reports.size() == 1);
  const auto& r = answer.reports[0];
  REQUIRE(r.path);
  CHECK(r.path->route == doc::p2p_route::common_switch);
  CHECK(r.path->common == "0000:01:00.0");
  std::vector<std::string> hops;
  for (const auto& h : r.path->hops) hops.push_back(h.bdf);
  CHECK(hops == std::vector<std::string>{controller_bdf, "0000:02:00.0", "0000:01:00.0", "0000:02:01.0", gpu_bdf});
  CHECK(r.path->redirecting.empty());
  CHECK(r.path->acs_unknown.empty());
  REQUIRE(r.path->hops[1].facts);
  CHECK(r.path->hops[1].facts->type == doc::port_type::switch_downstream);
}

TEST_CASE("the controller's BAR0, link and driver come from its sysfs entry and config space") {
  fake::machine m;
  switch_topology(m, 64 * gib, "nvme");
  const auto c = examine(m).reports.at(0).controller;
  CHECK(c.pci.bdf == controller_bdf);
  CHECK(c.pci.vendor == 0x144d);
  CHECK(c.pci.class_code == doc::nvme_class_code);
  REQUIRE(c.pci.bar_bytes);
  CHECK((*c.pci.bar_bytes)[0] == 16384);
  REQUIRE(c.pci.link);
  CHECK(c.pci.link->speed == 3);
  CHECK(c.pci.link->max_speed == 4);
  CHECK(c.pci.link->width == 4);
  CHECK(c.pci.link->below_max());
  CHECK(c.driver == "nvme");
  CHECK_FALSE(c.group);
}

TEST_CASE("without an IOMMU an unbound controller runs tier 1 on sysfs as root") {
  fake::machine m;
  switch_topology(m);
  const auto r = examine(m).reports.at(0);
  CHECK(r.at(backend::sysfs, tier::one).result == outcome::works);
  CHECK(r.at(backend::vfio, tier::one).result == outcome::not_possible);
  CHECK(mentions(r.at(backend::vfio, tier::one), "IOMMU on"));
}

TEST_CASE("under a common switch kmod can run tiers 2 and 3 once the module is loaded and bound") {
  fake::machine m;
  switch_topology(m);
  const auto r = examine(m).reports.at(0);
  for (tier t : {tier::two, tier::three}) {
    const auto& v = r.at(backend::kmod, t);
    CHECK(v.result == outcome::needs_setup);
    CHECK(mentions(v, "not loaded (insmod kmod/cunvme.ko)"));
    CHECK(mentions(v, "bind cunvme"));
    CHECK(mentions(v, "common switch below 0000:01:00.0"));
  }
}

TEST_CASE("with the module built with nvidia_p2p and the controller bound to it, kmod tier 2 works") {
  fake::machine m;
  switch_topology(m, 64 * gib, "cunvme");
  m.module("cunvme", {{"max_pinned_mb", "16384"}});
  m.module_uses("cunvme", "nvidia");
  const auto r = examine(m).reports.at(0);
  CHECK(r.cunvme_module.loaded);
  CHECK(r.cunvme_module.parameters == std::vector<std::pair<std::string, std::string>>{{"max_pinned_mb", "16384"}});
  CHECK(r.cunvme_uses_nvidia_p2p);
  CHECK(r.at(backend::kmod, tier::two).result == outcome::works);
  CHECK(r.at(backend::kmod, tier::three).result == outcome::works);
}

TEST_CASE("a module that does not hold nvidia was built without nvidia_p2p, and dma-buf is left unchecked") {
  fake::machine m;
  switch_topology(m, 64 * gib, "cunvme");
  m.module("cunvme");
  const auto r = examine(m).reports.at(0);
  CHECK_FALSE(r.cunvme_uses_nvidia_p2p);
  CHECK(r.at(backend::kmod, tier::two).result == outcome::not_checked);
  CHECK(mentions(r.at(backend::kmod, tier::two), "without nvidia_p2p"));
}

TEST_CASE("sysfs and vfio refuse GPU memory and name kmod") {
  fake::machine m;
  switch_topology(m);
  const auto r = examine(m).reports.at(0);
  for (backend b : {backend::sysfs, backend::vfio}) {
    for (tier t : {tier::two, tier::three}) {
      CHECK(r.at(b, t).result == outcome::not_possible);
      CHECK(mentions(r.at(b, t), "only kmod pins GPU memory"));
    }
  }
}

TEST_CASE("doorbells from the GPU are not checked without CUDA, and say what would check them") {
  fake::machine m;
  switch_topology(m);
  const auto v = examine(m).reports.at(0).at(backend::sysfs, tier::doorbells);
  CHECK(v.result == outcome::not_checked);
  CHECK(mentions(v, "cudaHostRegisterIoMemory"));
}

TEST_CASE("under different root ports with ACS redirect set, peer-to-peer goes through the root complex") {
  fake::machine m;
  m.add("pci0000:00/0000:00:01.0", fake::port(PCI_EXP_TYPE_ROOT_PORT, PCI_ACS_CTRL_REQ_RED | PCI_ACS_CTRL_CMPLT_RED | PCI_ACS_CTRL_VALID));
  m.add("pci0000:00/0000:00:02.0", fake::port(PCI_EXP_TYPE_ROOT_PORT, PCI_ACS_CTRL_VALID));
  m.add("pci0000:00/0000:00:01.0/0000:03:00.0", fake::nvme());
  m.add("pci0000:00/0000:00:02.0/0000:04:00.0", fake::gpu(64 * gib));
  m.module("nvidia");
  const auto r = examine(m).reports.at(0);
  REQUIRE(r.path);
  CHECK(r.path->route == doc::p2p_route::root_complex);
  CHECK(r.path->common == "pci0000:00");
  CHECK(r.path->redirecting == std::vector<std::string>{"0000:00:01.0"});
  const auto& v = r.at(backend::kmod, tier::two);
  CHECK(v.result == outcome::needs_setup);  // the module; the path alone would make it "limited"
  CHECK(mentions(v, "goes through the root complex"));
  CHECK(mentions(v, "ACS P2P redirect is enabled on 0000:00:01.0"));
}

TEST_CASE("under different root complexes kmod tier 2 is not possible and tier 1 is suggested") {
  fake::machine m;
  m.add("pci0000:00/0000:00:01.0", fake::port(PCI_EXP_TYPE_ROOT_PORT));
  m.add("pci0000:80/0000:80:01.0", fake::port(PCI_EXP_TYPE_ROOT_PORT));
  m.add("pci0000:00/0000:00:01.0/0000:03:00.0", fake::nvme());
  m.add("pci0000:80/0000:80:01.0/0000:81:00.0", fake::gpu(64 * gib));
  const auto r = examine(m).reports.at(0);
  CHECK(r.path->route == doc::p2p_route::different_root_complexes);
  CHECK(r.at(backend::kmod, tier::two).result == outcome::not_possible);
  CHECK(mentions(r.at(backend::kmod, tier::two), "use tier 1"));
}

TEST_CASE("with the IOMMU translating and the controller on vfio-pci, vfio runs tier 1 and tiers 2 and 3 need kmod") {
  fake::machine n;
  n.iommu("dmar0");
  n.add("pci0000:00/0000:00:01.0", fake::port(PCI_EXP_TYPE_ROOT_PORT));
  auto ssd = fake::nvme();
  ssd.driver = "vfio-pci";
  ssd.iommu_group = "12";
  n.add("pci0000:00/0000:00:01.0/0000:03:00.0", ssd);
  n.group_type("12", "DMA-FQ");
  n.add("pci0000:00/0000:00:02.0", fake::port(PCI_EXP_TYPE_ROOT_PORT));
  auto g = fake::gpu(64 * gib);
  g.iommu_group = "13";
  n.add("pci0000:00/0000:00:02.0/0000:04:00.0", g);
  n.group_type("13", "DMA-FQ");
  n.module("nvidia");
  const auto r = examine(n).reports.at(0);
  REQUIRE(r.controller.group);
  CHECK(r.controller.group->number == "12");
  CHECK(doc::translation_of(r.controller.group) == doc::dma_translation::translated);
  CHECK(r.iommu.enabled());
  CHECK(r.iommu.units == std::vector<std::string>{"dmar0"});
  CHECK(r.at(backend::vfio, tier::one).result == outcome::works);
  CHECK(r.at(backend::vfio, tier::two).result == outcome::not_possible);
  CHECK(mentions(r.at(backend::vfio, tier::two), "VFIO cannot map GPU memory"));
  CHECK(r.at(backend::kmod, tier::two).result != outcome::not_possible);
  CHECK(r.at(backend::sysfs, tier::one).result == outcome::not_possible);
  CHECK(mentions(r.at(backend::sysfs, tier::one), "translates the controller's DMA"));
}

namespace {

/// The controller in IOMMU group 7 of type `type` (with a second endpoint in that group, bound
/// to `neighbour_driver`, where given) and a GPU under another root port.
void grouped_controller(fake::machine& m, const std::string& type, const std::string& controller_driver,
                        const std::string& neighbour_driver = "") {
  m.iommu("dmar0");
  m.add("pci0000:00/0000:00:01.0", fake::port(PCI_EXP_TYPE_ROOT_PORT));
  auto ssd = fake::nvme();
  ssd.driver = controller_driver;
  ssd.iommu_group = "7";
  m.add("pci0000:00/0000:00:01.0/0000:03:00.0", ssd);
  if (!neighbour_driver.empty()) {
    fake::function nic;
    nic.class_code = 0x020000, nic.port_type = PCI_EXP_TYPE_ENDPOINT, nic.driver = neighbour_driver, nic.iommu_group = "7";
    m.add("pci0000:00/0000:00:01.0/0000:03:00.1", nic);
  }
  m.group_type("7", type);
  m.add("pci0000:00/0000:00:02.0", fake::port(PCI_EXP_TYPE_ROOT_PORT));
  m.add("pci0000:00/0000:00:02.0/0000:04:00.0", fake::gpu(64 * gib));
  m.module("nvidia");
}

}  // namespace

TEST_CASE("an identity (passthrough) group leaves DMA untranslated: sysfs works, vfio still can") {
  fake::machine m;
  grouped_controller(m, "identity", "");
  const auto r = examine(m).reports.at(0);
  CHECK(doc::translation_of(r.controller.group) == doc::dma_translation::passthrough);
  CHECK(mentions(r.at(backend::sysfs, tier::one), "untranslated"));
  CHECK(r.at(backend::sysfs, tier::one).result != outcome::not_possible);
  CHECK(r.at(backend::vfio, tier::one).result == outcome::needs_setup);
  CHECK(mentions(r.at(backend::vfio, tier::one), "bind vfio-pci"));
}

TEST_CASE("vfio needs every other device of the controller's group off its driver") {
  fake::machine m;
  grouped_controller(m, "DMA", "vfio-pci", "ixgbe");
  const auto r = examine(m).reports.at(0);
  REQUIRE(r.controller.group);
  CHECK(r.controller.group->members.size() == 2);
  const auto& v = r.at(backend::vfio, tier::one);
  CHECK(v.result == outcome::needs_setup);
  CHECK(mentions(v, "also holds 0000:03:00.1 (driver ixgbe)"));
}

TEST_CASE("a 256 MiB GPU BAR1 limits tiers 2 and 3, and the reason says how much") {
  fake::machine m;
  switch_topology(m, 256 * mib, "cunvme");
  m.module("cunvme");
  m.module_uses("cunvme", "nvidia");
  const auto r = examine(m).reports.at(0);
  REQUIRE(r.gpu);
  CHECK(r.gpu->bar1_bytes() == 256 * mib);
  for (tier t : {tier::two, tier::three}) {
    CHECK(r.at(backend::kmod, t).result == outcome::limited);
    CHECK(mentions(r.at(backend::kmod, t), "BAR1 is 256 MiB"));
  }
  CHECK(r.at(backend::kmod, tier::one).result == outcome::works);
}

TEST_CASE("a large BAR1 is no limit") {
  fake::machine m;
  switch_topology(m, 64 * gib);
  CHECK_FALSE(mentions(examine(m).reports.at(0).at(backend::kmod, tier::two), "BAR1"));
}

TEST_CASE("without an NVMe controller the answer is empty but lists the GPUs") {
  fake::machine m;
  m.add("pci0000:00/0000:00:02.0", fake::port(PCI_EXP_TYPE_ROOT_PORT));
  m.add("pci0000:00/0000:00:02.0/0000:04:00.0", fake::gpu(128 * gib));
  const auto answer = examine(m);
  CHECK(answer.reports.empty());
  REQUIRE(answer.gpus.size() == 1);
  CHECK(answer.gpus[0].pci.bdf == gpu_bdf);
  CHECK(answer.gpus[0].bar1_bytes() == 128 * gib);
  CHECK(answer.gpus[0].driver == "nvidia");
}

TEST_CASE("a GPU whose BAR0 is 64-bit has its BAR1 at resource 2, as a VM presents an H100") {
  // Read on the H100 machine (a Firecracker VM): resource lines 0 (16 MiB, 64-bit), 2 (128 GiB)
  // and 4 (32 MiB); line 1 is BAR0's upper half, empty. nvidia-smi says BAR1 131072 MiB.
  fake::machine m;
  m.add("pci0000:00/0000:00:02.0", fake::port(PCI_EXP_TYPE_ROOT_PORT));
  fake::function g = fake::gpu(0);
  g.bars = {16u << 20, 0, 128 * gib, 0, 32u << 20, 0};
  m.add("pci0000:00/0000:00:02.0/0000:04:00.0", g);
  const auto answer = examine(m);
  REQUIRE(answer.gpus.size() == 1);
  CHECK(answer.gpus[0].bar1_bytes() == 128 * gib);
}

TEST_CASE("a root without a PCI bus is answered as no controller") {
  fake::machine m;
  std::filesystem::remove_all(m.root / "sys");
  const auto answer = examine(m);
  CHECK(answer.reports.empty());
  CHECK(answer.gpus.empty());
}

TEST_CASE("a controller address that does not exist is an error naming it") {
  fake::machine m;
  switch_topology(m);
  CHECK_THROWS_WITH_AS(examine(m, "0000:3f:00.0"), doctest::Contains("0000:3f:00.0: no such PCI device"), cunvme::host::error);
}

TEST_CASE("a controller address in upper case names the same function") {
  fake::machine m;
  switch_topology(m);
  m.add("pci0000:00/0000:00:0a.0", fake::port(PCI_EXP_TYPE_ROOT_PORT));
  m.add("pci0000:00/0000:00:0a.0/0000:0b:00.0", fake::nvme());
  CHECK(examine(m, "0000:0B:00.0").reports.at(0).controller.pci.bdf == "0000:0b:00.0");
}

TEST_CASE("a malformed controller address is an error") {
  fake::machine m;
  switch_topology(m);
  CHECK_THROWS_WITH_AS(examine(m, "3:00.0"), doctest::Contains("not a PCI address"), cunvme::host::error);
}

TEST_CASE("an address that is no NVMe controller is an error giving its class") {
  fake::machine m;
  switch_topology(m);
  CHECK_THROWS_WITH_AS(examine(m, gpu_bdf), doctest::Contains("class 0x030200"), cunvme::host::error);
}

TEST_CASE("a GPU index past the GPUs found is an error") {
  fake::machine m;
  switch_topology(m);
  CHECK_THROWS_WITH_AS(examine(m, std::nullopt, "1"), doctest::Contains("1 found"), cunvme::host::error);
}

TEST_CASE("GPU N is the Nth NVIDIA GPU in PCI bus order, and a BDF names one directly") {
  fake::machine m;
  switch_topology(m);
  m.add("pci0000:00/0000:00:03.0", fake::port(PCI_EXP_TYPE_ROOT_PORT));
  m.add("pci0000:00/0000:00:03.0/0000:05:00.0", fake::gpu(32 * gib));
  m.add("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.1", [] {
    fake::function audio;  // the GPU's HDMI audio function: NVIDIA, but no GPU class
    audio.vendor = 0x10de, audio.class_code = 0x040300, audio.port_type = PCI_EXP_TYPE_ENDPOINT;
    return audio;
  }());
  const auto answer = examine(m, std::nullopt, "1");
  REQUIRE(answer.gpus.size() == 2);
  CHECK(answer.gpus[0].pci.bdf == gpu_bdf);
  CHECK(answer.reports.at(0).gpu->pci.bdf == "0000:05:00.0");
  CHECK(answer.reports.at(0).path->route == doc::p2p_route::root_complex);
  CHECK(examine(m, std::nullopt, "0000:05:00.0").reports.at(0).gpu->index == 1);
}

TEST_CASE("without a GPU the controller's facts are given and every GPU tier says why not") {
  fake::machine m;
  m.add("pci0000:00/0000:00:01.0", fake::port(PCI_EXP_TYPE_ROOT_PORT));
  m.add("pci0000:00/0000:00:01.0/0000:03:00.0", fake::nvme());
  const auto answer = examine(m);
  REQUIRE(answer.reports.size() == 1);
  const auto& r = answer.reports[0];
  CHECK_FALSE(r.gpu);
  CHECK_FALSE(r.path);
  CHECK((*r.controller.pci.bar_bytes)[0] == 16384);
  for (tier t : {tier::doorbells, tier::one}) {
    CHECK(r.at(backend::kmod, t).result == outcome::not_possible);
    CHECK(mentions(r.at(backend::kmod, t), "no NVIDIA GPU found"));
  }
}

TEST_CASE("a GPU not driven by nvidia cannot take part") {
  fake::machine m;
  m.add("pci0000:00/0000:00:01.0", fake::port(PCI_EXP_TYPE_ROOT_PORT));
  m.add("pci0000:00/0000:00:01.0/0000:03:00.0", fake::nvme());
  m.add("pci0000:00/0000:00:02.0", fake::port(PCI_EXP_TYPE_ROOT_PORT));
  m.add("pci0000:00/0000:00:02.0/0000:04:00.0", fake::gpu(64 * gib, "nouveau"));
  const auto v = examine(m).reports.at(0).at(backend::kmod, tier::one);
  CHECK(v.result == outcome::not_possible);
  CHECK(mentions(v, "driven by nouveau"));
}

TEST_CASE("every controller is examined when none is named") {
  fake::machine m;
  switch_topology(m);
  m.add("pci0000:00/0000:00:05.0", fake::port(PCI_EXP_TYPE_ROOT_PORT));
  m.add("pci0000:00/0000:00:05.0/0000:06:00.0", fake::nvme());
  const auto answer = examine(m);
  REQUIRE(answer.reports.size() == 2);
  CHECK(answer.reports[0].controller.pci.bdf == controller_bdf);
  CHECK(answer.reports[1].controller.pci.bdf == "0000:06:00.0");
  CHECK(examine(m, "0000:06:00.0").reports.size() == 1);
}

TEST_CASE("a finite RLIMIT_MEMLOCK without CAP_IPC_LOCK limits tier 1") {
  fake::machine m;
  switch_topology(m, 64 * gib, "vfio-pci");
  const doc::process_facts user{8 * mib, false, true};
  const auto v = examine(m, std::nullopt, std::nullopt, user).reports.at(0).at(backend::kmod, tier::one);
  CHECK(mentions(v, "RLIMIT_MEMLOCK is 8 MiB"));
}

TEST_CASE("without free huge pages sysfs tier 1 is limited to 4 KiB queues") {
  fake::machine m;
  switch_topology(m);
  m.hugepages(16, 0);
  const auto r = examine(m).reports.at(0);
  CHECK(r.hugepages.known);
  CHECK(r.hugepages.total == 16);
  CHECK(r.hugepages.page_bytes == 2 * mib);
  CHECK(r.at(backend::sysfs, tier::one).result == outcome::limited);
  CHECK(mentions(r.at(backend::sysfs, tier::one), "no free huge pages"));
}

TEST_CASE("config space cut to 64 bytes (not root) leaves links and ACS unknown, and says so") {
  fake::machine m;
  m.add("pci0000:00/0000:00:01.0", fake::port(PCI_EXP_TYPE_ROOT_PORT));
  auto ssd = fake::nvme();
  ssd.root_only_config = true;
  m.add("pci0000:00/0000:00:01.0/0000:03:00.0", ssd);
  m.add("pci0000:00/0000:00:01.0/0000:04:00.0", fake::gpu(64 * gib));
  m.module("nvidia");
  const auto r = examine(m).reports.at(0);
  CHECK_FALSE(r.controller.pci.capabilities_readable);
  CHECK_FALSE(r.controller.pci.link);
  CHECK(r.path->acs_unknown == std::vector<std::string>{controller_bdf});
  CHECK(mentions(r.at(backend::kmod, tier::two), "ACS unknown on 1 function(s)"));
}

TEST_CASE("the printed report carries the facts and a verdict line per backend and tier") {
  fake::machine m;
  switch_topology(m, 256 * mib);
  const auto answer = examine(m);
  char* text = nullptr;
  std::size_t size = 0;
  std::FILE* out = ::open_memstream(&text, &size);
  REQUIRE(out != nullptr);
  doc::print_answer(out, answer);
  std::fclose(out);
  const std::string printed(text, size);
  std::free(text);
  CHECK(printed.find("controller 0000:03:00.0  144d:a808  driver none") != std::string::npos);
  CHECK(printed.find("BAR0              16 KiB") != std::string::npos);
  CHECK(printed.find("BAR1 256 MiB") != std::string::npos);
  CHECK(printed.find("PCIe path         common PCIe switch: 0000:01:00.0") != std::string::npos);
  CHECK(printed.find("8 GT/s x4 (max 16 GT/s x4): below what the device can do") != std::string::npos);
  CHECK(printed.find("not checked here (needs CUDA: cudaHostRegister with cudaHostRegisterIoMemory)") != std::string::npos);
  std::size_t verdict_lines = 0;
  for (std::size_t at = printed.find("\n    sysfs  "); at != std::string::npos; at = printed.find("\n    sysfs  ", at + 1)) ++verdict_lines;
  for (std::size_t at = printed.find("\n    kmod   "); at != std::string::npos; at = printed.find("\n    kmod   ", at + 1)) ++verdict_lines;
  CHECK(verdict_lines == 8);
}

TEST_CASE("without a resource file the BAR sizes are unknown, not zero") {
  fake::machine m;
  switch_topology(m);
  std::filesystem::remove(m.root / "sys/bus/pci/devices" / controller_bdf / "resource");
  const auto r = examine(m).reports.at(0);
  CHECK_FALSE(r.controller.pci.bar_bytes);
  CHECK(r.gpu->bar1_bytes() == 64 * gib);
}

TEST_CASE("a function libpci cannot identify (no vendor file) is an error, not an exit") {
  fake::machine m;
  switch_topology(m);
  std::filesystem::remove(m.root / "sys/bus/pci/devices" / gpu_bdf / "vendor");
  CHECK_THROWS_WITH_AS(examine(m), doctest::Contains("libpci: Cannot open"), std::runtime_error);
}
