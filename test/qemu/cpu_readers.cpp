// Device-side readers and writers run by CPU threads against a real controller (QEMU's, in
// the guest of run_guest.sh, through sysfs:, vfio: or kmod:; or the emulator): for every
// slot × completion × doorbell policy combination, four threads share one queue pair, or, with
// slots::exclusive, own one each. Each thread works on its own slice of a region of the
// namespace: random reads checked against its copy of the slice (some of them up to four in
// flight through the asynchronous form), random writes recorded in it, then a "seal" that writes the whole slice with `sealed_word(o, seed)` and reads it back.
// The region ends up holding sealed words whatever the random phase did, so the host can check
// the disk image afterwards (check_image.py) knowing only the seed and the region.
//
//   cpu_readers URI --seed N --region OFFSET_MIB:SIZE_MIB [--ops K]
//
// Outside the region the namespace must hold host::pattern_word (the harness's disks,
// emu:pattern); inside it the random phase reads that pattern too. Prints one line per
// combination ("PASS name" / "FAIL name: why") and a summary; exits 0 when all passed.
#include <cunvme/host/queue/io_queue.cuh>
#include <cunvme/host/open.cuh>

#include "../pattern.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace host = cunvme::host;
namespace slots = cunvme::slots;
namespace completion = cunvme::completion;
namespace doorbell = cunvme::doorbell;
namespace prp = cunvme::prp;

namespace {

constexpr unsigned threads = 4;
constexpr std::size_t buffer_bytes = 64 * 1024;  // per thread: up to 128 blocks of 512 bytes, a PRP list

/// The word at byte `o` of the region after the seal. check_image.py computes the same.
constexpr std::uint64_t sealed_word(std::uint64_t o, std::uint64_t seed) { return test::word_at(o, seed); }

struct options {
  std::string uri;
  std::uint64_t seed = 0;
  std::uint64_t region_offset = 0, region_bytes = 0;
  std::uint32_t ops = 200;
};

/// What every combination shares: the controller, the namespace, the region's split into
/// slices (combination c, thread t → slice c·threads + t).
struct rig {
  const options& opt;
  host::controller& ctrl;
  cunvme::namespace_view ns;
  std::uint64_t first_lba = 0, region_blocks = 0, slices = 0;
  bool qemu = false;  ///< QEMU's controller (Identify MN): see the shadow-doorbell queue size in run_combination

  [[nodiscard]] std::uint64_t slice_begin(std::uint64_t i) const { return first_lba + region_blocks * i / slices; }
};

/// The queue as the host sees it when a wait ran out: whether the controller left an SQE
/// unfetched (SQ head behind the rung tail), or a completion unposted (CQ slot at the head
/// without the expected phase), or the host left one unconsumed; with shadow doorbells, the
/// shadow values and the controller's EventIdx. A wait that never ends is then named.
std::string describe(const cunvme::queue_view& q) {
  const auto word = [](const auto& w) { return std::to_string(std::atomic_ref(const_cast<std::remove_cvref_t<decltype(w)>&>(w)).load()); };
  const cunvme::queue_counters& c = *q.counters;
  std::string s = "queue " + std::to_string(q.qid) + " (" + std::to_string(q.entries) + " entries): SQ reserved " + word(c.sq_reserved) +
                  ", published " + word(c.sq_published) + ", rung " + word(c.sq_rung) + ", head (SQHD) " + word(c.sq_head) + "; CQ head " +
                  word(c.cq_head);
  const std::uint64_t head = std::atomic_ref(const_cast<std::uint64_t&>(c.cq_head)).load();
  const cunvme::spec::completion_entry& e = q.cq[head % q.entries];
  const std::uint32_t dw3 = std::atomic_ref(const_cast<std::uint32_t&>(reinterpret_cast<const std::uint32_t*>(&e)[3])).load();
  const bool expected_phase = (head / q.entries) % 2 == 0;
  s += ", its slot's phase " + std::to_string(cunvme::spec::cqe_status::phase(static_cast<std::uint16_t>(dw3 >> 16))) + " (new would be " +
       std::to_string(expected_phase) + ", CID " + std::to_string(dw3 & 0xffffu) + ")";
  if (q.sq_shadow != nullptr) {
    s += "; shadow SQ tail " + word(*q.sq_shadow) + " EventIdx " + word(*q.sq_event_index) + ", shadow CQ head " + word(*q.cq_shadow) + " EventIdx " +
         word(*q.cq_event_index);
  }
  return s + "; doorbells " + word(c.doorbell_mmio_writes) + " MMIO, " + word(c.doorbell_skipped) + " skipped";
}

struct thread_result {
  std::uint64_t failures = 0, mismatches = 0;
  std::uint64_t async_reads = 0, no_cid_retries = 0;  // how often the asynchronous form ran, and found every CID taken
  std::string first_problem;
  const cunvme::queue_view* queue = nullptr;  ///< described with the first failure
  std::atomic<bool>* give_up = nullptr;       ///< set on a failure: the combination's other threads stop early
  void fail(const std::string& why) {
    ++failures;
    if (first_problem.empty()) first_problem = why + (queue != nullptr ? "; " + describe(*queue) : std::string());
    if (give_up != nullptr) give_up->store(true);
  }
  [[nodiscard]] bool stopped() const { return give_up != nullptr && give_up->load(); }
};

/// A buffer as a PRP builder takes it, page by page: right for every backend (pagemap's 4 KiB
/// pages or huge pages, VFIO's IOVA pages, the module's pinned pages).
prp::page_list pages_of(const host::dma_buffer& b) {
  return prp::page_list{b.pages().data(), static_cast<unsigned>(std::countr_zero(b.page_size()))};
}

/// Compares `blocks` blocks read into `words` with the thread's copy of its slice from `lba` on
/// (relative to the slice).
void compare(const std::uint64_t* words, const std::vector<std::uint64_t>& copy, std::uint64_t lba, std::uint64_t blocks, std::uint64_t lba_size,
             const std::string& what, thread_result& out) {
  for (std::size_t i = 0; i < blocks * lba_size / 8; ++i) {
    if (words[i] != copy[lba * lba_size / 8 + i]) {
      ++out.mismatches;
      if (out.first_problem.empty()) out.first_problem = what + ": word " + std::to_string(i) + " differs";
    }
  }
}

/// Up to four reads in flight from this thread (the asynchronous form), each into its own
/// quarter of the buffer: with four threads on a shared queue of 8 entries, more commands than
/// the queue holds, so submitters meet a full queue and a CID pool run dry. A submit refused
/// for want of a CID waits for this thread's own reads first, then retries (bounded).
template <class Reader>
void async_reads(const Reader& reader, const host::dma_buffer& buffer, std::uint64_t begin, std::uint64_t lbas, const std::vector<std::uint64_t>& copy,
                 std::mt19937_64& rng, thread_result& out) {
  const std::uint64_t lba_size = reader.ns().lba_size();
  const std::uint64_t quarter = std::min<std::uint64_t>({buffer.size() / 4 / lba_size, reader.ns().max_blocks, lbas});
  const auto dst = pages_of(buffer);
  struct pending {
    cunvme::io_handle handle;
    std::uint64_t lba, blocks, offset;
  };
  std::vector<pending> inflight;
  const auto finish = [&](pending& p) {
    const auto r = reader.wait(p.handle);
    const std::string what = "async read of " + std::to_string(p.blocks) + " blocks at LBA " + std::to_string(begin + p.lba);
    if (!r.ok()) return out.fail(what + ": " + cunvme::to_string(r));
    compare(reinterpret_cast<const std::uint64_t*>(buffer.data() + p.offset), copy, p.lba, p.blocks, lba_size, what, out);
  };
  const unsigned count = 1 + static_cast<unsigned>(rng() % 4);
  for (unsigned k = 0; k < count; ++k) {
    const std::uint64_t blocks = 1 + rng() % quarter;
    const std::uint64_t lba = rng() % (lbas - blocks + 1);
    const std::uint64_t offset = k * (buffer.size() / 4);
    std::memset(buffer.data() + offset, 0xee, blocks * lba_size);
    cunvme::io_handle h;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      h = reader.submit_read(begin + lba, static_cast<std::uint32_t>(blocks), dst, offset);
      if (h.state != cunvme::io_handle::phase::finished || h.result.error != cunvme::io_error::no_command_id) break;
      ++out.no_cid_retries;
      for (auto& p : inflight) finish(p);
      inflight.clear();
      if (std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::yield();  // the other threads hold every CID: let them finish
    }
    if (h.state == cunvme::io_handle::phase::finished) {
      out.fail("async read submit at LBA " + std::to_string(begin + lba) + ": " + cunvme::to_string(h.result));
      continue;
    }
    inflight.push_back({h, lba, blocks, offset});
    ++out.async_reads;
  }
  // Finished in another order than submitted: the last first.
  for (auto p = inflight.rbegin(); p != inflight.rend(); ++p) finish(*p);
}

/// One thread's work on slice [begin, end): random verified I/O, then the seal.
template <class Reader, class Writer>
void run_slice(const Reader& reader, const Writer& writer, const host::dma_buffer& buffer, std::uint64_t begin, std::uint64_t end,
               const options& opt, std::uint64_t stream, thread_result& out) {
  const std::uint64_t lba_size = reader.ns().lba_size();
  const std::uint64_t lbas = end - begin;
  const std::uint64_t max_blocks = std::min<std::uint64_t>(buffer.size() / lba_size, lbas);
  const auto dst = pages_of(buffer);
  auto* words = reinterpret_cast<std::uint64_t*>(buffer.data());
  std::vector<std::uint64_t> copy(lbas * lba_size / 8);
  for (std::size_t i = 0; i < copy.size(); ++i) copy[i] = host::pattern_word(begin * lba_size + i * 8);
  std::mt19937_64 rng(opt.seed * 1000003u + stream);
  for (std::uint32_t op = 0; op < opt.ops && !out.stopped(); ++op) {
    const std::uint64_t blocks = 1 + rng() % (rng() % 4 == 0 ? max_blocks : std::min<std::uint64_t>(8, max_blocks));
    const std::uint64_t lba = rng() % (lbas - blocks + 1);
    const std::size_t n = blocks * lba_size / 8, at = lba * lba_size / 8;
    const std::string what = " of " + std::to_string(blocks) + " blocks at LBA " + std::to_string(begin + lba);
    const auto kind = rng() % 6;
    if (kind == 5) {
      async_reads(reader, buffer, begin, lbas, copy, rng, out);
    } else if (kind < 2) {
      for (std::size_t i = 0; i < n; ++i) words[i] = copy[at + i] = test::word_at((begin + lba) * lba_size + i * 8, stream * 100000 + op + 1);
      if (const auto r = writer.write(begin + lba, blocks, dst, 0); !r.ok()) out.fail("write" + what + ": " + cunvme::to_string(r));
    } else {
      std::memset(words, 0xee, n * 8);
      if (const auto r = reader.read(begin + lba, blocks, dst, 0); !r.ok()) {
        out.fail("read" + what + ": " + cunvme::to_string(r));
        continue;
      }
      compare(words, copy, lba, blocks, lba_size, "read" + what, out);
    }
  }
  if (out.stopped()) return;  // the combination has failed: no seal, the image check fails too
  // The seal: the whole slice written, then read back and compared.
  for (std::uint64_t lba = begin; lba < end; lba += max_blocks) {
    const std::uint64_t blocks = std::min(max_blocks, end - lba);
    for (std::size_t i = 0; i < blocks * lba_size / 8; ++i) words[i] = sealed_word(lba * lba_size + i * 8, opt.seed);
    if (const auto r = writer.write(lba, blocks, dst, 0); !r.ok()) out.fail("seal write at LBA " + std::to_string(lba) + ": " + cunvme::to_string(r));
  }
  for (std::uint64_t lba = begin; lba < end; lba += max_blocks) {
    const std::uint64_t blocks = std::min(max_blocks, end - lba);
    std::memset(words, 0xee, blocks * lba_size);
    if (const auto r = reader.read(lba, blocks, dst, 0); !r.ok()) {
      out.fail("seal read at LBA " + std::to_string(lba) + ": " + cunvme::to_string(r));
      continue;
    }
    for (std::size_t i = 0; i < blocks * lba_size / 8; ++i) {
      if (words[i] != sealed_word(lba * lba_size + i * 8, opt.seed)) {
        ++out.mismatches;
        if (out.first_problem.empty()) out.first_problem = "seal read at LBA " + std::to_string(lba) + ": word " + std::to_string(i) + " differs";
      }
    }
  }
}

/// Runs one combination as slices [first_slice, first_slice + threads) of the region.
/// Returns an empty string when every thread's I/O succeeded and verified, else why not;
/// `stats` says what ran.
template <class Slots, class Completion, class Doorbell>
std::string run_combination(const rig& r, std::uint64_t first_slice, std::string& stats) {
  constexpr bool owned = std::is_same_v<Slots, slots::exclusive>;  // exclusive: one queue per thread
  using queue = cunvme::queue_policies<Slots, Completion>;
  std::vector<std::unique_ptr<host::io_queue>> queues;
  // Small queues, so that they wrap many times and (shared) run full — except with shadow
  // doorbells on QEMU 7.2, whose controller re-reads a CQ's shadow head only when it posts a
  // completion: once its CQ is full it never looks again, a host that moved the head in the
  // shadow slot only (EventIdx let it skip the MMIO write) waits for completions QEMU holds,
  // and each wait ends only in a 10 s timeout (seen as a guest that does not finish in 100 s,
  // about one run in eight). Queues that can never fill keep those runs about the readers.
  constexpr bool shadow = std::is_same_v<Doorbell, doorbell::shadow> || std::is_same_v<Doorbell, doorbell::coalescing<doorbell::shadow>>;
  const std::uint32_t entries = shadow && r.qemu ? 64u : owned ? 4u : 8u;
  for (unsigned t = 0; t < (owned ? threads : 1u); ++t) queues.push_back(std::make_unique<host::io_queue>(r.ctrl, entries));
  std::vector<host::dma_buffer> buffers;
  for (unsigned t = 0; t < threads; ++t) buffers.push_back(r.ctrl.memory().allocate(buffer_bytes));
  std::vector<std::uint32_t> stop(queues.size(), 0);
  std::vector<std::thread> pollers;
  if constexpr (std::is_same_v<Completion, completion::dedicated_poller>) {
    for (std::size_t i = 0; i < queues.size(); ++i) {
      pollers.emplace_back([&, i] { (void)completion::poller<Doorbell>::run(queues[i]->view(), stop[i]); });
    }
  }
  // A failed thread stops the others after their current operation: a queue that stalls
  // ends the combination in one timeout, named by `describe`, not in one per remaining operation.
  std::atomic<bool> give_up{false};
  std::vector<thread_result> results(threads);
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    results[t].queue = &queues[owned ? t : 0]->view();
    results[t].give_up = &give_up;
    pool.emplace_back([&, t] {
      const auto& view = queues[owned ? t : 0]->view();
      cunvme::block_reader<queue, prp::page_list, Doorbell> reader(view, r.ns);
      cunvme::block_writer<queue, prp::page_list, Doorbell> writer(view, r.ns);
      run_slice(reader, writer, buffers[t], r.slice_begin(first_slice + t), r.slice_begin(first_slice + t + 1), r.opt, first_slice + t, results[t]);
    });
  }
  for (auto& th : pool) th.join();
  for (auto& s : stop) std::atomic_ref<std::uint32_t>(s).store(1, std::memory_order_release);
  for (auto& p : pollers) p.join();
  std::string why;
  for (unsigned t = 0; t < threads; ++t) {
    if (results[t].failures + results[t].mismatches != 0 && why.empty()) {
      why = "thread " + std::to_string(t) + ": " + std::to_string(results[t].failures) + " failed commands, " + std::to_string(results[t].mismatches) +
            " words differ; first: " + results[t].first_problem;
    }
  }
  std::uint64_t async = 0, retries = 0, mmio = 0, skipped = 0;
  for (const auto& t : results) async += t.async_reads, retries += t.no_cid_retries;
  for (const auto& q : queues) {
    const auto c = q->counters();
    mmio += c.doorbell_mmio_writes, skipped += c.doorbell_skipped;
    if (why.empty() && c.unexpected_completions != 0) why = std::to_string(c.unexpected_completions) + " completions for commands not in flight";
    if (why.empty() && q->cids_in_use() != 0) why = std::to_string(q->cids_in_use()) + " CIDs still in use after every command finished";
  }
  stats = std::to_string(async) + " async reads, " + std::to_string(retries) + " submits found no free CID, " + std::to_string(mmio) +
          " MMIO doorbell writes, " + std::to_string(skipped) + " skipped";
  return why;
}

template <class S, class C, class D>
struct combo {
  using slots_t = S;
  using completion_t = C;
  using doorbell_t = D;
};

template <class T>
constexpr bool uses_shadow = std::is_same_v<typename T::doorbell_t, doorbell::shadow> ||
                             std::is_same_v<typename T::doorbell_t, doorbell::coalescing<doorbell::shadow>>;

template <class T>
std::string name_of() {
  const std::string s = std::is_same_v<typename T::slots_t, slots::exclusive>        ? "exclusive (a queue per thread)"
                        : std::is_same_v<typename T::slots_t, slots::multi_producer> ? "multi_producer (one shared queue)"
                                                                                     : "warp_aggregated (one shared queue)";
  const std::string c = std::is_same_v<typename T::completion_t, completion::cooperative> ? "cooperative" : "dedicated_poller";
  const std::string d = std::is_same_v<typename T::doorbell_t, doorbell::mmio>                       ? "mmio"
                        : std::is_same_v<typename T::doorbell_t, doorbell::shadow>                   ? "shadow"
                        : std::is_same_v<typename T::doorbell_t, doorbell::coalescing<doorbell::mmio>> ? "coalescing<mmio>"
                                                                                                       : "coalescing<shadow>";
  return s + ", " + c + ", " + d;
}

// Every valid combination (as in test/policies/reader_test.cpp): slots::exclusive never shares
// a queue, so it is paired with plain doorbells only (coalescing needs several submitters).
using all = std::tuple<
    combo<slots::exclusive, completion::cooperative, doorbell::mmio>, combo<slots::exclusive, completion::cooperative, doorbell::shadow>,
    combo<slots::exclusive, completion::dedicated_poller, doorbell::mmio>, combo<slots::exclusive, completion::dedicated_poller, doorbell::shadow>,
    combo<slots::multi_producer, completion::cooperative, doorbell::mmio>,
    combo<slots::multi_producer, completion::cooperative, doorbell::coalescing<doorbell::mmio>>,
    combo<slots::multi_producer, completion::cooperative, doorbell::shadow>,
    combo<slots::multi_producer, completion::cooperative, doorbell::coalescing<doorbell::shadow>>,
    combo<slots::multi_producer, completion::dedicated_poller, doorbell::mmio>,
    combo<slots::multi_producer, completion::dedicated_poller, doorbell::coalescing<doorbell::mmio>>,
    combo<slots::warp_aggregated, completion::cooperative, doorbell::mmio>,
    combo<slots::warp_aggregated, completion::cooperative, doorbell::coalescing<doorbell::shadow>>,
    combo<slots::warp_aggregated, completion::dedicated_poller, doorbell::shadow>,
    combo<slots::warp_aggregated, completion::dedicated_poller, doorbell::coalescing<doorbell::mmio>>>;
constexpr std::size_t combinations = std::tuple_size_v<all>;

/// Runs the combinations whose doorbells use shadow slots (`shadow`) or not, on a controller
/// brought up to match: with shadow doorbells the controller reads the SQ tail from the shadow
/// slot, so MMIO-only submitters must not share a controller with them.
template <std::size_t... I>
void run_all(const options& opt, bool shadow, int& passed, int& failed, std::index_sequence<I...>) {
  host::controller_options o;
  o.shadow_doorbells = shadow;
  std::unique_ptr<host::controller> ctrl;
  try {
    ctrl = host::open(opt.uri, o);
  } catch (const std::exception& e) {
    std::printf("FAIL bring-up (shadow doorbells %s): %s\n", shadow ? "on" : "off", e.what());
    ++failed;
    return;
  }
  if (shadow && !ctrl->shadow_doorbells()) {
    std::printf("SKIP shadow-doorbell combinations: the controller has no Doorbell Buffer Config\n");
    return;
  }
  rig r{opt, *ctrl, host::make_namespace_view(*ctrl, 1)};
  r.qemu = cunvme::spec::trimmed(ctrl->identify().mn) == "QEMU NVMe Ctrl";
  const std::uint64_t lba_size = r.ns.lba_size();
  r.first_lba = opt.region_offset / lba_size;
  r.region_blocks = opt.region_bytes / lba_size;
  r.slices = combinations * threads;
  const auto one = [&]<class T>(T, std::size_t index) {
    if (uses_shadow<T> != shadow) return;
    try {
      std::string stats;
      const std::string why =
          run_combination<typename T::slots_t, typename T::completion_t, typename T::doorbell_t>(r, index * threads, stats);
      if (why.empty()) {
        std::printf("PASS %s (%s)\n", name_of<T>().c_str(), stats.c_str());
        ++passed;
      } else {
        std::printf("FAIL %s: %s\n", name_of<T>().c_str(), why.c_str());
        ++failed;
      }
    } catch (const std::exception& e) {
      std::printf("FAIL %s: %s\n", name_of<T>().c_str(), e.what());
      ++failed;
    }
    std::fflush(stdout);
  };
  (one(std::tuple_element_t<I, all>{}, I), ...);
  // Durable before the harness powers the guest off and checks the image.
  try {
    auto q = ctrl->create_queue_pair(2);
    if (q->flush(1) != cunvme::spec::status::successful_completion) {
      std::printf("FAIL flush\n");
      ++failed;
    }
  } catch (const std::exception& e) {
    std::printf("FAIL flush: %s\n", e.what());
    ++failed;
  }
}

bool parse_u64(const std::string& s, std::uint64_t& v) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 18) return false;
  v = std::stoull(s);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const auto usage = [&] {
    std::fprintf(stderr, "usage: %s URI --seed N --region OFFSET_MIB:SIZE_MIB [--ops K]\n", argv[0]);
    return 2;
  };
  if (argc < 2) return usage();
  options opt;
  opt.uri = argv[1];
  bool have_seed = false, have_region = false;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::string value = i + 1 < argc ? argv[i + 1] : "";
    std::uint64_t a = 0, b = 0;
    if (arg == "--seed" && parse_u64(value, opt.seed)) {
      have_seed = true;
    } else if (arg == "--region" && value.find(':') != std::string::npos && parse_u64(value.substr(0, value.find(':')), a) &&
               parse_u64(value.substr(value.find(':') + 1), b) && b > 0 && a < (1u << 20) && b < (1u << 20)) {
      opt.region_offset = a << 20;
      opt.region_bytes = b << 20;
      have_region = true;
    } else if (arg == "--ops" && parse_u64(value, a) && a > 0 && a <= 1000000) {
      opt.ops = static_cast<std::uint32_t>(a);
    } else {
      std::fprintf(stderr, "%s: bad or incomplete option '%s'\n", argv[0], arg.c_str());
      return usage();
    }
    ++i;
  }
  if (!have_seed || !have_region) return usage();
  {
    // The region must lie inside namespace 1 and give every thread a slice of whole blocks.
    std::unique_ptr<host::controller> ctrl;
    try {
      ctrl = host::open(opt.uri);
    } catch (const std::exception& e) {
      std::printf("FAIL bring-up: %s\ncpu_readers: 0 passed, 1 failed\n", e.what());
      return 1;
    }
    const auto& ns = ctrl->namespace_by_id(1);
    if (ns.metadata_size != 0 || opt.region_offset + opt.region_bytes > ns.bytes() || opt.region_bytes / ns.lba_size < combinations * threads * 8) {
      std::fprintf(stderr, "%s: the region (%llu MiB at %llu MiB) must lie in namespace 1 (%llu bytes, no metadata) and hold %zu blocks\n", argv[0],
                   static_cast<unsigned long long>(opt.region_bytes >> 20), static_cast<unsigned long long>(opt.region_offset >> 20),
                   static_cast<unsigned long long>(ns.bytes()), combinations * threads * 8);
      return 2;
    }
    std::printf("cpu_readers on %s: %s, %u-byte blocks, region %llu MiB at %llu MiB, seed %llu, %u ops per thread, %u threads\n", opt.uri.c_str(),
                cunvme::spec::trimmed(ctrl->identify().mn).c_str(), ns.lba_size, static_cast<unsigned long long>(opt.region_bytes >> 20),
                static_cast<unsigned long long>(opt.region_offset >> 20), static_cast<unsigned long long>(opt.seed), opt.ops, threads);
  }
  int passed = 0, failed = 0;
  run_all(opt, false, passed, failed, std::make_index_sequence<combinations>{});
  run_all(opt, true, passed, failed, std::make_index_sequence<combinations>{});
  std::printf("cpu_readers: %d passed, %d failed\n", passed, failed);
  return failed == 0 && passed > 0 ? 0 : 1;
}
