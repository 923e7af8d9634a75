// Shared setup of the policies suite: an emulated controller brought up through the host
// path, a verified data pattern, and the composition of every policy combination.
#pragma once

#include <cunvme/emu/fault_injection.cuh>
#include <cunvme/emu/controller_config.cuh>
#include <cunvme/host/backend/emu_backend.cuh>
#include <cunvme/host/queue/io_queue.cuh>
#include <cunvme/io/reader.cuh>

#include <doctest/doctest.h>

#include "../pattern.hpp"

#include <cstdint>
#include <cstring>
#include <latch>
#include <memory>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace test {

namespace host = cunvme::host;
namespace spec = cunvme::spec;
namespace emu = cunvme::emu;
namespace slots = cunvme::slots;
namespace completion = cunvme::completion;
namespace doorbell = cunvme::doorbell;
namespace prp = cunvme::prp;
using cunvme::io_error;
using cunvme::io_result;

/// 8 MiB of 512-byte blocks (or `bytes` of `lba_size` blocks), two workers.
[[nodiscard]] inline emu::controller_config small_config(std::uint32_t lba_size = 512, std::uint64_t bytes = 8 << 20) {
  emu::controller_config c;
  c.namespaces = {emu::namespace_config::in_memory(lba_size, bytes / lba_size)};
  return c;
}

/// A fault rule: every read meeting LBAs [first, last] completes with Unrecovered Read Error.
[[nodiscard]] inline emu::fault_rule read_error_at(std::uint64_t first, std::uint64_t last) {
  emu::fault_rule rule;
  rule.status = spec::status::unrecovered_read_error;
  rule.opcode = static_cast<std::uint8_t>(spec::nvm_opcode::read);
  rule.lba_first = first;
  rule.lba_last = last;
  rule.fraction = 1;
  return rule;
}

/// `small_config()` with one fault rule.
[[nodiscard]] inline emu::controller_config with_rule(emu::fault_rule rule) {
  auto config = small_config();
  config.faults = {rule};
  return config;
}

/// An emulated controller up through host::controller, with its emulator reachable.
struct rig {
  explicit rig(emu::controller_config config = small_config(), host::controller_options options = {}) {
    auto backend = std::make_unique<host::emu_backend>(std::move(config));
    emulator = &backend->controller();
    ctrl = std::make_unique<host::controller>(std::move(backend), options);
  }
  /// Fills the namespace with `word_at(o, round)` directly in the emulator's store.
  void fill(std::uint64_t round = 0) const {
    auto& store = emulator->store(1);
    const std::uint64_t bytes = ctrl->namespace_by_id(1).bytes();
    std::vector<std::uint64_t> words(1 << 16);
    for (std::uint64_t at = 0; at < bytes; at += words.size() * 8) {
      for (std::size_t i = 0; i < words.size(); ++i) words[i] = word_at(at + i * 8, round);
      store.write(at, words.data(), std::min<std::uint64_t>(words.size() * 8, bytes - at));
    }
  }
  emu::controller* emulator = nullptr;
  std::unique_ptr<host::controller> ctrl;
};

/// A DMA buffer as a reader takes it: contiguous (the emulator's IOMMU maps one range).
[[nodiscard]] inline prp::contiguous contiguous_of(const host::dma_buffer& b) { return prp::contiguous{b.bus()}; }
/// The same buffer described page by page.
[[nodiscard]] inline prp::page_list pages_of(const host::dma_buffer& b) { return prp::page_list{b.pages().data(), 12}; }

template <class Slots, class Completion, class Doorbell, class Prp = prp::contiguous>
using reader_of = cunvme::block_reader<cunvme::queue_policies<Slots, Completion>, Prp, Doorbell>;
template <class Slots, class Completion, class Doorbell, class Prp = prp::contiguous>
using writer_of = cunvme::block_writer<cunvme::queue_policies<Slots, Completion>, Prp, Doorbell>;

/// Runs a dedicated poller thread for the lifetime of the object when `Completion` asks for one.
template <class Completion, class Doorbell>
class poller_thread {
 public:
  explicit poller_thread(const cunvme::queue_view& q) {
    if constexpr (std::is_same_v<Completion, completion::dedicated_poller>) {
      thread_ = std::thread([this, q] { consumed_ = completion::poller<Doorbell>::run(q, stop_); });
    }
  }
  ~poller_thread() { stop(); }
  std::uint64_t stop() {
    if (thread_.joinable()) {
      std::atomic_ref<std::uint32_t>(stop_).store(1, std::memory_order_release);
      thread_.join();
    }
    return consumed_;
  }

 private:
  std::uint32_t stop_ = 0;
  std::uint64_t consumed_ = 0;
  std::thread thread_;
};

/// Runs `body(thread index)` on `threads` threads released together, and joins them.
template <class Body>
void on_threads(unsigned threads, Body body) {
  std::latch start(threads);
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) pool.emplace_back([&, t] {
    start.arrive_and_wait();
    body(t);
  });
  for (auto& th : pool) th.join();
}

}  // namespace test
