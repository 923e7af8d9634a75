// A volume's members on the host: checks that namespaces on several controllers can form one
// striped or mirrored volume, and lays out the member table (`volume_member`s and their queue
// views) where the threads using the volume address it — host memory for CPU threads, GPU
// memory for kernels.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/checked.cuh>
#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/memory/dma_memory.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/queue/io_queue.cuh>
#include <cunvme/host/memory/queue_memory.cuh>
#include <cunvme/policy/prp.cuh>
#include <cunvme/volume/volume.cuh>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <utility>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// Namespaces on one or more controllers as one volume, and the queue pairs its threads use.
/// The member table holds copies of the queue pairs' views, which are pointers and constants: a
/// controller reset keeps each queue pair's identifier and memory, so the table stays valid
/// across it. Make the volume again only after destroying and creating one of its queue pairs,
/// and keep the queue pairs alive as long as the volume. A timed-out command on a member is
/// recovered by the library's one rule (host/controller/recovery.cuh): after the kernel, that member's
/// `io_queue::abort_timed_out()`, then `controller::reset()` of its controller where the
/// outcome `needs_reset()`.
///
/// Usage: examples/snippets/host.cpp, `striped_volume`; in kernels, kernels.cu `volumes`.
class volume {
 public:
  /// One member: a namespace and queue pairs on its controller (all on the same controller).
  struct member {
    std::vector<io_queue*> queues;
    std::uint32_t nsid = 1;
  };

  /// Stripes of `stripe_bytes` (a power of two, at least one block) taken by the members in
  /// turn (RAID-0). The volume holds as many whole stripe rows as the smallest member does.
  /// `gpu_table`: where `device_view` puts the member table (`host::gpu_bookkeeping`, say).
  /// Throws `host::error` where the members cannot form a volume (see `mirrored`).
  [[nodiscard]] static volume striped(std::vector<member> members, std::uint64_t stripe_bytes, io_queue_memory gpu_table = {}) {
    return volume(std::move(members), volume_layout::striped, stripe_bytes, std::move(gpu_table));
  }

  /// Every member holding every block (RAID-1): as many blocks as the smallest member. Reads
  /// go to the members in turn by 64 KiB stripe. Throws `host::error` for no members or more
  /// than `max_volume_members`, a member without queue pairs or with queue pairs on two
  /// controllers, one namespace given twice, namespaces with metadata or protection
  /// information or of different block sizes, or a volume of no blocks.
  [[nodiscard]] static volume mirrored(std::vector<member> members, io_queue_memory gpu_table = {}) {
    return volume(std::move(members), volume_layout::mirrored, 64 * 1024, std::move(gpu_table));
  }

  volume(volume&&) noexcept = default;
  volume& operator=(volume&&) noexcept = default;
  volume(const volume&) = delete;
  volume& operator=(const volume&) = delete;

  /// The volume as CPU threads address it.
  [[nodiscard]] volume_view view() const noexcept {
    volume_view v = shape_;
    v.members = reinterpret_cast<const volume_member*>(host_table_.data());
    return v;
  }

  /// The volume as GPU threads address it; throws `host::error` where no `gpu_table` memory
  /// was given.
  [[nodiscard]] volume_view device_view() const {
    if (!gpu_table_) throw error("Volume for GPU threads", name(), "no GPU memory for its member table was given (pass gpu_table, e.g. host::gpu_bookkeeping)");
    volume_view v = shape_;
    v.members = static_cast<const volume_member*>(gpu_table_.device_data());
    return v;
  }

  [[nodiscard]] std::uint32_t member_count() const noexcept { return shape_.member_count; }
  [[nodiscard]] controller& controller_of(std::uint32_t m) const { return members_.at(m).queues.front()->owner(); }
  [[nodiscard]] const cunvme::namespace_view& namespace_of(std::uint32_t m) const { return namespaces_.at(m); }
  [[nodiscard]] std::uint64_t blocks() const noexcept { return shape_.blocks; }
  [[nodiscard]] std::uint64_t block_bytes() const noexcept { return shape_.block_bytes(); }
  [[nodiscard]] volume_layout layout() const noexcept { return shape_.layout; }
  [[nodiscard]] std::uint64_t stripe_bytes() const noexcept { return shape_.stripe_blocks() << shape_.lba_shift; }
  /// The controllers' names, for messages.
  [[nodiscard]] std::string name() const {
    std::string s;
    for (const member& m : members_) s += (s.empty() ? "" : "+") + m.queues.front()->owner().name();
    return s;
  }

 private:
  volume(std::vector<member> members, volume_layout layout, std::uint64_t stripe_bytes, io_queue_memory gpu_table)
      : members_(std::move(members)) {
    const std::string what = layout == volume_layout::striped ? "Create striped volume" : "Create mirrored volume";
    if (members_.empty() || members_.size() > max_volume_members) {
      throw error(what, "volume", std::to_string(members_.size()) + " members: a volume has 1 to " + std::to_string(max_volume_members));
    }
    std::uint64_t smallest = ~std::uint64_t{0};
    std::uint64_t timeout = 0;
    for (std::size_t i = 0; i < members_.size(); ++i) {
      const member& m = members_[i];
      const std::string which = "member " + std::to_string(i);
      if (m.queues.empty() || std::find(m.queues.begin(), m.queues.end(), nullptr) != m.queues.end()) {
        throw error(what, "volume", which + " has no queue pair (or a null one)");
      }
      const controller& ctrl = m.queues.front()->owner();
      for (const io_queue* q : m.queues) {
        if (&q->owner() != &ctrl) throw error(what, ctrl.name(), which + "'s queue pairs are on two controllers (" + ctrl.name() + ", " + q->owner().name() + ")");
        timeout = std::max<std::uint64_t>(timeout, q->view().timeout_ns);
      }
      for (std::size_t j = 0; j < i; ++j) {
        if (&members_[j].queues.front()->owner() == &ctrl && members_[j].nsid == m.nsid) {
          throw error(what, ctrl.name(), which + " is namespace " + std::to_string(m.nsid) + " again (member " + std::to_string(j) + ")");
        }
      }
      cunvme::namespace_view ns = m.queues.front()->namespace_view(m.nsid);
      if (!ns.transferable() || ns.metadata != metadata_layout::none) {
        throw error(what, ctrl.name(), which + ": namespace " + std::to_string(m.nsid) + " carries metadata or protection information; volumes take plain blocks");
      }
      if (i > 0 && ns.lba_shift != namespaces_.front().lba_shift) {
        throw error(what, ctrl.name(), which + "'s blocks are " + std::to_string(ns.lba_size()) + " bytes, member 0's " +
                                           std::to_string(namespaces_.front().lba_size()) + ": members need one block size");
      }
      smallest = std::min(smallest, ns.lba_count);
      namespaces_.push_back(ns);
    }
    const unsigned lba_shift = namespaces_.front().lba_shift;
    if (stripe_bytes == 0 || !std::has_single_bit(stripe_bytes) || stripe_bytes < (std::uint64_t{1} << lba_shift)) {
      throw error(what, name(), "the stripe of " + std::to_string(stripe_bytes) + " bytes is not a power of two of at least one " +
                                    std::to_string(std::uint64_t{1} << lba_shift) + "-byte block");
    }
    shape_.member_count = static_cast<std::uint32_t>(members_.size());
    shape_.layout = layout;
    shape_.lba_shift = lba_shift;
    shape_.stripe_shift = static_cast<std::uint32_t>(std::countr_zero(stripe_bytes) - lba_shift);
    shape_.timeout_ns = timeout;
    if (layout == volume_layout::striped) {
      const std::uint64_t rows = smallest >> shape_.stripe_shift;
      if (rows > (~std::uint64_t{0} >> shape_.stripe_shift) / members_.size()) throw error(what, name(), "the volume's block count does not fit 64 bits");
      shape_.blocks = (rows << shape_.stripe_shift) * members_.size();
    } else {
      shape_.blocks = smallest;
    }
    if (shape_.blocks == 0) {
      throw error(what, name(), "the smallest member (" + std::to_string(smallest) + " blocks) holds no whole stripe of " + std::to_string(stripe_bytes) + " bytes");
    }
    host_table_ = table_image(nullptr);
    if (gpu_table.bookkeeping) {
      gpu_table_ = gpu_table.bookkeeping(host_table_.size());
      if (gpu_table_.size() < host_table_.size() || gpu_table_.device_data() == nullptr) {
        throw error(what, name(), "the gpu_table allocator gave no GPU memory of " + std::to_string(host_table_.size()) + " bytes");
      }
      const std::vector<std::byte> image = table_image(static_cast<std::byte*>(gpu_table_.device_data()));
      if (gpu_table.copy_in) {
        gpu_table.copy_in(gpu_table_.device_data(), image.data(), image.size());
      } else if (gpu_table_.data() != nullptr) {
        std::memcpy(gpu_table_.data(), image.data(), image.size());
      } else {
        throw error(what, name(), "the gpu_table memory is not host-addressable and no copy_in was given");
      }
    }
  }

  /// The member table as it must lie at `base` (its own storage where `base` is null): the
  /// members, then each member's queue views, the members' pointers into it.
  [[nodiscard]] std::vector<std::byte> table_image(std::byte* base) const {
    std::size_t views = 0;
    for (const member& m : members_) views += m.queues.size();
    const std::size_t queues_at = (members_.size() * sizeof(volume_member) + alignof(queue_view) - 1) / alignof(queue_view) * alignof(queue_view);
    std::vector<std::byte> image(queues_at + views * sizeof(queue_view));
    std::byte* at = base != nullptr ? base : image.data();
    std::size_t next = 0;
    for (std::size_t i = 0; i < members_.size(); ++i) {
      volume_member vm;
      vm.queues = reinterpret_cast<const queue_view*>(at + queues_at + next * sizeof(queue_view));
      vm.queue_count = static_cast<std::uint32_t>(members_[i].queues.size());
      vm.ns = namespaces_[i];
      std::memcpy(image.data() + i * sizeof(volume_member), &vm, sizeof vm);
      for (const io_queue* q : members_[i].queues) std::memcpy(image.data() + queues_at + next++ * sizeof(queue_view), &q->view(), sizeof(queue_view));
    }
    return image;
  }

  std::vector<member> members_;
  std::vector<cunvme::namespace_view> namespaces_;
  volume_view shape_{};
  std::vector<std::byte> host_table_;  // operator new's alignment (16) covers queue_view's
  dma_buffer gpu_table_;
};

/// Memory that member 0's controller reaches, as each member of a volume reaches it: the
/// memory itself on member 0's controller, and one mapping for each other controller, shared
/// by the members on it — `dma_allocator::map_host` for host memory, `map_gpu` for GPU memory.
/// Owns the mappings (release it before the memory); `of(m)` may be the memory itself, so use
/// it while the memory stays where it is.
class member_mappings {
 public:
  member_mappings() = default;
  /// Throws `host::error` (as `what`) where a controller cannot map the memory, or where
  /// another controller needs memory that neither the host nor a GPU addresses (a CMB).
  member_mappings(const volume& vol, const dma_buffer& memory, const std::string& what) {
    std::vector<const controller*> seen{&vol.controller_of(0)};  // seen[k] reaches it as mapping[k]
    std::vector<const dma_buffer*> mapping{&memory};
    for (std::uint32_t m = 0; m < vol.member_count(); ++m) {
      const controller* c = &vol.controller_of(m);
      const auto known = std::find(seen.begin(), seen.end(), c);
      if (known != seen.end()) {
        reach_.push_back(mapping[static_cast<std::size_t>(known - seen.begin())]);
        continue;
      }
      dma_allocator& other = vol.controller_of(m).memory();
      if (memory.location() == memory_location::gpu && memory.device_data() != nullptr) {
        mapped_.push_back(other.map_gpu(memory.device_data(), memory.size()));
      } else if (memory.location() == memory_location::pinned_host && memory.data() != nullptr) {
        mapped_.push_back(other.map_host(memory.data(), memory.size()));
      } else {
        throw error(what, vol.name(), "member 0's DMA memory is neither host nor GPU memory the other controllers can map");
      }
      seen.push_back(c);
      mapping.push_back(&mapped_.back());
      reach_.push_back(&mapped_.back());
    }
  }
  /// The memory as member `m`'s controller reaches it.
  [[nodiscard]] const dma_buffer& of(std::uint32_t m) const { return *reach_.at(m); }
  [[nodiscard]] std::uint32_t members() const noexcept { return static_cast<std::uint32_t>(reach_.size()); }

 private:
  std::deque<dma_buffer> mapped_;  // deque: the pointers in reach_ stay valid as it grows
  std::vector<const dma_buffer*> reach_;
};

/// DMA memory that every member of a volume reaches, for `volume_io` from CPU threads: allocated
/// from member 0's controller and mapped for each other controller (`dma_allocator::map_host`).
/// `buffers()` describes it page by page as each member addresses it.
class volume_memory {
 public:
  volume_memory(const volume& vol, std::size_t bytes)
      : own_(vol.controller_of(0).memory().allocate(bytes)), mappings_(vol, own_, "Allocate volume memory") {
    pages_.resize(mappings_.members());
    for (std::uint32_t m = 0; m < mappings_.members(); ++m) {
      pages_[m] = mappings_.of(m).bus_pages(4096);
      if (pages_[m].empty()) throw error("Allocate volume memory", vol.name(), "member " + std::to_string(m) + " reaches the memory in pieces not aligned to 4 KiB");
    }
    for (const auto& p : pages_) lists_.push_back(prp::page_list{p.data(), 12});
  }
  [[nodiscard]] std::byte* data() const noexcept { return own_.data(); }
  [[nodiscard]] std::size_t size() const noexcept { return own_.size(); }
  /// The memory as each member's controller addresses it, for CPU threads (host memory).
  [[nodiscard]] member_buffers<prp::page_list> buffers() const noexcept { return {lists_.data()}; }

 private:
  dma_buffer own_;
  member_mappings mappings_;  // released before own_
  std::vector<std::vector<std::uint64_t>> pages_;
  std::vector<prp::page_list> lists_;
};

}  // namespace host
CUNVME_NAMESPACE_END
