// What the fuzz harnesses share: an oracle that aborts (libFuzzer then keeps the input) with
// the failed condition and where it is.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(c)                                                             \
  do {                                                                            \
    if (!(c)) {                                                                   \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c); \
      std::abort();                                                               \
    }                                                                             \
  } while (0)
