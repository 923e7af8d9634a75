// Usage snippets of the spec layer (include/cunvme/spec/) and detail/checked.cuh, compiled and
// run by `meson test` (suite `snippets`) so they cannot drift from the headers. Each function
// is the snippet a header's comment points to by name; main runs them all and checks what
// their comments promise.
#include "snippet_check.hpp"

#include <cunvme/detail/checked.cuh>
#include <cunvme/spec/bit_field.cuh>
#include <cunvme/spec/identify.cuh>
#include <cunvme/spec/log_page.cuh>
#include <cunvme/spec/opcodes.cuh>
#include <cunvme/spec/queue_entry.cuh>
#include <cunvme/spec/status.cuh>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace spec = cunvme::spec;

namespace {

using snippet::expect;

// ---- detail/checked.cuh ------------------------------------------------------------------------

/// `mul_overflows`: a size from two caller values, refused rather than wrapped.
bool bytes_of(std::uint64_t blocks, std::uint64_t block_size, std::uint64_t& bytes) {
  if (cunvme::detail::mul_overflows(blocks, block_size, bytes)) return false;  // report an error instead
  return true;
}

// ---- spec/bit_field.cuh ------------------------------------------------------------------------

/// `bit_field`: a field of a raw register word, read and written without touching the others.
std::uint64_t mqes_field(std::uint64_t cap_raw) {
  using mqes = spec::bit_field<std::uint64_t, 0, 16, std::uint16_t>;
  const auto n = mqes::get(cap_raw);  // 0-based queue entries
  cap_raw = mqes::set(cap_raw, 2047);  // other bits untouched
  expect(mqes::get(cap_raw) == 2047, "bit_field set");
  return n;
}

// ---- spec/queue_entry.cuh ----------------------------------------------------------------------

/// `submission_entry`: a Read of one block into a buffer at `bus`.
spec::submission_entry read_command(std::uint64_t bus) {
  spec::submission_entry sqe{};
  sqe.set_opcode(spec::nvm_opcode::read).set_cid(7);
  sqe.nsid = 1;
  sqe.prp1 = bus;
  return sqe;
}

/// `completion_entry`: a CQE is read only once its phase matches the consumer's.
bool completion_for(const spec::completion_entry& cqe, bool expected_phase, std::uint16_t& cid, spec::status& s) {
  if (cqe.phase() != expected_phase) return false;  // not posted yet
  s = cqe.status();
  cid = cqe.cid;
  return true;
}

// ---- spec/status.cuh ---------------------------------------------------------------------------

/// `status`: compare with the enum, print with `to_string`.
std::string describe(const spec::completion_entry& cqe) {
  const spec::status s = cqe.status();
  if (s == spec::status::lba_out_of_range) return "past the namespace: " + spec::to_string(s);  // "LBA Out of Range (0/0x80)"
  if (!spec::is_success(s)) return spec::to_string(s);
  return "ok";
}

/// `make_status`: SCT and SC as the spec's figures give them.
static_assert(spec::make_status(spec::status_code_type::generic, 0x80) == spec::status::lba_out_of_range);

/// `status_names`: the whole table.
std::size_t count_status_names() {
  std::size_t n = 0;
  for (auto [value, text] : spec::status_names()) n += text != nullptr && std::string_view(spec::name(value)) == text;
  return n;
}

/// `name`: never null, so it can go straight into a message (host or kernel printf).
void print_failure(const spec::completion_entry& cqe) { std::printf("read failed: %s\n", spec::name(cqe.status())); }

/// `cqe_status`: the raw 16-bit status field, decoded without a completion_entry.
bool posted_with_dnr(const spec::completion_entry* cq, std::uint32_t head, bool expected_phase) {
  const auto word = cq[head].status_field;
  return spec::cqe_status::phase(word) == expected_phase && spec::cqe_status::dnr(word);
}

/// `make_status_field`: phase bit 0, status in bits 15:1, DNR bit 15.
static_assert(spec::cqe_status::make_status_field(spec::status::lba_out_of_range, /*phase=*/true, /*dnr=*/true) == 0x8101);

// ---- spec/identify.cuh -------------------------------------------------------------------------

/// `identify_cns`: CDW10 of an Identify command.
std::uint32_t identify_controller_cdw10() { return static_cast<std::uint32_t>(spec::identify_cns::controller); }

/// `lba_format`: 4096-byte blocks with 8 bytes of metadata.
std::uint64_t lba_format_block() {
  spec::lba_format f{};
  f.set_ms(8).set_lbads(12).set_rp(0);
  return f.lba_data_size_bytes();  // 4096
}

/// `power_state_descriptor`: the budget of power state 0.
std::uint32_t power_budget(const spec::identify_controller& id) {
  std::uint32_t budget_uw = 0;
  const auto& ps0 = id.psd[0];
  if (!ps0.non_operational()) budget_uw = ps0.max_power_microwatts();
  return budget_uw;
}

/// `identify_controller` (filled by Identify, CNS 01h) and `trimmed`.
std::string controller_summary(const spec::identify_controller& id) {
  const auto max_bytes = id.mdts_bytes(4096);  // 0: no limit
  const bool shadow = id.supports_doorbell_buffer_config();
  const std::string model = spec::trimmed(id.mn);
  const std::string serial = spec::trimmed(id.sn);
  return model + " " + serial + " mdts " + std::to_string(max_bytes) + (shadow ? " shadow doorbells" : "");
}

/// `identify_namespace` (filled by Identify, CNS 00h, NSID 1).
std::uint64_t namespace_bytes(const spec::identify_namespace& ns) {
  const auto block = ns.lba_size_bytes();  // 512 or 4096 on most drives
  return ns.nsze * block;
}

/// `active_namespace_list` (filled by Identify, CNS 02h, NSID 0).
std::vector<std::uint32_t> active_namespaces(const spec::active_namespace_list& list) {
  std::vector<std::uint32_t> nsids;
  for (std::uint32_t i = 0; i < list.count(); ++i) nsids.push_back(list.nsid[i]);
  return nsids;
}

// ---- spec/log_page.cuh -------------------------------------------------------------------------

/// `get_log_page_dwords`: the dwords of a Get Log Page command.
spec::submission_entry error_log_command(const spec::identify_controller& id) {
  spec::submission_entry sqe{};
  const auto dw = spec::get_log_page_dwords::for_log(spec::log_page_id::error_information, id.error_log_page_entries() * 64);
  sqe.cdw10 = dw.cdw10;
  sqe.cdw11 = dw.cdw11;
  sqe.cdw12 = dw.cdw12;
  sqe.cdw13 = dw.cdw13;
  sqe.cdw14 = dw.cdw14;
  return sqe;
}

/// `error_information_log_entry`: entries until the first empty one.
std::size_t report_errors(const std::vector<spec::error_information_log_entry>& entries) {
  std::size_t n = 0;
  for (const auto& e : entries) {
    if (!e.valid()) break;
    std::printf("sq %u cid %u: SCT %u SC 0x%02x, byte %u\n", e.sqid, e.cid, e.status_code_type(), e.status_code(), e.parameter_error_byte());
    ++n;
  }
  return n;
}

/// `u128_le` and `data_units`: SMART counters.
std::uint64_t data_units_read(std::uint64_t blocks_read) {
  spec::u128_le reads{};
  reads.add(spec::data_units(blocks_read));
  return reads.fits_in_64_bits() ? reads.low64() : ~std::uint64_t{0};
}

/// `smart_health_information_log` (Get Log Page, LID 02h, NSID FFFFFFFFh, 512 bytes).
std::uint64_t written_bytes_upper_bound(const spec::smart_health_information_log& log) {
  if (log.critical_warning != 0) std::printf("warning at %d °C\n", static_cast<int>(log.composite_temperature_kelvin()) - 273);
  return log.data_units_written.low64() * 1000 * 512;
}

}  // namespace

int main() {
  std::uint64_t bytes = 0;
  expect(bytes_of(8, 512, bytes) && bytes == 4096, "mul_overflows fits");
  expect(!bytes_of(~std::uint64_t{0}, 2, bytes), "mul_overflows refuses a wrap");
  expect(mqes_field(0xffffull) == 0xffff, "bit_field get");

  const spec::submission_entry sqe = read_command(0x10000);
  expect(sqe.prp1 == 0x10000 && sqe.nsid == 1, "read command");
  spec::completion_entry cqe{};
  cqe.cid = 7;
  cqe.status_field = spec::cqe_status::make_status_field(spec::status::lba_out_of_range, true, true);
  std::uint16_t cid = 0;
  spec::status s{};
  expect(!completion_for(cqe, false, cid, s) && completion_for(cqe, true, cid, s) && cid == 7, "completion_for");
  expect(describe(cqe) == "past the namespace: LBA Out of Range (0/0x80)", "describe");
  print_failure(cqe);
  expect(posted_with_dnr(&cqe, 0, true), "cqe_status");
  expect(count_status_names() == spec::status_names().size(), "status_names");

  expect(identify_controller_cdw10() == 1, "identify_cns");
  expect(lba_format_block() == 4096, "lba_format");
  spec::identify_controller id{};
  std::memcpy(id.mn, "cunvme snippet   ", 16);
  std::memcpy(id.sn, "42  ", 4);
  expect(controller_summary(id).rfind("cunvme snippet 42", 0) == 0, "identify_controller");
  (void)power_budget(id);
  spec::identify_namespace ns{};
  ns.nsze = 8;
  expect(namespace_bytes(ns) == 8 * ns.lba_size_bytes(), "identify_namespace");
  spec::active_namespace_list list{};
  list.nsid[0] = 1;
  list.nsid[1] = 3;
  expect(active_namespaces(list) == std::vector<std::uint32_t>{1, 3}, "active_namespace_list");

  (void)error_log_command(id);
  expect(report_errors(std::vector<spec::error_information_log_entry>(2)) == 0, "error log");
  expect(data_units_read(1001) == 2, "data_units");
  spec::smart_health_information_log log{};
  expect(written_bytes_upper_bound(log) == 0, "smart log");
  return snippet::finish("spec");
}
