// PRP1/PRP2 (and a PRP list) for a range of a `dma_buffer`, through the one PRP builder
// (`prp::build`): for host commands whose data a reader does not move (Get Log Page on the
// admin queue), with every refusal a `host::error` that says why.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/memory/dma_memory.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/policy/prp.cuh>
#include <cunvme/spec/queue_entry.cuh>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <string>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// Why `prp::build` refused, for a `host::error` (every result named: a new one must be added here).
[[nodiscard]] inline std::string prp_build_failure(prp::build_result r, unsigned page_shift, std::size_t buffer_page, std::size_t list_bytes) {
  const std::string controller_page = std::to_string(std::uint64_t{1} << page_shift);
  switch (r) {
    case prp::build_result::ok: return "no error";
    case prp::build_result::unaligned_start: return "the buffer offset is not dword aligned (PRP1 bits 1:0 must be zero)";
    case prp::build_result::pages_misaligned:
      return "the buffer's " + std::to_string(buffer_page) + "-byte pages do not line up with the controller's " + controller_page +
             "-byte pages (smaller, or not aligned to them)";
    case prp::build_result::list_too_small:
      return "the transfer needs more PRP list entries than the " + std::to_string(list_bytes) + "-byte PRP list memory holds";
    case prp::build_result::list_misaligned: return "the PRP list memory is not aligned to the controller's " + controller_page + "-byte page";
    case prp::build_result::invalid_page_size:
      return "page sizes out of range (controller page " + controller_page + " bytes, buffer page " + std::to_string(buffer_page) +
             " bytes; 4 KiB..128 MiB and 4 KiB..2^63 allowed)";
    case prp::build_result::range_overflow: return "the buffer range or the PRP list's bus range does not fit 64 bits";
  }
  return "unknown PRP build result " + std::to_string(static_cast<unsigned>(r));
}

/// PRP1/PRP2 for `bytes` of `buffer` at `offset` with controller pages of 2^`page_shift`
/// bytes, with a list in `lists` (page-aligned DMA memory that must outlive the command) when
/// the transfer spans more than two pages. Throws `host::error` (naming `device`) for a range
/// outside the buffer or whatever `prp::build` refuses.
inline void fill_prps(spec::submission_entry& sqe, const dma_buffer& buffer, std::size_t offset, std::uint64_t bytes, const dma_buffer& lists,
                      unsigned page_shift, const std::string& device) {
  // page_list reads the page of every byte it maps: the range must lie inside the buffer.
  if (offset > buffer.size() || bytes > buffer.size() - offset) {
    throw error("Build PRPs", device, std::to_string(bytes) + " bytes at offset " + std::to_string(offset) + " do not fit the " +
                                          std::to_string(buffer.size()) + "-byte buffer");
  }
  if (buffer.page_size() == 0 || (buffer.page_size() & (buffer.page_size() - 1)) != 0) {
    throw error("Build PRPs", device, "the buffer's page size " + std::to_string(buffer.page_size()) + " is not a power of two");
  }
  const std::size_t page = std::size_t{1} << page_shift;
  const std::uint64_t list_capacity = std::min<std::uint64_t>(lists.size() / 8, ~std::uint32_t{0});
  prp::list_memory list{reinterpret_cast<std::uint64_t*>(lists.data()), lists.bus(), static_cast<std::uint32_t>(list_capacity)};
  // List memory needs each controller page contiguous, not the whole of it (4.1.1): chain
  // pointers then take each page's own bus address.
  std::vector<std::uint64_t> list_pages;
  if (!lists.contiguous(0, lists.size())) {
    list_pages = lists.bus_pages(page);
    if (list_pages.empty()) {
      throw error("Build PRPs", device, "a " + std::to_string(page) + "-byte page of the PRP list memory is not one aligned bus range");
    }
    list.pages = list_pages.data();
  }
  const auto buffer_shift = static_cast<unsigned>(std::countr_zero(buffer.page_size()));
  prp::prp_entries e;
  // A buffer that is one bus range (the emulator's, VFIO's, a huge page) serves any
  // controller page size; one listed page by page only pages at least as large.
  const auto r = bytes != 0 && buffer.contiguous(offset, bytes)
                     ? prp::build(prp::contiguous{buffer.bus(offset) - offset}, offset, bytes, page_shift, list, e)
                     : prp::build(prp::page_list{buffer.pages().data(), buffer_shift}, offset, bytes, page_shift, list, e);
  if (r != prp::build_result::ok) throw error("Build PRPs", device, prp_build_failure(r, page_shift, buffer.page_size(), lists.size()));
  sqe.prp1 = e.prp1;
  sqe.prp2 = e.prp2;
}

}  // namespace host
CUNVME_NAMESPACE_END
