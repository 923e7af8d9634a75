// The checks behind arrays.hpp.
#include "arrays.hpp"

#include <nanobind/stl/string.h>

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <system_error>

namespace nb = nanobind;

namespace cunvme_python {
namespace {

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
  // The size: digits only, 1 to 64 bytes (a "<u-4" or "<fx" is no array cunvme can size).
  std::int64_t itemsize = 0;
  const char* first = typestr.data() + 2;
  const char* last = typestr.data() + typestr.size();
  const auto [end, ec] = std::from_chars(first, last, itemsize);
  if (ec != std::errc{} || end != last || *first == '-' || *first == '+' || itemsize < 1 || itemsize > 64) {
    throw nb::type_error((std::string(role) + " has element type '" + typestr + "': its size is not 1 to 64 bytes").c_str());
  }
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

}  // namespace

array_bytes describe(nb::handle obj, const char* role, bool writable) {
  if (nb::hasattr(obj, "__cuda_array_interface__")) return from_cuda_array_interface(obj, role, writable);
  return from_ndarray(obj, role, writable);
}

/// cupy's Stream and ExternalStream: their `.ptr` is a cudaStream_t (a cupy Event's or
/// MemoryPointer's `.ptr` is something else, and must not be launched on).
static bool is_cupy_stream(nb::handle s) {
  const nb::handle type = s.type();
  const std::string module = nb::hasattr(type, "__module__") ? nb::cast<std::string>(type.attr("__module__")) : std::string();
  const std::string name = nb::cast<std::string>(type.attr("__name__"));
  return module.rfind("cupy", 0) == 0 && (name == "Stream" || name == "ExternalStream");
}

std::uintptr_t stream_handle(nb::handle s) {
  if (s.is_none()) return 0;
  nb::object handle;
  if (nb::isinstance<nb::int_>(s)) {
    handle = nb::borrow(s);
  } else if (nb::hasattr(s, "__cuda_stream__")) {
    handle = nb::cast<nb::tuple>(s.attr("__cuda_stream__")())[1];
  } else if (nb::hasattr(s, "cuda_stream")) {
    handle = s.attr("cuda_stream");
  } else if (nb::hasattr(s, "ptr") && is_cupy_stream(s)) {
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

}  // namespace cunvme_python
