// What the URI tests of the host suite share: the emulator behind an opened controller, and
// whether opening a URI is refused with a message naming what was wrong.
#pragma once

#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/backend/emu_backend.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/open.cuh>

#include <doctest/doctest.h>

#include <memory>
#include <string>

namespace uri_test {

inline cunvme::emu::controller& emulator(std::unique_ptr<cunvme::host::controller>& c) {
  return dynamic_cast<cunvme::host::emu_backend&>(c->backend()).controller();
}

/// The message of the host::error `uri` is refused with ("" when it opens).
inline std::string refusal(const std::string& uri) {
  try {
    auto c = cunvme::host::open(uri);
  } catch (const cunvme::host::error& e) {
    return e.what();
  }
  return {};
}

/// Whether opening `uri` is refused with a host::error whose message holds every one of `parts`.
template <class... Parts>
bool refused_naming(const std::string& uri, const Parts&... parts) {
  const std::string what = refusal(uri);
  INFO(uri, " -> '", what, "'");
  return !what.empty() && ((what.find(parts) != std::string::npos) && ...);
}

}  // namespace uri_test
