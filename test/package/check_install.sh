#!/usr/bin/env bash
# Installs cunvme into a scratch prefix and builds three consumers against it the way users
# do: CMake find_package(cunvme) + cunvme::cunvme, pkg-config --cflags cunvme, and Meson's
# dependency('cunvme') with cunvme as a subproject. With "with-loader" (the build found
# nlohmann-json) each also builds a consumer of the loader's headers, and the installed
# pkg-config and CMake files must declare nlohmann-json: a consumer whose compiler happens to
# find it on its default path would build without that declaration, so it is checked itself.
set -euo pipefail
src=$1 build=$2 loader=${3:-without-loader}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cat >"$work/consumer.cpp" <<'CPP'
#include <cunvme/spec/registers.cuh>
#include <cunvme/spec/status.cuh>
int main() {
  constexpr cunvme::spec::cap_register cap{0x004018200f0107ffull};
  static_assert(cap.mqes() == 2047);
  return cunvme::spec::to_string(cunvme::spec::status::lba_out_of_range) == "LBA Out of Range (0/0x80)" ? 0 : 1;
}
CPP

cat >"$work/loader_consumer.cpp" <<'CPP'
#include <cunvme/loader/placement.cuh>
#include <cunvme/loader/safetensors.cuh>
int main() {
  // A 1000-byte file on 512-byte blocks from LBA 0: one extent of two blocks.
  const auto p = cunvme::loader::file_placement::contiguous(512, 0, 1000, 2);
  return p.extents().size() == 1 && p.extents()[0].blocks == 2 ? 0 : 1;
}
CPP
consumers=(consumer)
if [ "$loader" = with-loader ]; then consumers+=(loader_consumer); fi

echo "== meson install into $work/root"
meson install -C "$build" --no-rebuild --quiet --destdir "$work/root"
prefix=$(meson introspect "$build" --buildoptions | python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"))')
root="$work/root$prefix"
test -f "$root/include/cunvme/cunvme.cuh"
# The kernel module's ABI header, which host/backend/kmod_abi.cuh includes.
test -f "$root/include/cunvme/kmod/cunvme_ioctl.h"

echo "== CMake find_package(cunvme)"
mkdir -p "$work/cmake"
cat >"$work/cmake/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.18)
project(consumer CXX)
find_package(cunvme 0.1 CONFIG REQUIRED)
foreach(c ${consumers[*]})
  add_executable(\${c} "$work/\${c}.cpp")
  target_link_libraries(\${c} PRIVATE cunvme::cunvme)
endforeach()
if("$loader" STREQUAL "with-loader")
  get_target_property(links cunvme::cunvme INTERFACE_LINK_LIBRARIES)
  if(NOT "nlohmann_json::nlohmann_json" IN_LIST links)
    message(FATAL_ERROR "cunvme::cunvme does not bring nlohmann_json::nlohmann_json, which the loader headers need (links: \${links})")
  endif()
endif()
CMAKE
cmake -S "$work/cmake" -B "$work/cmake/build" -DCMAKE_PREFIX_PATH="$root" >/dev/null
cmake --build "$work/cmake/build" >/dev/null
for c in "${consumers[@]}"; do "$work/cmake/build/$c"; done

echo "== pkg-config cunvme"
pcdir=$(dirname "$(find "$root" -name cunvme.pc | head -n1)")
cflags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --define-prefix --cflags cunvme)
if [ "$loader" = with-loader ] && ! PKG_CONFIG_PATH="$pcdir" pkg-config --print-requires cunvme | grep -q '^nlohmann_json'; then
  echo "cunvme.pc does not require nlohmann_json, which the loader headers need:" >&2
  cat "$pcdir/cunvme.pc" >&2
  exit 1
fi
for c in "${consumers[@]}"; do
  c++ -std=c++20 $cflags "$work/$c.cpp" -o "$work/pc_$c"
  "$work/pc_$c"
done

echo "== Meson subproject dependency('cunvme')"
mkdir -p "$work/meson/subprojects"
ln -s "$src" "$work/meson/subprojects/cunvme"
cp "$work/consumer.cpp" "$work/loader_consumer.cpp" "$work/meson/"
cat >"$work/meson/meson.build" <<MESON
project('consumer', 'cpp', default_options: ['cpp_std=c++20'])
foreach c : '${consumers[*]}'.split()
  executable(c, c + '.cpp', dependencies: dependency('cunvme'))
endforeach
MESON
meson setup "$work/meson/build" "$work/meson" -Dcunvme:gpu=disabled >/dev/null
meson compile -C "$work/meson/build" >/dev/null
for c in "${consumers[@]}"; do "$work/meson/build/$c"; done
echo "all three consumers built and ran: ${consumers[*]}"
