#include <cunvme/spec/registers.cuh>

#include <doctest/doctest.h>

#include <cstdint>

namespace spec = cunvme::spec;


TEST_CASE("QEMU 7.2's CAP decodes to its documented capabilities") {
  constexpr spec::cap_register cap{0x004018200f0107ffull};
  static_assert(cap.mqes() == 2047);
  static_assert(cap.max_queue_entries() == 2048);
  static_assert(cap.cqr());
  static_assert(cap.ams() == 0);
  static_assert(cap.to() == 15);
  static_assert(cap.timeout_ms() == 7500);
  static_assert(cap.dstrd() == 0);
  static_assert(cap.doorbell_stride() == 4);
  static_assert(!cap.nssrs());
  static_assert(cap.css() == 0xc1);
  static_assert(cap.supports(spec::cap_css::nvm_command_set));
  static_assert(cap.supports(spec::cap_css::io_command_sets));
  static_assert(cap.supports(spec::cap_css::no_io_command_set));
  static_assert(!cap.bps());
  static_assert(cap.mpsmin() == 0);
  static_assert(cap.mpsmax() == 4);
  static_assert(cap.min_page_size() == 4096);
  static_assert(cap.max_page_size() == 65536);
  static_assert(!cap.pmrs());
  static_assert(!cap.cmbs());
  CHECK(cap.raw == 0x004018200f0107ffull);
}

TEST_CASE("every CAP field round-trips through its setter without touching other bits") {
  auto check = [](auto set, auto get, auto value, std::uint64_t mask) {
    for (std::uint64_t background : {std::uint64_t{0}, ~std::uint64_t{0}}) {
      spec::cap_register r{background};
      set(r, value);
      CHECK(get(r) == value);
      CHECK((r.raw & ~mask) == (background & ~mask));
    }
  };
  using c = spec::cap_register;
  check([](c& r, auto v) { r.set_mqes(v); }, [](const c& r) { return r.mqes(); }, std::uint16_t{0x1234}, c::mqes_field::mask);
  check([](c& r, auto v) { r.set_cqr(v); }, [](const c& r) { return r.cqr(); }, false, c::cqr_field::mask);
  check([](c& r, auto v) { r.set_cqr(v); }, [](const c& r) { return r.cqr(); }, true, c::cqr_field::mask);
  check([](c& r, auto v) { r.set_ams(v); }, [](const c& r) { return r.ams(); }, std::uint8_t{2}, c::ams_field::mask);
  check([](c& r, auto v) { r.set_to(v); }, [](const c& r) { return r.to(); }, std::uint8_t{0x5a}, c::to_field::mask);
  check([](c& r, auto v) { r.set_dstrd(v); }, [](const c& r) { return r.dstrd(); }, std::uint8_t{9}, c::dstrd_field::mask);
  check([](c& r, auto v) { r.set_nssrs(v); }, [](const c& r) { return r.nssrs(); }, false, c::nssrs_field::mask);
  check([](c& r, auto v) { r.set_css(v); }, [](const c& r) { return r.css(); }, std::uint8_t{0x41}, c::css_field::mask);
  check([](c& r, auto v) { r.set_bps(v); }, [](const c& r) { return r.bps(); }, false, c::bps_field::mask);
  check([](c& r, auto v) { r.set_mpsmin(v); }, [](const c& r) { return r.mpsmin(); }, std::uint8_t{3}, c::mpsmin_field::mask);
  check([](c& r, auto v) { r.set_mpsmax(v); }, [](const c& r) { return r.mpsmax(); }, std::uint8_t{0xc}, c::mpsmax_field::mask);
  check([](c& r, auto v) { r.set_pmrs(v); }, [](const c& r) { return r.pmrs(); }, false, c::pmrs_field::mask);
  check([](c& r, auto v) { r.set_cmbs(v); }, [](const c& r) { return r.cmbs(); }, false, c::cmbs_field::mask);
  check([](c& r, auto v) { r.set_cmbs(v); }, [](const c& r) { return r.cmbs(); }, true, c::cmbs_field::mask);
}

TEST_CASE("CAP fields sit at the bit positions of Figure 36") {
  using c = spec::cap_register;
  static_assert(c::mqes_field::mask == 0x000000000000ffffull);
  static_assert(c::cqr_field::mask == 0x0000000000010000ull);
  static_assert(c::ams_field::mask == 0x0000000000060000ull);
  static_assert(c::to_field::mask == 0x00000000ff000000ull);
  static_assert(c::dstrd_field::mask == 0x0000000f00000000ull);
  static_assert(c::nssrs_field::mask == 0x0000001000000000ull);
  static_assert(c::css_field::mask == 0x00001fe000000000ull);
  static_assert(c::bps_field::mask == 0x0000200000000000ull);
  static_assert(c::mpsmin_field::mask == 0x000f000000000000ull);
  static_assert(c::mpsmax_field::mask == 0x00f0000000000000ull);
  static_assert(c::pmrs_field::mask == 0x0100000000000000ull);
  static_assert(c::cmbs_field::mask == 0x0200000000000000ull);
  CHECK((c::mqes_field::mask | c::cqr_field::mask | c::ams_field::mask | c::to_field::mask | c::dstrd_field::mask |
         c::nssrs_field::mask | c::css_field::mask | c::bps_field::mask | c::mpsmin_field::mask | c::mpsmax_field::mask |
         c::pmrs_field::mask | c::cmbs_field::mask) == 0x03ff3fffff07ffffull);
}

TEST_CASE("doorbells follow the stride formula of section 3.1.3") {
  static_assert(spec::sq_tail_doorbell_offset(0, 0) == 0x1000);
  static_assert(spec::cq_head_doorbell_offset(0, 0) == 0x1004);
  static_assert(spec::sq_tail_doorbell_offset(1, 0) == 0x1008);
  static_assert(spec::cq_head_doorbell_offset(1, 0) == 0x100c);
  // DSTRD 2: doorbells 16 bytes apart.
  static_assert(spec::sq_tail_doorbell_offset(3, 2) == 0x1000 + 6 * 16);
  static_assert(spec::cq_head_doorbell_offset(3, 2) == 0x1000 + 7 * 16);
  static_assert(spec::bar_bytes_for_queues(64, 0) == 0x1000 + 129 * 4 + 4);
  static_assert(spec::bar_bytes_for_queues(65535, 15) == 0x1000 + 131071ull * (4u << 15) + 4);  // past 32 bits
  static_assert(spec::bar_bytes_for_queues(3, 2) == spec::cq_head_doorbell_offset(3, 2) + 4);
  static_assert(spec::max_qid_in_bar(spec::bar_bytes_for_queues(3, 10), 10) == 3);
  static_assert(spec::max_qid_in_bar(spec::bar_bytes_for_queues(3, 10) - 1, 10) == 2);
  static_assert(spec::max_qid_in_bar(spec::bar_bytes_for_queues(64, 0), 0) == 64);
  static_assert(spec::max_qid_in_bar(spec::bar_bytes_for_queues(64, 0) - 1, 0) == 63);
  static_assert(spec::max_qid_in_bar(0x1000 + 8, 0) == 0);
  static_assert(spec::max_qid_in_bar(0x1000 + 7, 0) == -1);
  static_assert(spec::max_qid_in_bar(0x1000 + 8, 1) == -1);
  static_assert(spec::max_qid_in_bar(0x800, 0) == -1);
  CHECK(spec::doorbell_stride_bytes(3) == 32);
}

TEST_CASE("VS encodes major, minor and tertiary versions and orders them") {
  constexpr auto v14 = spec::version_register{0x00010400};
  static_assert(v14.mjr() == 1 && v14.mnr() == 4 && v14.ter() == 0);
  static_assert(spec::version_register::make(2, 0, 1).raw == 0x00020001);
  static_assert(v14.at_least(1, 3));
  static_assert(v14.at_least(1, 4));
  static_assert(!v14.at_least(2, 0));
  CHECK(spec::version_register::make(1, 4).raw == v14.raw);
}

TEST_CASE("the CC value Linux writes decodes to 64/16-byte entries, 4 KiB pages, enabled") {
  constexpr spec::cc_register cc{0x00460001};
  static_assert(cc.en());
  static_assert(cc.css() == spec::cc_css::nvm_command_set);
  static_assert(cc.mps() == 0 && cc.page_size() == 4096);
  static_assert(cc.ams() == spec::cc_ams::round_robin);
  static_assert(cc.shn() == spec::shutdown_notification::none);
  static_assert(cc.iosqes() == 6);
  static_assert(cc.iocqes() == 4);
  static_assert(!cc.crime());
  constexpr auto built = spec::cc_register{}.set_iosqes(6).set_iocqes(4).set_en(true);
  static_assert(built.raw == cc.raw);
  CHECK(cc.raw == 0x00460001u);
}

TEST_CASE("every CC field round-trips through its setter without touching other bits") {
  auto check = [](auto set, auto get, auto value, std::uint32_t mask) {
    for (std::uint32_t background : {0u, ~0u}) {
      spec::cc_register r{background};
      set(r, value);
      CHECK(get(r) == value);
      CHECK((r.raw & ~mask) == (background & ~mask));
    }
  };
  using c = spec::cc_register;
  check([](c& r, auto v) { r.set_en(v); }, [](const c& r) { return r.en(); }, true, c::en_field::mask);
  check([](c& r, auto v) { r.set_en(v); }, [](const c& r) { return r.en(); }, false, c::en_field::mask);
  check([](c& r, auto v) { r.set_css(v); }, [](const c& r) { return r.css(); }, spec::cc_css::all_supported_io_command_sets, c::css_field::mask);
  check([](c& r, auto v) { r.set_mps(v); }, [](const c& r) { return r.mps(); }, std::uint8_t{4}, c::mps_field::mask);
  check([](c& r, auto v) { r.set_ams(v); }, [](const c& r) { return r.ams(); }, spec::cc_ams::weighted_round_robin_with_urgent, c::ams_field::mask);
  check([](c& r, auto v) { r.set_shn(v); }, [](const c& r) { return r.shn(); }, spec::shutdown_notification::abrupt, c::shn_field::mask);
  check([](c& r, auto v) { r.set_shn(v); }, [](const c& r) { return r.shn(); }, spec::shutdown_notification::normal, c::shn_field::mask);
  check([](c& r, auto v) { r.set_iosqes(v); }, [](const c& r) { return r.iosqes(); }, std::uint8_t{6}, c::iosqes_field::mask);
  check([](c& r, auto v) { r.set_iocqes(v); }, [](const c& r) { return r.iocqes(); }, std::uint8_t{4}, c::iocqes_field::mask);
  check([](c& r, auto v) { r.set_crime(v); }, [](const c& r) { return r.crime(); }, true, c::crime_field::mask);
}

TEST_CASE("CC fields sit at the bit positions of Figure 41") {
  using c = spec::cc_register;
  static_assert(c::en_field::mask == 0x00000001u);
  static_assert(c::css_field::mask == 0x00000070u);
  static_assert(c::mps_field::mask == 0x00000780u);
  static_assert(c::ams_field::mask == 0x00003800u);
  static_assert(c::shn_field::mask == 0x0000c000u);
  static_assert(c::iosqes_field::mask == 0x000f0000u);
  static_assert(c::iocqes_field::mask == 0x00f00000u);
  static_assert(c::crime_field::mask == 0x01000000u);
  CHECK((c::en_field::mask | c::css_field::mask | c::mps_field::mask | c::ams_field::mask | c::shn_field::mask |
         c::iosqes_field::mask | c::iocqes_field::mask | c::crime_field::mask) == 0x01fffff1u);
}

TEST_CASE("CSTS decodes ready, fatal and shutdown states and round-trips every field") {
  constexpr spec::csts_register ready_and_shut_down{0x9};
  static_assert(ready_and_shut_down.rdy());
  static_assert(!ready_and_shut_down.cfs());
  static_assert(ready_and_shut_down.shst() == spec::shutdown_status::shutdown_complete);
  static_assert(spec::csts_register{0x2}.cfs());
  static_assert(spec::csts_register{0x4}.shst() == spec::shutdown_status::shutdown_processing);
  static_assert(spec::csts_register{0x10}.nssro());
  static_assert(spec::csts_register{0x20}.pp());
  static_assert(spec::csts_register{0x40}.st());

  auto check = [](auto set, auto get, auto value, std::uint32_t mask) {
    for (std::uint32_t background : {0u, ~0u}) {
      spec::csts_register r{background};
      set(r, value);
      CHECK(get(r) == value);
      CHECK((r.raw & ~mask) == (background & ~mask));
    }
  };
  using c = spec::csts_register;
  check([](c& r, auto v) { r.set_rdy(v); }, [](const c& r) { return r.rdy(); }, true, c::rdy_field::mask);
  check([](c& r, auto v) { r.set_cfs(v); }, [](const c& r) { return r.cfs(); }, true, c::cfs_field::mask);
  check([](c& r, auto v) { r.set_shst(v); }, [](const c& r) { return r.shst(); }, spec::shutdown_status::shutdown_complete, c::shst_field::mask);
  check([](c& r, auto v) { r.set_nssro(v); }, [](const c& r) { return r.nssro(); }, false, c::nssro_field::mask);
  check([](c& r, auto v) { r.set_pp(v); }, [](const c& r) { return r.pp(); }, true, c::pp_field::mask);
  check([](c& r, auto v) { r.set_st(v); }, [](const c& r) { return r.st(); }, false, c::st_field::mask);
}

TEST_CASE("AQA holds 0-based admin queue sizes in 12-bit fields") {
  constexpr spec::aqa_register linux_aqa{0x001f001f};
  static_assert(linux_aqa.asqs() == 31 && linux_aqa.acqs() == 31);
  static_assert(spec::aqa_register{}.set_asqs(4095).set_acqs(1).raw == 0x00010fffu);
  static_assert(spec::aqa_register::asqs_field::mask == 0x00000fffu);
  static_assert(spec::aqa_register::acqs_field::mask == 0x0fff0000u);
  static_assert(!spec::aqa_register::asqs_field::fits(4096));
  CHECK(spec::max_admin_queue_entries == 4096);
}

TEST_CASE("CMBLOC and CMBSZ decode a 64 MiB CMB in BAR2 with queue and list support") {
  // QEMU's nvme device with cmb_size_mb=64: CMBLOC BIR 2 at offset 0, CMBSZ SZU 1 MiB, SZ 64,
  // submission queues, completion queues, lists, read and write data supported.
  constexpr spec::cmbloc_register loc{0x00000002};
  constexpr spec::cmbsz_register sz{0x0004021f};
  static_assert(loc.bir() == 2 && loc.ofst() == 0);
  static_assert(sz.sqs() && sz.cqs() && sz.lists() && sz.rds() && sz.wds());
  static_assert(sz.szu() == spec::cmb_size_unit::mib_1);
  static_assert(sz.unit_bytes() == 1u << 20);
  static_assert(sz.sz() == 64);
  static_assert(sz.size_bytes() == 64ull << 20);
  CHECK(spec::cmbsz_register{}.set_szu(spec::cmb_size_unit::kib_4).set_sz(16).size_bytes() == 65536);
}

TEST_CASE("every CMBLOC field round-trips through its setter") {
  constexpr auto loc = spec::cmbloc_register{}
                           .set_bir(4).set_cqmms(true).set_cqpds(true).set_cdpmls(true)
                           .set_cdpcils(true).set_cdmmms(true).set_cqda(true).set_ofst(0xabcde);
  static_assert(loc.bir() == 4 && loc.cqmms() && loc.cqpds() && loc.cdpmls() && loc.cdpcils() && loc.cdmmms() &&
                loc.cqda() && loc.ofst() == 0xabcde);
  static_assert(loc.raw == (4u | 1u << 3 | 1u << 4 | 1u << 5 | 1u << 6 | 1u << 7 | 1u << 8 | 0xabcdeu << 12));
  static_assert(spec::cmbloc_register{~0u}.set_cdpmls(false).raw == ~(1u << 5));
  CHECK(loc.ofst() == 0xabcde);
}

TEST_CASE("every CMBSZ field round-trips through its setter") {
  constexpr auto sz = spec::cmbsz_register{}.set_sqs(true).set_cqs(false).set_lists(true).set_rds(false)
                          .set_wds(true).set_szu(spec::cmb_size_unit::gib_64).set_sz(0xfffff);
  static_assert(sz.sqs() && !sz.cqs() && sz.lists() && !sz.rds() && sz.wds());
  static_assert(sz.szu() == spec::cmb_size_unit::gib_64 && sz.sz() == 0xfffff);
  static_assert(sz.raw == (1u | 1u << 2 | 1u << 4 | 6u << 8 | 0xfffffu << 12));
  static_assert(spec::cmbsz_register{~0u}.set_cqs(false).set_rds(false).raw == ~(1u << 1 | 1u << 3));
  CHECK(sz.unit_bytes() == 64ull << 30);
}

TEST_CASE("CMBMSC enables the CMB at a 4 KiB aligned controller base address") {
  constexpr auto msc = spec::cmbmsc_register{}.set_cre(true).set_cmse(true).set_controller_base_address(0xfe000000ull);
  static_assert(msc.cre() && msc.cmse());
  static_assert(msc.controller_base_address() == 0xfe000000ull);
  static_assert(msc.raw == 0xfe000003ull);
  static_assert(spec::cmbmsc_register{}.set_controller_base_address(0x12345fffull).controller_base_address() == 0x12345000ull);
  CHECK(!spec::cmbmsc_register{}.cre());
}

TEST_CASE("CMBSTS bit 0 reports an invalid CMB controller base address") {
  static_assert(spec::cmbsts_register{0x00000001u}.cbai());
  static_assert(!spec::cmbsts_register{0xfffffffeu}.cbai());
  static_assert(spec::cmbsts_register{}.set_cbai(true).raw == 1u);
  static_assert(spec::cmbsts_register{~0u}.set_cbai(false).raw == ~1u);
  static_assert(spec::cmbsts_register::cbai_field::mask == 0x1u);
  CHECK(!spec::cmbsts_register{}.cbai());
}

TEST_CASE("NSSR is armed by the ASCII value NVMe") {
  static_assert(spec::nvm_subsystem_reset_value == ('N' << 24 | 'V' << 16 | 'M' << 8 | 'e'));
  CHECK(spec::nvm_subsystem_reset_value == 0x4e564d65u);
}

#ifdef __CUDACC__
// Device code must see the same accessors (compiled for every GPU arch, never launched here).
__global__ void decode_registers_on_device(std::uint64_t cap, std::uint32_t* out) {
  const spec::cap_register c{cap};
  out[0] = c.mqes();
  out[1] = spec::sq_tail_doorbell_offset(3, c.dstrd());
  out[2] = spec::cc_register{}.set_en(true).set_iosqes(6).raw;
}
#endif
