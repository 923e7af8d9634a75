// What the owner of a shared controller does for the requests that change what an attached
// process may reach: its memory placed on (and taken off) the controller's bus, and the admin
// commands it may send (sharing::controller_owner, controller_owner.cuh).
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/sharing/controller_owner.cuh>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace host::sharing {

inline reply controller_owner::map_memory(controller_owner::attached_process& p, const request& q, const cunvme::detail::file_descriptor& file, cunvme::detail::file_descriptor& page_file) {
  if (!file) return reply::refusal("no memory file came with the request");
  const std::uint64_t bytes = q.a, alignment = q.b;
  struct stat st{};
  if (::fstat(file.get(), &st) != 0 || !S_ISREG(st.st_mode) || bytes == 0 || bytes % 4096 != 0 || static_cast<std::uint64_t>(st.st_size) < bytes) {
    return reply::refusal("the memory file does not hold " + std::to_string(bytes) + " bytes in whole 4 KiB pages");
  }
  // Sealed against shrinking: a file cut short under the owner's mapping would fault its
  // accesses (SIGBUS) or free pages the controller still reaches.
  const int seals = ::fcntl(file.get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) return reply::refusal("the memory file is not sealed against shrinking (F_SEAL_SHRINK)");
  if (alignment < 4096 || (alignment & (alignment - 1)) != 0 || alignment > (std::uint64_t{2} << 20)) {
    return reply::refusal("alignment " + std::to_string(alignment) + " is not a power of two from 4 KiB to 2 MiB");
  }
  {
    const std::scoped_lock lock(mutex_);
    if (bytes > max_bytes_per_process_ - std::min(max_bytes_per_process_, p.mapped_bytes)) {
      return reply::refusal(who(p) + " would map more than " + std::to_string(max_bytes_per_process_) + " bytes (half the machine's memory)");
    }
  }
  // A huge-page file maps on its page size (st_blksize: 2 MiB for hugetlbfs, 4 KiB otherwise).
  const auto file_page = static_cast<std::uint64_t>(std::max<blksize_t>(st.st_blksize, 4096));
  if (bytes % file_page != 0) return reply::refusal("the memory file's " + std::to_string(bytes) + " bytes are not whole pages of " + std::to_string(file_page) + " bytes");
  // The owner's mapping starts on `alignment`, so the bus address does where the backend keeps
  // the offset within it (the emulator's IOMMU and VFIO IOVAs do): a reservation that much
  // larger, the file mapped inside it.
  const std::uint64_t map_alignment = std::max(alignment, file_page);
  const std::size_t reserved = static_cast<std::size_t>(bytes + map_alignment);
  void* reservation = ::mmap(nullptr, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reservation == MAP_FAILED) return reply::refusal(std::system_error(errno, std::generic_category(), "reserve address space").what());
  const std::uintptr_t at = (reinterpret_cast<std::uintptr_t>(reservation) + map_alignment - 1) / map_alignment * map_alignment;
  // MAP_POPULATE: every page is there before the backend translates or pins it.
  if (::mmap(reinterpret_cast<void*>(at), static_cast<std::size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, file.get(), 0) ==
      MAP_FAILED) {
    const int e = errno;
    ::munmap(reservation, reserved);
    return reply::refusal(std::system_error(e, std::generic_category(), "map the memory file").what());
  }
  region r{0, bytes, nullptr, reservation, reserved};
  try {
    r.mapped = std::make_shared<dma_buffer>(ctrl_.backend().memory().map_host(reinterpret_cast<void*>(at), static_cast<std::size_t>(bytes)));
  } catch (const std::exception& e) {
    ::munmap(reservation, reserved);
    return reply::refusal(e.what());
  }
  reply out;
  const std::vector<std::uint64_t>& pages = r.mapped->pages();
  const std::uint64_t page = r.mapped->page_size();
  if (pages.empty()) {
    release(r);
    return reply::refusal("the owner's backend mapped the memory to no page");
  }
  if (r.mapped->contiguous(0, r.mapped->size()) && r.mapped->bus() % alignment == 0) {
    out.a = r.mapped->bus();
  } else if (pages[0] % alignment == 0) {
    // Pages scattered on the bus (pinned physical pages): their addresses in a file of their own.
    page_file = cunvme::detail::file_descriptor(::memfd_create("cunvme-pages", MFD_CLOEXEC));
    const std::size_t list = pages.size() * sizeof(std::uint64_t);
    if (!page_file || ::pwrite(page_file.get(), pages.data(), list, 0) != static_cast<ssize_t>(list)) {
      page_file.reset();
      release(r);
      return reply::refusal(std::system_error(errno, std::generic_category(), "write the page list").what());
    }
    out.a = pages[0];
    out.b = pages.size();
    out.c = page;
  } else {
    release(r);
    return reply::refusal("the controller cannot reach this memory on a " + std::to_string(alignment) + "-byte boundary");
  }
  r.bus = pages[0];
  const std::scoped_lock lock(mutex_);
  if (p.regions.count(r.bus) != 0) {
    page_file.reset();
    release(r);  // the same memory twice: its first mapping stays
    return reply::refusal("this memory is on the bus already (the same memory file twice)");
  }
  p.mapped_bytes += bytes;
  p.regions.emplace(r.bus, std::move(r));
  return out;
}

inline reply controller_owner::map_gpu(controller_owner::attached_process& p, const request& q) {
  if (emu_ == nullptr) return reply::refusal("an attached process's GPU memory reaches an emulated controller only (" + ctrl_.name() + " is not one)");
  const emu::memory_hooks& hooks = emu_->config().memory;
  if (!hooks.open_exported_gpu) return reply::refusal("the owner's emulator has no GPU reach (open it for GPU threads) to open another process's GPU memory");
  const auto [base, size] = hooks.open_exported_gpu(q.handle);
  if (base == nullptr) return reply::refusal("CUDA could not open the exported GPU memory in the owner's process");
  // Only the exported allocation: an offset or size past it would reach other memory here.
  if (q.a == 0 || q.b > size || q.a > size - q.b) {
    hooks.close_exported_gpu(base);
    return reply::refusal(std::to_string(q.a) + " bytes at offset " + std::to_string(q.b) + " run past the exported allocation's " + std::to_string(size));
  }
  region r{0, q.a, nullptr, base, 0};
  try {
    r.mapped = std::make_shared<dma_buffer>(ctrl_.backend().memory().map_gpu_range(static_cast<std::byte*>(base) + q.b, static_cast<std::size_t>(q.a)));
    r.bus = r.mapped->bus();
  } catch (const std::exception& e) {
    hooks.close_exported_gpu(base);
    return reply::refusal(e.what());
  }
  const std::scoped_lock lock(mutex_);
  if (p.regions.count(r.bus) != 0) {
    release(r);
    return reply::refusal("this GPU memory is on the bus already");
  }
  p.regions.emplace(r.bus, r);
  reply out;
  out.a = r.bus;
  return out;
}

inline reply controller_owner::unmap_memory(controller_owner::attached_process& p, std::uint64_t bus) {
  region gone;
  {
    const std::scoped_lock lock(mutex_);
    const auto it = p.regions.find(bus);
    if (it == p.regions.end()) return reply::refusal("no region of " + who(p) + " at this bus address");
    for (const auto* queues : {&p.sqs, &p.cqs}) {
      for (const auto& [qid, m] : *queues) {
        if (in_region(it->second, m.bus, m.bytes)) return reply::refusal("queue " + std::to_string(qid) + " lies in this memory: delete it first");
      }
    }
    gone = it->second;
    p.mapped_bytes -= std::min(p.mapped_bytes, gone.bytes);
    p.regions.erase(it);
  }
  release(gone);
  return reply{};
}

inline reply controller_owner::admin(controller_owner::attached_process& p, const spec::submission_entry& sqe) {
  const auto opcode = static_cast<spec::admin_opcode>(sqe.opcode());
  const auto qid = static_cast<std::uint16_t>(sqe.cdw10 & 0xffff);
  const std::string name = "admin command " + std::to_string(static_cast<unsigned>(sqe.opcode()));
  const std::uint64_t page = std::uint64_t{1} << ctrl_.page_shift();
  const auto mine = [&](const char* what) { return reply::refusal(name + ": " + what + " is not " + who(p) + "'s"); };
  queue_memory created{};
  switch (opcode) {
    case spec::admin_opcode::identify:
      if (!data_in_own_memory(p, sqe.prp1, sqe.prp2, 4096)) return mine("the 4 KiB it returns (PRP1/PRP2)");
      break;
    case spec::admin_opcode::get_log_page: {
      const std::uint64_t bytes = ((std::uint64_t{sqe.cdw11 & 0xffff} << 16 | sqe.cdw10 >> 16) + 1) * 4;
      if (bytes > 2 * page) return reply::refusal(name + ": log pages over two controller pages are read by the owner only");
      if (!data_in_own_memory(p, sqe.prp1, sqe.prp2, bytes)) return mine("the memory the log page goes to (PRP1/PRP2)");
      break;
    }
    case spec::admin_opcode::get_features:
      // Features with data return at most 4 KiB; those without name no memory.
      if ((sqe.prp1 != 0 || sqe.prp2 != 0) && !data_in_own_memory(p, sqe.prp1, sqe.prp2, 4096)) return mine("the memory the feature goes to");
      break;
    case spec::admin_opcode::create_io_completion_queue:
    case spec::admin_opcode::create_io_submission_queue: {
      const bool sq = opcode == spec::admin_opcode::create_io_submission_queue;
      const std::uint64_t entries = std::uint64_t{(sqe.cdw10 >> 16) & 0xffff} + 1;
      created = {sqe.prp1, entries * (sq ? 64 : 16)};
      if (!holds(p, qid)) return reply::refusal(name + ": queue " + std::to_string(qid) + " is not " + who(p) + "'s (take one first)");
      if ((sqe.cdw11 & 1u) == 0) return reply::refusal(name + ": an attached process's queues are physically contiguous (PC = 1)");
      if (sq) {
        const auto cqid = static_cast<std::uint16_t>(sqe.cdw11 >> 16);
        const std::scoped_lock lock(mutex_);
        if (p.cqs.count(cqid) == 0) return reply::refusal(name + ": CQ " + std::to_string(cqid) + " is no queue of " + who(p));
      }
      if (!owns_memory(p, created.bus, created.bytes)) return mine("the queue's memory");
      break;
    }
    case spec::admin_opcode::delete_io_submission_queue:
    case spec::admin_opcode::delete_io_completion_queue:
    case spec::admin_opcode::abort:
      if (!holds(p, qid)) return reply::refusal(name + ": queue " + std::to_string(qid) + " is not " + who(p) + "'s");
      break;
    default:
      return reply::refusal(name + " is the owner's alone: an attached process identifies, reads features and log pages, and creates, "
                                   "deletes and aborts on its own queues");
  }
  reply r;
  r.cqe = ctrl_.admin_command(sqe, who(p) + "'s " + name);
  // The owner's record of the process's queues follows what the controller did.
  const bool done = r.cqe.status() == spec::status::successful_completion;
  const std::scoped_lock lock(mutex_);
  switch (opcode) {
    case spec::admin_opcode::create_io_completion_queue:
      if (done) p.cqs[qid] = created;
      break;
    case spec::admin_opcode::create_io_submission_queue:
      if (done) p.sqs[qid] = created;
      break;
    case spec::admin_opcode::delete_io_completion_queue:
      if (done || r.cqe.status() == spec::status::invalid_queue_identifier) p.cqs.erase(qid);
      break;
    case spec::admin_opcode::delete_io_submission_queue:
      if (done || r.cqe.status() == spec::status::invalid_queue_identifier) p.sqs.erase(qid);
      break;
    default:
      break;
  }
  return r;
}

}  // namespace host::sharing
CUNVME_NAMESPACE_END
