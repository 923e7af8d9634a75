// The memory of a page cache over one namespace, owned on the host: the page table, the slots'
// owner words and clock bits, the counters and the slots' bytes. The slots come from the
// controller's DMA memory (it reads into and writes from them); the bookkeeping by default
// beside them, so one allocation serves CPU threads and, where the controller was opened with
// `gpu_reach()`, GPU threads — or, for kernels, from GPU memory (`gpu_bookkeeping`): a grid's
// lookups, clock sweeps and reference counts are then atomics in the GPU's L2, not round trips
// over PCIe that starve the cache's own I/O. For kernels the slots too belong in GPU memory
// (`slot_allocator`, e.g. `host::allocate_gpu`): the controller's DMA puts pages there
// (peer-to-peer), and every hit reads the GPU's own memory instead of crossing PCIe.
// `view()` and `device_view()` are what `page_cache` takes.
#pragma once

#include <cunvme/cache/page_table.cuh>
#include <cunvme/config.cuh>
#include <cunvme/detail/checked.cuh>
#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/memory/dma_memory.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/memory/queue_memory.cuh>
#include <cunvme/host/owners/volume_members.cuh>
#include <cunvme/io/namespace_view.cuh>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// Where a page cache's slots come from: `bytes` of memory that `ctrl` reaches, zeroed (GPU
/// memory from `host::allocate_gpu`, say). Empty: `ctrl`'s DMA memory (pinned host memory).
using slot_allocator = std::function<dma_buffer(controller& ctrl, std::size_t bytes)>;

/// A page cache's memory: `slots` pages of `page_bytes` each over the namespace `ns` addresses.
/// Page p is blocks [p × blocks per page, (p + 1) × blocks per page); blocks at the namespace's
/// end that do not fill a whole page are not covered. The page table takes 8 bytes per page of
/// the namespace (2 MiB for 1 GiB of 4 KiB pages).
///
/// Usage: examples/snippets/host.cpp, `page_cache_reads`.
class page_cache_memory {
 public:
  /// Throws `host::error` where the cache cannot exist: a page size that is not a power of two
  /// from 4 KiB to 64 KiB or not a whole number of the namespace's blocks, a namespace readers
  /// cannot address (separate metadata, protection information), no slots, more slots than the
  /// namespace has pages (a larger cache holds nothing more) or than the slot field indexes,
  /// sizes that do not fit memory, or DMA memory that cannot be had. `bookkeeping`: where the
  /// page table, owners, clock bits and counters go (`io_queue_memory::bookkeeping`, with its
  /// `copy_in`/`copy_out` where the host cannot address it); empty: the controller's DMA memory.
  /// `slot_memory`: where the slots go; empty: the controller's DMA memory.
  page_cache_memory(controller& ctrl, const cunvme::namespace_view& ns, std::uint64_t page_bytes, std::uint64_t slots,
                    io_queue_memory bookkeeping = {}, const slot_allocator& slot_memory = {})
      : device_(ctrl.name()), copy_in_(std::move(bookkeeping.copy_in)), copy_out_(std::move(bookkeeping.copy_out)) {
    const std::string what = "Create page cache";
    const unsigned shift = page_shift_of(what, page_bytes);
    if (!ns.transferable()) {
      throw error(what, device_, "namespace " + std::to_string(ns.nsid) + " keeps separate metadata or protection information, which readers do not handle");
    }
    if (ns.block_bytes() > page_bytes || page_bytes % ns.block_bytes() != 0) {
      throw error(what, device_, "the page size " + std::to_string(page_bytes) + " is not a whole number of namespace " + std::to_string(ns.nsid) +
                                     "'s " + std::to_string(ns.block_bytes()) + "-byte blocks");
    }
    const std::uint64_t pages = ns.lba_count / (page_bytes / ns.block_bytes());
    check_slots(what, slots, pages, page_bytes, "namespace " + std::to_string(ns.nsid) + "'s");
    data_ = allocate_slots(what, ctrl, data_bytes_of(what, slots, page_bytes), ctrl.page_bytes(), slot_memory);
    view_.nsid = ns.nsid;
    view_.blocks_per_page = static_cast<std::uint32_t>(page_bytes / ns.block_bytes());
    lay_out(what, pages, slots, shift, {&data_}, ctrl.page_bytes(), std::move(bookkeeping.bookkeeping), ctrl.memory());
  }

  /// A cache over a volume (`host::volume`): the slots are allocated for member 0's
  /// controller and mapped for each other controller (`member_mappings`), so every member
  /// reads into and writes from the same slots. Throws `host::error` as above, and where a
  /// striped volume's stripe is smaller than a page (a page must lie on one member) or a
  /// member's controller cannot map the slots.
  page_cache_memory(const volume& vol, std::uint64_t page_bytes, std::uint64_t slots, io_queue_memory bookkeeping = {},
                    const slot_allocator& slot_memory = {})
      : device_(vol.name()), copy_in_(std::move(bookkeeping.copy_in)), copy_out_(std::move(bookkeeping.copy_out)) {
    const std::string what = "Create page cache over a volume";
    const unsigned shift = page_shift_of(what, page_bytes);
    if (vol.block_bytes() > page_bytes) {
      throw error(what, device_, "the page size " + std::to_string(page_bytes) + " is smaller than the volume's " + std::to_string(vol.block_bytes()) + "-byte blocks");
    }
    if (vol.layout() == volume_layout::striped && vol.stripe_bytes() < page_bytes) {
      throw error(what, device_, "the stripe of " + std::to_string(vol.stripe_bytes()) + " bytes is smaller than the page size " + std::to_string(page_bytes) +
                                     ": a page must lie on one member");
    }
    const std::uint64_t pages = vol.blocks() / (page_bytes / vol.block_bytes());
    check_slots(what, slots, pages, page_bytes, "the volume's");
    std::size_t controller_page = 0;
    for (std::uint32_t m = 0; m < vol.member_count(); ++m) controller_page = std::max(controller_page, vol.controller_of(m).page_bytes());
    controller& first = vol.controller_of(0);
    data_ = allocate_slots(what, first, data_bytes_of(what, slots, page_bytes), controller_page, slot_memory);
    // Each member reaches the slots through its controller's own mapping (one per controller).
    mappings_ = member_mappings(vol, data_, what);
    std::vector<const dma_buffer*> reach;
    for (std::uint32_t m = 0; m < vol.member_count(); ++m) reach.push_back(&mappings_.of(m));
    view_.nsid = 0;
    view_.members = vol.member_count();
    view_.blocks_per_page = static_cast<std::uint32_t>(page_bytes / vol.block_bytes());
    lay_out(what, pages, slots, shift, reach, controller_page, std::move(bookkeeping.bookkeeping), first.memory());
  }

  /// The cache as CPU threads address it; throws `host::error` where its bookkeeping or its
  /// slots lie in memory only GPU threads address.
  [[nodiscard]] const page_cache_view& view() const {
    if (host_view_.table == nullptr) {
      throw error("Page cache for CPU threads", device_, "its bookkeeping is in GPU memory: CPU threads cannot use this cache");
    }
    if (host_view_.data == nullptr) {
      throw error("Page cache for CPU threads", device_, "its slots are in GPU memory: CPU threads cannot use this cache");
    }
    return host_view_;
  }

  /// The cache as GPU threads address it; throws `host::error` where its memory is not mapped
  /// for the GPU (open the controller with `gpu_reach()`).
  [[nodiscard]] page_cache_view device_view() const {
    if (bookkeeping_.device_data() == nullptr || data_.device_data() == nullptr) {
      throw error("Page cache for GPU threads", device_, "its memory is not mapped for the GPU: open the controller with gpu_reach()");
    }
    return bind(static_cast<unsigned char*>(bookkeeping_.device_data()), static_cast<unsigned char*>(data_.device_data()));
  }

  /// A snapshot of the counters; exact while no thread uses the cache.
  [[nodiscard]] page_cache_counters counters() const {
    page_cache_counters c;
    read_bookkeeping(&c, 0, sizeof c);
    return c;
  }

  /// A snapshot of `page`'s table word (decode it with `page_word::`); throws `host::error`
  /// for a page past the namespace's.
  [[nodiscard]] std::uint64_t page_entry(std::uint64_t page) const {
    if (page >= view_.pages) throw error("Read page cache entry", device_, "page " + std::to_string(page) + " is past the last (" + std::to_string(view_.pages) + ")");
    if (host_view_.table != nullptr) return bookkeeping_word<std::uint64_t>(host_view_.table[page]).load(cuda::std::memory_order_acquire);
    std::uint64_t w = 0;
    read_bookkeeping(&w, layout_.table_at + page * 8, sizeof w);
    return w;
  }

  /// A snapshot of `slot`'s owner word (`slot_owner::`); throws `host::error` past the last slot.
  [[nodiscard]] std::uint64_t slot_entry(std::uint32_t slot) const { return slot_word(host_view_.owners, layout_.owners_at, slot); }

  /// A snapshot of `slot`'s generation (odd while a fill replaces its bytes, and for good once a
  /// fill into it timed out); throws `host::error` past the last slot.
  [[nodiscard]] std::uint32_t slot_generation(std::uint32_t slot) const { return slot_word(host_view_.generations, layout_.generations_at, slot); }

 private:
  /// Slot `slot`'s entry of the per-slot array at `host_array` (as the host addresses it, or
  /// null) and byte `at` of the bookkeeping.
  template <class T>
  [[nodiscard]] T slot_word(T* host_array, std::size_t at, std::uint32_t slot) const {
    if (slot >= view_.slots) throw error("Read page cache slot", device_, "slot " + std::to_string(slot) + " is past the last (" + std::to_string(view_.slots) + ")");
    if (host_array != nullptr) return bookkeeping_word<T>(host_array[slot]).load(cuda::std::memory_order_acquire);
    T w = 0;
    read_bookkeeping(&w, at + std::size_t{slot} * sizeof(T), sizeof w);
    return w;
  }

  /// log2 of `page_bytes`, which must be a power of two from 4 KiB to 64 KiB.
  [[nodiscard]] unsigned page_shift_of(const std::string& what, std::uint64_t page_bytes) const {
    if (page_bytes == 0 || (page_bytes & (page_bytes - 1)) != 0) {
      throw error(what, device_, "the page size " + std::to_string(page_bytes) + " is not a power of two");
    }
    const unsigned shift = static_cast<unsigned>(std::countr_zero(page_bytes));
    if (shift < min_cache_page_shift || shift > max_cache_page_shift) {
      throw error(what, device_, "the page size " + std::to_string(page_bytes) + " is outside 4 KiB..64 KiB");
    }
    return shift;
  }
  /// The slots' memory: from `slot_memory` where given, else `ctrl`'s DMA memory; starting on
  /// a `controller_page` boundary of the bus, as PRP entries of whole pages need.
  [[nodiscard]] dma_buffer allocate_slots(const std::string& what, controller& ctrl, std::size_t bytes, std::size_t controller_page,
                                          const slot_allocator& slot_memory) const {
    if (!slot_memory) return ctrl.memory().allocate(bytes, controller_page);
    dma_buffer b = slot_memory(ctrl, bytes);
    if (b.size() < bytes || b.pages().empty()) {
      throw error(what, device_, "the slot allocator gave " + std::to_string(b.size()) + " bytes for " + std::to_string(bytes));
    }
    if (b.bus() % controller_page != 0) {
      throw error(what, device_, "the slot allocator's memory does not start on a " + std::to_string(controller_page) + "-byte controller page");
    }
    return b;
  }
  void check_slots(const std::string& what, std::uint64_t slots, std::uint64_t pages, std::uint64_t page_bytes, const std::string& whose) const {
    if (slots == 0) throw error(what, device_, "a cache needs at least one slot");
    if (slots > pages) {
      throw error(what, device_, std::to_string(slots) + " slots are more than " + whose + " " + std::to_string(pages) + " pages of " +
                                     std::to_string(page_bytes) + " bytes");
    }
    if (slots > page_word::max_slots) {
      throw error(what, device_, std::to_string(slots) + " slots are more than a page word indexes (" + std::to_string(page_word::max_slots) + ")");
    }
  }
  [[nodiscard]] std::size_t data_bytes_of(const std::string& what, std::uint64_t slots, std::uint64_t page_bytes) const {
    std::uint64_t data_bytes = 0;
    if (cunvme::detail::mul_overflows(slots, page_bytes, data_bytes) || data_bytes > ~std::size_t{0}) {
      throw error(what, device_, std::to_string(slots) + " slots of " + std::to_string(page_bytes) + " bytes do not fit the address space");
    }
    return static_cast<std::size_t>(data_bytes);
  }

  /// Allocates and fills in the bookkeeping for `pages` pages and `slots` slots of 2^`shift`
  /// bytes, whose bytes (`data_`) each member reaches through `reach[m]`: the bus address of
  /// each piece of the largest page size every mapping has (at least `controller_page`).
  void lay_out(const std::string& what, std::uint64_t pages, std::uint64_t slots, unsigned shift, const std::vector<const dma_buffer*>& reach,
               std::size_t controller_page, const std::function<dma_buffer(std::size_t)>& allocate_bookkeeping, dma_allocator& fallback) {
    std::size_t data_page = data_.page_size();
    for (const dma_buffer* b : reach) data_page = std::min(data_page, b->page_size());
    if (data_page < controller_page || (data_page & (data_page - 1)) != 0) {
      throw error(what, device_, "the slots' memory comes in " + std::to_string(data_page) + "-byte pages, smaller than the controller's " +
                                     std::to_string(controller_page));
    }
    std::vector<std::uint64_t> bus;
    for (const dma_buffer* b : reach) {
      const std::vector<std::uint64_t> pieces = b->bus_pages(data_page);
      if (pieces.empty()) throw error(what, device_, "a controller reaches the slots' memory in pieces not aligned to " + std::to_string(data_page) + " bytes");
      bus.insert(bus.end(), pieces.begin(), pieces.end());
    }
    const std::uint64_t data_pages = bus.size() / reach.size();
    page_cache_layout layout;
    if (!page_cache_layout::of(pages, slots, bus.size(), layout)) {
      throw error(what, device_, "a page table of " + std::to_string(pages) + " pages does not fit the address space");
    }
    // Zeroed: every page INVALID, every slot free.
    bookkeeping_ = allocate_bookkeeping ? allocate_bookkeeping(layout.bytes) : fallback.allocate(layout.bytes);
    if (bookkeeping_.size() < layout.bytes) {
      throw error(what, device_, "the bookkeeping allocator gave " + std::to_string(bookkeeping_.size()) + " bytes for " + std::to_string(layout.bytes));
    }
    write_bookkeeping(layout.bus_pages_at, bus.data(), bus.size() * 8);
    layout_ = layout;
    view_.pages = pages;
    view_.slots = static_cast<std::uint32_t>(slots);
    view_.page_shift = shift;
    view_.data_pages = data_pages;
    data_page_shift_ = static_cast<unsigned>(std::countr_zero(data_page));
    if (bookkeeping_.data() != nullptr) {
      host_view_ = bind(reinterpret_cast<unsigned char*>(bookkeeping_.data()), reinterpret_cast<unsigned char*>(data_.data()));
    }
  }

  /// Bytes at `offset` of the bookkeeping, through `copy_out` where the host cannot address it.
  void read_bookkeeping(void* to, std::size_t offset, std::size_t bytes) const {
    if (bookkeeping_.data() != nullptr) {
      std::memcpy(to, bookkeeping_.data() + offset, bytes);
    } else if (copy_out_) {
      copy_out_(to, static_cast<const unsigned char*>(bookkeeping_.device_data()) + offset, bytes);
    } else {
      throw error("Read page cache bookkeeping", device_, "it lies in memory the host cannot address and no copy_out was given");
    }
  }
  void write_bookkeeping(std::size_t offset, const void* from, std::size_t bytes) const {
    if (bookkeeping_.data() != nullptr) {
      std::memcpy(bookkeeping_.data() + offset, from, bytes);
    } else if (copy_in_) {
      copy_in_(static_cast<unsigned char*>(bookkeeping_.device_data()) + offset, from, bytes);
    } else {
      throw error("Create page cache", device_, "its bookkeeping lies in memory the host cannot address and no copy_in was given");
    }
  }

  /// The view with its pointers into `bookkeeping` and `data` as one side addresses them.
  [[nodiscard]] page_cache_view bind(unsigned char* bookkeeping, unsigned char* data) const noexcept {
    page_cache_view v = view_;
    layout_.bind(v, bookkeeping);
    v.data = data;
    v.data_bus = prp::page_list{reinterpret_cast<const std::uint64_t*>(bookkeeping + layout_.bus_pages_at), data_page_shift_};
    return v;
  }

  std::string device_;
  dma_buffer data_;
  member_mappings mappings_;  // data_ as the volume's other controllers reach it; released before data_
  dma_buffer bookkeeping_;
  unsigned data_page_shift_ = 12;
  page_cache_layout layout_{};
  page_cache_view view_{};       // sizes only
  page_cache_view host_view_{};  // null pointers where the bookkeeping is GPU memory
  std::function<void(void* to, const void* from, std::size_t bytes)> copy_in_;
  std::function<void(void* to, const void* from, std::size_t bytes)> copy_out_;
};

}  // namespace host
CUNVME_NAMESPACE_END
