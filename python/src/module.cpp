// cunvme._cunvme: the Python bindings (nanobind). A thin layer over the headers: a controller
// from `host::open`, the host path through one `host::queue_pair`, the GPU path through
// `cunvme::device` and `copy_n` (gpu_path.hpp); arrays.hpp checks a caller's array (kind, size,
// contiguity) before a pointer is handed on, errors.hpp turns failures into Python exceptions.
#include "arrays.hpp"
#include "errors.hpp"
#include "gpu_path.hpp"
#include "loader.hpp"

#include <cunvme/config.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/open.cuh>
#include <cunvme/host/sharing/controller_owner.cuh>
#include <cunvme/host/queue/queue_pair.cuh>
#include <cunvme/io/io_result.cuh>
#include <cunvme/io/request_plan.cuh>
#include <cunvme/spec/command_fields.cuh>
#include <cunvme/spec/identify.cuh>
#include <cunvme/spec/status.cuh>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

namespace nb = nanobind;
namespace host = cunvme::host;
namespace spec = cunvme::spec;

namespace cunvme_python {
namespace {

// ---- the device -----------------------------------------------------------------------------

/// A GPU copy in flight: `cunvme.Transfer`. Keeps the array (and, through nanobind's
/// keep_alive, the device) alive until it is gone.
class transfer {
 public:
  transfer(std::unique_ptr<gpu_copy> copy, nb::object array, nb::ndarray<nb::ro> exported, std::string operation)
      : array_(std::move(array)), exported_(std::move(exported)), copy_(std::move(copy)), operation_(std::move(operation)) {}
  transfer(transfer&&) noexcept = default;  // nb::cast moves it in; the moved-from one holds no copy
  transfer& operator=(transfer&&) = delete;
  /// A Transfer dropped before its stream ran the copy waits for it: the array goes back to
  /// its allocator (torch's, cupy's caching one) only after the kernel stopped writing it.
  ~transfer() {
    if (copy_ == nullptr || copy_->ready()) return;
    // With the GIL held (a destructor may run while the interpreter finalizes, where it must
    // not be released): the copy needs no Python thread to finish, only the GPU and the
    // controller's own threads.
    try {
      (void)copy_->wait();
    } catch (...) {
      // A kernel that failed to run writes nothing more: the array may go.
    }
  }

  [[nodiscard]] bool ready() const { return copy_->ready(); }

  void wait() {
    cunvme::io_result r;
    {
      nb::gil_scoped_release release;
      r = copy_->wait();
    }
    check(r, operation_, cunvme::waited_out(r.error) ? copy_->timeout_cause() : std::string());
  }

 private:
  // The array before the copy: members go in reverse order, so the copy (and its wait) is
  // done with before the references to the array are dropped.
  nb::object array_;
  nb::ndarray<nb::ro> exported_;
  std::unique_ptr<gpu_copy> copy_;
  std::string operation_;
};

/// `uri` with the emulator's fault rules `faults` — one rule (str) or a sequence of them — as
/// its `fault=` key, rules joined by '+'; the URI's own parser checks each rule. None: `uri`.
std::string with_fault_rules(const std::string& uri, const nb::object& faults) {
  if (faults.is_none()) return uri;
  std::vector<std::string> rules;
  if (nb::isinstance<nb::str>(faults)) {
    rules.push_back(nb::cast<std::string>(faults));
  } else if (PySequence_Check(faults.ptr()) != 0) {
    for (nb::handle rule : faults) {
      if (!nb::isinstance<nb::str>(rule)) throw nb::type_error("faults: every fault rule must be a str");
      rules.push_back(nb::cast<std::string>(rule));
    }
  } else {
    throw nb::type_error("faults must be a fault rule (str) or a list of them");
  }
  if (rules.empty()) return uri;
  if (uri != "emu" && uri.rfind("emu:", 0) != 0) {
    throw nb::value_error(("faults= is the emulator's fault injection; '" + uri + "' is not an emu device").c_str());
  }
  std::string joined;
  for (const std::string& rule : rules) joined += (joined.empty() ? "" : "+") + rule;
  return uri + (uri == "emu" ? ":" : ",") + "fault=" + joined;
}

class device {
 public:
  device(const std::string& given_uri, std::uint32_t nsid, double timeout_seconds, const nb::object& gpu, const nb::object& faults)
      : uri_(with_fault_rules(given_uri, faults)), nsid_(nsid) {
    // gpu: None (where CUDA finds one), False, True (the current GPU) or a CUDA ordinal.
    std::optional<bool> use_gpu;
    int ordinal = -1;
    if (nb::isinstance<nb::bool_>(gpu)) {
      use_gpu = nb::cast<bool>(gpu);
    } else if (nb::isinstance<nb::int_>(gpu)) {
      const long long asked = nb::cast<long long>(gpu);
      if (asked < 0 || asked > 1 << 20) throw nb::value_error("gpu must be None, True, False or a GPU ordinal (0, 1, …)");
      use_gpu = true;
      ordinal = static_cast<int>(asked);
    } else if (!gpu.is_none()) {
      throw nb::type_error("gpu must be None, True, False or a GPU ordinal (int)");
    }
    const std::string& uri = uri_;
    if (!std::isfinite(timeout_seconds) || timeout_seconds <= 0 || timeout_seconds > 86400) {
      throw nb::value_error("timeout must be a number of seconds in (0, 86400]");
    }
    const auto timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(timeout_seconds));
    host::controller_options options;
    options.command_timeout = std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
    // Every queue pair the controller grants: a controller this process serves (serve()) hands
    // them to the processes attached to it, which take copy_n's queue pairs each.
    options.io_queue_pairs = 65535;
    nb::gil_scoped_release release;
    gpu_reason_ = use_gpu == false ? "the device was opened with gpu=False" : gpu_unavailable_reason();
    if (use_gpu == true && !gpu_reason_.empty()) throw device_failure{"Open " + uri + " with gpu=True: " + gpu_reason_};
    if (gpu_reason_.empty()) {
      gpu_ = open_gpu_path(uri, nsid, timeout, options, ordinal);
      ctrl_ = &gpu_->controller();
    } else {
      own_ = host::open(uri, options);
      ctrl_ = own_.get();
    }
    ns_ = ctrl_->namespace_by_id(nsid);
    const std::uint64_t block = ns_.block_bytes();
    // One command per chunk (at most MDTS, and NLB's 65536 blocks): a failing status names
    // exactly the blocks of the command that failed. At most 4 MiB of bounce memory.
    const std::uint64_t per_command = cunvme::max_blocks_per_command(ctrl_->max_transfer_bytes(), block);
    chunk_blocks_ = std::max<std::uint64_t>(1, std::min<std::uint64_t>(per_command, (std::uint64_t{4} << 20) / block));
    qp_ = ctrl_->create_queue_pair(64);
    bounce_ = ctrl_->memory().allocate(static_cast<std::size_t>(chunk_blocks_ * block));
  }

  [[nodiscard]] std::uint64_t block_size() const { return ns_.block_bytes(); }
  [[nodiscard]] std::uint64_t blocks() const { return ns_.lba_count; }
  [[nodiscard]] std::uint32_t nsid() const { return nsid_; }
  [[nodiscard]] const std::string& uri() const { return uri_; }
  [[nodiscard]] bool gpu() const {
    const std::shared_lock life(life_);
    return gpu_ != nullptr;
  }
  [[nodiscard]] const std::string& gpu_unavailable() const { return gpu_reason_; }
  /// The GPU (CUDA ordinal) the GPU path serves; None on the host path.
  [[nodiscard]] std::optional<int> gpu_ordinal() const {
    const std::shared_lock life(life_);
    return gpu_ != nullptr ? std::optional<int>(gpu_->gpu()) : std::nullopt;
  }

  /// Serves this device's controller to other processes at socket `path`
  /// (host::sharing::controller_owner): they open Device("attach:" + path, gpu=their GPU).
  void serve(const std::string& path) {
    nb::gil_scoped_release release;
    const std::unique_lock life(life_);
    host::controller& c = open();
    if (owner_ != nullptr) throw device_failure{"Serve at " + path + ": the device serves at " + owner_->path() + " already"};
    owner_ = std::make_unique<host::sharing::controller_owner>(c, path);
  }
  /// Stops serving: the processes still attached are let go (their queues deleted).
  void stop_serving() {
    nb::gil_scoped_release release;
    const std::unique_lock life(life_);
    owner_.reset();
  }
  /// What the owner serves: the socket, processes attached, queue identifiers they hold, processes reclaimed.
  nb::object serving() const {
    const std::shared_lock life(life_);
    if (owner_ == nullptr) return nb::none();
    nb::dict d;
    d["path"] = owner_->path();
    d["processes"] = owner_->processes();
    d["queue_ids_held"] = owner_->queue_ids_held();
    d["processes_reclaimed"] = owner_->processes_reclaimed();
    d["queues_reclaimed"] = owner_->queues_reclaimed();
    return d;
  }
  [[nodiscard]] bool closed() const {
    const std::shared_lock life(life_);
    return ctrl_ == nullptr;
  }

  [[nodiscard]] std::string name() {
    const std::shared_lock life(life_);
    return open().name();
  }

  nb::dict info() {
    const std::shared_lock life(life_);
    host::controller& c = open();
    const spec::identify_controller& id = c.identify();
    nb::dict d;
    d["device"] = c.name();
    d["model"] = spec::trimmed(id.mn);
    d["serial"] = spec::trimmed(id.sn);
    d["firmware"] = spec::trimmed(id.fr);
    d["nvme_version"] = std::to_string(c.version().mjr()) + "." + std::to_string(c.version().mnr()) + "." + std::to_string(c.version().ter());
    d["vendor_id"] = id.vid;
    d["mdts"] = id.mdts;
    d["max_transfer_bytes"] = c.max_transfer_bytes();
    d["io_queue_pairs"] = c.io_queue_pairs_granted();
    nb::list namespaces;
    for (const host::namespace_info& ns : c.namespaces()) {
      nb::dict n;
      n["nsid"] = ns.nsid;
      n["block_size"] = ns.lba_size;
      n["blocks"] = ns.lba_count;
      n["metadata_size"] = ns.metadata_size;
      n["extended_lba"] = ns.extended_lba;
      n["protection_type"] = ns.protection_type;
      namespaces.append(n);
    }
    d["namespaces"] = namespaces;
    d["gpu"] = gpu_ != nullptr;
    return d;
  }

  nb::object read(std::uint64_t lba, std::uint64_t blocks, nb::handle out, nb::handle stream, bool sync) {
    return transfer_op(false, lba, blocks, out, stream, sync);
  }
  nb::object write(std::uint64_t lba, std::uint64_t blocks, nb::handle src, nb::handle stream, bool sync) {
    return transfer_op(true, lba, blocks, src, stream, sync);
  }

  void flush() {
    spec::status s;
    {
      nb::gil_scoped_release release;  // as in transfer_op: life_ only without the GIL
      const std::shared_lock life(life_);
      (void)open();
      const std::lock_guard io(host_io_);
      s = qp_->flush(nsid_);
    }
    if (!spec::is_success(s)) throw nvme_failure{"Flush", s, 0, 0};
  }

  /// Waits for GPU copies still in flight, deletes the queues and shuts the controller down.
  void close() {
    nb::gil_scoped_release release;
    const std::unique_lock life(life_);
    owner_.reset();  // attached processes let go before the controller goes
    bounce_ = host::dma_buffer{};
    qp_.reset();
    ctrl_ = nullptr;
    own_.reset();
    gpu_.reset();
  }

 private:
  host::controller& open() const {
    if (ctrl_ == nullptr) throw device_failure{"the device is closed"};
    return *ctrl_;
  }

  nb::object transfer_op(bool write, std::uint64_t lba, std::uint64_t blocks, nb::handle array, nb::handle stream, bool sync) {
    const char* role = write ? "src" : "out";
    const std::string operation = write ? "Write" : "Read";
    if (blocks == 0) throw nb::value_error("blocks must be at least 1");
    if (plan(lba, blocks).error == cunvme::plan_error::lba_wrap) throw nb::value_error("lba + blocks runs past LBA 2^64 - 1");
    const array_bytes a = describe(array, role, !write);
    const auto need = times(blocks, block_size());
    if (!need || *need > a.bytes) {
      throw nb::value_error((std::string(role) + " holds " + std::to_string(a.bytes) + " bytes; " + std::to_string(blocks) + " blocks of " +
                             std::to_string(block_size()) + " bytes need " + (need ? std::to_string(*need) : std::string("more than 2^64")))
                                .c_str());
    }
    const std::uintptr_t handle = stream_handle(stream);
    // PRP entries are dword aligned (NVMe 2.0, 4.1.1): the copy's first byte must be too.
    if (a.gpu && reinterpret_cast<std::uintptr_t>(a.data) % 4 != 0) {
      throw nb::value_error((std::string(role) + " starts at a GPU address that is not a multiple of 4 bytes: NVMe data pointers are "
                                                 "dword aligned")
                                .c_str());
    }
    std::unique_ptr<gpu_copy> copy;
    {
      // life_ is taken without the GIL and given back before the GIL is taken again: close()
      // may be waiting for it, and a thread that holds the GIL may be queued behind close().
      nb::gil_scoped_release release;
      const std::shared_lock life(life_);
      (void)open();
      if (!a.gpu) {
        host_transfer(write, lba, blocks, a.data);
      } else if (gpu_ == nullptr) {
        throw device_failure{role + std::string(" is GPU memory, but this device has no GPU path: ") + gpu_reason_};
      } else {
        copy = write ? gpu_->write(lba, blocks, a.data, a.bytes, handle) : gpu_->read(lba, blocks, a.data, a.bytes, handle);
      }
    }
    if (!a.gpu) return nb::none();
    transfer t(std::move(copy), nb::borrow(array), a.exported, operation);
    if (sync) {
      t.wait();
      return nb::none();
    }
    return nb::cast(std::move(t));
  }

  /// The request in chunks of the bounce buffer (each one command: at most MDTS), by the one planner.
  [[nodiscard]] cunvme::request_plan plan(std::uint64_t lba, std::uint64_t blocks) const {
    return cunvme::plan_request(cunvme::request_geometry::of(ns_.block_bytes(), 0, ns_.lba_count, chunk_blocks_), lba, blocks);
  }

  /// The host path: one command per chunk through the bounce buffer, on the calling thread. A
  /// range past the namespace's end fails as the controller would fail its command (LBA Out of
  /// Range, naming it), before any chunk moves.
  void host_transfer(bool write, std::uint64_t lba, std::uint64_t blocks, std::byte* data) {
    const std::lock_guard io(host_io_);
    const char* operation = write ? "Write" : "Read";
    const cunvme::request_plan p = plan(lba, blocks);
    if (p.error == cunvme::plan_error::past_capacity) throw nvme_failure{operation, spec::status::lba_out_of_range, p.fail_lba, p.fail_blocks};
    if (!p.ok()) throw device_failure{std::string(operation) + " of " + std::to_string(blocks) + " blocks at LBA " + std::to_string(lba) + ": " + cunvme::to_string(p.error)};
    for (std::uint64_t i = 0; i < p.commands(); ++i) {
      const cunvme::planned_command c = p.command(i);
      const auto bytes = static_cast<std::size_t>(std::uint64_t{c.blocks} * p.block_bytes);
      std::byte* at = data + c.byte_offset;
      if (write) std::memcpy(bounce_.data(), at, bytes);
      const spec::status s = write ? qp_->write(nsid_, c.slba, c.blocks, bounce_) : qp_->read(nsid_, c.slba, c.blocks, bounce_);
      if (!spec::is_success(s)) throw nvme_failure{operation, s, c.slba, c.blocks};
      if (!write) std::memcpy(at, bounce_.data(), bytes);
    }
  }

  std::string uri_;
  std::uint32_t nsid_;
  std::string gpu_reason_;
  // Declared before what uses them, so destroyed after: the GPU path owns the controller
  // there is one, `own_` where there is not.
  std::unique_ptr<gpu_path> gpu_;
  std::unique_ptr<host::controller> own_;
  std::unique_ptr<host::sharing::controller_owner> owner_;  // before the controller goes (close())
  host::controller* ctrl_ = nullptr;
  host::namespace_info ns_{};
  std::uint64_t chunk_blocks_ = 1;
  std::unique_ptr<host::queue_pair> qp_;
  host::dma_buffer bounce_;
  std::mutex host_io_;             // the queue pair takes one host thread at a time
  mutable std::shared_mutex life_;  // I/O shares it; close() takes it alone
};

}  // namespace
}  // namespace cunvme_python

NB_MODULE(_cunvme, m) {
  using namespace cunvme_python;
  m.doc() = "cunvme's bindings; use the package `cunvme`, which re-exports them.";
  m.attr("__version__") = std::to_string(CUNVME_VERSION_MAJOR) + "." + std::to_string(CUNVME_VERSION_MINOR) + "." + std::to_string(CUNVME_VERSION_PATCH);

  register_errors();
  register_loader(m);

  m.def("status_name", [](unsigned code) { return std::string(spec::name(static_cast<spec::status>(code & 0x7ffu))); }, nb::arg("code"),
        "The NVMe specification's name for a status code, (SCT << 8) | SC.");
  m.def("gpu_unavailable_reason", &gpu_unavailable_reason, "Why this process cannot use the GPU path, or '' when it can.");

  nb::class_<transfer>(m, "Transfer", "A GPU read or write enqueued on a stream (cunvme::pending_copy).")
      .def("ready", &transfer::ready, "Whether wait() would return without blocking.")
      .def("wait", &transfer::wait,
           "Blocks until the stream has run the copy; raises NvmeError (an NVMe status), IoError (a timeout or a refused "
           "request) or DeviceError (the kernel failed to run). May be called again: the same outcome.");

  nb::class_<device>(m, "Device",
                     "An NVMe controller and one of its namespaces (see the package's docstring). Device(uri='emu', nsid=1, "
                     "timeout=10.0, gpu=None, faults=None): gpu=None opens it for GPU threads where CUDA finds a GPU, False never, True "
                     "(the current GPU) or a GPU ordinal (that GPU) or DeviceError. uri 'attach:PATH' opens a controller another process "
                     "serves (Device.serve), with queue pairs of this process's own. faults: the emulator's fault injection, one rule or a list of rules as the URI's fault= key takes "
                     "them (e.g. 'read:status=0x281:nth=3'); ValueError for a device that is not emu.")
      .def(nb::init<const std::string&, std::uint32_t, double, const nb::object&, const nb::object&>(), nb::arg("uri") = "emu",
           nb::arg("nsid") = 1, nb::arg("timeout") = 10.0, nb::arg("gpu").none() = nb::none(), nb::arg("faults").none() = nb::none())
      .def_prop_ro("block_size", &device::block_size, "Bytes per block in a caller's array (data, and metadata with extended LBAs).")
      .def_prop_ro("blocks", &device::blocks, "Blocks in the namespace (NSZE).")
      .def_prop_ro("nsid", &device::nsid)
      .def_prop_ro("uri", &device::uri, "The URI the device was opened with.")
      .def_prop_ro("name", &device::name, "The controller's name (the URI's device).")
      .def_prop_ro("gpu", &device::gpu, "Whether GPU arrays are taken (a CUDA GPU was found and gpu was not False).")
      .def_prop_ro("gpu_unavailable_reason", &device::gpu_unavailable, "Why there is no GPU path, or ''.")
      .def_prop_ro("gpu_ordinal", &device::gpu_ordinal, "The GPU (CUDA ordinal) the GPU path serves; None on the host path.")
      .def("serve", &device::serve, nb::arg("path"),
           "Serves this controller to other processes at Unix socket `path` (this process owns its admin queue): they open "
           "Device('attach:' + path, gpu=their GPU) with queue pairs of their own; one that exits or is killed has its queues "
           "deleted before its memory is let go. The emulator must be opened with 'shared' (emu:shared,...).")
      .def("stop_serving", &device::stop_serving, "Stops serving; the processes still attached are let go (their queues deleted).")
      .def_prop_ro("serving", &device::serving,
                   "None, or a dict: path, processes (attached now), queue_ids_held, processes_reclaimed, queues_reclaimed.")
      .def("info", &device::info, "Identify data: model, serial, firmware, MDTS and every namespace.")
      .def("read", &device::read, nb::arg("lba"), nb::arg("blocks"), nb::arg("out"), nb::arg("stream").none() = nb::none(),
           nb::arg("sync") = false, nb::keep_alive<0, 1>(),
           "Reads `blocks` blocks at `lba` into the first blocks * block_size bytes of `out` (C-contiguous, writable).\n\n"
           "A host array (numpy, bytearray, memoryview): the host path, done on return; returns None. A GPU array "
           "(__cuda_array_interface__ or DLPack): copy_n enqueued on `stream` (None, an int handle, a torch or cupy "
           "stream); returns a Transfer, or waits and returns None with sync=True. Raises ValueError/TypeError for a bad "
           "array, NvmeError for an NVMe status, DeviceError for a setup failure. On the host path the commands before a "
           "failing one (commands of at most MDTS, in LBA order) have moved their blocks. With the emulator, threads "
           "reading at once pass non-blocking streams: None is the legacy default stream, where another thread's "
           "synchronous copy (.cpu()) waits for the read while holding a lock the emulator's copies need.")
      .def("write", &device::write, nb::arg("lba"), nb::arg("blocks"), nb::arg("src"), nb::arg("stream").none() = nb::none(),
           nb::arg("sync") = false, nb::keep_alive<0, 1>(),
           "Writes the first blocks * block_size bytes of `src` (C-contiguous) to `blocks` blocks at `lba`; "
           "host and GPU arrays as for read().")
      .def("__repr__", [](device& d) {
        return "<cunvme.Device " + (d.closed() ? std::string("(closed)") : d.name()) + " nsid " + std::to_string(d.nsid()) + ": " +
               std::to_string(d.blocks()) + " blocks of " + std::to_string(d.block_size()) + " bytes" + (d.gpu() ? ", GPU path" : ", host path") + ">";
      })
      .def("flush", &device::flush, "Flush (the volatile write cache to media).")
      .def("close", &device::close, "Waits for GPU copies in flight, deletes the queues and shuts the controller down.")
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__exit__", [](device& d, nb::args) { d.close(); });
}
