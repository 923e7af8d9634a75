#!/usr/bin/env bash
# Boots a small Linux guest under QEMU (TCG) with QEMU's NVMe controller and runs static test
# programs in it against that controller, through sysfs (see ../shared/QEMU.md).
#
#   run_guest.sh --name NAME [--nvme-args 'ARGS'] [--disk-mb N] [--lba 512|4096] \
#                -- PROGRAM [ARGS...] [--- PROGRAM [ARGS...]]...
#
# In program arguments @BDF@ becomes the controller's PCI address and @URI@ "sysfs:<BDF>".
# The disk holds a known pattern: the 8-byte little-endian word at byte offset o is
# (o / 8) XOR 0x5a5a5a5a5a5a5a5a (cunvme::host::pattern_word).
# Exit 0 when every program exited 0, 1 otherwise, 77 (skipped) when QEMU, a guest kernel,
# busybox or cpio is missing.
set -euo pipefail

name=guest nvme_args="" disk_mb=64 lba=512
while [ $# -gt 0 ]; do
  case "$1" in
    --name) name=$2; shift 2 ;;
    --nvme-args) nvme_args=$2; shift 2 ;;
    --disk-mb) disk_mb=$2; shift 2 ;;
    --lba) lba=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "run_guest.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "run_guest.sh: no program given" >&2; exit 2; }

missing=()
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86_64)
kernel=$(ls -1 /boot/vmlinuz-* 2>/dev/null | sort -V | tail -n1 || true)
[ -n "$kernel" ] && [ -r "$kernel" ] || missing+=("a guest kernel (/boot/vmlinuz-*)")
# The initramfs has no libraries: busybox must be the static build (busybox-static).
busybox=/bin/busybox
if [ ! -x "$busybox" ] || ldd "$busybox" >/dev/null 2>&1; then missing+=("a static busybox"); fi
command -v cpio >/dev/null || missing+=(cpio)
if [ ${#missing[@]} -gt 0 ]; then
  echo "skipped: missing ${missing[*]} (install qemu-system-x86 linux-image-amd64 busybox-static cpio)"
  exit 77
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root"/{bin,sbin,proc,sys,dev,tmp}
cp "$busybox" "$root/bin/busybox"
ln -s busybox "$root/bin/sh"

# /init runs each program with its arguments; @BDF@/@URI@ expand in the guest.
{
  echo '#!/bin/sh'
  echo '/bin/busybox --install -s /bin'
  echo 'mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev'
  echo 'BDF=""'
  echo 'for d in /sys/bus/pci/devices/*; do [ "$(cat $d/class)" = "0x010802" ] && BDF=${d##*/}; done'
  echo 'echo "CUNVME-BDF $BDF"'
  # Locked pages must not be migrated under the controller's DMA; huge pages hold queues.
  echo 'echo 0 > /proc/sys/vm/compact_unevictable_allowed'
  echo 'echo 64 > /proc/sys/vm/nr_hugepages'
  programs=()
  line=""
  flush_line() {
    if [ -n "$line" ]; then echo "$line; echo \"CUNVME-RESULT $prog_name \$?\""; fi
  }
  prog_name=""
  first=1
  for arg in "$@"; do
    if [ "$arg" = "---" ]; then flush_line; line=""; first=1; continue; fi
    if [ $first -eq 1 ]; then
      prog_name=$(basename "$arg")
      cp "$arg" "$root/bin/$prog_name"
      programs+=("$prog_name")
      line="/bin/$prog_name"
      first=0
    else
      arg=${arg//@URI@/sysfs:\$BDF}
      arg=${arg//@BDF@/\$BDF}
      line="$line \"$arg\""
    fi
  done
  flush_line
  echo 'poweroff -f'
} > "$root/init"
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$work/initramfs.cpio.gz"

python3 - "$work/disk.img" "$disk_mb" <<'PY'
import sys
from array import array
path, mb = sys.argv[1], int(sys.argv[2])
words = mb * 1024 * 1024 // 8
chunk = 1 << 20
with open(path, "wb") as f:
    for start in range(0, words, chunk):
        n = min(chunk, words - start)
        a = array("Q", range(start, start + n))
        mask = 0x5a5a5a5a5a5a5a5a
        a = array("Q", (w ^ mask for w in a))
        f.write(a.tobytes())
PY

if [ "$lba" = 4096 ]; then
  nvme=(-device "nvme,id=n0,serial=deadbeef${nvme_args:+,$nvme_args}"
        -device nvme-ns,drive=nvm,bus=n0,nsid=1,logical_block_size=4096,physical_block_size=4096)
else
  nvme=(-device "nvme,serial=deadbeef,drive=nvm${nvme_args:+,$nvme_args}")
fi

echo "== $name: booting $(basename "$kernel") with QEMU's NVMe controller (${nvme_args:-default}, ${lba}-byte blocks)"
start=$(date +%s)
set +e
timeout 100 qemu-system-x86_64 -machine q35,accel=tcg -cpu max -smp 1 -m 512M -nodefaults -display none \
  -serial stdio -no-reboot -kernel "$kernel" -initrd "$work/initramfs.cpio.gz" \
  -append "console=ttyS0 panic=-1 quiet loglevel=3" \
  -drive file="$work/disk.img",if=none,id=nvm,format=raw "${nvme[@]}" 2>&1 | tee "$work/serial.log"
qemu_rc=${PIPESTATUS[0]}
set -e
echo "== $name: guest ran $(( $(date +%s) - start )) s, QEMU exit $qemu_rc"

[ $qemu_rc -eq 124 ] && { echo "FAIL: the guest did not power off within 100 s"; exit 1; }
grep -q "CUNVME-BDF 0000:" "$work/serial.log" || { echo "FAIL: the guest found no NVMe controller"; exit 1; }
status=0
for p in "${programs[@]}"; do
  if grep -q "CUNVME-RESULT $p 0" "$work/serial.log"; then
    echo "== $p passed"
  else
    echo "== $p FAILED ($(grep "CUNVME-RESULT $p " "$work/serial.log" || echo 'no result: it crashed or hung'))"
    status=1
  fi
done
exit $status
