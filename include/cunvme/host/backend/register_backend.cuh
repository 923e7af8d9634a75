// How the host reaches a controller's registers and memory: one small interface, one
// implementation per way in (the emulator, a sysfs BAR mapping, VFIO, the kernel module).
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/access.cuh>
#include <cunvme/host/memory/dma_memory.cuh>
#include <cunvme/spec/registers.cuh>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include <sys/mman.h>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// The CMB as a backend maps it: a window of `bytes` at `offset` into an mmap'ed BAR, at bus
/// address `bus`. Owns the mapping.
class bar_window {
 public:
  bar_window() = default;
  bar_window(const bar_window&) = delete;
  bar_window& operator=(const bar_window&) = delete;
  ~bar_window() { reset(); }

  /// Takes over `map` (`map_size` bytes from mmap), replacing any earlier window.
  void assign(std::byte* map, std::size_t map_size, std::uint64_t offset, std::uint64_t bytes, std::uint64_t bus) noexcept {
    reset();
    map_ = map;
    map_size_ = map_size;
    offset_ = offset;
    bytes_ = bytes;
    bus_ = bus;
  }
  [[nodiscard]] std::byte* data() const noexcept { return map_ == nullptr ? nullptr : map_ + offset_; }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }
  [[nodiscard]] std::uint64_t bus() const noexcept { return bus_; }

 private:
  void reset() noexcept {
    if (map_ != nullptr) ::munmap(map_, map_size_);
    map_ = nullptr;
    bytes_ = bus_ = 0;
  }
  std::byte* map_ = nullptr;
  std::size_t map_size_ = 0;
  std::uint64_t offset_ = 0, bytes_ = 0, bus_ = 0;
};

/// How another process maps BAR0, for a controller shared by several processes (host/sharing/):
/// `bytes` of the file `fd` at `offset`, MAP_SHARED. `fd` is -1 where the backend cannot hand its
/// BAR on; it stays the backend's (the owner sends a duplicate).
struct shareable_bar {
  int fd = -1;
  std::uint64_t offset = 0;
  std::size_t bytes = 0;
};

/// A controller's BAR0 and DMA memory, as one backend reaches them.
///
/// Registers are accessed as aligned 32-bit words only: 64-bit registers are written as two
/// halves, low first (QEMU.md; some platforms split 64-bit MMIO anyway).
class register_backend {
 public:
  virtual ~register_backend() = default;

  /// How errors name the device: "emu", "0000:01:00.0".
  [[nodiscard]] virtual std::string name() const = 0;
  /// BAR0 mapped into this process (uncached for real devices).
  [[nodiscard]] virtual std::byte* bar() const = 0;
  [[nodiscard]] virtual std::size_t bar_size() const = 0;
  /// The controller's memory buffer mapped into this process, and the bus address the host
  /// gave it in CMBMSC.CBA (for PRPs and queue bases); nullptr/0 where there is none.
  [[nodiscard]] virtual std::byte* cmb() const { return nullptr; }
  [[nodiscard]] virtual std::size_t cmb_size() const { return 0; }
  [[nodiscard]] virtual std::uint64_t cmb_bus_address() const { return 0; }
  /// Maps `bytes` of the CMB at `offset` in BAR `bar_index` (CMBLOC.BIR/OFST, CMBSZ); after
  /// it, cmb()/cmb_size()/cmb_bus_address() describe it. Throws `host::error` where the
  /// backend cannot reach a CMB.
  virtual void map_cmb(unsigned bar_index, std::uint64_t offset, std::uint64_t bytes) = 0;
  /// DMA memory for this controller.
  [[nodiscard]] virtual dma_allocator& memory() = 0;
  /// BAR0 as another process maps it (`shareable_bar`); none by default.
  [[nodiscard]] virtual shareable_bar bar_for_other_processes() const { return {}; }

  /// Whether GPU threads reach bar() and memory() only once they are registered for them
  /// (`host_registrar`): true for mmap'ed BARs and pinned pages; false where they were made
  /// GPU-usable when allocated (an emulator built with CUDA memory hooks).
  [[nodiscard]] virtual bool needs_gpu_registration() const { return true; }
  /// Whether bar() maps device MMIO (registered with cudaHostRegisterIoMemory) rather than
  /// RAM (the emulator's register page).
  [[nodiscard]] virtual bool bar_is_io_memory() const { return true; }
  /// What the backend saw during the last `recent` that may explain commands that did not
  /// complete in time, for the error that reports them (the emulator's data copies held up in
  /// the CUDA driver); empty where it saw nothing.
  [[nodiscard]] virtual std::string timeout_cause(std::chrono::nanoseconds recent) const {
    (void)recent;
    return {};
  }

  /// MMIO through the mapped BAR; a backend whose registers are not plain memory (the
  /// emulator's register file) overrides both. An offset outside the BAR or off a 4-byte
  /// boundary throws rather than touching memory past the mapping.
  [[nodiscard]] virtual std::uint32_t read32(std::uint32_t offset) const {
    return access::mmio_load(register_at(offset, "Read register"));
  }
  virtual void write32(std::uint32_t offset, std::uint32_t value) const {
    access::mmio_store_after_writes(register_at(offset, "Write register"), value);
  }
  /// How many queues have both doorbells (CAP.DSTRD `dstrd` apart) inside BAR0, the admin
  /// queue first: a device whose BAR is smaller than its stride and queue count imply would
  /// otherwise take doorbell stores past the mapping.
  [[nodiscard]] std::uint32_t queues_in_bar(unsigned dstrd) const {
    return static_cast<std::uint32_t>(std::clamp<long long>(spec::max_qid_in_bar(bar_size(), dstrd) + 1, 0, 65536));
  }
  [[nodiscard]] std::uint64_t read64(std::uint32_t offset) const {
    return std::uint64_t{read32(offset)} | std::uint64_t{read32(offset + 4)} << 32;
  }
  void write64(std::uint32_t offset, std::uint64_t value) const {
    write32(offset, static_cast<std::uint32_t>(value));
    write32(offset + 4, static_cast<std::uint32_t>(value >> 32));
  }

 private:
  [[nodiscard]] std::uint32_t* register_at(std::uint32_t offset, const char* operation) const {
    const std::size_t size = bar_size();
    if (offset % 4 != 0 || size < 4 || offset > size - 4) {
      throw error(operation, name(), "offset " + std::to_string(offset) + (offset % 4 != 0 ? " is not on a 4-byte boundary" : " is outside the " + std::to_string(size) + "-byte BAR0"));
    }
    return reinterpret_cast<std::uint32_t*>(bar() + offset);
  }
};

}  // namespace host
CUNVME_NAMESPACE_END
