// Host-path conformance: the same cases against any controller `host::open` reaches — the
// emulator in CI, QEMU's NVMe controller inside a Linux guest, a real SSD.
//
//   conformance URI [--pattern] [--expect-cmb] [--metadata MS:extended|MS:separate] [--only-metadata]
//
// --pattern: the namespace was filled with host::pattern_word (QEMU harness disks, emu:pattern).
// --expect-cmb: the controller has a CMB; a queue pair places its SQ there.
// --metadata: namespace 1 is formatted with MS bytes of metadata per block, as extended LBAs
//   or in a separate buffer; the "metadata:" cases check that it is reported and handled.
// --only-metadata: run only the "metadata:" cases (a separate-metadata namespace refuses the
//   plain reads and writes the other cases make).
// Prints one line per case ("PASS name" / "FAIL name: why") and a summary; exits 0 when all passed.
#include <cunvme/host/open.cuh>

#include "../guest_checks.hpp"

#include <chrono>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <sys/mman.h>

namespace host = cunvme::host;
namespace spec = cunvme::spec;

namespace {

using test::expect;
using test::failure;

void expect_status(spec::status got, spec::status want, const std::string& what) {
  expect(got == want, what + ": got " + spec::to_string(got) + ", want " + spec::to_string(want));
}

struct context {
  std::string uri;
  bool pattern = false;
  bool expect_cmb = false;
  int expect_ms = -1;          // --metadata: MS expected on namespace 1; -1: not checked
  bool expect_extended = false;
  bool only_metadata = false;
  std::unique_ptr<host::controller> ctrl;
  std::uint32_t nsid = 1;
  std::uint32_t lba = 512;       // bytes per block in a data buffer (data, and metadata with extended LBAs)
  std::uint32_t lba_data = 512;  // data bytes per block
  std::uint64_t blocks = 0;
  // Writes go to the second half of the namespace so the pattern in the first half stays.
  std::uint64_t scratch_lba = 0;
};

constexpr std::byte guard_byte{0xa5};

/// The first `bytes` of `memory` as a buffer of its own (not owning): the bytes after it are
/// a guard region that a transfer past the buffer's end would change.
host::dma_buffer guarded(const host::dma_buffer& memory, std::size_t bytes) {
  std::memset(memory.data(), static_cast<int>(guard_byte), memory.size());
  return host::dma_buffer(memory.data(), nullptr, bytes, memory.page_size(), memory.pages(), memory.location(), {});
}

bool guard_intact(const host::dma_buffer& memory, std::size_t from) {
  for (std::size_t i = from; i < memory.size(); ++i) {
    if (memory.data()[i] != guard_byte) return false;
  }
  return true;
}

void fill_random(std::byte* p, std::size_t n, std::uint32_t seed) {
  std::mt19937_64 rng(seed);
  for (std::size_t i = 0; i + 8 <= n; i += 8) {
    const std::uint64_t w = rng();
    std::memcpy(p + i, &w, 8);
  }
}

/// Writes `blocks` blocks at `lba` through `qp`, reads them back into another buffer at
/// `offset`, and compares.
void round_trip(context& c, host::queue_pair& qp, std::uint64_t lba, std::uint64_t blocks, std::size_t offset, std::uint32_t seed) {
  const std::size_t bytes = blocks * c.lba;
  auto out = c.ctrl->memory().allocate(offset + bytes);
  auto in = c.ctrl->memory().allocate(offset + bytes);
  fill_random(out.data() + offset, bytes, seed);
  expect_status(qp.write(c.nsid, lba, blocks, out, offset), spec::status::successful_completion, "write of " + std::to_string(blocks) + " blocks");
  expect_status(qp.read(c.nsid, lba, blocks, in, offset), spec::status::successful_completion, "read of " + std::to_string(blocks) + " blocks");
  expect(std::memcmp(out.data() + offset, in.data() + offset, bytes) == 0,
         "data read back differs from data written (" + std::to_string(blocks) + " blocks, first at byte " +
             std::to_string(std::mismatch(out.data() + offset, out.data() + offset + bytes, in.data() + offset).first - (out.data() + offset)) +
             " of " + std::to_string(bytes) + ")");
}

std::uint64_t smart_host_reads(host::controller& ctrl) {
  const auto log = ctrl.log_page(spec::log_page_id::smart_health_information, sizeof(spec::smart_health_information_log));
  spec::smart_health_information_log smart;
  std::memcpy(&smart, log.data(), sizeof smart);
  return smart.host_read_commands.low64();
}

/// Anonymous private memory that no allocator of the controller handed out, faulted in,
/// locked and excluded from fork (as cunvme's allocators make their own) where asked;
/// unmapped when dropped.
struct outside_memory {
  outside_memory(std::size_t n, bool lock) : bytes(n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    expect(p != MAP_FAILED, "mmap of " + std::to_string(n) + " bytes failed");
    data = static_cast<std::byte*>(p);
    std::memset(data, static_cast<int>(guard_byte), n);  // each page private, and a guard for the read
    expect(!lock || ::mlock(data, n) == 0, "mlock failed");
    expect(::madvise(data, n, MADV_DONTFORK) == 0, "madvise(MADV_DONTFORK) failed");
  }
  outside_memory(const outside_memory&) = delete;
  outside_memory& operator=(const outside_memory&) = delete;
  ~outside_memory() { ::munmap(data, bytes); }
  std::byte* data = nullptr;
  std::size_t bytes;
};

bool scheme_is(const context& c, const char* scheme) { return c.uri.rfind(scheme, 0) == 0; }

/// Writes `blocks` blocks of random data at `lba` from the controller's own memory, reads them
/// into `target` (memory mapped with map_host), and checks the data and that the bytes of
/// `target` past the transfer kept their guard.
void read_into_mapped(context& c, host::queue_pair& qp, const host::dma_buffer& target, std::uint64_t lba, std::uint64_t blocks, std::uint32_t seed) {
  const std::size_t bytes = blocks * c.lba;
  expect(bytes < target.size(), "the mapped memory leaves no guard after the transfer");
  auto out = c.ctrl->memory().allocate(bytes);
  fill_random(out.data(), bytes, seed);
  std::memset(target.data(), static_cast<int>(guard_byte), target.size());
  expect_status(qp.write(c.nsid, lba, blocks, out), spec::status::successful_completion, "write of the data to read back");
  expect_status(qp.read(c.nsid, lba, blocks, target), spec::status::successful_completion, "read into the mapped memory");
  expect(std::memcmp(out.data(), target.data(), bytes) == 0, "the read's data differs in the mapped memory");
  for (std::size_t i = bytes; i < target.size(); ++i) expect(target.data()[i] == guard_byte, "the read wrote past its blocks into the mapped memory");
}

using case_fn = std::function<void(context&)>;

const std::vector<std::pair<std::string, case_fn>>& cases() {
  static const std::vector<std::pair<std::string, case_fn>> all = {
      {"bring-up leaves the controller ready with sane capabilities",
       [](context& c) {
         expect(c.ctrl->csts().rdy() && !c.ctrl->csts().cfs(), "CSTS is not RDY=1 CFS=0");
         expect(c.ctrl->cap().mqes() >= 1, "CAP.MQES is 0");
         expect(c.ctrl->version().at_least(1, 0), "VS is below 1.0");
         expect(c.ctrl->io_queue_pairs_granted() >= 1, "no I/O queues granted");
       }},
      {"Identify Controller names the controller and its entry sizes",
       [](context& c) {
         const auto& id = c.ctrl->identify();
         expect(!spec::trimmed(id.sn).empty(), "empty serial number");
         expect(!spec::trimmed(id.mn).empty(), "empty model number");
         expect(id.sqes_min() == 6 && id.cqes_min() == 4, "SQES/CQES minimum is not 64/16 bytes");
         expect(id.nn >= 1, "NN is 0");
       }},
      {"metadata: the namespace info carries the metadata size and where metadata travels",
       [](context& c) {
         if (c.expect_ms < 0) return;
         const auto& ns = c.ctrl->namespace_by_id(c.nsid);
         expect(ns.metadata_size == static_cast<unsigned>(c.expect_ms),
                "MS is " + std::to_string(ns.metadata_size) + ", want " + std::to_string(c.expect_ms));
         expect(ns.extended_lba == c.expect_extended, std::string("FLBAS bit 4 (extended LBAs) reads ") + (ns.extended_lba ? "1" : "0"));
         expect(ns.block_bytes() == ns.lba_size + (c.expect_extended ? ns.metadata_size : 0u), "block_bytes() does not match the format");
       }},
      {"metadata: a 7-block read into a buffer of 7 data blocks writes nothing past the buffer",
       [](context& c) {
         const std::uint32_t data = c.ctrl->namespace_by_id(c.nsid).lba_size;
         auto qp = c.ctrl->create_queue_pair(4);
         auto memory = c.ctrl->memory().allocate(7 * data + 4096);
         const auto view = guarded(memory, 7 * data);
         try {
           (void)qp->read(c.nsid, 0, 7, view);
         } catch (const host::error&) {
           // Refused (a namespace with metadata): nothing may have been written at all.
           expect(guard_intact(memory, 0), "a refused read changed the buffer");
           return;
         }
         expect(guard_intact(memory, 7 * data), "the read wrote past the end of its " + std::to_string(7 * data) + "-byte buffer");
       }},
      {"metadata: extended LBAs round-trip data and metadata, block_bytes() per block, and stop at the buffer's end",
       [](context& c) {
         if (c.expect_ms < 0 || !c.expect_extended) return;
         const std::uint64_t block = c.ctrl->namespace_by_id(c.nsid).block_bytes();
         auto qp = c.ctrl->create_queue_pair(8);
         // Small transfers only: QEMU 7.2 loses interleaved metadata past the first 512 bytes of a
         // command's metadata (126 blocks: every data byte right, ~500 metadata bytes wrong) and
         // fails commands of more than ~512 extended blocks (IOV_MAX) with Write Fault. Larger
         // and MDTS-split extended transfers are covered against the emulator (test/host/metadata).
         const std::uint64_t sizes[] = {1, 7, 15};
         std::uint32_t seed = 70;
         for (const std::uint64_t n : sizes) {
           auto out = c.ctrl->memory().allocate(n * block);
           fill_random(out.data(), out.size(), seed++);
           auto memory = c.ctrl->memory().allocate(n * block + 4096);
           const auto in = guarded(memory, n * block);
           expect_status(qp->write(c.nsid, c.scratch_lba, n, out), spec::status::successful_completion, "extended write of " + std::to_string(n));
           expect_status(qp->read(c.nsid, c.scratch_lba, n, in), spec::status::successful_completion, "extended read of " + std::to_string(n));
           std::uint64_t data_bad = 0, metadata_bad = 0;
           for (std::uint64_t i = 0; i < out.size(); ++i) {
             if (out.data()[i] != in.data()[i]) ++(i % block < c.lba_data ? data_bad : metadata_bad);
           }
           expect(data_bad == 0 && metadata_bad == 0, "read back differs (" + std::to_string(n) + " blocks): " + std::to_string(data_bad) +
                                                          " data bytes, " + std::to_string(metadata_bad) + " metadata bytes");
           expect(guard_intact(memory, n * block), "the read wrote past its buffer (" + std::to_string(n) + " blocks)");
         }
       }},
      {"metadata: separate metadata round-trips through a metadata buffer (MPTR), data and metadata verified",
       [](context& c) {
         if (c.expect_ms < 0 || c.expect_extended) return;
         const auto& ns = c.ctrl->namespace_by_id(c.nsid);
         auto qp = c.ctrl->create_queue_pair(8);
         const std::uint64_t sizes[] = {1, 7, c.ctrl->max_transfer_bytes() / ns.lba_size + 3};
         std::uint32_t seed = 80;
         for (const std::uint64_t n : sizes) {
           auto out = c.ctrl->memory().allocate(n * ns.lba_size);
           auto meta_out = c.ctrl->memory().allocate(n * ns.metadata_size);
           fill_random(out.data(), out.size(), seed++);
           fill_random(meta_out.data(), meta_out.size(), seed++);
           auto memory = c.ctrl->memory().allocate(n * ns.lba_size + 4096);
           auto meta_memory = c.ctrl->memory().allocate(n * ns.metadata_size + 4096);
           const auto in = guarded(memory, n * ns.lba_size);
           const auto meta_in = guarded(meta_memory, n * ns.metadata_size);
           expect_status(qp->write(c.nsid, c.scratch_lba, n, out, 0, meta_out), spec::status::successful_completion,
                         "write with metadata of " + std::to_string(n));
           expect_status(qp->read(c.nsid, c.scratch_lba, n, in, 0, meta_in), spec::status::successful_completion,
                         "read with metadata of " + std::to_string(n));
           expect(std::memcmp(out.data(), in.data(), out.size()) == 0, "data read back differs (" + std::to_string(n) + " blocks)");
           expect(std::memcmp(meta_out.data(), meta_in.data(), meta_out.size()) == 0, "metadata read back differs (" + std::to_string(n) + " blocks)");
           expect(guard_intact(memory, n * ns.lba_size), "the read wrote past its data buffer");
           expect(guard_intact(meta_memory, n * ns.metadata_size), "the read wrote past its metadata buffer");
         }
       }},
      {"metadata: a plain read on a separate-metadata namespace is refused, naming the metadata buffer",
       [](context& c) {
         if (c.expect_ms < 0 || c.expect_extended) return;
         auto qp = c.ctrl->create_queue_pair(4);
         auto memory = c.ctrl->memory().allocate(8192);
         const auto view = guarded(memory, 4096);
         try {
           (void)qp->read(c.nsid, 0, 1, view);
         } catch (const host::error& e) {
           expect(std::string(e.what()).find("metadata buffer") != std::string::npos, std::string("wrong error: ") + e.what());
           expect(guard_intact(memory, 0), "a refused read changed the buffer");
           return;
         }
         throw failure{"a read without a metadata buffer was accepted"};
       }},
      {"every active namespace has 512-byte or 4 KiB blocks and a capacity",
       [](context& c) {
         expect(!c.ctrl->namespaces().empty(), "no active namespace");
         for (const auto& ns : c.ctrl->namespaces()) {
           expect(ns.lba_size == 512 || ns.lba_size == 4096, "namespace " + std::to_string(ns.nsid) + " has " + std::to_string(ns.lba_size) + "-byte blocks");
           expect(ns.lba_count > 0, "namespace " + std::to_string(ns.nsid) + " is empty");
         }
       }},
      {"queue pairs of 2 entries and of MQES+1 entries are created and deleted",
       [](context& c) {
         { auto q = c.ctrl->create_queue_pair(2); }
         { auto q = c.ctrl->create_queue_pair(c.ctrl->cap().max_queue_entries()); }
       }},
      {"a queue larger than MQES+1 entries is refused with Invalid Queue Size",
       [](context& c) {
         const std::uint32_t too_many = c.ctrl->cap().max_queue_entries() + 1;
         if (too_many > 65536) return;
         try {
           auto q = c.ctrl->create_queue_pair(too_many);
         } catch (const host::error& e) {
           expect(e.status() == spec::status::invalid_queue_size, std::string("wrong error: ") + e.what());
           return;
         }
         throw failure{"a queue of " + std::to_string(too_many) + " entries was accepted"};
       }},
      {"the namespace's known pattern reads back",
       [](context& c) {
         if (!c.pattern) return;
         auto qp = c.ctrl->create_queue_pair(16);
         const std::uint64_t blocks = std::min<std::uint64_t>((1u << 20) / c.lba, c.scratch_lba);
         auto in = c.ctrl->memory().allocate(blocks * c.lba);
         expect_status(qp->read(c.nsid, 0, blocks, in), spec::status::successful_completion, "pattern read");
         for (std::uint64_t o = 0; o + 8 <= blocks * c.lba; o += 8) {
           std::uint64_t w;
           std::memcpy(&w, in.data() + o, 8);
           expect(w == host::pattern_word(o), "pattern word at byte " + std::to_string(o) + " differs");
         }
       }},
      {"writes read back at 1 block, 4 KiB, two pages, a PRP list, MDTS and beyond",
       [](context& c) {
         auto qp = c.ctrl->create_queue_pair(32);
         const std::uint64_t mdts_blocks = c.ctrl->max_transfer_bytes() / c.lba;
         std::uint32_t seed = 1;
         const std::uint64_t sizes[] = {1, 4096 / c.lba, 8192 / c.lba, 65536 / c.lba, mdts_blocks, 2 * mdts_blocks + 3};
         for (std::uint64_t n : sizes) {
           if (n == 0) continue;
           round_trip(c, *qp, c.scratch_lba, n, 0, seed++);
         }
       }},
      {"a transfer that starts inside a page uses a PRP1 offset",
       [](context& c) {
         auto qp = c.ctrl->create_queue_pair(8);
         round_trip(c, *qp, c.scratch_lba + 64, (3 * 4096) / c.lba + 1, 512, 7);
       }},
      {"queues wrap and the phase tag flips",
       [](context& c) {
         auto qp = c.ctrl->create_queue_pair(4);
         auto buf = c.ctrl->memory().allocate(c.lba);
         for (int i = 0; i < 13; ++i) expect_status(qp->read(c.nsid, static_cast<std::uint64_t>(i), 1, buf), spec::status::successful_completion, "read " + std::to_string(i));
       }},
      {"several queue pairs work side by side",
       [](context& c) {
         auto a = c.ctrl->create_queue_pair(16);
         auto b = c.ctrl->create_queue_pair(16);
         round_trip(c, *a, c.scratch_lba + 1000, 8, 0, 21);
         round_trip(c, *b, c.scratch_lba + 2000, 8, 0, 22);
         round_trip(c, *a, c.scratch_lba + 3000, 8, 0, 23);
       }},
      {"Flush completes",
       [](context& c) {
         auto qp = c.ctrl->create_queue_pair(4);
         expect_status(qp->flush(c.nsid), spec::status::successful_completion, "flush");
       }},
      {"an LBA past the end of the namespace is LBA Out of Range",
       [](context& c) {
         auto qp = c.ctrl->create_queue_pair(4);
         auto buf = c.ctrl->memory().allocate(c.lba);
         expect_status(qp->read(c.nsid, c.blocks, 1, buf), spec::status::lba_out_of_range, "read at the end");
       }},
      {"a namespace that does not exist is Invalid Namespace or Format",
       [](context& c) {
         auto qp = c.ctrl->create_queue_pair(4);
         auto buf = c.ctrl->memory().allocate(4096);
         auto sqe = spec::make_rw(spec::nvm_opcode::read, c.ctrl->identify().nn + 1, 0, 1, buf.bus());
         expect_status(qp->execute(sqe, "Read").status(), spec::status::invalid_namespace_or_format, "read of a missing namespace");
       }},
      {"an unknown I/O opcode is Invalid Command Opcode",
       [](context& c) {
         auto qp = c.ctrl->create_queue_pair(4);
         spec::submission_entry sqe{};
         sqe.set_opcode(std::uint8_t{0x7f});
         sqe.nsid = c.nsid;
         expect_status(qp->execute(sqe, "Opcode 7Fh").status(), spec::status::invalid_command_opcode, "opcode 7Fh");
       }},
      {"SMART / Health counts host read commands",
       [](context& c) {
         const auto before = smart_host_reads(*c.ctrl);
         auto qp = c.ctrl->create_queue_pair(4);
         auto buf = c.ctrl->memory().allocate(c.lba);
         for (int i = 0; i < 5; ++i) expect_status(qp->read(c.nsid, 0, 1, buf), spec::status::successful_completion, "read");
         expect(smart_host_reads(*c.ctrl) >= before + 5, "Host Read Commands did not grow by 5");
       }},
      {"reset (CC.EN 0, bring-up again) re-creates live queue pairs on their identifiers; I/O before and after reads back",
       [](context& c) {
         auto a = c.ctrl->create_queue_pair(16);
         auto b = c.ctrl->create_queue_pair(8);
         const std::uint16_t a_id = a->id(), b_id = b->id();
         round_trip(c, *a, c.scratch_lba + 7000, 16, 0, 70);
         c.ctrl->reset();
         expect(c.ctrl->csts().rdy() && !c.ctrl->csts().cfs(), "CSTS is not RDY=1 CFS=0 after the reset");
         expect(a->id() == a_id && b->id() == b_id, "a queue pair changed its identifier");
         round_trip(c, *a, c.scratch_lba + 7100, 16, 0, 71);
         round_trip(c, *b, c.scratch_lba + 7200, (3 * 4096) / c.lba + 1, 0, 72);
         auto fresh = c.ctrl->create_queue_pair(8);
         round_trip(c, *fresh, c.scratch_lba + 7300, 8, 0, 73);
       }},
      {"Abort of a command that is not outstanding reports it not aborted, and the queue goes on",
       [](context& c) {
         auto qp = c.ctrl->create_queue_pair(8);
         round_trip(c, *qp, c.scratch_lba + 7400, 8, 0, 74);
         expect(!c.ctrl->abort(qp->id(), 3), "the controller says it aborted a command that had completed");
         round_trip(c, *qp, c.scratch_lba + 7500, 8, 0, 75);
       }},
      {"map_host: locked anonymous memory no allocator of this controller handed out receives a read's data",
       [](context& c) {
         outside_memory memory(3 * 4096, true);
         if (scheme_is(c, "sysfs:") && !host::pagemap_allocator::unevictable_compaction_disabled()) {
           // Compaction may move locked 4 KiB pages here: sysfs must refuse them, saying so.
           try {
             (void)c.ctrl->memory().map_host(memory.data, memory.bytes);
           } catch (const host::error& e) {
             expect(std::string(e.what()).find("compact_unevictable_allowed") != std::string::npos, std::string("wrong error: ") + e.what());
             return;
           }
           throw failure{"sysfs mapped locked 4 KiB pages although compaction may move them"};
         }
         auto mapped = c.ctrl->memory().map_host(memory.data, memory.bytes);
         expect(mapped.data() == memory.data && mapped.size() == memory.bytes, "the buffer is not the memory given");
         auto qp = c.ctrl->create_queue_pair(8);
         read_into_mapped(c, *qp, mapped, c.scratch_lba + 7600, 8192 / c.lba, 90);
       }},
      {"map_host: huge pages a second allocator handed out receive a read's data (on sysfs at the same physical pages)",
       [](context& c) {
         if (scheme_is(c, "emu:")) return;  // the second allocator reads pagemap: root in the guest (the emulator's case is a host test)
         host::pagemap_allocator second("second allocator");
         auto slots = second.allocate(2u << 20);
         auto mapped = c.ctrl->memory().map_host(slots.data(), slots.size());
         if (scheme_is(c, "sysfs:")) expect(mapped.pages() == slots.pages(), "sysfs translated the memory to other pages than its allocator");
         auto qp = c.ctrl->create_queue_pair(8);
         read_into_mapped(c, *qp, mapped, c.scratch_lba + 7700, (64 * 1024) / c.lba, 91);
         expect(second.still_at(slots), "the pages moved while this controller had them mapped");
       }},
      {"map_host: unlocked memory is refused by sysfs (it could move) and pinned by the others, where a read lands in it",
       [](context& c) {
         outside_memory memory(3 * 4096, false);
         if (scheme_is(c, "sysfs:")) {
           try {
             (void)c.ctrl->memory().map_host(memory.data, memory.bytes);
           } catch (const host::error& e) {
             expect(std::string(e.what()).find("not locked") != std::string::npos && std::string(e.what()).find("mlock") != std::string::npos,
                    std::string("wrong error: ") + e.what());
             return;
           }
           throw failure{"sysfs mapped memory nothing keeps at its physical addresses"};
         }
         auto mapped = c.ctrl->memory().map_host(memory.data, memory.bytes);
         auto qp = c.ctrl->create_queue_pair(8);
         read_into_mapped(c, *qp, mapped, c.scratch_lba + 7800, 4096 / c.lba, 92);
       }},
      {"map_host refuses a null pointer, a start inside a page and zero bytes with a host::error naming the operation",
       [](context& c) {
         outside_memory memory(2 * 4096, true);
         const auto refused = [&](void* p, std::size_t n, const char* what) {
           try {
             (void)c.ctrl->memory().map_host(p, n);
           } catch (const host::error& e) {
             expect(std::string(e.what()).find("Map host memory") != std::string::npos, std::string(what) + ": wrong error: " + e.what());
             return;
           }
           throw failure{std::string(what) + " was mapped"};
         };
         refused(nullptr, 4096, "a null pointer");
         refused(memory.data + 512, 4096, "a start inside a page");
         refused(memory.data, 0, "zero bytes");
       }},
      {"with shadow doorbells (Doorbell Buffer Config) I/O still completes",
       [](context& c) {
         if (!c.ctrl->identify().supports_doorbell_buffer_config()) return;
         c.ctrl.reset();
         host::controller_options options;
         options.shadow_doorbells = true;
         c.ctrl = host::open(c.uri, options);
         expect(c.ctrl->shadow_doorbells(), "Doorbell Buffer Config was not sent");
         auto qp = c.ctrl->create_queue_pair(8);
         for (int i = 0; i < 3; ++i) round_trip(c, *qp, c.scratch_lba + 4000 + 64u * i, 16, 0, 40 + i);
       }},
      {"with shadow doorbells a queue pair re-created on a deleted queue's identifier does I/O that reads back",
       [](context& c) {
         // DESIGN.md rule 5: the deleted queue's shadow and EventIdx slots must not carry over
         // (a stale EventIdx made the host skip the new queue's first MMIO doorbell: QEMU never
         // ran the command).
         if (!c.ctrl->identify().supports_doorbell_buffer_config()) return;
         c.ctrl.reset();
         host::controller_options options;
         options.shadow_doorbells = true;
         options.command_timeout = std::chrono::milliseconds(5000);
         c.ctrl = host::open(c.uri, options);
         expect(c.ctrl->shadow_doorbells(), "Doorbell Buffer Config was not sent");
         std::uint16_t first_id = 0;
         {
           auto qp = c.ctrl->create_queue_pair(8);
           first_id = qp->id();
           for (int i = 0; i < 3; ++i) round_trip(c, *qp, c.scratch_lba + 6000 + 64u * i, 16, 0, 60 + i);
         }
         auto qp = c.ctrl->create_queue_pair(8);
         expect(qp->id() == first_id, "the new queue pair got identifier " + std::to_string(qp->id()) + ", not the deleted " + std::to_string(first_id));
         for (int i = 0; i < 3; ++i) round_trip(c, *qp, c.scratch_lba + 6400 + 64u * i, 16, 0, 63 + i);
         expect(c.ctrl->unexpected_completions() == 0, std::to_string(c.ctrl->unexpected_completions()) + " completions for commands not in flight");
       }},
      {"with the SQ in the controller memory buffer I/O reads back",
       [](context& c) {
         if (!c.expect_cmb) return;
         expect(c.ctrl->cap().cmbs(), "CAP.CMBS is 0 but a CMB was expected");
         c.ctrl.reset();
         host::controller_options options;
         options.use_cmb = true;
         c.ctrl = host::open(c.uri, options);
         auto qp = c.ctrl->create_queue_pair(16, host::queue_placement::cmb_submission);
         for (int i = 0; i < 3; ++i) round_trip(c, *qp, c.scratch_lba + 5000 + 64u * i, 24, 0, 50 + i);
       }},
      {"after shutdown, commands fail with 'controller not ready'",
       [](context& c) {
         c.ctrl->shutdown();
         try {
           (void)c.ctrl->admin(spec::make_get_features(spec::feature_id::number_of_queues), "Get Features");
         } catch (const host::error& e) {
           expect(std::string(e.what()).find("not ready") != std::string::npos, std::string("wrong error: ") + e.what());
           return;
         }
         throw failure{"an admin command was accepted by a controller that was shut down"};
       }},
  };
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s URI [--pattern] [--expect-cmb] [--metadata MS:extended|MS:separate] [--only-metadata]\n", argv[0]);
    return 2;
  }
  context c;
  c.uri = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--pattern") {
      c.pattern = true;
    } else if (arg == "--expect-cmb") {
      c.expect_cmb = true;
    } else if (arg == "--only-metadata") {
      c.only_metadata = true;
    } else if (arg == "--metadata" && i + 1 < argc) {
      const std::string v = argv[++i];
      const auto colon = v.find(':');
      const std::string mode = colon == std::string::npos ? "" : v.substr(colon + 1);
      if (mode != "extended" && mode != "separate") {
        std::fprintf(stderr, "%s: --metadata takes MS:extended or MS:separate, not %s\n", argv[0], v.c_str());
        return 2;
      }
      c.expect_ms = std::stoi(v.substr(0, colon));
      c.expect_extended = mode == "extended";
    } else {
      std::fprintf(stderr, "%s: unknown option %s\n", argv[0], arg.c_str());
      return 2;
    }
  }
  try {
    c.ctrl = host::open(c.uri);
  } catch (const std::exception& e) {
    std::printf("FAIL bring-up: %s\nconformance: 0 passed, 1 failed\n", e.what());
    return 1;
  }
  const auto& ns = c.ctrl->namespace_by_id(c.nsid);
  c.lba_data = ns.lba_size;
  c.lba = static_cast<std::uint32_t>(ns.block_bytes());  // extended LBAs: data and metadata per block in the buffer
  c.blocks = ns.lba_count;
  c.scratch_lba = ns.lba_count / 2;
  std::printf("conformance on %s: %s %s, %zu namespace(s), %u-byte blocks\n", c.uri.c_str(), spec::trimmed(c.ctrl->identify().mn).c_str(),
              spec::trimmed(c.ctrl->identify().fr).c_str(), c.ctrl->namespaces().size(), c.lba);
  test::tally results;
  for (const auto& [name, run] : cases()) {
    if (c.only_metadata && name.rfind("metadata: ", 0) != 0) continue;
    results.run(name, [&] {
      if (!c.ctrl) c.ctrl = host::open(c.uri);
      run(c);
    });
  }
  return results.summary("conformance");
}
