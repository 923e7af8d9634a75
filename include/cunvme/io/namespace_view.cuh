// The namespace a reader or writer addresses: block size, MDTS split, metadata layout — a
// trivially copyable value from Identify Namespace (host::make_namespace_view) passed to
// kernels with the queue pair's view.
#pragma once

#include <cunvme/config.cuh>

#include <cuda/std/cstdint>
#include <cuda/std/type_traits>

CUNVME_NAMESPACE_BEGIN

/// Where a namespace's metadata (LBAF.MS bytes per block) travels.
enum class metadata_layout : cuda::std::uint8_t {
  none,      ///< no metadata
  extended,  ///< at the end of each block, in the data buffer (extended LBAs, FLBAS bit 4): readers move it with the data
  separate,  ///< in a separate buffer MPTR points to: readers refuse (io_error::metadata_unsupported)
};

/// The namespace a reader addresses, as Identify Namespace and MDTS describe it.
struct namespace_view {
  cuda::std::uint32_t nsid = 1;
  cuda::std::uint32_t lba_shift = 9;     ///< log2 of the LBA data size
  cuda::std::uint32_t max_blocks = 0;    ///< blocks one command may carry: min(MDTS / block_bytes(), 65536)
  cuda::std::uint64_t lba_count = 0;
  cuda::std::uint16_t metadata_size = 0;  ///< LBAF.MS: metadata bytes per block
  metadata_layout metadata = metadata_layout::none;
  bool protection = false;               ///< end-to-end protection information enabled (DPS): refused, like separate metadata

  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t lba_size() const noexcept { return 1u << lba_shift; }
  /// Bytes one block occupies in the data buffer: its data, and with extended LBAs its metadata.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t block_bytes() const noexcept {
    return cuda::std::uint64_t{lba_size()} + (metadata == metadata_layout::extended ? metadata_size : 0u);
  }
  /// Whether readers and writers can address the namespace (no MPTR, no protection information).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool transferable() const noexcept { return metadata != metadata_layout::separate && !protection; }
};
static_assert(cuda::std::is_trivially_copyable_v<namespace_view>);

CUNVME_NAMESPACE_END
