#!/usr/bin/env bash
# Installs cunvme into a scratch prefix and builds three consumers against it the way users
# do: CMake find_package(cunvme) + cunvme::cunvme, pkg-config --cflags cunvme, and Meson's
# dependency('cunvme') with cunvme as a subproject.
set -euo pipefail
src=$1 build=$2
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

echo "== meson install into $work/root"
meson install -C "$build" --no-rebuild --quiet --destdir "$work/root"
prefix=$(meson introspect "$build" --buildoptions | python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"))')
root="$work/root$prefix"
test -f "$root/include/cunvme/cunvme.cuh"

echo "== CMake find_package(cunvme)"
mkdir -p "$work/cmake"
cat >"$work/cmake/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.18)
project(consumer CXX)
find_package(cunvme 0.1 CONFIG REQUIRED)
add_executable(consumer "$work/consumer.cpp")
target_link_libraries(consumer PRIVATE cunvme::cunvme)
CMAKE
cmake -S "$work/cmake" -B "$work/cmake/build" -DCMAKE_PREFIX_PATH="$root" >/dev/null
cmake --build "$work/cmake/build" >/dev/null
"$work/cmake/build/consumer"

echo "== pkg-config cunvme"
pcdir=$(dirname "$(find "$root" -name cunvme.pc | head -n1)")
cflags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --define-prefix --cflags cunvme)
c++ -std=c++20 $cflags "$work/consumer.cpp" -o "$work/pc_consumer"
"$work/pc_consumer"

echo "== Meson subproject dependency('cunvme')"
mkdir -p "$work/meson/subprojects"
ln -s "$src" "$work/meson/subprojects/cunvme"
cp "$work/consumer.cpp" "$work/meson/"
cat >"$work/meson/meson.build" <<'MESON'
project('consumer', 'cpp', default_options: ['cpp_std=c++20'])
executable('consumer', 'consumer.cpp', dependencies: dependency('cunvme'))
MESON
meson setup "$work/meson/build" "$work/meson" -Dcunvme:gpu=disabled >/dev/null
meson compile -C "$work/meson/build" >/dev/null
"$work/meson/build/consumer"
echo "all three consumers built and ran"
