// Everything about an emulated controller that a user can choose, with defaults that give a
// useful device in one line: `cunvme::emu::controller ctrl;`.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/emu/dma_space.cuh>
#include <cunvme/emu/fault_injection.cuh>
#include <cunvme/emu/namespace_pinning.cuh>
#include <cunvme/emu/timing_model.cuh>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace emu {

/// One namespace: its LBA size, its metadata, its capacity and where its bytes live.
///
/// With metadata (`metadata_size` > 0) every block carries `metadata_size` bytes besides its
/// `lba_size` data bytes (LBAF.MS). `extended_lba` picks where they travel (FLBAS bit 4):
/// true — at the end of each block in the data buffer, `lba_size + metadata_size` bytes per
/// block (QEMU's `mset=1`); false — in a separate contiguous buffer MPTR points to (`mset=0`).
/// The backing store (RAM or file) then holds `lba_count × (lba_size + metadata_size)` bytes:
/// blocks with their metadata interleaved (extended), or all data followed by all metadata
/// (separate), so each mode's transfers are single ranges of the store.
struct namespace_config {
  std::uint32_t lba_size = 512;          ///< 512 or 4096 bytes
  std::uint64_t lba_count = 1ull << 21;  ///< 1 GiB of 512-byte blocks (RAM is reserved lazily)
  std::string file;                      ///< empty: RAM; else a file backs the namespace
  bool read_only = false;                ///< write protected: Write, Write Zeroes and deallocation fail with Namespace Is Write Protected
  std::uint16_t metadata_size = 0;       ///< metadata bytes per block, 0..4096 (0: none)
  bool extended_lba = false;             ///< with metadata: at the end of each block (true) or through MPTR (false)

  /// Bytes the backing store holds per block: data and metadata.
  [[nodiscard]] std::uint64_t stored_block_bytes() const noexcept { return std::uint64_t{lba_size} + metadata_size; }

  /// `lba_count` blocks of `lba_size` bytes in RAM.
  [[nodiscard]] static namespace_config in_memory(std::uint32_t lba_size, std::uint64_t lba_count) {
    namespace_config n;
    n.lba_size = lba_size;
    n.lba_count = lba_count;
    return n;
  }

  /// A namespace backed by `path`, its capacity the file's size rounded up to whole blocks
  /// (the last one's bytes past the file's end read as zeros, and a Write that would store
  /// bytes there fails with Write Fault: the file is never extended by it) unless `lba_count`
  /// is given (then the file is cut to, or extended to, that many blocks).
  [[nodiscard]] static namespace_config from_file(std::string path, std::uint32_t lba_size = 512,
                                                  std::uint64_t lba_count = 0) {
    namespace_config n;
    n.file = std::move(path);
    n.lba_size = lba_size;
    n.lba_count = lba_count;
    return n;
  }

  /// This namespace formatted with `bytes` of metadata per block, extended LBAs or not.
  [[nodiscard]] namespace_config with_metadata(std::uint16_t bytes, bool extended) const {
    namespace_config n = *this;
    n.metadata_size = bytes;
    n.extended_lba = extended;
    return n;
  }
};

/// How the controller gets memory the host and, with CUDA, the GPU can store to (BAR0 and
/// the CMB), and how it reaches GPU memory. The defaults use ordinary page-aligned host
/// memory and reach no GPU; `emu/cuda_memory.cuh` installs pinned, mapped memory (so GPU
/// threads can ring doorbells), CUDA copies and pinned namespaces.
struct memory_hooks {
  std::function<void*(std::size_t bytes)> allocate;
  std::function<void(void* pointer, std::size_t bytes)> release;
  device_copier device_copy;
  /// Makes host memory the controller copies from and to fast for `device_copy`
  /// (cudaHostRegister: a copy from pageable memory is staged by the driver at about half
  /// the bandwidth). Called for one granule of a namespace's mapping at a time
  /// (`controller_config::pinning`), the first time a command moves data between it and
  /// device memory or ahead of that, from worker threads and the pin-ahead threads, never
  /// twice for one granule (`read_only`: mapped without write access); false leaves the
  /// granule pageable, which only makes copies slower (`controller::namespace_pinned_bytes`
  /// tells). Empty: nothing is registered.
  std::function<bool(void* pointer, std::size_t bytes, bool read_only)> register_host;
  /// Undoes each successful `register_host`, before the namespace's memory is unmapped.
  std::function<void(void* pointer, std::size_t bytes)> unregister_host;
  /// Opens GPU memory another process exported (a 64-byte CUDA IPC handle) in this process, for
  /// a controller shared with it (host/sharing/): the allocation's device address and size,
  /// {nullptr, 0} where it cannot.
  std::function<std::pair<void*, std::size_t>(const std::byte* handle)> open_exported_gpu;
  /// Closes what `open_exported_gpu` opened, once no copy uses it.
  std::function<void(void* pointer)> close_exported_gpu;
  /// Makes a shared BAR0 (`controller_config::shared_bar`: a memory file, not `allocate`'s
  /// memory) reachable by this process's GPU threads at its host address; false where it
  /// cannot (the controller is then not built). Undone by `unregister_bar` before it is unmapped.
  std::function<bool(void* pointer, std::size_t bytes)> register_bar;
  std::function<void(void* pointer)> unregister_bar;
};

/// How worker threads wait when there is nothing to do.
struct idle_policy {
  std::uint32_t spins = 2000;                         ///< polls before sleeping
  std::chrono::microseconds sleep{20};                ///< then sleep this long per poll
};

struct controller_config {
  // ---- registers (CAP, VS) ----------------------------------------------------------------
  std::uint32_t max_queue_entries = 4096;   ///< CAP.MQES + 1: 2 to 65536
  bool contiguous_queues_required = true;   ///< CAP.CQR (the emulator supports only PC=1 queues)
  std::uint8_t doorbell_stride = 0;         ///< CAP.DSTRD: doorbells 4 << DSTRD bytes apart
  std::uint8_t mpsmin = 0;                  ///< CAP.MPSMIN: 4 KiB
  std::uint8_t mpsmax = 4;                  ///< CAP.MPSMAX: 64 KiB
  std::uint8_t timeout = 20;                ///< CAP.TO in 500 ms units: 10 s
  std::uint16_t version_major = 2, version_minor = 0;
  std::chrono::milliseconds ready_delay{0};  ///< CC.EN → CSTS.RDY delay; must not exceed CAP.TO

  // ---- identity and limits (Identify Controller) ------------------------------------------
  std::string serial = "CUNVME-EMU-0001";
  std::string model = "cunvme emulated NVMe controller";
  std::string firmware = "0.1.0";
  std::uint16_t vendor_id = 0xc0de;         ///< not a PCI-SIG assigned ID: this is an emulator
  std::uint8_t mdts = 7;                    ///< 2^MDTS minimum pages per command: 512 KiB
  std::uint16_t max_io_queues = 64;         ///< I/O SQs (and CQs) the controller can allocate
  std::uint16_t interrupt_vectors = 32;     ///< vectors a Create I/O CQ may name (none fire)
  bool volatile_write_cache = true;
  std::uint8_t abort_command_limit = 3;     ///< ACL, 0-based
  std::uint8_t async_event_request_limit = 3;  ///< AERL, 0-based
  std::uint16_t error_log_entries = 64;     ///< ELPE + 1

  // ---- sharing ----------------------------------------------------------------------------
  /// BAR0 in a memory file (memfd) that other processes map (`controller::bar_file()`): their
  /// doorbell stores reach this controller, for a controller shared by several processes
  /// (host/sharing/). The BAR is then never placed by `memory.allocate`.
  bool shared_bar = false;

  // ---- controller memory buffer ------------------------------------------------------------
  std::uint64_t cmb_bytes = 0;              ///< 0: no CMB; else a multiple of 4 KiB
  bool cmb_mixed_data_locations = false;    ///< CMBLOC.CDPMLS: may one command's data mix CMB and host memory

  // ---- namespaces, data path, threads -------------------------------------------------------
  std::vector<namespace_config> namespaces{namespace_config{}};
  unsigned workers = 2;                      ///< threads serving I/O queues (the admin queue has its own)
  idle_policy idle{};
  bool out_of_order_completions = false;     ///< post each batch's completions in a shuffled order
  std::uint64_t seed = 1;                    ///< for the shuffle
  timing_model timing = timing_model::none();
  /// false: Read and Write are checked exactly as with data movement (namespace, LBA range,
  /// MDTS, write protection, every PRP check) and complete with the same statuses, but no
  /// byte is copied: a read leaves the host buffer as it was and a write leaves the
  /// namespace as it was. For command-rate measurements in which the host threads' memcpy
  /// would otherwise set the rate. `stats()` still counts the bytes the commands carried;
  /// Write Zeroes and Dataset Management still change the namespace.
  bool move_data = true;
  std::vector<fault_rule> faults;
  std::uint64_t fault_seed = 1;
  memory_hooks memory;                       ///< empty: page-aligned host memory
  pinning_config pinning;                    ///< how `memory.register_host` pins the namespaces, granule by granule
};

}  // namespace emu
CUNVME_NAMESPACE_END
