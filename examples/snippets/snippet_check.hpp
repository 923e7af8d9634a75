// What every snippet program shares: a check that reports what failed and counts it, and the
// exit status (0, or 1 after any failed check) with one closing line.
#pragma once

#include <cstdio>

namespace snippet {

inline int failures = 0;

/// Reports `what` on stderr and counts a failure unless `ok`.
inline void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "snippet check failed: %s\n", what);
    ++failures;
  }
}

/// The closing line and exit status of the snippet program `name`.
inline int finish(const char* name) {
  std::printf("%s snippets: %s\n", name, failures == 0 ? "all ran" : "FAILED");
  return failures == 0 ? 0 : 1;
}

}  // namespace snippet
