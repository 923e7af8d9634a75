// cunvme._cunvme: the Python bindings (nanobind). A thin layer over the headers: a controller
// from `host::open`, the host path through one `host::queue_pair`, the GPU path through
// `cunvme::device` and `copy_n` (gpu_path.hpp), and the checks a Python caller needs before
// a pointer is handed on: the array's kind, size, contiguity and alignment.
#include "gpu_path.hpp"

#include <cunvme/config.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/open.cuh>
#include <cunvme/host/queue_pair.cuh>
#include <cunvme/io/io_result.cuh>
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

namespace nb = nanobind;
namespace host = cunvme::host;
namespace spec = cunvme::spec;

namespace cunvme_python {
namespace {

// ---- errors: C++ types the translator turns into cunvme's Python exceptions ------------------

/// A command completed with an NVMe error status: `cunvme.NvmeError`.
struct nvme_failure {
  std::string operation;
  spec::status status;
  std::uint64_t lba;
  std::uint64_t blocks;
};

/// An I/O outcome that is no NVMe status (a timeout, a request the readers refuse): `cunvme.IoError`.
struct io_failure {
  std::string operation;
  cunvme::io_result result;
};

/// Setup refused by the extension itself (a closed device, no GPU path): `cunvme.DeviceError`.
struct device_failure {
  std::string message;
};

/// The exception classes of cunvme/_errors.py, looked up once at import.
struct error_classes {
  nb::object device_error, nvme_error, io_error;
};
error_classes& errors() {
  static error_classes classes;
  return classes;
}

void raise_python(const nb::object& type, const std::string& message, nb::kwargs details) {
  nb::object e = type(message, **details);
  PyErr_SetObject(type.ptr(), e.ptr());
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const nvme_failure& f) {
    nb::kwargs k;
    k["status"] = spec::name(f.status);
    k["status_code"] = static_cast<unsigned>(f.status);
    k["lba"] = f.lba;
    k["blocks"] = f.blocks;
    raise_python(errors().nvme_error, f.operation + ": " + spec::to_string(f.status) + " at LBA " + std::to_string(f.lba) + " (" +
                                          std::to_string(f.blocks) + " blocks)",
                 k);
  } catch (const io_failure& f) {
    nb::kwargs k;
    k["reason"] = cunvme::to_string(f.result.error);
    k["lba"] = f.result.lba;
    k["blocks"] = f.result.blocks;
    raise_python(errors().io_error, f.operation + ": " + cunvme::to_string(f.result), k);
  } catch (const host::error& e) {
    nb::kwargs k;
    k["operation"] = e.operation();
    k["device"] = e.device();
    if (e.status()) k["status"] = spec::name(*e.status());
    raise_python(errors().device_error, e.what(), k);
  } catch (const device_failure& f) {
    raise_python(errors().device_error, f.message, nb::kwargs());
  }
}

/// Raises the Python exception for a failed `io_result`.
void check(const cunvme::io_result& r, const std::string& operation) {
  if (r.ok()) return;
  if (r.error == cunvme::io_error::nvme_status) throw nvme_failure{operation, r.status, r.lba, r.blocks};
  throw io_failure{operation, r};
}

// ---- arrays ---------------------------------------------------------------------------------

/// The bytes of a caller's array, once checked: where they are, how many, on which side, and
/// the imported DLPack tensor or buffer, held until the transfer is done (an exporter may
/// hand out memory that lives only as long as its export).
struct array_bytes {
  std::byte* data = nullptr;
  std::size_t bytes = 0;
  bool gpu = false;
  nb::ndarray<nb::ro> exported{};
};

/// "numpy.ndarray of dtype object", "list": what a caller passed, for messages.
std::string python_type_name(nb::handle o) {
  std::string name = nb::type_name(o.type()).c_str();
  if (nb::hasattr(o, "dtype")) {
    if (const nb::object dtype = nb::steal(PyObject_Str(o.attr("dtype").ptr())); dtype.is_valid() && nb::isinstance<nb::str>(dtype)) {
      name += " of dtype " + nb::cast<std::string>(dtype);
    }
    PyErr_Clear();
  }
  return name;
}

/// Product of `count` and `size`; nullopt when it does not fit.
std::optional<std::size_t> times(std::size_t count, std::size_t size) {
  if (size != 0 && count > std::numeric_limits<std::size_t>::max() / size) return std::nullopt;
  return count * size;
}

/// Whether `strides` (in bytes) lay `shape` out in C order without gaps. Extents of 1 take any stride.
template <class Shape, class Stride>
bool c_contiguous(std::size_t dims, Shape shape, Stride stride, std::int64_t itemsize) {
  std::int64_t expected = itemsize;
  for (std::size_t i = dims; i-- > 0;) {
    if (shape(i) == 0) return true;
    if (shape(i) != 1 && stride(i) != expected) return false;
    expected *= static_cast<std::int64_t>(shape(i));
  }
  return true;
}

/// `__cuda_array_interface__` (version 2 or 3): a GPU array of any library that speaks it.
array_bytes from_cuda_array_interface(nb::handle obj, const char* role, bool writable) {
  const nb::object cai = obj.attr("__cuda_array_interface__");
  if (!nb::isinstance<nb::dict>(cai)) throw nb::type_error((std::string(role) + ".__cuda_array_interface__ is not a dict").c_str());
  const nb::dict d = nb::borrow<nb::dict>(cai);
  if (d.contains("mask") && !d["mask"].is_none()) {
    throw nb::value_error((std::string(role) + " is a masked array (__cuda_array_interface__ mask): cunvme moves raw bytes only").c_str());
  }
  const nb::tuple data = nb::cast<nb::tuple>(d["data"]);
  const auto pointer = nb::cast<std::uintptr_t>(data[0]);
  const bool readonly = nb::cast<bool>(data[1]);
  const std::string typestr = nb::cast<std::string>(d["typestr"]);
  // "<f4", "|u1": byte order, kind, size in bytes.
  if (typestr.size() < 3 || typestr[1] == 'O') {
    throw nb::type_error((std::string(role) + " has element type '" + typestr + "': cunvme needs plain numbers or bytes").c_str());
  }
  const std::int64_t itemsize = std::stoll(typestr.substr(2));
  const nb::tuple shape = nb::cast<nb::tuple>(d["shape"]);
  std::size_t elements = 1;
  for (nb::handle extent : shape) {
    const auto e = times(elements, nb::cast<std::size_t>(extent));
    if (!e) throw nb::value_error((std::string(role) + "'s shape overflows 64 bits").c_str());
    elements = *e;
  }
  if (d.contains("strides") && !d["strides"].is_none()) {
    const nb::tuple strides = nb::cast<nb::tuple>(d["strides"]);
    const auto shape_at = [&](std::size_t i) { return nb::cast<std::size_t>(shape[i]); };
    const auto stride_at = [&](std::size_t i) { return nb::cast<std::int64_t>(strides[i]); };
    if (strides.size() != shape.size() || !c_contiguous(shape.size(), shape_at, stride_at, itemsize)) {
      throw nb::value_error((std::string(role) + " is not C-contiguous: cunvme moves one contiguous range of bytes "
                                                 "(cupy.ascontiguousarray / tensor.contiguous() make one)")
                                .c_str());
    }
  }
  if (writable && readonly) throw nb::value_error((std::string(role) + " is read-only").c_str());
  const auto bytes = times(elements, static_cast<std::size_t>(itemsize));
  if (!bytes) throw nb::value_error((std::string(role) + "'s size overflows 64 bits").c_str());
  return array_bytes{reinterpret_cast<std::byte*>(pointer), *bytes, true, {}};
}

/// A DLPack array (torch, cupy, JAX, numpy) or a buffer (numpy, bytearray, memoryview).
array_bytes from_ndarray(nb::handle obj, const char* role, bool writable) {
  nb::ndarray<> a;
  if (!nb::try_cast(obj, a)) {
    // A refused import may leave the exporter's exception (numpy's BufferError) set.
    PyErr_Clear();
    nb::ndarray<nb::ro> ro;
    const bool read_only = nb::try_cast(obj, ro);
    PyErr_Clear();
    if (read_only) {
      if (writable) throw nb::value_error((std::string(role) + " is read-only").c_str());
      a = nb::ndarray<>(ro.handle());
    } else {
      throw nb::type_error((std::string(role) + " must be a numpy array, a buffer (bytearray, memoryview) or a GPU array that speaks DLPack "
                                                "or __cuda_array_interface__ (torch, cupy), not " + python_type_name(obj))
                               .c_str());
    }
  }
  const nb::dlpack::dtype t = a.dtype();
  if (t.bits % 8 != 0) throw nb::type_error((std::string(role) + " has " + std::to_string(t.bits) + "-bit elements: cunvme moves whole bytes").c_str());
  const auto itemsize = static_cast<std::int64_t>(t.bits / 8) * t.lanes;
  const auto shape_at = [&](std::size_t i) { return a.shape(i); };
  const auto stride_at = [&](std::size_t i) { return a.stride(i) * itemsize; };
  if (!c_contiguous(a.ndim(), shape_at, stride_at, itemsize)) {
    throw nb::value_error((std::string(role) + " is not C-contiguous: cunvme moves one contiguous range of bytes "
                                               "(numpy.ascontiguousarray / tensor.contiguous() make one)")
                              .c_str());
  }
  const auto bytes = times(a.size(), static_cast<std::size_t>(itemsize));
  if (!bytes) throw nb::value_error((std::string(role) + "'s size overflows 64 bits").c_str());
  array_bytes out{static_cast<std::byte*>(const_cast<void*>(a.data())), *bytes, false, nb::ndarray<nb::ro>(a.handle())};
  switch (a.device_type()) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value:     // pinned host memory: the CPU copies it
    case nb::device::cuda_managed::value:  // reachable from the CPU too
      return out;
    case nb::device::cuda::value:
      out.gpu = true;
      return out;
    default:
      throw nb::type_error((std::string(role) + " lives on DLPack device type " + std::to_string(a.device_type()) +
                            ": cunvme takes CPU arrays and CUDA GPU arrays")
                               .c_str());
  }
}

array_bytes describe(nb::handle obj, const char* role, bool writable) {
  if (nb::hasattr(obj, "__cuda_array_interface__")) return from_cuda_array_interface(obj, role, writable);
  return from_ndarray(obj, role, writable);
}

/// A CUDA stream from None (the legacy default stream), an int handle, a torch stream
/// (`.cuda_stream`), a cupy stream (`.ptr`) or an object with `__cuda_stream__`.
std::uintptr_t stream_handle(nb::handle s) {
  if (s.is_none()) return 0;
  nb::object handle;
  if (nb::isinstance<nb::int_>(s)) {
    handle = nb::borrow(s);
  } else if (nb::hasattr(s, "__cuda_stream__")) {
    handle = nb::cast<nb::tuple>(s.attr("__cuda_stream__")())[1];
  } else if (nb::hasattr(s, "cuda_stream")) {
    handle = s.attr("cuda_stream");
  } else if (nb::hasattr(s, "ptr")) {
    handle = s.attr("ptr");
  } else {
    throw nb::type_error(("stream must be None, an int handle, or a stream object with .cuda_stream (torch), .ptr (cupy) or "
                          "__cuda_stream__, not " + python_type_name(s))
                             .c_str());
  }
  if (!nb::isinstance<nb::int_>(handle) || nb::cast<std::int64_t>(handle) < 0) {
    throw nb::value_error("stream handle must be a non-negative int");
  }
  return nb::cast<std::uintptr_t>(handle);
}

// ---- the device -----------------------------------------------------------------------------

/// A GPU copy in flight: `cunvme.Transfer`. Keeps the array (and, through nanobind's
/// keep_alive, the device) alive until it is gone.
class transfer {
 public:
  transfer(std::unique_ptr<gpu_copy> copy, nb::object array, nb::ndarray<nb::ro> exported, std::string operation)
      : copy_(std::move(copy)), array_(std::move(array)), exported_(std::move(exported)), operation_(std::move(operation)) {}

  [[nodiscard]] bool ready() const { return copy_->ready(); }

  void wait() {
    cunvme::io_result r;
    {
      nb::gil_scoped_release release;
      r = copy_->wait();
    }
    check(r, operation_);
  }

 private:
  std::unique_ptr<gpu_copy> copy_;
  nb::object array_;
  nb::ndarray<nb::ro> exported_;
  std::string operation_;
};

class device {
 public:
  device(const std::string& uri, std::uint32_t nsid, double timeout_seconds, std::optional<bool> use_gpu) : nsid_(nsid) {
    if (!std::isfinite(timeout_seconds) || timeout_seconds <= 0 || timeout_seconds > 86400) {
      throw nb::value_error("timeout must be a number of seconds in (0, 86400]");
    }
    const auto timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(timeout_seconds));
    host::controller_options options;
    options.command_timeout = std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
    nb::gil_scoped_release release;
    gpu_reason_ = use_gpu == false ? "the device was opened with gpu=False" : gpu_unavailable_reason();
    if (use_gpu == true && !gpu_reason_.empty()) throw device_failure{"Open " + uri + " with gpu=True: " + gpu_reason_};
    if (gpu_reason_.empty()) {
      gpu_ = open_gpu_path(uri, nsid, timeout, options);
      ctrl_ = &gpu_->controller();
    } else {
      own_ = host::open(uri, options);
      ctrl_ = own_.get();
    }
    ns_ = ctrl_->namespace_by_id(nsid);
    const std::uint64_t block = ns_.block_bytes();
    // One command per chunk (at most MDTS, and NLB's 65536 blocks): a failing status names
    // exactly the blocks of the command that failed. At most 4 MiB of bounce memory.
    const std::uint64_t per_command = std::min<std::uint64_t>(ctrl_->max_transfer_bytes() / block, spec::rw_fields::max_blocks);
    chunk_blocks_ = std::max<std::uint64_t>(1, std::min<std::uint64_t>(per_command, (std::uint64_t{4} << 20) / block));
    qp_ = ctrl_->create_queue_pair(64);
    bounce_ = ctrl_->memory().allocate(static_cast<std::size_t>(chunk_blocks_ * block));
  }

  [[nodiscard]] std::uint64_t block_size() const { return ns_.block_bytes(); }
  [[nodiscard]] std::uint64_t blocks() const { return ns_.lba_count; }
  [[nodiscard]] std::uint32_t nsid() const { return nsid_; }
  [[nodiscard]] bool gpu() const { return gpu_ != nullptr; }
  [[nodiscard]] const std::string& gpu_unavailable() const { return gpu_reason_; }
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
    const std::shared_lock life(life_);
    (void)open();
    spec::status s;
    {
      nb::gil_scoped_release release;
      const std::lock_guard io(host_io_);
      s = qp_->flush(nsid_);
    }
    if (!spec::is_success(s)) throw nvme_failure{"Flush", s, 0, 0};
  }

  /// Waits for GPU copies still in flight, deletes the queues and shuts the controller down.
  void close() {
    nb::gil_scoped_release release;
    const std::unique_lock life(life_);
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
    if (lba > std::numeric_limits<std::uint64_t>::max() - (blocks - 1)) throw nb::value_error("lba + blocks runs past LBA 2^64 - 1");
    const array_bytes a = describe(array, role, !write);
    const auto need = times(blocks, block_size());
    if (!need || *need > a.bytes) {
      throw nb::value_error((std::string(role) + " holds " + std::to_string(a.bytes) + " bytes; " + std::to_string(blocks) + " blocks of " +
                             std::to_string(block_size()) + " bytes need " + (need ? std::to_string(*need) : std::string("more than 2^64")))
                                .c_str());
    }
    const std::uintptr_t handle = stream_handle(stream);
    const std::shared_lock life(life_);
    (void)open();
    if (!a.gpu) {
      nb::gil_scoped_release release;
      host_transfer(write, lba, blocks, a.data);
      return nb::none();
    }
    if (gpu_ == nullptr) throw device_failure{role + std::string(" is GPU memory, but this device has no GPU path: ") + gpu_reason_};
    // PRP entries are dword aligned (NVMe 2.0, 4.1.1): the copy's first byte must be too.
    if (reinterpret_cast<std::uintptr_t>(a.data) % 4 != 0) {
      throw nb::value_error((std::string(role) + " starts at a GPU address that is not a multiple of 4 bytes: NVMe data pointers are "
                                                 "dword aligned")
                                .c_str());
    }
    std::unique_ptr<gpu_copy> copy;
    {
      nb::gil_scoped_release release;
      copy = write ? gpu_->write(lba, blocks, a.data, a.bytes, handle) : gpu_->read(lba, blocks, a.data, a.bytes, handle);
    }
    transfer t(std::move(copy), nb::borrow(array), a.exported, operation);
    if (sync) {
      t.wait();
      return nb::none();
    }
    return nb::cast(std::move(t));
  }

  /// The host path: one command per chunk through the bounce buffer, on the calling thread.
  void host_transfer(bool write, std::uint64_t lba, std::uint64_t blocks, std::byte* data) {
    const std::lock_guard io(host_io_);
    const std::uint64_t block = block_size();
    for (std::uint64_t done = 0; done < blocks;) {
      const std::uint64_t n = std::min(blocks - done, chunk_blocks_);
      const auto bytes = static_cast<std::size_t>(n * block);
      std::byte* at = data + done * block;
      if (write) std::memcpy(bounce_.data(), at, bytes);
      const spec::status s = write ? qp_->write(nsid_, lba + done, n, bounce_) : qp_->read(nsid_, lba + done, n, bounce_);
      if (!spec::is_success(s)) throw nvme_failure{write ? "Write" : "Read", s, lba + done, n};
      if (!write) std::memcpy(at, bounce_.data(), bytes);
      done += n;
    }
  }

  std::uint32_t nsid_;
  std::string gpu_reason_;
  // Declared before what uses them, so destroyed after: the GPU path owns the controller
  // there is one, `own_` where there is not.
  std::unique_ptr<gpu_path> gpu_;
  std::unique_ptr<host::controller> own_;
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

  const nb::module_ e = nb::module_::import_("cunvme._errors");
  errors() = error_classes{e.attr("DeviceError"), e.attr("NvmeError"), e.attr("IoError")};
  nb::register_exception_translator(&translate);

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
                     "timeout=10.0, gpu=None): gpu=None opens it for GPU threads where CUDA finds a GPU, False never, True or "
                     "DeviceError.")
      .def(nb::init<const std::string&, std::uint32_t, double, std::optional<bool>>(), nb::arg("uri") = "emu", nb::arg("nsid") = 1,
           nb::arg("timeout") = 10.0, nb::arg("gpu").none() = nb::none())
      .def_prop_ro("block_size", &device::block_size, "Bytes per block in a caller's array (data, and metadata with extended LBAs).")
      .def_prop_ro("blocks", &device::blocks, "Blocks in the namespace (NSZE).")
      .def_prop_ro("nsid", &device::nsid)
      .def_prop_ro("name", &device::name, "The controller's name (the URI's device).")
      .def_prop_ro("gpu", &device::gpu, "Whether GPU arrays are taken (a CUDA GPU was found and gpu was not False).")
      .def_prop_ro("gpu_unavailable_reason", &device::gpu_unavailable, "Why there is no GPU path, or ''.")
      .def("info", &device::info, "Identify data: model, serial, firmware, MDTS and every namespace.")
      .def("read", &device::read, nb::arg("lba"), nb::arg("blocks"), nb::arg("out"), nb::arg("stream").none() = nb::none(),
           nb::arg("sync") = false, nb::keep_alive<0, 1>(),
           "Reads `blocks` blocks at `lba` into the first blocks * block_size bytes of `out` (C-contiguous, writable).\n\n"
           "A host array (numpy, bytearray, memoryview): the host path, done on return; returns None. A GPU array "
           "(__cuda_array_interface__ or DLPack): copy_n enqueued on `stream` (None, an int handle, a torch or cupy "
           "stream); returns a Transfer, or waits and returns None with sync=True. Raises ValueError/TypeError for a bad "
           "array, NvmeError for an NVMe status, DeviceError for a setup failure.")
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
