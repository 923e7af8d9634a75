// A namespace as the host sees it (Identify Namespace decoded and checked), what a transfer
// on it needs, and the same namespace as the readers address it (`namespace_view`).
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/io/namespace_view.cuh>
#include <cunvme/io/request_plan.cuh>
#include <cunvme/spec/command_fields.cuh>
#include <cunvme/spec/identify.cuh>

#include <bit>
#include <cstdint>
#include <string>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// A namespace as Identify Namespace describes it (`describe_namespace`).
///
/// Metadata (LBAF.MS > 0) travels one of two ways, fixed when the namespace was formatted
/// (FLBAS bit 4): with extended LBAs each block's metadata follows its data in the data
/// buffer (`block_bytes()` = lba_size + metadata_size per block); otherwise it lives in a
/// separate buffer the command's MPTR points to, which `queue_pair::read`/`write` take in
/// their metadata overloads.
struct namespace_info {
  std::uint32_t nsid = 0;
  std::uint32_t lba_size = 0;         ///< data bytes per block (2^LBADS)
  std::uint64_t lba_count = 0;        ///< NSZE
  std::uint16_t metadata_size = 0;    ///< LBAF.MS: metadata bytes per block; 0: none
  bool extended_lba = false;          ///< with metadata: it is at the end of each block in the data buffer (FLBAS bit 4)
  std::uint8_t protection_type = 0;   ///< DPS bits 2:0: end-to-end protection information type; 0: none

  /// Data bytes of the namespace (metadata not counted). `describe_namespace` refuses
  /// namespaces whose data and metadata do not fit 64 bits, so this cannot wrap for them.
  [[nodiscard]] std::uint64_t bytes() const noexcept { return std::uint64_t{lba_size} * lba_count; }
  /// Bytes one block occupies in the data buffer: its data, and its metadata with extended LBAs.
  [[nodiscard]] std::uint64_t block_bytes() const noexcept { return std::uint64_t{lba_size} + (extended_lba ? metadata_size : 0u); }
  /// Whether I/O needs a separate metadata buffer (MPTR).
  [[nodiscard]] bool separate_metadata() const noexcept { return metadata_size != 0 && !extended_lba; }
};

/// The namespace `nsid`'s Identify Namespace data as a `namespace_info`. Throws `host::error`
/// (naming `device`) for data no I/O can be built on: FLBAS selecting a format past NLBAF,
/// an LBADS below 9 (the spec's minimum, 512 bytes) or above 31, or a capacity whose bytes
/// (data and metadata) do not fit 64 bits.
[[nodiscard]] inline namespace_info describe_namespace(std::uint32_t nsid, const spec::identify_namespace& id, const std::string& device) {
  const std::string operation = "Identify Namespace " + std::to_string(nsid);
  const unsigned index = id.formatted_lba_index();
  if (index >= id.number_of_lba_formats()) {
    throw error(operation, device, "FLBAS selects LBA format " + std::to_string(index) + " but NLBAF lists only " +
                                       std::to_string(id.number_of_lba_formats()));
  }
  const spec::lba_format format = id.current_lba_format();
  if (format.lbads() < 9 || format.lbads() > 31) {
    throw error(operation, device, "LBA format " + std::to_string(index) + " has LBADS " + std::to_string(format.lbads()) +
                                       " (data size 2^LBADS must be 512 bytes to 2 GiB)");
  }
  namespace_info info;
  info.nsid = nsid;
  info.lba_size = std::uint32_t{1} << format.lbads();
  info.lba_count = id.nsze;
  info.metadata_size = format.ms();
  info.extended_lba = info.metadata_size != 0 && id.metadata_at_end_of_lba();
  info.protection_type = id.protection_type();
  const std::uint64_t stored = std::uint64_t{info.lba_size} + info.metadata_size;
  if (info.lba_count > ~std::uint64_t{0} / stored) {
    throw error(operation, device, std::to_string(info.lba_count) + " blocks of " + std::to_string(stored) + " bytes exceed 2^64 bytes");
  }
  return info;
}

/// Throws `host::error` unless `operation` (Read, Write) can be done right on namespace `ns`
/// by this library, before anything is sent: end-to-end protection information is not
/// handled (PRACT and PRCHK are never set, so the controller would check or return PI the
/// caller did not ask for); separate metadata needs a metadata buffer, and a metadata buffer
/// needs a namespace with separate metadata.
inline void require_transferable(const namespace_info& ns, bool with_metadata_buffer, const std::string& operation, const std::string& device) {
  const std::string what = "namespace " + std::to_string(ns.nsid);
  if (ns.protection_type != 0) {
    throw error(operation, device, what + " has end-to-end protection information enabled (DPS type " + std::to_string(ns.protection_type) +
                                       "), which cunvme does not handle: format it without protection information");
  }
  if (ns.separate_metadata() && !with_metadata_buffer) {
    throw error(operation, device, what + " keeps " + std::to_string(ns.metadata_size) +
                                       " bytes of metadata per block in a separate buffer (MPTR): pass a metadata buffer");
  }
  if (!ns.separate_metadata() && with_metadata_buffer) {
    throw error(operation, device, what + (ns.metadata_size == 0 ? " has no metadata" : " carries its metadata in the data buffer (extended LBAs)") +
                                       ": a separate metadata buffer does not apply");
  }
}

/// How readers address `ns` when one command may move `max_transfer_bytes` (MDTS, which
/// counts extended LBAs' metadata; NLB caps a command at 65536 blocks). A namespace with
/// separate metadata or protection information gets a view readers refuse
/// (io_error::metadata_unsupported); host::queue_pair handles separate metadata. Throws
/// `host::error` (naming `device`) when MDTS is smaller than one block.
[[nodiscard]] inline namespace_view make_namespace_view(const namespace_info& ns, std::uint64_t max_transfer_bytes, const std::string& device) {
  const std::uint64_t per_command = max_blocks_per_command(max_transfer_bytes, ns.block_bytes());
  if (per_command == 0) {
    throw error("Prepare namespace " + std::to_string(ns.nsid), device,
                "MDTS (" + std::to_string(max_transfer_bytes) + " bytes) is smaller than one " + std::to_string(ns.block_bytes()) + "-byte block");
  }
  namespace_view v;
  v.nsid = ns.nsid;
  v.lba_shift = static_cast<std::uint32_t>(std::countr_zero(ns.lba_size));
  // A count whose bytes are whole dwords keeps every command's start dword aligned without the
  // planner stepping down per request (where none is, it refuses requests of several commands).
  const std::uint64_t aligned = dword_aligned_split(per_command, ns.block_bytes(), 0);
  v.max_blocks = static_cast<std::uint32_t>(aligned != 0 ? aligned : per_command);
  v.lba_count = ns.lba_count;
  v.metadata_size = ns.metadata_size;
  v.metadata = ns.metadata_size == 0 ? metadata_layout::none : ns.extended_lba ? metadata_layout::extended : metadata_layout::separate;
  v.protection = ns.protection_type != 0;
  return v;
}

}  // namespace host
CUNVME_NAMESPACE_END
