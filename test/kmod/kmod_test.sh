#!/usr/bin/env bash
# The kmod suite's steps (test/kmod/meson.build):
#
#   kmod_test.sh build        KMOD_SRC OUT   build cunvme.ko with -Werror against the headers of
#                                            a guest kernel in /boot; check its vermagic
#   kmod_test.sh build-nvidia KMOD_SRC OUT   the same with nvidia_p2p (GPU pinning), against
#                                            NVIDIA's open kernel module sources: compile check
#                                            only (no nvidia.ko to link or load here)
#   kmod_test.sh guest KMOD_SRC OUT RUN_GUEST [run_guest.sh args...]
#                                            build, then boot that kernel under QEMU with the
#                                            module loaded and the controller bound to it
#   kmod_test.sh abi-c INCLUDE_DIR OUT C_FILE
#                                            build C_FILE (kmod_abi.c) as strict C11 user space
#                                            against INCLUDE_DIR, natively and for i386 where the
#                                            compiler has 32-bit headers: the ABI header
#                                            (<cunvme/kmod/cunvme_ioctl.h>) is plain C
#   kmod_test.sh build-exporter KMOD_SRC OUT EXPORTER_SRC
#                                            build the dma-buf test exporter (test/kmod/exporter)
#                                            with -Werror against the same headers
#   kmod_test.sh guest-dma-buf KMOD_SRC OUT RUN_GUEST EXPORTER_SRC PROGRAM [run_guest.sh args...]
#                                            build both modules, embed the exporter into a copy
#                                            of PROGRAM (kmod_dma_buf, ELF section
#                                            .cunvme_exporter_ko: run_guest.sh carries programs
#                                            only) and run it in the guest as "PROGRAM @BDF@"
#
# The kernel: the newest /boot/vmlinuz-KV that has headers in /lib/modules/KV/build (Debian's
# linux-image-amd64 + linux-headers-amd64 of one release; .ci/setup installs them).
# NVIDIA sources: $CUNVME_NVIDIA_SRC (a checkout of open-gpu-kernel-modules or an unpacked
# nvidia-open-kernel-source), else Debian's /usr/src/nvidia-open-kernel.tar.xz
# (nvidia-open-kernel-source, in contrib).
# Exit 77 (skipped) when kernel headers, make or a C compiler (or, for build-nvidia, NVIDIA's
# sources) are missing.
set -euo pipefail

usage() { echo "usage: kmod_test.sh build|build-nvidia|guest|build-exporter|guest-dma-buf KMOD_SRC OUT [ARGS...] | abi-c INCLUDE_DIR OUT C_FILE" >&2; exit 2; }
[ $# -ge 3 ] || usage
mode=$1 src=$2 out=$3
shift 3

# User space only: no kernel needed.
if [ "$mode" = abi-c ]; then
  [ $# -eq 1 ] || usage
  command -v gcc >/dev/null 2>&1 || { echo "skipped: missing gcc"; exit 77; }
  mkdir -p "$out"
  cflags=(-std=c11 -pedantic -Wall -Wextra -Werror -I "$src")
  gcc "${cflags[@]}" "$1" -o "$out/kmod_abi" && "$out/kmod_abi" || { echo "FAIL: $1 against $src (native)"; exit 1; }
  echo "== the ABI header builds as strict C11 user space ($(uname -m))"
  if echo '#include <linux/ioctl.h>' | gcc -m32 -x c -c - -o /dev/null 2>/dev/null; then
    gcc -m32 "${cflags[@]}" -c "$1" -o "$out/kmod_abi32.o" || { echo "FAIL: $1 against $src (i386)"; exit 1; }
    echo "== and for i386: the layout compat_ioctl hands the module is the same"
  else
    echo "== i386 not checked: the compiler has no 32-bit kernel headers (gcc-multilib)"
  fi
  exit 0
fi

kernel="" kdir=""
for k in $(printf '%s\n' /boot/vmlinuz-* | sort -rV); do
  kv=${k#/boot/vmlinuz-}
  if [ -e "$k" ] && [ -f "/lib/modules/$kv/build/Makefile" ]; then kernel=$k kdir=/lib/modules/$kv/build; break; fi
done
missing=()
[ -n "$kernel" ] || missing+=("a /boot/vmlinuz-KV with headers in /lib/modules/KV/build")
command -v make >/dev/null 2>&1 || missing+=(make)
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
if [ ${#missing[@]} -gt 0 ]; then
  what=$(printf '%s, ' "${missing[@]}")
  echo "skipped: missing ${what%, } (install linux-image-amd64 linux-headers-amd64 build-essential)"
  exit 77
fi

# Builds in $1, a copy made by kmod/'s own "make source-tree" (what DKMS builds from), so the
# source tree stays clean and that copy is proven to build on its own; make rebuilds what changed.
# The guests run side by side (meson.build) and each builds the module first: one make at a
# time in a directory, so that a guest starting while another builds waits and finds it built.
locked() {
  local dir=$1
  shift
  mkdir -p "$dir"
  ( flock 9 && "$@" ) 9>"$dir/.kmod_test.lock"
}

build() { locked "$1" build_unlocked "$@"; }
build_exporter() { locked "$2" build_exporter_unlocked "$@"; }

build_unlocked() {
  local dir=$1
  shift
  local log=$dir/build.log
  if ! make -s -C "$src" source-tree DEST="$(cd "$dir" && pwd)" >"$log" 2>&1; then
    cat "$log"
    echo "FAIL: make source-tree did not copy kmod/ and its ABI header"
    return 1
  fi
  if ! make -C "$dir" KDIR="$kdir" CUNVME_WERROR=1 "$@" >"$log" 2>&1; then
    cat "$log"
    echo "FAIL: cunvme.ko did not build against $kdir"
    return 1
  fi
  # -Werror makes compiler warnings errors; modpost's are checked here (the undefined
  # nvidia_p2p_* symbols of a compile check without NVIDIA_SYMVERS are the expected ones).
  if grep -v 'nvidia_p2p_[a-z_]*" \[.*\] undefined!' "$log" | grep -qi 'warning'; then
    cat "$log"
    echo "FAIL: warnings while building cunvme.ko"
    return 1
  fi
  local magic
  magic=$(modinfo -F vermagic "$dir/cunvme.ko" 2>/dev/null | cut -d' ' -f1 || true)
  if command -v modinfo >/dev/null 2>&1 && [ "$magic" != "${kernel#/boot/vmlinuz-}" ]; then
    echo "FAIL: cunvme.ko has vermagic '$magic', the kernel is ${kernel#/boot/vmlinuz-}"
    return 1
  fi
}

# Builds the test exporter from $1 in $2, with -Werror and no warnings.
build_exporter_unlocked() {
  local from=$1 dir=$2
  for f in Kbuild cunvme_test_exporter.c cunvme_test_exporter.h; do
    cmp -s "$from/$f" "$dir/$f" || cp "$from/$f" "$dir/$f"
  done
  local log=$dir/build.log
  if ! make -C "$kdir" M="$(cd "$dir" && pwd)" CUNVME_WERROR=1 modules >"$log" 2>&1; then
    cat "$log"
    echo "FAIL: cunvme_test_exporter.ko did not build against $kdir"
    return 1
  fi
  if grep -qi 'warning' "$log"; then
    cat "$log"
    echo "FAIL: warnings while building cunvme_test_exporter.ko"
    return 1
  fi
}

case "$mode" in
  build-exporter)
    [ $# -ge 1 ] || usage
    build_exporter "$1" "$out" || exit 1
    cat "$out/build.log"
    echo "== cunvme_test_exporter.ko built with -Werror for $(basename "$kernel") ($(stat -c %s "$out/cunvme_test_exporter.ko") bytes)"
    ;;
  guest-dma-buf)
    [ $# -ge 3 ] || usage
    run_guest=$1 exporter_src=$2 program=$3
    shift 3
    command -v objcopy >/dev/null 2>&1 || { echo "skipped: missing objcopy (binutils)"; exit 77; }
    build "$out" || exit 1
    build_exporter "$exporter_src" "$out/exporter" || exit 1
    # A directory of its own: the other dma-buf guest may be embedding at the same time.
    guest_dir=$(mktemp -d "$out/exporter/guest.XXXXXX")
    trap 'rm -rf "$guest_dir"' EXIT
    guest_program=$guest_dir/kmod_dma_buf
    objcopy --add-section .cunvme_exporter_ko="$out/exporter/cunvme_test_exporter.ko" \
      --set-section-flags .cunvme_exporter_ko=noload,readonly "$program" "$guest_program"
    "$run_guest" --kernel "$kernel" --module "$out/cunvme.ko" "$@" -- "$guest_program" @BDF@
    ;;
  build)
    build "$out" || exit 1
    cat "$out/build.log"
    echo "== cunvme.ko built with -Werror for $(basename "$kernel") ($(stat -c %s "$out/cunvme.ko") bytes)"
    ;;
  build-nvidia)
    nvsrc=${CUNVME_NVIDIA_SRC:-}
    if [ -n "$nvsrc" ] && [ ! -d "$nvsrc" ]; then
      echo "FAIL: CUNVME_NVIDIA_SRC=$nvsrc is not a directory"
      exit 1
    fi
    if [ -z "$nvsrc" ] && [ -f /usr/src/nvidia-open-kernel.tar.xz ]; then
      # Debian's nvidia-open-kernel-source: only its nv-p2p.h is needed.
      nvsrc=$out/nvidia-src
      if [ ! -f "$nvsrc/nvidia/nv-p2p.h" ] || [ /usr/src/nvidia-open-kernel.tar.xz -nt "$nvsrc/nvidia/nv-p2p.h" ]; then
        mkdir -p "$nvsrc"
        tar -xJf /usr/src/nvidia-open-kernel.tar.xz -C "$nvsrc" --strip-components=2 \
          modules/nvidia-open-kernel/nvidia/nv-p2p.h
      fi
    fi
    if [ -z "$nvsrc" ]; then
      echo "skipped: no NVIDIA open kernel module sources (set CUNVME_NVIDIA_SRC, or install Debian contrib's nvidia-open-kernel-source)"
      exit 77
    fi
    build "$out/module" NVIDIA_SRC="$(cd "$nvsrc" && pwd)" || exit 1
    cat "$out/module/build.log"
    if ! modinfo -F depends "$out/module/cunvme.ko" >/dev/null 2>&1 ||
       ! grep -q nvidia_p2p_get_pages "$out/module/cunvme.ko"; then
      echo "FAIL: the nvidia_p2p build does not reference nvidia_p2p_get_pages"
      exit 1
    fi
    echo "== cunvme.ko with nvidia_p2p compiles with -Werror against $nvsrc for $(basename "$kernel") (not loaded: no GPU driver here)"
    ;;
  guest)
    [ $# -ge 1 ] || usage
    run_guest=$1
    shift
    build "$out" || exit 1
    exec "$run_guest" --kernel "$kernel" --module "$out/cunvme.ko" "$@"
    ;;
  *) usage ;;
esac
