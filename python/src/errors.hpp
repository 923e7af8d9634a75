// The extension's errors: C++ types its code throws, which the translator registered at import
// turns into cunvme's Python exceptions (cunvme/_errors.py). host::error becomes DeviceError.
#pragma once

#include <cunvme/io/io_result.cuh>
#include <cunvme/spec/status.cuh>

#include <cstdint>
#include <string>

namespace cunvme_python {

/// A command completed with an NVMe error status: `cunvme.NvmeError`.
struct nvme_failure {
  std::string operation;
  cunvme::spec::status status;
  std::uint64_t lba;
  std::uint64_t blocks;
};

/// An I/O outcome that is no NVMe status (a timeout, a request the readers refuse): `cunvme.IoError`.
struct io_failure {
  std::string operation;
  cunvme::io_result result;
  std::string cause;  ///< what the controller's backend saw that may explain a timeout, or empty
};

/// Setup refused by the extension itself (a closed device, no GPU path): `cunvme.DeviceError`.
struct device_failure {
  std::string message;
};

/// A file's format or placement refused by the loader: `cunvme.FormatError` (a ValueError).
struct format_failure {
  std::string message;
};

/// Looks up cunvme._errors' classes and registers the translator. Once, at import.
void register_errors();

/// Throws the error for a failed `io_result` (nothing for success).
void check(const cunvme::io_result& r, const std::string& operation, const std::string& cause = {});

}  // namespace cunvme_python
