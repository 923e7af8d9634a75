// The emulated controller's NVM command set (NVMe 2.0 NVM Command Set specification 3.2):
// Read, Write, Flush, Write Zeroes and Dataset Management, with the data path they share with
// admin commands: moving a command's data through its PRPs, and holding a namespace's store
// ranges until copies into device memory are done.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/emu/backing_store.cuh>
#include <cunvme/emu/dma_space.cuh>
#include <cunvme/emu/nvm_checks.cuh>
#include <cunvme/emu/prp_walker.cuh>
#include <cunvme/emu/queues.cuh>
#include <cunvme/spec/command_fields.cuh>
#include <cunvme/spec/opcodes.cuh>
#include <cunvme/spec/queue_entry.cuh>
#include <cunvme/spec/status.cuh>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <utility>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace emu::detail {

class nvm_commands : public queues {
 protected:
  using queues::queues;

  // ---- command data ----------------------------------------------------------------------------
  /// Copies `bytes` of controller data to the command's PRPs.
  [[nodiscard]] spec::status to_host(engine& e, const dma_space::view& mem, const spec::submission_entry& sqe, const void* data,
                                     std::uint64_t bytes) {
    const auto s = e.walker.walk(mem, sqe.prp1, sqe.prp2, bytes, page_size_, config_.cmb_mixed_data_locations);
    if (s != spec::status::successful_completion) return s;
    const auto* src = static_cast<const std::byte*>(data);
    for (const auto& seg : e.walker.segments()) {
      if (!mem.copy_in(seg.region, seg.offset, src, seg.length)) return spec::status::data_transfer_error;
      src += seg.length;
    }
    return mem.finish_device_writes() ? spec::status::successful_completion : spec::status::data_transfer_error;
  }

  /// Copies `data_bytes` of controller data to the command's PRPs, then zeros up to `bytes`
  /// (a log page read past its end), the zeros from one static page.
  [[nodiscard]] spec::status to_host_padded(engine& e, const dma_space::view& mem, const spec::submission_entry& sqe,
                                            const std::byte* data, std::uint64_t data_bytes, std::uint64_t bytes) {
    static constexpr std::byte zeros[4096] = {};
    const auto s = e.walker.walk(mem, sqe.prp1, sqe.prp2, bytes, page_size_, config_.cmb_mixed_data_locations);
    if (s != spec::status::successful_completion) return s;
    std::uint64_t done = 0;
    for (const auto& seg : e.walker.segments()) {
      for (std::uint64_t at = 0; at < seg.length;) {
        const std::uint64_t n = done < data_bytes ? std::min(seg.length - at, data_bytes - done)
                                                  : std::min<std::uint64_t>(seg.length - at, sizeof zeros);
        if (!mem.copy_in(seg.region, seg.offset + at, done < data_bytes ? data + done : zeros, n)) {
          return spec::status::data_transfer_error;
        }
        at += n;
        done += n;
      }
    }
    return mem.finish_device_writes() ? spec::status::successful_completion : spec::status::data_transfer_error;
  }

  /// Copies `bytes` of host data from the command's PRPs.
  [[nodiscard]] spec::status from_host(engine& e, const dma_space::view& mem, const spec::submission_entry& sqe, void* data,
                                       std::uint64_t bytes) {
    const auto s = e.walker.walk(mem, sqe.prp1, sqe.prp2, bytes, page_size_, config_.cmb_mixed_data_locations);
    if (s != spec::status::successful_completion) return s;
    auto* dst = static_cast<std::byte*>(data);
    for (const auto& seg : e.walker.segments()) {
      if (!mem.copy_out(seg.region, seg.offset, dst, seg.length)) return spec::status::data_transfer_error;
      dst += seg.length;
    }
    return spec::status::successful_completion;
  }


  /// Waits once for the burst's copies into device memory, before any of its completions is
  /// posted: a CUDA synchronize per command capped the emulator at about 110 k commands/s
  /// (bench/RESULTS.md, P3). Reads whose copies failed complete with Data Transfer Error.
  /// Deferring the wait past later commands of the burst is allowed: commands in flight
  /// together have no order (NVMe 2.0 base specification, "Command Ordering Requirements"),
  /// so a later write may overlap an earlier read.
  void settle_copies(engine& e, const dma_space::view& mem) {
    if (e.awaiting.empty() && e.holds.empty()) return;
    const bool copied = mem.finish_device_writes();
    // The data has left the store: writers may have its ranges again.
    e.holds.clear();
    e.held_locks = 0;
    if (!copied && e.command_copies) e.command_copies_lost = true;
    e.command_copies = false;
    if (!copied) {
      for (const auto& a : e.awaiting) {
        pending_completion& pc = e.batch[a.index];
        if (spec::cqe_status::status_of(pc.cqe.status_field) != spec::status::successful_completion) continue;
        pc.cqe.status_field = spec::cqe_status::make_status_field(spec::status::data_transfer_error, false, true);
        pc.dnr = true;
        errors_.log_command(pc.sqid, pc.cqe.cid, spec::status::data_transfer_error, a.lba, a.nsid);
      }
    }
    e.awaiting.clear();
  }

  /// Releases the store ranges a burst still holds when serve_sq leaves early, after waiting
  /// for the copies out of them.
  struct release_holds_on_exit {
    release_holds_on_exit(engine& engine_, const dma_space::view& view) : e(engine_), mem(view) {}
    release_holds_on_exit(const release_holds_on_exit&) = delete;
    release_holds_on_exit& operator=(const release_holds_on_exit&) = delete;
    ~release_holds_on_exit() {
      if (e.holds.empty()) return;
      try {
        (void)mem.finish_device_writes();
      } catch (...) {
        // The copies' fate is unknown either way; the ranges must not stay locked.
      }
      e.holds.clear();
      e.held_locks = 0;
    }
    engine& e;
    const dma_space::view& mem;
  };

  /// Locks a thread may hold for reads whose copies are in flight: ThreadSanitizer, which CI
  /// runs, aborts a thread holding more than 64, and the controller holds a few of its own.
  static constexpr std::size_t max_held_locks = 32;

  /// Runs `copy(p, p2)`, `p` and `p2` the store's bytes at `offset` and `offset2`, under one
  /// shared lock of [offset, offset + len) and [offset2, offset2 + len2) (a command's data and
  /// separate metadata: a write lands before both or after both). When `in_flight` (copies into device memory complete later, in
  /// settle_copies), the lock is kept until they have: a write overlapping the read waits for
  /// the read's data to have left the store, so no read returns a mix of old and new data.
  /// A thread that keeps such locks never waits for another lock while it does (that could
  /// deadlock with a writer waiting for one it keeps): it takes the range only if it is free
  /// now, and otherwise settles the burst's copies, letting its locks go, before it waits.
  template <class Copy>
  [[nodiscard]] bool read_from_store(engine& e, const dma_space::view& mem, const backing_store& store, std::uint64_t offset,
                                     std::uint64_t len, std::uint64_t offset2, std::uint64_t len2, bool in_flight, Copy copy) {
    if (!in_flight) {
      // Done before returning, so held only for the copy; but with earlier reads' holds kept,
      // waiting for this range could deadlock as below: try it, else let them go first.
      if (!e.holds.empty()) {
        if (auto hold = store.try_hold_for_read(offset, len, offset2, len2); hold && e.held_locks + hold->locks_held() <= max_held_locks) {
          return copy(hold->data(), hold->data2());
        }
        settle_copies(e, mem);
      }
      bool ok = false;
      store.with_read_access(offset, len, offset2, len2, [&](const std::byte* p, const std::byte* p2) { ok = copy(p, p2); });
      return ok;
    }
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (auto hold = store.try_hold_for_read(offset, len, offset2, len2); hold && e.held_locks + hold->locks_held() <= max_held_locks) {
        const bool ok = copy(hold->data(), hold->data2());
        e.command_copies = true;
        e.held_locks += hold->locks_held();
        e.holds.push_back(std::move(*hold));
        return ok;
      }
      if (e.holds.empty()) break;
      settle_copies(e, mem);
    }
    // Contended, or too long to hold: wait for the range holding nothing else, and for the
    // copies before letting it go.
    bool ok = false;
    store.with_read_access(offset, len, offset2, len2, [&](const std::byte* p, const std::byte* p2) { ok = copy(p, p2) && mem.finish_device_writes(); });
    return ok;
  }

  /// Pins the granules a command's data (and separate metadata) lie in before it copies them
  /// to or from device memory, and, where its data reaches past every granule used before,
  /// asks for the granules after it to be pinned ahead. (A worker may wait here for another
  /// thread's registration while it holds earlier reads' store ranges: registering takes no
  /// store lock, so that delays writers to them, and cannot deadlock.)
  void pin_for_device_copies(namespace_state& n, std::uint64_t at, std::uint64_t bytes, std::uint64_t metadata_at, std::uint64_t metadata_bytes) {
    pinned_granules& granules = *n.pinning;
    granules.use(at, bytes);
    granules.use(metadata_at, metadata_bytes);
    const std::uint64_t last = granules.granule_of(at + bytes - 1);
    if (granules.advanced_to(last)) pin_ahead_.request(granules, last + 1, config_.pinning.ahead);
  }

  /// Calls `copy(piece, at, length)` over [p, p + len) of `n`'s store cut where its pinned
  /// granules meet: CUDA refuses a copy whose host side spans two registrations.
  template <class Byte, class Copy>
  [[nodiscard]] static bool by_granule(const namespace_state& n, Byte* p, std::uint64_t len, Copy&& copy) {
    if (!n.pinning) return copy(p, std::uint64_t{0}, len);
    return n.pinning->for_each_piece(p, len, [&](const std::byte*, std::uint64_t at, std::uint64_t length) {
      return copy(p + at, at, length);
    });
  }

  [[nodiscard]] static bool lands_on_device(const std::vector<data_segment>& segments) noexcept {
    return std::any_of(segments.begin(), segments.end(), [](const data_segment& s) { return s.region.kind == memory_kind::device; });
  }

  // ---- NVM commands -----------------------------------------------------------------------------
  outcome execute_io(engine& e, const dma_space::view& mem, const spec::submission_entry& sqe) {
    e.counted.commands.fetch_add(1, std::memory_order_relaxed);
    if (const spec::status s = nvm_checks::check_transfer_fields(sqe); s != spec::status::successful_completion) return fail(s);
    switch (static_cast<spec::nvm_opcode>(sqe.opcode())) {
      case spec::nvm_opcode::read: return read_write(e, mem, sqe, false);
      case spec::nvm_opcode::write: return read_write(e, mem, sqe, true);
      case spec::nvm_opcode::flush: return flush(sqe);
      case spec::nvm_opcode::write_zeroes: return write_zeroes(sqe);
      case spec::nvm_opcode::dataset_management: return dataset_management(e, mem, sqe);
      default: return fail(spec::status::invalid_command_opcode);
    }
  }

  /// The namespace `nsid` names, or nullptr where none is active.
  [[nodiscard]] namespace_state* active_namespace(std::uint32_t nsid) noexcept { return namespace_active(nsid) ? &namespaces_[nsid - 1] : nullptr; }

  /// Checks NSID and the LBA range of a command; nullptr with `error` set if they are bad.
  [[nodiscard]] namespace_state* checked_range(std::uint32_t nsid, std::uint64_t slba, std::uint64_t blocks, spec::status& error) {
    namespace_state* n = active_namespace(nsid);
    if (n == nullptr) {
      error = spec::status::invalid_namespace_or_format;
      return nullptr;
    }
    if (const spec::status s = nvm_checks::check_lba_range(slba, blocks, n->lba_count); s != spec::status::successful_completion) {
      error = s;
      return nullptr;
    }
    return n;
  }

  [[nodiscard]] std::uint64_t max_transfer_bytes() const noexcept { return nvm_checks::max_transfer_bytes(config_.mdts, cap_.min_page_size()); }

  outcome read_write(engine& e, const dma_space::view& mem, const spec::submission_entry& sqe, bool is_write) {
    const nvm_checks::block_range range = nvm_checks::blocks_of(sqe);
    const std::uint64_t slba = range.slba;
    const std::uint64_t blocks = range.blocks;
    outcome o;
    o.lba = slba;
    o.nsid = sqe.nsid;
    o.is_write = is_write;
    const auto failed = [&o](spec::status s) {
      o.status = s;
      return o;
    };
    namespace_state* n = active_namespace(sqe.nsid);
    // MDTS counts metadata that is interleaved with the data (extended LBAs), not a separate
    // metadata buffer (Identify Controller, MDTS): the block's stride in the data buffer.
    o.status = nvm_checks::check_read_write(
        range, n == nullptr ? nvm_checks::namespace_limits{} : nvm_checks::namespace_limits{true, n->lba_count, n->data_stride()}, max_transfer_bytes());
    if (o.status != spec::status::successful_completion) return o;
    const std::uint64_t bytes = blocks * n->data_stride();
    if (is_write && n->read_only) return failed(spec::status::namespace_is_write_protected);
    // Separate metadata: MPTR is the address of one contiguous, dword-aligned buffer of MS
    // bytes per block (NVMe 2.0 4.1.1, PSDT 00b).
    const std::uint64_t metadata_bytes = n->separate_metadata() ? blocks * n->ms : 0;
    std::optional<dma_region> metadata;
    if (metadata_bytes != 0) {
      if (!spec::dword_aligned(sqe.mptr)) return failed(spec::status::invalid_field_in_command);
      metadata = mem.find(sqe.mptr, metadata_bytes);
      if (!metadata) return failed(spec::status::data_transfer_error);
    }
    o.status = e.walker.walk(mem, sqe.prp1, sqe.prp2, bytes, page_size_, config_.cmb_mixed_data_locations);
    if (o.status != spec::status::successful_completion) return o;
    // The zeros after a file's partial last block are not the file's: data written there
    // could never reach it, so the command fails whole, as a write the medium refuses.
    if (is_write && !n->writable(slba, blocks)) return failed(spec::status::write_fault);
    // Without data movement every check above has run and the command completes as it
    // would have; only the copies (which, not attempted, cannot fail) are left out.
    if (config_.move_data) {
      // One lock over the command's whole range, not one per segment, and over its separate
      // metadata too, held (for reads into device memory) until the copies are done: an
      // overlapping write sees all of it or none, data and metadata alike.
      const std::uint64_t at = slba * n->data_stride();
      const std::uint64_t metadata_at = metadata ? n->metadata_offset(slba) : 0;
      const std::uint64_t from = metadata ? sqe.mptr - metadata->bus : 0;
      bool ok = true;
      e.command_copies = e.command_copies_lost = false;
      const bool on_device = lands_on_device(e.walker.segments()) || (metadata && metadata->kind == memory_kind::device);
      if (on_device && n->pinning) pin_for_device_copies(*n, at, bytes, metadata_at, metadata_bytes);
      if (is_write) {
        n->store.with_write_access(at, bytes, metadata_at, metadata_bytes, [&](std::byte* p, std::byte* mp) {
          for (const auto& seg : e.walker.segments()) {
            if (ok) ok = by_granule(*n, p, seg.length, [&](std::byte* piece, std::uint64_t off, std::uint64_t len) { return mem.copy_out(seg.region, seg.offset + off, piece, len); });
            p += seg.length;
          }
          if (ok && metadata) ok = by_granule(*n, mp, metadata_bytes, [&](std::byte* piece, std::uint64_t off, std::uint64_t len) { return mem.copy_out(*metadata, from + off, piece, len); });
        });
      } else {
        ok = read_from_store(e, mem, n->store, at, bytes, metadata_at, metadata_bytes, on_device, [&](const std::byte* p, const std::byte* mp) {
          for (const auto& seg : e.walker.segments()) {
            if (!by_granule(*n, p, seg.length, [&](const std::byte* piece, std::uint64_t off, std::uint64_t len) {
                  return mem.copy_in(seg.region, seg.offset + off, piece, len);
                })) {
              return false;
            }
            p += seg.length;
          }
          return !metadata || by_granule(*n, mp, metadata_bytes, [&](const std::byte* piece, std::uint64_t off, std::uint64_t len) {
                   return mem.copy_in(*metadata, from + off, piece, len);
                 });
        });
      }
      if (!ok) return failed(spec::status::data_transfer_error);
      // A settle of the burst's copies after this command's own had started (read_from_store
      // settles before copying, so only a later path could) that reported a failure may have
      // been this command's (one wait covers them all).
      if (e.command_copies_lost) return failed(spec::status::data_transfer_error);
      // Copies into GPU memory may still be in flight: serve_sq waits for the whole burst's
      // before any completion is posted (settle_copies).
      o.copies_in_flight = !is_write;
    }
    o.bytes = bytes;
    if (is_write) {
      e.counted.bytes_written.fetch_add(bytes, std::memory_order_relaxed);
      e.counted.write_commands.fetch_add(1, std::memory_order_relaxed);
      // Force Unit Access, or no volatile cache: the data is durable before completion.
      if ((spec::rw_fields::fua::get(sqe.cdw12) || !volatile_write_cache_enabled_) && !durable(*n)) {
        o.status = spec::status::write_fault;
      }
    } else {
      e.counted.bytes_read.fetch_add(bytes, std::memory_order_relaxed);
      e.counted.read_commands.fetch_add(1, std::memory_order_relaxed);
    }
    return o;
  }

  [[nodiscard]] static bool durable(namespace_state& n) {
    if (!n.store.file_backed()) return true;
    try {
      n.store.flush();
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }

  outcome flush(const spec::submission_entry& sqe) {
    if (sqe.nsid == spec::broadcast_nsid && config_.volatile_write_cache) {
      for (auto& n : namespaces_) {
        if (!durable(n)) return fail(spec::status::write_fault);
      }
      return outcome{};
    }
    if (!namespace_active(sqe.nsid)) return fail(spec::status::invalid_namespace_or_format);
    return durable(namespaces_[sqe.nsid - 1]) ? outcome{} : fail(spec::status::write_fault);
  }

  outcome write_zeroes(const spec::submission_entry& sqe) {
    const auto [slba, blocks] = nvm_checks::blocks_of(sqe);
    outcome o;
    o.lba = slba;
    o.nsid = sqe.nsid;
    namespace_state* n = checked_range(sqe.nsid, slba, blocks, o.status);
    if (n == nullptr) return o;
    if (n->read_only) {
      o.status = spec::status::namespace_is_write_protected;
      return o;
    }
    n->zero_blocks(slba, blocks);
    return o;
  }

  outcome dataset_management(engine& e, const dma_space::view& mem, const spec::submission_entry& sqe) {
    if (!namespace_active(sqe.nsid)) return fail(spec::status::invalid_namespace_or_format);
    const std::uint32_t count = spec::dataset_management_fields::nr::get(sqe.cdw10) + 1u;
    std::vector<spec::dsm_range> ranges(count);
    const auto s = from_host(e, mem, sqe, ranges.data(), ranges.size() * sizeof(spec::dsm_range));
    if (s != spec::status::successful_completion) return fail(s);
    if (!spec::dataset_management_fields::ad::get(sqe.cdw11)) return outcome{};  // attributes are hints
    namespace_state& n = namespaces_[sqe.nsid - 1];
    if (n.read_only) return fail(spec::status::namespace_is_write_protected);
    // Check every range before touching any: a command fails as a whole.
    for (const auto& r : ranges) {
      spec::status error{};
      if (checked_range(sqe.nsid, r.starting_lba, r.length_in_logical_blocks, error) == nullptr) {
        outcome o = fail(error);
        o.lba = r.starting_lba;
        o.nsid = sqe.nsid;
        return o;
      }
    }
    for (const auto& r : ranges) {
      if (r.length_in_logical_blocks != 0) n.zero_blocks(r.starting_lba, r.length_in_logical_blocks);
    }
    return outcome{};
  }
};

}  // namespace emu::detail
CUNVME_NAMESPACE_END
