// libFuzzer harness for the emulated controller: the input is a stream of host actions —
// SQEs on the admin and I/O queues (PRPs inside, at the edges of and outside registered
// regions), raw register and doorbell writes, CC.EN toggles, region unmap/remap, CMB enable,
// move and disable, PRP lists and data written by the host — against one controller reused
// across inputs.
//
// Oracles (each a finding: a message on stderr, then abort):
// - no sanitizer report (ASan, UBSan);
// - guard bytes around every registered region untouched, and a region's bytes untouched
//   while it is unmapped;
// - every wait bounded (a controller that does not answer in time is a finding);
// - every completion status one the emulator documents (controller::documented_statuses);
// - after each input a reset (EN = 0, RDY falls) and a fresh enable work and Identify
//   Controller completes successfully.
//
// Build: ninja -C BUILD test/fuzz/fuzz_emu. Run: BUILD/test/fuzz/fuzz_emu CORPUS_DIR
// test/fuzz/corpus/emu (README, "Fuzzing").
#include <cunvme/emu/controller.cuh>

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace {

namespace spec = cunvme::spec;
namespace emu = cunvme::emu;
using clock_type = std::chrono::steady_clock;

[[noreturn]] void finding(const char* what, std::uint64_t detail = 0) {
  std::fprintf(stderr, "emu_fuzz finding: %s (%llu / %#llx)\n", what, static_cast<unsigned long long>(detail),
               static_cast<unsigned long long>(detail));
  std::abort();
}

// Every wait the harness does is bounded by this; the controller runs with CAP.TO = 1 s.
constexpr auto step_bound = std::chrono::seconds(3);

template <class F>
bool wait_for(F done, std::chrono::nanoseconds bound = step_bound) {
  const auto until = clock_type::now() + bound;
  while (!done()) {
    if (clock_type::now() > until) return false;
    std::this_thread::yield();
  }
  return true;
}

constexpr std::size_t guard_bytes = 4096;
constexpr std::byte guard_pattern{0xa5};
constexpr std::byte unmapped_pattern{0x5a};

/// Host memory registered with the controller, with guard bytes on both sides that the
/// controller must never touch.
struct region {
  region(emu::controller& c, std::size_t n) : ctrl(&c), bytes(n) {
    base = static_cast<std::byte*>(std::aligned_alloc(4096, n + 2 * guard_bytes));
    if (base == nullptr) finding("harness out of memory", n);
    std::memset(base, static_cast<int>(guard_pattern), guard_bytes);
    std::memset(base + guard_bytes + n, static_cast<int>(guard_pattern), guard_bytes);
    std::memset(data(), 0, n);
    map();
  }
  region(const region&) = delete;
  region& operator=(const region&) = delete;
  ~region() {
    if (mapped) ctrl->dma().unmap(bus);
    std::free(base);
  }
  [[nodiscard]] std::byte* data() const { return base + guard_bytes; }
  void map() {
    bus = ctrl->dma().map(data(), bytes);
    mapped = true;
  }
  void unmap() {
    ctrl->dma().unmap(bus);  // returns once no access to it is in progress
    mapped = false;
    std::memset(data(), static_cast<int>(unmapped_pattern), bytes);
  }
  void remap() {
    check_unmapped_untouched();
    std::memset(data(), 0, bytes);
    map();
  }
  void check_guards() const {
    for (std::size_t i = 0; i < guard_bytes; ++i) {
      if (base[i] != guard_pattern) finding("guard byte before a region overwritten", i);
      if (base[guard_bytes + bytes + i] != guard_pattern) finding("guard byte after a region overwritten", i);
    }
  }
  void check_unmapped_untouched() const {
    if (mapped) return;
    for (std::size_t i = 0; i < bytes; ++i) {
      if (data()[i] != unmapped_pattern) finding("an unmapped region was written", i);
    }
  }

  emu::controller* ctrl;
  std::size_t bytes;
  std::byte* base = nullptr;
  std::uint64_t bus = 0;
  bool mapped = false;
};

/// A queue pair as the harness sees it; the controller may have refused to create it.
struct queue {
  std::uint16_t qid = 0;
  std::uint32_t entries = 0;  // 0: not created
  spec::submission_entry* sq = nullptr;
  spec::completion_entry* cq = nullptr;
  std::uint32_t sq_tail = 0, cq_head = 0;
  bool phase = true;
};

constexpr std::uint16_t max_io_queues = 3;
constexpr std::uint32_t admin_entries = 32;
constexpr std::uint32_t max_entries = 64;  // CAP.MQES + 1
constexpr std::uint64_t cmb_bytes = 64 * 1024;

class harness {
 public:
  harness()
      : ctrl_(make_config()),
        admin_sq_(ctrl_, 4096),
        admin_cq_(ctrl_, 4096),
        io_(ctrl_, 2 * max_io_queues * 4096),
        data_(ctrl_, 64 * 1024),
        spare_(ctrl_, 16 * 1024) {
    admin_.qid = 0;
    admin_.entries = admin_entries;
    admin_.sq = reinterpret_cast<spec::submission_entry*>(admin_sq_.data());
    admin_.cq = reinterpret_cast<spec::completion_entry*>(admin_cq_.data());
  }

  void run(const std::uint8_t* bytes, std::size_t size) {
    FuzzedDataProvider in(bytes, size);
    // Each input ends with the controller reset, enabled and idle: only the first starts cold.
    if (!ready_) reset_and_enable();
    ready_ = false;
    cq_memory_targeted_ = false;
    for (int step = 0; step < 256 && in.remaining_bytes() > 0; ++step) act(in);
    drain_all();
    check_memory();
    // The controller must come back from whatever the input did.
    reset_and_enable();
    // The reset ended every command's DMA: what the admin CQ holds now the controller posted.
    cq_memory_targeted_ = false;
    identify_must_work();
    check_memory();
    ready_ = true;
  }

 private:
  static emu::controller_config make_config() {
    emu::controller_config c;
    c.max_queue_entries = max_entries;
    c.max_io_queues = max_io_queues;
    c.timeout = 2;  // CAP.TO: 1 s
    c.mdts = 4;     // 64 KiB
    c.error_log_entries = 8;
    c.cmb_bytes = cmb_bytes;
    c.workers = 1;
    c.namespaces = {emu::namespace_config::in_memory(512, 1024), emu::namespace_config::in_memory(4096, 64)};
    // CUNVME_FUZZ_SPIN=1 (a machine with a core per emulator thread to spare): the threads
    // never sleep, and each step waits for them the least.
    const char* spin = std::getenv("CUNVME_FUZZ_SPIN");
    c.idle.spins = spin != nullptr && spin[0] == '1' ? ~std::uint32_t{0} : 64;
    c.idle.sleep = std::chrono::microseconds(1);
    return c;
  }

  // ---- MMIO ------------------------------------------------------------------------------------
  void write_reg(spec::register_offset r, std::uint32_t v) { ctrl_.write_register(spec::to_underlying(r), v); }
  void write_reg64(spec::register_offset r, std::uint64_t v) {
    write_reg(r, static_cast<std::uint32_t>(v));
    ctrl_.write_register(spec::to_underlying(r) + 4, static_cast<std::uint32_t>(v >> 32));
  }
  [[nodiscard]] spec::csts_register csts() const { return spec::csts_register{ctrl_.read_register(spec::to_underlying(spec::register_offset::csts))}; }
  /// Doorbells as a GPU thread rings them: a plain store into the BAR memory.
  void doorbell(std::uint32_t offset, std::uint32_t value) {
    std::atomic_ref<std::uint32_t>(*reinterpret_cast<std::uint32_t*>(ctrl_.bar() + offset)).store(value, std::memory_order_release);
  }

  // ---- reset and bring-up -------------------------------------------------------------------------
  void reset_and_enable() {
    write_reg64(spec::register_offset::cmbmsc, 0);
    write_reg(spec::register_offset::cc, 0);
    if (!wait_for([&] { return !csts().rdy(); })) finding("CSTS.RDY did not fall after CC.EN = 0");
    if (!spare_.mapped) spare_.remap();
    std::memset(admin_sq_.data(), 0, admin_sq_.bytes);
    std::memset(admin_cq_.data(), 0, admin_cq_.bytes);
    admin_.sq_tail = admin_.cq_head = 0;
    admin_.phase = true;
    for (auto& q : io_queues_) q = queue{};
    write_reg(spec::register_offset::aqa,
              spec::aqa_register{}.set_asqs(admin_entries - 1).set_acqs(admin_entries - 1).raw);
    write_reg64(spec::register_offset::asq, admin_sq_.bus);
    write_reg64(spec::register_offset::acq, admin_cq_.bus);
    write_reg(spec::register_offset::cc, spec::cc_register{}.set_iosqes(6).set_iocqes(4).set_en(true).raw);
    if (!wait_for([&] { return csts().rdy() || csts().cfs(); })) finding("neither RDY nor CFS after CC.EN = 1");
    if (!csts().rdy()) finding("a reset controller did not become ready with valid admin queues", csts().raw);
  }

  void identify_must_work() {
    const auto before = ctrl_.stats();
    std::memset(data_.data(), 0, 4096);
    spec::submission_entry sqe = spec::make_identify(spec::identify_cns::controller, 0, data_.bus);
    sqe.set_cid(0xbeef);
    submit(admin_, sqe, /*raw_doorbell=*/false);
    spec::completion_entry cqe{};
    bool got = false;
    if (!wait_for([&] {
          got = next_completion(admin_, cqe);
          return got;
        })) {
      // Whether the command was fetched at all, and how the controller stands, for the report.
      const auto after = ctrl_.stats();
      std::fprintf(stderr, "CSTS %#x; admin commands %llu -> %llu, completions posted %llu -> %llu, thread failures %llu\n",
                   csts().raw, static_cast<unsigned long long>(before.admin_commands),
                   static_cast<unsigned long long>(after.admin_commands), static_cast<unsigned long long>(before.completions_posted),
                   static_cast<unsigned long long>(after.completions_posted), static_cast<unsigned long long>(after.thread_failures));
      finding("no completion for Identify Controller after a reset");
    }
    if (cqe.cid != 0xbeef || cqe.status() != spec::status::successful_completion) {
      finding("Identify Controller after a reset failed", cqe.status_field);
    }
    const auto& id = *reinterpret_cast<const spec::identify_controller*>(data_.data());
    if (id.vid != ctrl_.config().vendor_id) finding("Identify Controller data wrong after a reset", id.vid);
  }

  void check_memory() const {
    for (const region* r : {&admin_sq_, &admin_cq_, &io_, &data_, &spare_}) r->check_guards();
    spare_.check_unmapped_untouched();
  }

  // ---- queues -------------------------------------------------------------------------------------
  void submit(queue& q, spec::submission_entry sqe, bool raw_doorbell) {
    if (q.entries == 0) return;
    q.sq[q.sq_tail % q.entries] = sqe;
    q.sq_tail = (q.sq_tail + 1) % q.entries;
    const std::uint32_t offset = spec::sq_tail_doorbell_offset(q.qid, 0);
    if (raw_doorbell) {
      doorbell(offset, q.sq_tail);
    } else {
      ctrl_.write_register(offset, q.sq_tail);
    }
  }

  bool next_completion(queue& q, spec::completion_entry& out) {
    if (q.entries == 0) return false;
    auto* slot = q.cq + q.cq_head;
    auto& dw3 = *reinterpret_cast<std::uint32_t*>(reinterpret_cast<std::byte*>(slot) + 12);
    const std::uint32_t last = std::atomic_ref<std::uint32_t>(dw3).load(std::memory_order_acquire);
    if (((last >> 16) & 1u) != (q.phase ? 1u : 0u)) return false;
    std::memcpy(&out, slot, sizeof out);
    // Only a CQ that no DMA was aimed at holds nothing but the controller's completions: a
    // read whose PRPs point into queue memory puts namespace data there, as the host asked.
    if (!cq_memory_targeted_ && !emu::controller::documented(out.status())) finding("a completion status the emulator does not document", out.status_field);
    q.cq_head = (q.cq_head + 1) % q.entries;
    if (q.cq_head == 0) q.phase = !q.phase;
    doorbell(spec::cq_head_doorbell_offset(q.qid, 0), q.cq_head);
    return true;
  }

  void drain(queue& q) {
    spec::completion_entry cqe{};
    for (std::uint32_t n = 0; n < max_entries && next_completion(q, cqe); ++n) {
    }
  }
  void drain_all() {
    drain(admin_);
    for (auto& q : io_queues_) drain(q);
  }

  // ---- addresses ------------------------------------------------------------------------------------
  /// A bus address for a PRP, a queue base or a list: inside, at the edges of and outside
  /// the registered regions and the CMB.
  std::uint64_t pick_address(FuzzedDataProvider& in) {
    const std::uint64_t address = pick_any_address(in);
    for (const region* r : {&admin_cq_, &io_}) {
      if (address - r->bus < r->bytes) cq_memory_targeted_ = true;
    }
    return address;
  }
  std::uint64_t pick_any_address(FuzzedDataProvider& in) {
    switch (in.ConsumeIntegralInRange<int>(0, 9)) {
      case 0: return data_.bus + (in.ConsumeIntegralInRange<std::uint64_t>(0, data_.bytes - 1) & ~std::uint64_t{3});
      case 1: return data_.bus + 4096 * in.ConsumeIntegralInRange<std::uint64_t>(0, data_.bytes / 4096 - 1);
      case 2: {
        static constexpr std::array<std::int64_t, 6> edges{-4096, -4, 0, 4, 4096, 8};
        const std::int64_t e = edges[in.ConsumeIntegralInRange<std::size_t>(0, edges.size() - 1)];
        const bool end = in.ConsumeBool();
        return (end ? data_.bus + data_.bytes : data_.bus) + static_cast<std::uint64_t>(e) - (end ? 8 : 0);
      }
      case 3: return spare_.bus + 4096 * in.ConsumeIntegralInRange<std::uint64_t>(0, spare_.bytes / 4096 - 1);
      case 4: return cmb_bus_ + 4096 * in.ConsumeIntegralInRange<std::uint64_t>(0, cmb_bytes / 4096);
      case 5: return io_.bus + 4096 * in.ConsumeIntegralInRange<std::uint64_t>(0, io_.bytes / 4096 - 1);
      case 6: return admin_cq_.bus;
      case 7: return 0;
      case 8: return in.ConsumeIntegral<std::uint64_t>();
      default: return data_.bus + data_.bytes - 4096 + (in.ConsumeIntegralInRange<std::uint64_t>(0, 4095) & ~std::uint64_t{3});
    }
  }

  spec::submission_entry raw_sqe(FuzzedDataProvider& in) {
    spec::submission_entry sqe{};
    const auto bytes = in.ConsumeBytes<std::uint8_t>(sizeof sqe);
    if (!bytes.empty()) std::memcpy(&sqe, bytes.data(), bytes.size());
    if (in.ConsumeIntegralInRange<int>(0, 7) != 0) {
      sqe.cdw0 &= 0xffff00ffu;  // FUSE and PSDT normal, most of the time
    }
    if (in.ConsumeBool()) sqe.prp1 = pick_address(in);
    if (in.ConsumeBool()) sqe.prp2 = pick_address(in);
    return sqe;
  }

  spec::submission_entry admin_sqe(FuzzedDataProvider& in) {
    static constexpr std::array<spec::admin_opcode, 11> opcodes{
        spec::admin_opcode::identify,
        spec::admin_opcode::get_features,
        spec::admin_opcode::set_features,
        spec::admin_opcode::create_io_completion_queue,
        spec::admin_opcode::create_io_submission_queue,
        spec::admin_opcode::delete_io_submission_queue,
        spec::admin_opcode::delete_io_completion_queue,
        spec::admin_opcode::get_log_page,
        spec::admin_opcode::doorbell_buffer_config,
        spec::admin_opcode::abort,
        spec::admin_opcode::asynchronous_event_request,
    };
    spec::submission_entry sqe = raw_sqe(in);
    if (in.ConsumeIntegralInRange<int>(0, 7) != 0) {
      sqe.set_opcode(opcodes[in.ConsumeIntegralInRange<std::size_t>(0, opcodes.size() - 1)]);
      if (in.ConsumeBool()) sqe.cdw10 &= 0x00ff00ffu;  // small CNS / FID / QID / LID
      if (in.ConsumeBool()) sqe.nsid = in.ConsumeIntegralInRange<std::uint32_t>(0, 3);
    }
    return sqe;
  }

  spec::submission_entry io_sqe(FuzzedDataProvider& in) {
    static constexpr std::array<spec::nvm_opcode, 5> opcodes{spec::nvm_opcode::read, spec::nvm_opcode::write, spec::nvm_opcode::flush,
                                                             spec::nvm_opcode::write_zeroes, spec::nvm_opcode::dataset_management};
    spec::submission_entry sqe = raw_sqe(in);
    if (in.ConsumeIntegralInRange<int>(0, 7) != 0) {
      const auto op = opcodes[in.ConsumeIntegralInRange<std::size_t>(0, opcodes.size() - 1)];
      sqe.set_opcode(op);
      sqe.nsid = in.ConsumeIntegralInRange<std::uint32_t>(0, 3);
      if (in.ConsumeBool()) spec::set_starting_lba(sqe, in.ConsumeIntegralInRange<std::uint64_t>(0, 1100));
      if (in.ConsumeBool()) sqe.cdw12 = in.ConsumeIntegralInRange<std::uint32_t>(0, 200);
      if (op == spec::nvm_opcode::dataset_management && in.ConsumeBool()) sqe.cdw10 = in.ConsumeIntegralInRange<std::uint32_t>(0, 8);
    }
    return sqe;
  }

  // ---- actions --------------------------------------------------------------------------------------
  void act(FuzzedDataProvider& in) {
    switch (in.ConsumeIntegralInRange<int>(0, 13)) {
      case 0:
      case 1: submit(admin_, admin_sqe(in), in.ConsumeBool()); break;
      case 2:
      case 3: {
        queue& q = io_queues_[in.ConsumeIntegralInRange<std::size_t>(0, max_io_queues - 1)];
        const int burst = in.ConsumeIntegralInRange<int>(1, 8);
        for (int i = 0; i < burst; ++i) submit(q, io_sqe(in), true);
        break;
      }
      case 4: create_pair(in); break;
      case 5: {  // host data and PRP lists in the data region
        const std::size_t at = in.ConsumeIntegralInRange<std::size_t>(0, data_.bytes / 8 - 1) * 8;
        const int entries = in.ConsumeIntegralInRange<int>(1, 16);
        for (int i = 0; i < entries && at + 8 * static_cast<std::size_t>(i) + 8 <= data_.bytes; ++i) {
          const std::uint64_t entry = pick_address(in);
          std::memcpy(data_.data() + at + 8 * static_cast<std::size_t>(i), &entry, 8);
        }
        break;
      }
      case 6: {  // a raw doorbell write, to a queue that may not exist, any value
        const auto qid = in.ConsumeIntegralInRange<std::uint16_t>(0, max_io_queues + 1);
        const bool cq = in.ConsumeBool();
        const std::uint32_t value = in.ConsumeBool() ? in.ConsumeIntegralInRange<std::uint32_t>(0, max_entries) : in.ConsumeIntegral<std::uint32_t>();
        const std::uint32_t offset = cq ? spec::cq_head_doorbell_offset(qid, 0) : spec::sq_tail_doorbell_offset(qid, 0);
        if (in.ConsumeBool()) {
          doorbell(offset, value);
        } else {
          ctrl_.write_register(offset, value);
        }
        break;
      }
      case 7: {  // a raw register write anywhere below the doorbells
        const std::uint32_t offset = in.ConsumeIntegralInRange<std::uint32_t>(0, 0x3ff) * 4;
        const std::uint32_t value = in.ConsumeIntegral<std::uint32_t>();
        ctrl_.write_register(offset, value);
        (void)ctrl_.read_register(offset);
        break;
      }
      case 8: toggle_enable(in); break;
      case 9:  // unmap or remap the spare region, whatever uses it
        if (spare_.mapped) {
          spare_.unmap();
        } else {
          spare_.remap();
        }
        break;
      case 10: {  // CMB: enable at the suggested address, on top of a buffer, anywhere; or disable
        static constexpr std::uint64_t suggested = emu::controller::suggested_cmb_address;
        const int how = in.ConsumeIntegralInRange<int>(0, 3);
        const std::uint64_t cba = how == 0 ? suggested : how == 1 ? data_.bus & ~0xfffull : in.ConsumeIntegral<std::uint64_t>() & ~0xfffull;
        const bool enable = how != 3;
        cmb_bus_ = cba;
        write_reg64(spec::register_offset::cmbmsc,
                    spec::cmbmsc_register{}.set_cre(enable || in.ConsumeBool()).set_cmse(enable).set_controller_base_address(cba).raw);
        break;
      }
      case 11: drain_all(); break;
      case 12: {  // let the controller run a little
        const auto pause = std::chrono::microseconds(in.ConsumeIntegralInRange<int>(0, 200));
        std::this_thread::sleep_for(pause);
        break;
      }
      default: {  // write data bytes the commands will move
        const std::size_t at = in.ConsumeIntegralInRange<std::size_t>(0, data_.bytes - 1);
        const auto bytes = in.ConsumeBytes<std::uint8_t>(in.ConsumeIntegralInRange<std::size_t>(0, 64));
        if (!bytes.empty()) std::memcpy(data_.data() + at, bytes.data(), std::min(bytes.size(), data_.bytes - at));
        break;
      }
    }
  }

  void create_pair(FuzzedDataProvider& in) {
    const auto index = in.ConsumeIntegralInRange<std::size_t>(0, max_io_queues - 1);
    queue& q = io_queues_[index];
    const auto qid = static_cast<std::uint16_t>(index + 1);
    const std::uint32_t entries = in.ConsumeBool() ? in.ConsumeIntegralInRange<std::uint32_t>(2, max_entries) : 16;
    std::byte* sq_memory = io_.data() + 2 * index * 4096;
    std::byte* cq_memory = sq_memory + 4096;
    std::memset(sq_memory, 0, 4096);
    std::memset(cq_memory, 0, 4096);
    q = queue{};
    q.qid = qid;
    q.entries = entries;
    q.sq = reinterpret_cast<spec::submission_entry*>(sq_memory);
    q.cq = reinterpret_cast<spec::completion_entry*>(cq_memory);
    const std::uint64_t sq_bus = in.ConsumeIntegralInRange<int>(0, 7) != 0 ? io_.bus + 2 * index * 4096 : pick_address(in);
    const std::uint64_t cq_bus = in.ConsumeIntegralInRange<int>(0, 7) != 0 ? io_.bus + (2 * index + 1) * 4096 : pick_address(in);
    // A CQ placed elsewhere (data pages, another queue) may be where a read's data lands.
    if (cq_bus != io_.bus + (2 * index + 1) * 4096) cq_memory_targeted_ = true;
    submit(admin_, spec::make_create_io_cq(qid, entries, cq_bus), false);
    submit(admin_, spec::make_create_io_sq(qid, entries, sq_bus, qid), false);
  }

  void toggle_enable(FuzzedDataProvider& in) {
    // A spec-following reset (3.7.2), then EN = 1 at once: the controller must see both writes.
    write_reg(spec::register_offset::cc, spec::cc_register{}.set_iosqes(6).set_iocqes(4).raw);
    if (in.ConsumeBool() && !wait_for([&] { return !csts().rdy(); })) finding("CSTS.RDY did not fall after CC.EN = 0");
    if (!in.ConsumeBool()) return;  // stays disabled until the end of the input
    std::memset(admin_cq_.data(), 0, admin_cq_.bytes);
    admin_.sq_tail = admin_.cq_head = 0;
    admin_.phase = true;
    for (auto& q : io_queues_) q = queue{};
    write_reg(spec::register_offset::cc, spec::cc_register{}.set_iosqes(6).set_iocqes(4).set_en(true).raw);
  }

  emu::controller ctrl_;
  region admin_sq_, admin_cq_, io_, data_, spare_;
  bool cq_memory_targeted_ = false;  // this input aimed a PRP or a CQ base at queue memory
  queue admin_;
  std::array<queue, max_io_queues> io_queues_{};
  std::uint64_t cmb_bus_ = emu::controller::suggested_cmb_address;
  bool ready_ = false;
};

harness& the_harness() {
  static harness h;  // one controller for every input: reset between them
  return h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  the_harness().run(data, size);
  return 0;
}
