// Identify data structures: layouts decode from raw little-endian bytes at the spec's offsets,
// and every accessor and setter follows the bit definitions of NVMe 2.0 / NVM Command Set 1.0.
#include <cunvme/spec/identify.cuh>

#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace {

using cunvme::spec::active_namespace_list;
using cunvme::spec::flush_broadcast;
using cunvme::spec::identify_cns;
using cunvme::spec::identify_controller;
using cunvme::spec::identify_namespace;
using cunvme::spec::lba_format;
using cunvme::spec::power_state_descriptor;
using cunvme::spec::sgl_support;
using cunvme::spec::trimmed;

using page = std::array<std::uint8_t, 4096>;

void put_le(page& image, std::size_t offset, std::uint64_t value, std::size_t width) {
  for (std::size_t i = 0; i < width; ++i) {
    image[offset + i] = static_cast<std::uint8_t>(value >> (8 * i));
  }
}

void put_text(page& image, std::size_t offset, const std::string& text, std::size_t width, char pad) {
  for (std::size_t i = 0; i < width; ++i) {
    image[offset + i] = static_cast<std::uint8_t>(i < text.size() ? text[i] : pad);
  }
}

template <class T>
T decode(const page& image) {
  static_assert(sizeof(T) == sizeof(page));
  T value;
  std::memcpy(&value, image.data(), sizeof value);
  return value;
}

// What QEMU 7.2's emulated controller (`-device nvme,serial=deadbeef`) reports, placed at the
// byte offsets of NVMe 2.0 Figure 275 without using the structure, so the test checks the
// structure's layout rather than restating it. Values as measured on QEMU 7.2 (VS 1.4.0,
// MDTS 7, NN 256, OACS 010Ah, SGLS 1h) and as set by its nvme_init_ctrl (64/16-byte entries,
// ONCS 015Dh, VWC 07h, one power state of 25 W).
page qemu_controller_image() {
  page image{};
  put_le(image, 0, 0x1b36, 2);    // VID: Red Hat
  put_le(image, 2, 0x1af4, 2);    // SSVID
  put_text(image, 4, "deadbeef", 20, ' ');
  put_text(image, 24, "QEMU NVMe Ctrl", 40, ' ');
  put_text(image, 64, "1.0", 8, ' ');
  put_le(image, 72, 6, 1);        // RAB
  put_le(image, 73, 0x525400, 3); // IEEE OUI
  put_le(image, 77, 7, 1);        // MDTS
  put_le(image, 78, 0, 2);        // CNTLID
  put_le(image, 80, 0x00010400, 4);
  put_le(image, 256, 0x010a, 2);  // OACS
  put_le(image, 258, 3, 1);       // ACL
  put_le(image, 259, 3, 1);       // AERL
  put_le(image, 262, 3, 1);       // ELPE
  put_le(image, 263, 0, 1);       // NPSS
  put_le(image, 266, 0x0157, 2);  // WCTEMP, 343 K
  put_le(image, 268, 0x0175, 2);  // CCTEMP, 373 K
  put_le(image, 512, 0x66, 1);    // SQES
  put_le(image, 513, 0x44, 1);    // CQES
  put_le(image, 516, 256, 4);     // NN
  put_le(image, 520, 0x015d, 2);  // ONCS
  put_le(image, 525, 0x07, 1);    // VWC
  put_le(image, 534, 0x0001, 2);  // OCFS
  put_le(image, 536, 0x00000001, 4);
  put_text(image, 768, "nqn.2019-08.org.qemu:deadbeef", 256, '\0');
  put_le(image, 2048, 0x09c4, 2);  // PSD0 MP: 25.00 W
  put_le(image, 2052, 0x10, 4);    // PSD0 ENLAT
  put_le(image, 2056, 0x04, 4);    // PSD0 EXLAT
  put_le(image, 3072, 0xa5, 1);    // first vendor-specific byte
  put_le(image, 4095, 0x5a, 1);    // last byte of the structure
  return image;
}

constexpr identify_controller controller_with(std::uint16_t oacs, std::uint16_t oncs) {
  identify_controller id{};
  id.oacs = oacs;
  id.oncs = oncs;
  return id;
}

// QEMU's default namespace formats (hw/nvme/ns.c): data 512 or 4096 bytes with 0, 8, 16 or
// 64 bytes of metadata, NLBAF 7; `logical_block_size=4096` selects FLBAS 4.
constexpr identify_namespace qemu_namespace(std::uint8_t flbas) {
  identify_namespace ns{};
  ns.nsze = 0x20000;
  ns.ncap = 0x20000;
  ns.nuse = 0x20000;
  ns.nlbaf = 7;
  ns.flbas = flbas;
  constexpr std::uint16_t metadata[4] = {0, 8, 16, 64};
  for (unsigned i = 0; i < 8; ++i) {
    ns.lbaf[i].set_lbads(i < 4 ? 9 : 12).set_ms(metadata[i % 4]);
  }
  return ns;
}

// A namespace with all 64 formats valid, format i having i bytes of metadata so the selected
// index can be read back from MS.
constexpr identify_namespace namespace_with_formats(std::uint8_t nlbaf, std::uint8_t flbas) {
  identify_namespace ns{};
  ns.nlbaf = nlbaf;
  ns.flbas = flbas;
  for (unsigned i = 0; i < 64; ++i) {
    ns.lbaf[i].set_lbads(12).set_ms(static_cast<std::uint16_t>(i));
  }
  return ns;
}

}  // namespace

TEST_CASE("identify CNS values are those of NVMe 2.0 Figure 273") {
  static_assert(static_cast<std::uint8_t>(identify_cns::namespace_data) == 0x00);
  static_assert(static_cast<std::uint8_t>(identify_cns::controller) == 0x01);
  static_assert(static_cast<std::uint8_t>(identify_cns::active_namespace_list) == 0x02);
  static_assert(static_cast<std::uint8_t>(identify_cns::namespace_identification_descriptor_list) == 0x03);
  CHECK(sizeof(identify_cns) == 1);
}

TEST_CASE("lba_format decodes MS, LBADS and RP from a raw dword") {
  constexpr lba_format f{0x020c0008u};
  static_assert(f.ms() == 8);
  static_assert(f.lbads() == 12);
  static_assert(f.rp() == 2);
  const lba_format all_ones{0xffffffffu};
  CHECK(all_ones.ms() == 0xffff);
  CHECK(all_ones.lbads() == 0xff);
  CHECK(all_ones.rp() == 3);
}

TEST_CASE("lba_format setters write their own field and leave the others alone") {
  constexpr lba_format f = [] {
    lba_format v{0xfc000000u};  // reserved bits 31:26 set
    v.set_ms(64).set_lbads(9).set_rp(1);
    return v;
  }();
  static_assert(f.raw == 0xfd090040u);
  static_assert(f.ms() == 64 && f.lbads() == 9 && f.rp() == 1);

  lba_format g{0xffffffffu};
  g.set_ms(0);
  CHECK(g.raw == 0xffff0000u);
  g.set_lbads(0);
  CHECK(g.raw == 0xff000000u);
  g.set_rp(0);
  CHECK(g.raw == 0xfc000000u);
}

TEST_CASE("lba_format set_rp keeps only the two RP bits") {
  lba_format f{0};
  f.set_rp(7);
  CHECK(f.rp() == 3);
  CHECK(f.raw == 0x03000000u);
}

TEST_CASE("lba_data_size_bytes is 2^LBADS and 0 for formats the spec forbids or leaves unavailable") {
  static_assert(lba_format{0}.lba_data_size_bytes() == 0);  // LBADS 0: not available
  static_assert(lba_format{}.set_lbads(8).lba_data_size_bytes() == 0);  // below 512 bytes
  static_assert(lba_format{}.set_lbads(9).lba_data_size_bytes() == 512);
  static_assert(lba_format{}.set_lbads(12).lba_data_size_bytes() == 4096);
  static_assert(lba_format{}.set_lbads(16).lba_data_size_bytes() == 65536);
  static_assert(lba_format{}.set_lbads(63).lba_data_size_bytes() == std::uint64_t{1} << 63);
  static_assert(lba_format{}.set_lbads(64).lba_data_size_bytes() == 0);
  lba_format f{};
  f.set_lbads(255);
  CHECK(f.lba_data_size_bytes() == 0);
}

TEST_CASE("power state maximum power is scaled by MXPS") {
  power_state_descriptor ps{};
  ps.mp = 0x09c4;  // 2500
  CHECK(ps.max_power_microwatts() == 25'000'000u);  // 0.01 W units: 25 W
  ps.mxps_nops = 0x01;
  CHECK(ps.max_power_microwatts() == 250'000u);  // 0.0001 W units: 0.25 W
  CHECK_FALSE(ps.non_operational());
}

TEST_CASE("power state NOPS marks a non-operational state") {
  power_state_descriptor ps{};
  CHECK_FALSE(ps.non_operational());
  ps.mxps_nops = 0x02;
  CHECK(ps.non_operational());
  CHECK(ps.max_power_microwatts() == 0);
}

TEST_CASE("identify controller fields decode from their NVMe 2.0 byte offsets") {
  const auto id = decode<identify_controller>(qemu_controller_image());
  CHECK(id.vid == 0x1b36);
  CHECK(id.ssvid == 0x1af4);
  CHECK(id.rab == 6);
  CHECK(id.ieee[0] == 0x00);
  CHECK(id.ieee[1] == 0x54);
  CHECK(id.ieee[2] == 0x52);
  CHECK(id.mdts == 7);
  CHECK(id.cntlid == 0);
  CHECK(id.ver == 0x00010400u);
  CHECK(id.oacs == 0x010a);
  CHECK(id.acl == 3);
  CHECK(id.aerl == 3);
  CHECK(id.elpe == 3);
  CHECK(id.npss == 0);
  CHECK(id.wctemp == 343);
  CHECK(id.cctemp == 373);
  CHECK(id.sqes == 0x66);
  CHECK(id.cqes == 0x44);
  CHECK(id.maxcmd == 0);
  CHECK(id.nn == 256);
  CHECK(id.oncs == 0x015d);
  CHECK(id.vwc == 0x07);
  CHECK(id.ocfs == 0x0001);
  CHECK(id.sgls == 0x1u);
  CHECK(id.psd[0].mp == 0x09c4);
  CHECK(id.psd[0].enlat == 0x10u);
  CHECK(id.psd[0].exlat == 0x04u);
  CHECK(id.vs[0] == 0xa5);
  CHECK(id.vs[1023] == 0x5a);
}

TEST_CASE("trimmed turns space-padded SN, MN and FR into their text") {
  const auto id = decode<identify_controller>(qemu_controller_image());
  CHECK(trimmed(id.sn) == "deadbeef");
  CHECK(trimmed(id.mn) == "QEMU NVMe Ctrl");
  CHECK(trimmed(id.fr) == "1.0");
}

TEST_CASE("trimmed reads the NUL-terminated SUBNQN") {
  const auto id = decode<identify_controller>(qemu_controller_image());
  CHECK(trimmed(id.subnqn) == "nqn.2019-08.org.qemu:deadbeef");
}

TEST_CASE("trimmed drops leading spaces and NUL padding and keeps inner spaces") {
  const char left_padded[8] = {' ', ' ', 'A', ' ', 'B', ' ', ' ', ' '};
  CHECK(trimmed(left_padded) == "A B");
  const char nul_padded[8] = {'X', 'Y', '\0', '\0', 'g', 'a', 'r', 'b'};
  CHECK(trimmed(nul_padded) == "XY");
  const char full[4] = {'W', 'X', 'Y', 'Z'};
  CHECK(trimmed(full) == "WXYZ");
  const char blank[4] = {' ', ' ', ' ', ' '};
  CHECK(trimmed(blank).empty());
}

TEST_CASE("SQES and CQES give required and maximum entry sizes as log2 bytes") {
  const auto id = decode<identify_controller>(qemu_controller_image());
  CHECK(id.sqes_min() == 6);  // 64-byte SQE
  CHECK(id.sqes_max() == 6);
  CHECK(id.cqes_min() == 4);  // 16-byte CQE
  CHECK(id.cqes_max() == 4);

  constexpr auto other = [] {
    identify_controller c{};
    c.sqes = 0x76;
    c.cqes = 0x54;
    return c;
  }();
  static_assert(other.sqes_min() == 6 && other.sqes_max() == 7);
  static_assert(other.cqes_min() == 4 && other.cqes_max() == 5);
}

TEST_CASE("mdts_bytes is 2^MDTS minimum memory pages") {
  const auto id = decode<identify_controller>(qemu_controller_image());
  CHECK(id.mdts_bytes(4096) == 512u * 1024u);  // QEMU: 512 KiB
  CHECK(id.mdts_bytes(65536) == 8u * 1024u * 1024u);
  constexpr auto big = [] {
    identify_controller c{};
    c.mdts = 20;
    return c;
  }();
  static_assert(big.mdts_bytes(4096) == std::uint64_t{4} << 30);  // past 32 bits
}

TEST_CASE("mdts_bytes is 0 when MDTS reports no transfer size limit") {
  constexpr identify_controller id{};
  static_assert(id.mdts == 0);
  static_assert(id.mdts_bytes(4096) == 0);
  CHECK(id.mdts_bytes(4096) == 0);
}

TEST_CASE("mdts_bytes saturates when the limit does not fit in 64 bits") {
  identify_controller id{};
  id.mdts = 52;  // 2^52 pages of 4 KiB = 2^64 bytes
  CHECK(id.mdts_bytes(4096) == ~std::uint64_t{0});
  id.mdts = 51;
  CHECK(id.mdts_bytes(4096) == std::uint64_t{1} << 63);
  id.mdts = 200;
  CHECK(id.mdts_bytes(4096) == ~std::uint64_t{0});
}

namespace {

using controller_flag = bool (identify_controller::*)() const noexcept;

struct flag_at_bit {
  unsigned bit;
  controller_flag flag;
  const char* name;
};

const flag_at_bit oacs_flags[] = {
    {0, &identify_controller::supports_security, "security"},
    {1, &identify_controller::supports_format_nvm, "format_nvm"},
    {2, &identify_controller::supports_firmware_download_commit, "firmware_download_commit"},
    {3, &identify_controller::supports_namespace_management, "namespace_management"},
    {4, &identify_controller::supports_device_self_test, "device_self_test"},
    {5, &identify_controller::supports_directives, "directives"},
    {6, &identify_controller::supports_nvme_mi_send_receive, "nvme_mi_send_receive"},
    {7, &identify_controller::supports_virtualization_management, "virtualization_management"},
    {8, &identify_controller::supports_doorbell_buffer_config, "doorbell_buffer_config"},
    {9, &identify_controller::supports_get_lba_status, "get_lba_status"},
    {10, &identify_controller::supports_command_and_feature_lockdown, "command_and_feature_lockdown"},
};

const flag_at_bit oncs_flags[] = {
    {0, &identify_controller::supports_compare, "compare"},
    {1, &identify_controller::supports_write_uncorrectable, "write_uncorrectable"},
    {2, &identify_controller::supports_dataset_management, "dataset_management"},
    {3, &identify_controller::supports_write_zeroes, "write_zeroes"},
    {4, &identify_controller::supports_save_and_select_features, "save_and_select_features"},
    {5, &identify_controller::supports_reservations, "reservations"},
    {6, &identify_controller::supports_timestamp, "timestamp"},
    {7, &identify_controller::supports_verify, "verify"},
    {8, &identify_controller::supports_copy, "copy"},
};

}  // namespace

TEST_CASE("each OACS bit sets exactly its own accessor") {
  for (const auto& set : oacs_flags) {
    const auto id = controller_with(static_cast<std::uint16_t>(1u << set.bit), 0xffff);
    for (const auto& probe : oacs_flags) {
      CAPTURE(set.name);
      CAPTURE(probe.name);
      CHECK((id.*probe.flag)() == (probe.bit == set.bit));
    }
  }
  const auto reserved_only = controller_with(0xf800, 0);  // bits 15:11
  for (const auto& probe : oacs_flags) {
    CAPTURE(probe.name);
    CHECK_FALSE((reserved_only.*probe.flag)());
  }
}

TEST_CASE("each ONCS bit sets exactly its own accessor") {
  for (const auto& set : oncs_flags) {
    const auto id = controller_with(0xffff, static_cast<std::uint16_t>(1u << set.bit));
    for (const auto& probe : oncs_flags) {
      CAPTURE(set.name);
      CAPTURE(probe.name);
      CHECK((id.*probe.flag)() == (probe.bit == set.bit));
    }
  }
  const auto reserved_only = controller_with(0, 0xfe00);  // bits 15:9
  for (const auto& probe : oncs_flags) {
    CAPTURE(probe.name);
    CHECK_FALSE((reserved_only.*probe.flag)());
  }
}

TEST_CASE("QEMU's OACS 010Ah offers Format NVM, Namespace Management and Doorbell Buffer Config") {
  const auto id = decode<identify_controller>(qemu_controller_image());
  CHECK_FALSE(id.supports_security());
  CHECK(id.supports_format_nvm());
  CHECK_FALSE(id.supports_firmware_download_commit());
  CHECK(id.supports_namespace_management());
  CHECK_FALSE(id.supports_device_self_test());
  CHECK_FALSE(id.supports_directives());
  CHECK_FALSE(id.supports_nvme_mi_send_receive());
  CHECK_FALSE(id.supports_virtualization_management());
  CHECK(id.supports_doorbell_buffer_config());
  CHECK_FALSE(id.supports_get_lba_status());
  CHECK_FALSE(id.supports_command_and_feature_lockdown());
  static_assert(controller_with(0x010a, 0).supports_doorbell_buffer_config());
}

TEST_CASE("QEMU's ONCS 015Dh offers Compare, DSM, Write Zeroes, Save/Select, Timestamp and Copy") {
  // 015Dh = bits 0, 2, 3, 4, 6, 8.
  const auto id = decode<identify_controller>(qemu_controller_image());
  CHECK(id.supports_compare());
  CHECK_FALSE(id.supports_write_uncorrectable());
  CHECK(id.supports_dataset_management());
  CHECK(id.supports_write_zeroes());
  CHECK(id.supports_save_and_select_features());
  CHECK_FALSE(id.supports_reservations());
  CHECK(id.supports_timestamp());
  CHECK_FALSE(id.supports_verify());
  CHECK(id.supports_copy());
  static_assert(!controller_with(0, 0x015d).supports_verify());
}

TEST_CASE("VWC reports a volatile write cache and Flush broadcast support") {
  const auto id = decode<identify_controller>(qemu_controller_image());
  CHECK(id.volatile_write_cache_present());
  CHECK(id.flush_broadcast_support() == flush_broadcast::supported);

  identify_controller c{};
  CHECK_FALSE(c.volatile_write_cache_present());
  CHECK(c.flush_broadcast_support() == flush_broadcast::not_indicated);
  c.vwc = 0x05;  // present, broadcast not supported
  CHECK(c.volatile_write_cache_present());
  CHECK(c.flush_broadcast_support() == flush_broadcast::not_supported);
  c.vwc = 0x06;  // no cache; bits 2:1 still decoded
  CHECK_FALSE(c.volatile_write_cache_present());
  CHECK(c.flush_broadcast_support() == flush_broadcast::supported);
}

TEST_CASE("SGLS bits 1:0 say whether and how SGLs are accepted") {
  const auto id = decode<identify_controller>(qemu_controller_image());
  CHECK(id.sgls_support() == sgl_support::no_alignment);
  CHECK_FALSE(id.supports_sgl_bit_bucket());

  identify_controller c{};
  CHECK(c.sgls_support() == sgl_support::not_supported);
  c.sgls = 0x2;
  CHECK(c.sgls_support() == sgl_support::dword_alignment);
  c.sgls = 0xfffefffcu;  // every other bit except bit 16
  CHECK(c.sgls_support() == sgl_support::not_supported);
  CHECK_FALSE(c.supports_sgl_bit_bucket());
}

TEST_CASE("SGLS bit 16 reports SGL Bit Bucket descriptors") {
  identify_controller c{};
  c.sgls = 0x00010001u;
  CHECK(c.supports_sgl_bit_bucket());
  CHECK(c.sgls_support() == sgl_support::no_alignment);
}

TEST_CASE("ELPE and NPSS are 0-based counts") {
  const auto id = decode<identify_controller>(qemu_controller_image());
  CHECK(id.error_log_page_entries() == 4);
  CHECK(id.number_of_power_states() == 1);
  constexpr auto full = [] {
    identify_controller c{};
    c.elpe = 255;
    c.npss = 31;
    return c;
  }();
  static_assert(full.error_log_page_entries() == 256);
  static_assert(full.number_of_power_states() == 32);
}

TEST_CASE("identify namespace fields decode from their NVM Command Set 1.0 byte offsets") {
  page image{};
  put_le(image, 0, 0x0000000123456789ull, 8);  // NSZE
  put_le(image, 8, 0x0000000123456000ull, 8);  // NCAP
  put_le(image, 16, 0x0000000000001000ull, 8); // NUSE
  put_le(image, 24, 0x14, 1);                  // NSFEAT
  put_le(image, 25, 7, 1);                     // NLBAF
  put_le(image, 26, 0x04, 1);                  // FLBAS
  put_le(image, 33, 0x09, 1);                  // DLFEAT
  put_le(image, 46, 0x0080, 2);                // NOIOB
  put_le(image, 48, 0x1122334455667788ull, 8); // NVMCAP, low half
  put_le(image, 72, 0x003f, 2);                // NOWS
  put_le(image, 74, 0x0100, 2);                // MSSRL
  put_le(image, 76, 0x00010000, 4);            // MCL
  put_le(image, 80, 0x7f, 1);                  // MSRC
  put_le(image, 92, 0x0000beef, 4);            // ANAGRPID
  put_le(image, 99, 0x01, 1);                  // NSATTR
  put_le(image, 100, 0x0002, 2);               // NVMSETID
  put_le(image, 102, 0x0003, 2);               // ENDGID
  put_le(image, 104, 0xaa, 1);                 // NGUID[0]
  put_le(image, 120, 0x525400, 3);             // EUI64[0..2]
  put_le(image, 128, 0x00090000, 4);           // LBAF0: 512 bytes
  put_le(image, 128 + 4 * 4, 0x000c0000, 4);   // LBAF4: 4096 bytes
  put_le(image, 128 + 63 * 4, 0x03100040, 4);  // LBAF63: 64 KiB, 64 bytes of metadata, RP 3
  put_le(image, 3840, 0xc3, 1);                // VS[0]
  const auto ns = decode<identify_namespace>(image);
  CHECK(ns.nsze == 0x0000000123456789ull);
  CHECK(ns.ncap == 0x0000000123456000ull);
  CHECK(ns.nuse == 0x1000u);
  CHECK(ns.nsfeat == 0x14);
  CHECK(ns.nlbaf == 7);
  CHECK(ns.flbas == 0x04);
  CHECK(ns.dlfeat == 0x09);
  CHECK(ns.noiob == 0x0080);
  CHECK(ns.nvmcap[0] == 0x88);
  CHECK(ns.nvmcap[7] == 0x11);
  CHECK(ns.nows == 0x003f);
  CHECK(ns.mssrl == 0x0100);
  CHECK(ns.mcl == 0x00010000u);
  CHECK(ns.msrc == 0x7f);
  CHECK(ns.anagrpid == 0xbeefu);
  CHECK(ns.nsattr == 0x01);
  CHECK(ns.nvmsetid == 2);
  CHECK(ns.endgid == 3);
  CHECK(ns.nguid[0] == 0xaa);
  CHECK(ns.eui64[0] == 0x00);
  CHECK(ns.eui64[1] == 0x54);
  CHECK(ns.eui64[2] == 0x52);
  CHECK(ns.lbaf[0].lba_data_size_bytes() == 512);
  CHECK(ns.lbaf[4].lba_data_size_bytes() == 4096);
  CHECK(ns.lbaf[63].lba_data_size_bytes() == 65536);
  CHECK(ns.lbaf[63].ms() == 64);
  CHECK(ns.lbaf[63].rp() == 3);
  CHECK(ns.vs[0] == 0xc3);
  CHECK(ns.lba_size_bytes() == 4096);
}

TEST_CASE("the protection type is DPS bits 2:0, and DPS bit 3 alone enables none") {
  identify_namespace ns{};
  CHECK(ns.protection_type() == 0);
  ns.dps = 0x01;
  CHECK(ns.protection_type() == 1);
  ns.dps = 0x0b;  // Type 3, protection information first in the metadata
  CHECK(ns.protection_type() == 3);
  ns.dps = 0x08;
  CHECK(ns.protection_type() == 0);
  ns.dps = 0x08;
  ns.set_protection_type(2);
  CHECK(ns.dps == 0x0a);
  static_assert(identify_namespace::dps_pit::mask == 0x07u);
}

TEST_CASE("QEMU's default namespace with FLBAS 0 has 512-byte blocks and no metadata") {
  constexpr auto ns = qemu_namespace(0x00);
  static_assert(ns.number_of_lba_formats() == 8);
  static_assert(ns.formatted_lba_index() == 0);
  static_assert(ns.current_lba_format().lbads() == 9);
  static_assert(ns.lba_size_bytes() == 512);
  static_assert(ns.metadata_size_bytes() == 0);
  static_assert(!ns.metadata_at_end_of_lba());
  CHECK(ns.nsze * ns.lba_size_bytes() == 64u * 1024u * 1024u);
}

TEST_CASE("FLBAS 4 on QEMU's namespace selects 4096-byte blocks") {
  constexpr auto ns = qemu_namespace(0x04);
  static_assert(ns.formatted_lba_index() == 4);
  static_assert(ns.lba_size_bytes() == 4096);
  static_assert(ns.metadata_size_bytes() == 0);
  const auto runtime = qemu_namespace(0x04);
  CHECK(runtime.current_lba_format().raw == 0x000c0000u);
}

TEST_CASE("FLBAS bit 4 marks metadata carried at the end of each LBA") {
  constexpr auto ns = qemu_namespace(0x15);  // format 5: 4096 + 8, extended LBA
  static_assert(ns.formatted_lba_index() == 5);
  static_assert(ns.metadata_at_end_of_lba());
  static_assert(ns.lba_size_bytes() == 4096);
  static_assert(ns.metadata_size_bytes() == 8);
  CHECK(ns.metadata_at_end_of_lba());
}

TEST_CASE("set_metadata_at_end_of_lba writes FLBAS bit 4 only") {
  auto ns = qemu_namespace(0x67);
  ns.set_metadata_at_end_of_lba(true);
  CHECK(ns.flbas == 0x77);
  CHECK(ns.metadata_at_end_of_lba());
  ns.set_metadata_at_end_of_lba(false);
  CHECK(ns.flbas == 0x67);
  CHECK_FALSE(ns.metadata_at_end_of_lba());
}

TEST_CASE("FLBAS bits 6:5 extend the format index when there are more than 16 formats") {
  constexpr auto ns = namespace_with_formats(63, 0x62);  // bits 3:0 = 2, bits 6:5 = 3
  static_assert(ns.number_of_lba_formats() == 64);
  static_assert(ns.formatted_lba_index() == 50);
  static_assert(ns.metadata_size_bytes() == 50);
  // 17 formats: index 16 is reachable only through bit 5.
  constexpr auto seventeen = namespace_with_formats(16, 0x20);
  static_assert(seventeen.formatted_lba_index() == 16);
  CHECK(seventeen.current_lba_format().ms() == 16);
}

TEST_CASE("FLBAS bits 6:5 are ignored with 16 or fewer formats") {
  constexpr auto ns = namespace_with_formats(15, 0x62);
  static_assert(ns.number_of_lba_formats() == 16);
  static_assert(ns.formatted_lba_index() == 2);
  CHECK(ns.metadata_size_bytes() == 2);
}

TEST_CASE("set_formatted_lba_index round-trips every index and keeps bits 4 and 7") {
  auto ns = namespace_with_formats(63, 0x90);  // bit 7 (reserved) and bit 4 set
  for (unsigned index = 0; index < 64; ++index) {
    CAPTURE(index);
    ns.set_formatted_lba_index(static_cast<std::uint8_t>(index));
    CHECK(ns.formatted_lba_index() == index);
    CHECK(ns.metadata_size_bytes() == index);
    CHECK((ns.flbas & 0x90) == 0x90);
  }
  constexpr auto set = [] {
    auto v = namespace_with_formats(63, 0);
    v.set_formatted_lba_index(37).set_metadata_at_end_of_lba(true);
    return v;
  }();
  static_assert(set.flbas == (0x05 | 0x10 | (0x2 << 5)));
}

TEST_CASE("an unavailable current format reports a 0-byte logical block") {
  constexpr auto ns = [] {
    auto v = qemu_namespace(0x03);
    v.lbaf[3].set_lbads(0);
    return v;
  }();
  static_assert(ns.lba_size_bytes() == 0);
  CHECK(ns.current_lba_format().ms() == 64);
}

TEST_CASE("active namespace list count stops at the first zero entry") {
  active_namespace_list list{};
  CHECK(list.count() == 0);
  list.nsid[0] = 1;
  list.nsid[1] = 2;
  list.nsid[2] = 7;
  CHECK(list.count() == 3);
  list.nsid[4] = 9;  // after a zero: not part of the list
  CHECK(list.count() == 3);
}

TEST_CASE("a full active namespace list counts all 1024 entries") {
  active_namespace_list list{};
  for (std::uint32_t i = 0; i < 1024; ++i) {
    list.nsid[i] = i + 1;
  }
  CHECK(list.count() == 1024);
}

#ifdef __CUDACC__
// Never launched: proves the accessors compile as device code.
__global__ void identify_accessors_compile_for_the_device(const identify_controller* id,
                                                          const identify_namespace* ns,
                                                          const active_namespace_list* list,
                                                          std::uint64_t* out) {
  out[0] = id->mdts_bytes(4096);
  out[1] = id->sqes_max() + id->cqes_max();
  out[2] = id->supports_doorbell_buffer_config() && id->supports_write_zeroes();
  out[3] = static_cast<std::uint64_t>(id->sgls_support());
  out[4] = id->psd[0].max_power_microwatts();
  out[5] = ns->lba_size_bytes();
  out[6] = ns->formatted_lba_index() + ns->metadata_at_end_of_lba();
  out[7] = list->count();
}
#endif
