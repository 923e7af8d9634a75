// The translator from the extension's C++ errors to cunvme's Python exceptions.
#include "errors.hpp"

#include <cunvme/host/error.cuh>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <exception>
#include <string>

namespace nb = nanobind;
namespace host = cunvme::host;
namespace spec = cunvme::spec;

namespace cunvme_python {
namespace {

/// The exception classes of cunvme/_errors.py, looked up once at import. Never destroyed: a
/// static's destructor would drop its references after the interpreter has finalized.
struct error_classes {
  nb::object device_error, nvme_error, io_error, format_error;
};
error_classes& errors() {
  static error_classes* classes = new error_classes;
  return *classes;
}

/// A message as Python text. Messages may quote bytes from a file (a parse error shows what it
/// read): bytes that are not UTF-8 come out as \xNN escapes instead of failing the conversion,
/// which would replace the error the caller can catch with a UnicodeDecodeError.
nb::str text(const std::string& message) {
  PyObject* s = PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()), "backslashreplace");
  if (s == nullptr) throw nb::python_error();
  return nb::steal<nb::str>(s);
}

void raise_python(const nb::object& type, const std::string& message, nb::kwargs details) {
  nb::object e = type(text(message), **details);
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
    if (!f.cause.empty()) k["cause"] = f.cause;
    raise_python(errors().io_error, f.operation + ": " + cunvme::to_string(f.result) + (f.cause.empty() ? "" : " (" + f.cause + ")"), k);
  } catch (const host::error& e) {
    nb::kwargs k;
    k["operation"] = text(e.operation());
    k["device"] = text(e.device());
    if (e.status()) k["status"] = spec::name(*e.status());
    raise_python(errors().device_error, e.what(), k);
  } catch (const device_failure& f) {
    raise_python(errors().device_error, f.message, nb::kwargs());
  } catch (const format_failure& f) {
    raise_python(errors().format_error, f.message, nb::kwargs());
  }
}

}  // namespace

void register_errors() {
  const nb::module_ e = nb::module_::import_("cunvme._errors");
  errors() = error_classes{e.attr("DeviceError"), e.attr("NvmeError"), e.attr("IoError"), e.attr("FormatError")};
  nb::register_exception_translator(&translate);
}

void check(const cunvme::io_result& r, const std::string& operation, const std::string& cause) {
  if (r.ok()) return;
  if (r.error == cunvme::io_error::nvme_status) throw nvme_failure{operation, r.status, r.lba, r.blocks};
  throw io_failure{operation, r, cause};
}

}  // namespace cunvme_python
