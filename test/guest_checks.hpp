// What the programs that run inside the QEMU guests share (static builds, no doctest): named
// checks and cases printed as "PASS name" / "FAIL name: why" lines the harness reads, a
// summary line, errno names, and sysfs reads and writes.
#pragma once

#include <cerrno>
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>

namespace test {

/// A failed expectation inside a case, with why.
struct failure {
  std::string why;
};

inline void expect(bool condition, const std::string& why) {
  if (!condition) throw failure{why};
}

/// One program's checks and cases, counted and printed as they finish.
struct tally {
  int passed = 0, failed = 0;

  void check(bool ok, const std::string& name, const std::string& why = "") {
    if (ok) {
      std::printf("PASS %s\n", name.c_str());
      ++passed;
    } else {
      std::printf("FAIL %s%s%s\n", name.c_str(), why.empty() ? "" : ": ", why.c_str());
      ++failed;
    }
    std::fflush(stdout);
  }

  /// Runs case `name`: it passes unless it throws (a `failure` or any exception, whose
  /// message is the reason).
  template <class Case>
  void run(const std::string& name, Case&& body) {
    try {
      body();
      check(true, name);
    } catch (const failure& f) {
      check(false, name, f.why);
    } catch (const std::exception& e) {
      check(false, name, e.what());
    }
  }

  /// Prints "`program`: N passed, M failed" and returns the exit status: 0 when all passed.
  [[nodiscard]] int summary(const char* program) const {
    std::printf("%s: %d passed, %d failed\n", program, passed, failed);
    return failed == 0 ? 0 : 1;
  }
};

/// The errno's name (the ones the guest programs expect), or its number.
inline std::string errno_name(int e) {
  switch (e) {
    case 0: return "success";
    case EACCES: return "EACCES";
    case EAGAIN: return "EAGAIN";
    case EBADF: return "EBADF";
    case EBUSY: return "EBUSY";
    case EFAULT: return "EFAULT";
    case EINVAL: return "EINVAL";
    case EIO: return "EIO";
    case ENODEV: return "ENODEV";
    case ENOENT: return "ENOENT";
    case ENOLINK: return "ENOLINK";
    case ENOMEM: return "ENOMEM";
    case ENOTTY: return "ENOTTY";
    case EOPNOTSUPP: return "EOPNOTSUPP";
    case EOVERFLOW: return "EOVERFLOW";
    case EPERM: return "EPERM";
    case ERANGE: return "ERANGE";
    case E2BIG: return "E2BIG";
    default: return "errno " + std::to_string(e);
  }
}

/// Checks that `rc`, from a call that sets errno, meant `want` (0: success).
inline void expect_errno(tally& t, long rc, int want, const std::string& name) {
  const int got = rc >= 0 ? 0 : errno;
  t.check(got == want, name + " -> " + errno_name(want), "got " + errno_name(got));
}

/// A number from a sysfs file, or -1 when it cannot be read.
inline long read_number(const std::string& path) {
  std::ifstream in(path);
  long v = -1;
  in >> v;
  return in ? v : -1;
}

inline bool write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  return static_cast<bool>(out);
}

}  // namespace test
