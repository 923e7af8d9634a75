#!/usr/bin/env bash
# Boots a small Linux guest under QEMU (TCG) with QEMU's emulated NVMe controller and runs
# static test programs in it against that controller, through sysfs (see shared/QEMU.md).
#
#   run_guest.sh --name NAME [--qemu-device-args 'ARGS'] [--disk-mb N] [--lba 512|4096] [--ns-args 'ARGS'] \
#                [--kernel VMLINUZ] [--module cunvme.ko [--module-args 'ARGS']] [--iommu] [--vfio] \
#                [--check-image CHECKER [--check-args 'ARGS']] [--smp N] [--disk-image IMAGE] [--guest-file FILE]... \
#                -- PROGRAM [ARGS...] [--- PROGRAM [ARGS...]]...
#   run_guest.sh --check-barriers [--kernel VMLINUZ]
#
# --qemu-device-args  appended to the '-device nvme,...' option, e.g. 'cmb_size_mb=16'
#                     (--nvme-args is the same option under its old name)
# --disk-mb N         size of the namespace's disk image in MiB (default 64)
# --disk-image IMAGE  a copy of IMAGE is the namespace's disk instead of the pattern (its size,
#                     a multiple of the block size, replaces --disk-mb): e.g. an ext4 image
# --guest-file FILE   FILE is in the guest as /files/<its basename> (repeatable): input for the
#                     programs, e.g. an extent map
# --lba 512|4096      logical block size (4096 puts the namespace on an nvme-ns device)
# --ns-args ARGS      appended to the namespace's '-device nvme-ns,...' option (the namespace is
#                     then an nvme-ns device at either block size), e.g. 'ms=8,mset=1' (8 bytes of
#                     metadata per block, extended LBAs) or 'ms=8,mset=0' (separate metadata). QEMU
#                     keeps metadata after the data in the disk image (disk-mb then holds both).
# --kernel VMLINUZ    the guest kernel (default: the newest /boot/vmlinuz-*)
# --module KO         the cunvme kernel module (kmod/), built for that kernel: before the
#                     programs the guest insmods it (with --module-args), binds the controller
#                     to it through driver_override (or, when --module-args has bdf=@BDF@,
#                     checks that loading bound it) and waits for /dev/cunvme/<BDF>; @URI@ is
#                     then "kmod:<BDF>". After the programs it checks that the module's
#                     pinned-page counter is 0, rmmods it and fails on kernel warnings in
#                     dmesg. Both steps report as programs named "insmod" and "rmmod".
# --iommu             an Intel IOMMU in the guest (intel_iommu=on): DMA addresses are IOVAs,
#                     so only the kmod: and vfio: paths work (sysfs: needs physical addresses)
# --vfio              --iommu, and the controller bound to vfio-pci: the guest insmods vfio,
#                     vfio_iommu_type1, vfio-pci and their dependencies (from the guest kernel's
#                     /lib/modules/KV, as modules.dep orders them), binds the controller through
#                     driver_override + drivers_probe and checks /dev/vfio/<group>; @URI@ is then
#                     "vfio:<BDF>". After the programs it fails on IOMMU (DMAR) faults, unbinds the
#                     controller and fails on kernel warnings. Both steps report as programs named
#                     "vfio-bind" and "vfio-unbind". Not with --module.
# --check-image CHECKER  after the guest powered off, runs 'CHECKER DISK_IMAGE ARGS...' on the
#                     host (ARGS from --check-args, split at spaces) and fails unless it exits 0:
#                     what the programs wrote, checked in the image itself (check_image.py).
# --smp N             guest CPUs (default 1; 1..4): with 2, threads of a program run at once,
#                     not only interleaved.
# --check-barriers    no programs: boots the kernel alone with the CPU options every guest gets
#                     and fails unless QEMU translated the guest's memory barriers into host ones
#                     (TCG's op log holds 'mb' ops). See qemu_cpu_args for why that can fail.
#
# A program written !PROGRAM is expected to fail: it passes when it exits 1 (an error it
# reported), and fails when it exits 0 or otherwise (a crash).
#
# What the programs see in the guest (Linux, busybox, root, no NVMe driver bound):
# - the controller is unbound; its BAR0 is /sys/bus/pci/devices/<BDF>/resource0. Bus mastering
#   and interrupt masking are left to the programs.
# - an argument containing @BDF@ gets the controller's PCI address (e.g. 0000:00:04.0) there,
#   @URI@ gets "sysfs:<BDF>" ("kmod:<BDF>" with --module, "vfio:<BDF>" with --vfio).
# - 64 huge pages of 2 MiB are reserved (MAP_HUGETLB), compact_unevictable_allowed is 0, and
#   /proc/self/pagemap gives physical (= bus) addresses: the guest has no IOMMU.
# - the disk (unless --disk-image) holds a known pattern: the 8-byte little-endian word at byte offset o is
#   (o / 8) XOR 0x5a5a5a5a5a5a5a5a (cunvme::host::pattern_word).
# - stdout and stderr both go to the serial console, which this script copies to its stdout.
#
# Serial protocol, one line each:  CUNVME-BDF <bdf>|none   CUNVME-HUGEPAGES <n>
#   CUNVME-RUN <program> [args...]   then   CUNVME-RESULT <program> <exit code>
# (<program> is the basename; 128+N for a program killed by signal N), then the guest powers off.
#
# Exit 0 when every program printed "CUNVME-RESULT <program> 0", 1 when one failed or the guest
# timed out, panicked or found no controller, 2 for bad usage, 77 (meson's "skipped") when QEMU,
# a guest kernel, a static busybox or cpio is missing. CUNVME_QEMU_TIMEOUT (seconds, default 100)
# bounds the guest's run; CUNVME_QEMU_KEEP=1 keeps the temp dir for a look.
set -euo pipefail

usage() {
  echo "usage: run_guest.sh --name NAME [--qemu-device-args 'ARGS'] [--disk-mb N] [--lba 512|4096]" \
       "[--kernel VMLINUZ] [--module KO [--module-args 'ARGS']] [--iommu] [--vfio] [--check-image CHECKER [--check-args 'ARGS']] [--smp N] [--disk-image IMAGE] [--guest-file FILE]..." \
       "-- PROGRAM [ARGS...] [--- PROGRAM [ARGS...]]..." >&2
  exit 2
}

name=guest device_args="" ns_args="" disk_mb=64 lba=512 kernel="" module="" module_args="" iommu="" vfio="" check_image="" check_args="" smp=1
check_barriers="" disk_image="" guest_files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --name) [ $# -ge 2 ] || usage; name=$2; shift 2 ;;
    --qemu-device-args|--nvme-args) [ $# -ge 2 ] || usage; device_args=$2; shift 2 ;;
    --disk-mb) [ $# -ge 2 ] || usage; disk_mb=$2; shift 2 ;;
    --lba) [ $# -ge 2 ] || usage; lba=$2; shift 2 ;;
    --ns-args) [ $# -ge 2 ] || usage; ns_args=$2; shift 2 ;;
    --kernel) [ $# -ge 2 ] || usage; kernel=$2; shift 2 ;;
    --module) [ $# -ge 2 ] || usage; module=$2; shift 2 ;;
    --module-args) [ $# -ge 2 ] || usage; module_args=$2; shift 2 ;;
    --iommu) iommu=1; shift ;;
    --vfio) vfio=1; iommu=1; shift ;;
    --check-image) [ $# -ge 2 ] || usage; check_image=$2; shift 2 ;;
    --check-args) [ $# -ge 2 ] || usage; check_args=$2; shift 2 ;;
    --smp) [ $# -ge 2 ] || usage; smp=$2; shift 2 ;;
    --check-barriers) check_barriers=1; shift ;;
    --disk-image) [ $# -ge 2 ] || usage; disk_image=$2; shift 2 ;;
    --guest-file) [ $# -ge 2 ] || usage; guest_files+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "run_guest.sh: unknown option '$1'" >&2; usage ;;
  esac
done
[ $# -gt 0 ] || [ -n "$check_barriers" ] || { echo "run_guest.sh: no program given" >&2; usage; }
[[ $disk_mb =~ ^[1-9][0-9]*$ ]] || { echo "run_guest.sh: --disk-mb needs a positive number" >&2; exit 2; }
[ "$lba" = 512 ] || [ "$lba" = 4096 ] || { echo "run_guest.sh: --lba is 512 or 4096" >&2; exit 2; }
[[ $ns_args =~ ^[A-Za-z0-9_=,]*$ ]] || { echo "run_guest.sh: --ns-args has odd characters" >&2; exit 2; }
timeout_s=${CUNVME_QEMU_TIMEOUT:-100}
if [ -n "$check_image" ] && [ ! -x "$check_image" ]; then
  echo "run_guest.sh: --check-image '$check_image' is not an executable file" >&2; exit 2
fi
if [ -n "$disk_image" ]; then
  [ -f "$disk_image" ] || { echo "run_guest.sh: --disk-image '$disk_image' not found" >&2; exit 2; }
  image_bytes=$(stat -c %s "$disk_image")
  if [ "$image_bytes" -eq 0 ] || [ $((image_bytes % lba)) -ne 0 ]; then
    echo "run_guest.sh: --disk-image is $image_bytes bytes, not a positive multiple of the $lba-byte block" >&2; exit 2
  fi
fi
for f in "${guest_files[@]}"; do
  [ -f "$f" ] || { echo "run_guest.sh: --guest-file '$f' not found" >&2; exit 2; }
  [[ $(basename "$f") =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "run_guest.sh: --guest-file '$f' has odd characters in its name" >&2; exit 2; }
done
[[ $smp =~ ^[1-4]$ ]] || { echo "run_guest.sh: --smp takes 1 to 4" >&2; exit 2; }
[[ $check_args =~ ^[A-Za-z0-9_=,.:/\ -]*$ ]] || { echo "run_guest.sh: --check-args has odd characters" >&2; exit 2; }
if [ -n "$module" ] && [ -n "$vfio" ]; then
  echo "run_guest.sh: --module and --vfio both want the controller; pass one" >&2; exit 2
fi
if [ -n "$module" ]; then
  [ -f "$module" ] || { echo "run_guest.sh: module '$module' not found" >&2; exit 2; }
  [[ $module_args =~ ^[A-Za-z0-9_=,.:@\ -]*$ ]] || { echo "run_guest.sh: --module-args has odd characters" >&2; exit 2; }
fi

# --- What this needs on the host; missing pieces skip the test (77) -----------------------
missing=()
command -v qemu-system-x86_64 >/dev/null 2>&1 || missing+=(qemu-system-x86_64)
[ -n "$kernel" ] || kernel=$(printf '%s\n' /boot/vmlinuz-* | sort -V | tail -n1)   # the newest
if [ ! -e "$kernel" ]; then
  missing+=("a guest kernel /boot/vmlinuz-*")
elif [ ! -r "$kernel" ]; then
  missing+=("a readable guest kernel ($kernel is not readable)")
fi
# The initramfs holds no shared libraries: busybox must be the static build.
busybox=""
for b in /bin/busybox /usr/bin/busybox "$(command -v busybox 2>/dev/null || true)"; do
  if [ -n "$b" ] && [ -x "$b" ] && ! ldd "$b" >/dev/null 2>&1; then busybox=$b; break; fi
done
[ -n "$busybox" ] || missing+=("a static busybox")
command -v cpio >/dev/null 2>&1 || missing+=(cpio)
if [ -n "$module" ] && [ -e "$kernel" ] && command -v modinfo >/dev/null 2>&1; then
  # A module loads only into the kernel it was built for.
  kv=$(basename "$kernel"); kv=${kv#vmlinuz-}
  magic=$(modinfo -F vermagic "$module" 2>/dev/null | cut -d' ' -f1)
  if [ "$magic" != "$kv" ]; then
    echo "FAIL: $module was built for kernel '${magic:-?}', the guest runs $kv (pass --kernel)"
    exit 1
  fi
fi
# --vfio: the guest kernel's VFIO modules, dependencies first (modules.dep lists each module's
# dependencies, transitively; a dependency's own line orders those among themselves).
vfio_modules=()   # paths under /lib/modules/KV, in load order
if [ -n "$vfio" ] && [ -e "$kernel" ]; then
  kv=$(basename "$kernel"); kv=${kv#vmlinuz-}
  moddir=/lib/modules/$kv
  add_module() {
    local m=$1 d seen
    for seen in "${vfio_modules[@]}"; do [ "$seen" = "$m" ] && return 0; done
    # shellcheck disable=SC2013 # one module path per word
    for d in $(awk -F: -v m="$m" '$1 == m { print $2 }' "$moddir/modules.dep"); do add_module "$d"; done
    vfio_modules+=("$m")
  }
  if [ ! -f "$moddir/modules.dep" ]; then
    missing+=("the guest kernel's modules ($moddir/modules.dep)")
  else
    for want in vfio vfio_iommu_type1 vfio-pci; do
      m=$(grep -oE "^([^:]*/)?$want\.ko(\.(xz|zst|gz))?:" "$moddir/modules.dep" | head -n1 | tr -d :)
      if [ -z "$m" ]; then missing+=("$want.ko in $moddir"); continue; fi
      add_module "$m"
    done
  fi
fi
if [ ${#missing[@]} -gt 0 ]; then
  what=$(printf '%s, ' "${missing[@]}")
  echo "skipped: missing ${what%, } (install qemu-system-x86 linux-image-amd64 busybox-static cpio)"
  exit 77
fi

# The guest's CPUs. Multi-threaded TCG with at least two possible CPUs, whatever --smp says:
# QEMU before 8.1 translates a guest's fences and locked instructions into host barriers and
# atomics only when the machine may have more than one CPU (CF_PARALLEL), although the NVMe
# controller's emulation runs on another host thread beside the vCPU. With one possible CPU a
# guest's store to a shadow doorbell and its load of EventIdx reorder on the host (x86 lets a
# load pass an earlier store), the controller's mirror-image check misses the store too, and
# the queue stalls with both sides waiting (CI saw it: 'qemu cpu readers vfio', 'qemu kmod cpu
# readers', doorbell::shadow). A real CPU runs the same code with its fences honoured. The
# hot-pluggable second CPU stays offline; --smp sets the CPUs the guest runs.
qemu_cpu_args() {
  local max=$(( smp > 2 ? smp : 2 ))
  printf '%s\n' -accel tcg,thread=multi -cpu max -smp "$smp,maxcpus=$max"
}
mapfile -t cpu_args < <(qemu_cpu_args)

if [ -n "$check_barriers" ]; then
  log=$(mktemp "${TMPDIR:-/tmp}/cunvme-tcg-ops.XXXXXX")
  trap 'rm -f "$log"' EXIT
  # No initramfs: the kernel runs its boot (full of barriers) and panics without a root, and
  # -no-reboot ends QEMU there. TCG logs each translated block's ops.
  timeout -k 5 60 qemu-system-x86_64 -machine q35 "${cpu_args[@]}" -m 256M -nodefaults -display none \
    -serial none -no-reboot -kernel "$kernel" -append "panic=-1" -d op -D "$log" </dev/null >/dev/null 2>&1 || true
  ops=$(grep -c '^ *mb ' "$log" || true)
  blocks=$(grep -c '^OP:' "$log" || true)
  echo "== check-barriers: $(basename "$kernel") with ${cpu_args[*]}: $blocks blocks translated, $ops memory-barrier ops"
  if [ "${blocks:-0}" -lt 1000 ]; then echo "FAIL: the guest kernel did not run far enough to tell"; exit 1; fi
  if [ "${ops:-0}" -lt 1 ]; then
    echo "FAIL: QEMU dropped the guest's memory barriers (TCG not in parallel mode): guest/controller races such as the shadow doorbell's would not be the library's"
    exit 1
  fi
  echo "PASS: the guest's memory barriers reach the host"
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/cunvme-qemu.XXXXXX")
if [ -n "${CUNVME_QEMU_KEEP:-}" ]; then
  trap 'echo "== kept $work (initramfs root, init, disk.img, serial.log)"' EXIT
else
  trap 'rm -rf "$work"' EXIT
fi
root=$work/root
mkdir -p "$root"/{bin,sbin,proc,sys,dev,tmp,files}
for f in "${guest_files[@]}"; do cp "$f" "$root/files/"; done

# --- initramfs: busybox, /init, the programs -------------------------------------------------
# Quotes a word for sh; @BDF@ and @URI@ then become references to the guest's $BDF.
scheme=sysfs
[ -n "$module" ] && scheme=kmod
[ -n "$vfio" ] && scheme=vfio
sh_word() {
  local q=${1//\'/\'\\\'\'}
  q=${q//@BDF@/\'\"\$BDF\"\'}
  q=${q//@URI@/\'\"$scheme:\$BDF\"\'}
  printf "'%s'" "$q"
}

programs=()   # basenames, in run order
commands=()   # one sh command line each
cmd="" prog=""
add_program() { [ -n "$cmd" ] && { programs+=("$prog"); commands+=("$cmd"); }; cmd=""; prog=""; }
for arg in "$@"; do
  if [ "$arg" = "---" ]; then add_program; continue; fi
  if [ -z "$cmd" ]; then
    expect_error=""
    case "$arg" in '!'*) expect_error=1; arg=${arg#!} ;; esac
    [ -f "$arg" ] || { echo "run_guest.sh: program '$arg' not found" >&2; exit 2; }
    if ldd "$arg" >/dev/null 2>&1; then
      echo "FAIL: $arg is dynamically linked; the guest has no libraries (link it with -static)"
      exit 1
    fi
    prog=$(basename "$arg")
    case "$prog" in busybox|sh|init) echo "run_guest.sh: a program may not be named $prog" >&2; exit 2 ;; esac
    cp "$arg" "$root/bin/$prog"
    chmod 755 "$root/bin/$prog"
    cmd="/bin/$prog"
    [ -z "$expect_error" ] || cmd="cunvme_expect_error $cmd"
  else
    cmd="$cmd $(sh_word "$arg")"
  fi
done
add_program
[ ${#programs[@]} -gt 0 ] || { echo "run_guest.sh: no program given" >&2; usage; }
if [ -n "$module" ]; then
  mkdir -p "$root/lib"
  cp "$module" "$root/lib/cunvme.ko"
  # Load and bind before the programs, unload after them: two more entries in the verdict.
  programs=(insmod "${programs[@]}" rmmod)
  commands=("cunvme_load $module_args" "${commands[@]}" cunvme_unload)
fi
vfio_names=()   # the modules' file names in the initramfs, in load order
if [ -n "$vfio" ]; then
  mkdir -p "$root/lib/vfio"
  # busybox insmod takes plain .ko files: compressed modules are unpacked here.
  for m in "${vfio_modules[@]}"; do
    base=$(basename "$m"); base=${base%.xz}; base=${base%.zst}; base=${base%.gz}
    case "$m" in
      *.xz) xz -dc "$moddir/$m" > "$root/lib/vfio/$base" ;;
      *.zst) zstd -qdc "$moddir/$m" > "$root/lib/vfio/$base" ;;
      *.gz) gzip -dc "$moddir/$m" > "$root/lib/vfio/$base" ;;
      *) cp "$moddir/$m" "$root/lib/vfio/$base" ;;
    esac
    vfio_names+=("$base")
  done
  programs=(vfio-bind "${programs[@]}" vfio-unbind)
  commands=(cunvme_vfio_bind "${commands[@]}" cunvme_vfio_unbind)
fi

cp "$busybox" "$root/bin/busybox"
for applet in sh $("$busybox" --list); do
  [ -e "$root/bin/$applet" ] || [ -L "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
done

{
  cat <<'EOF'
#!/bin/sh
export PATH=/bin:/sbin HOME=/ TERM=linux
mount -t devtmpfs dev /dev 2>/dev/null
exec </dev/console >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sys /sys
BDF=""
for d in /sys/bus/pci/devices/*; do
  if [ "$(cat "$d/class" 2>/dev/null)" = "0x010802" ]; then BDF=${d##*/}; break; fi
done
echo "CUNVME-BDF ${BDF:-none}"
# Pages under the controller's DMA must not move; queues and buffers may use 2 MiB pages.
echo 0 > /proc/sys/vm/compact_unevictable_allowed
echo 64 > /proc/sys/vm/nr_hugepages
echo "CUNVME-HUGEPAGES $(cat /proc/sys/vm/nr_hugepages)"
# The cunvme module (--module): load, bind the controller through driver_override, wait for
# its node; unload after the programs, with nothing left pinned.
cunvme_load() {
  args=$(echo "$*" | sed "s/@BDF@/$BDF/g")
  # shellcheck disable=SC2086 # one word per module parameter
  insmod /lib/cunvme.ko $args || return 1
  case " $args" in
    *" bdf="*) [ -e "/sys/bus/pci/drivers/cunvme/$BDF" ] || { echo "bdf= did not bind $BDF at load"; return 2; } ;;
    *) echo cunvme > "/sys/bus/pci/devices/$BDF/driver_override" || return 2
       echo "$BDF" > /sys/bus/pci/drivers/cunvme/bind || return 3 ;;
  esac
  for i in 1 2 3 4 5 6 7 8 9 10; do [ -c "/dev/cunvme/$BDF" ] && return 0; sleep 0.2; done
  echo "no /dev/cunvme/$BDF after binding"; return 4
}
cunvme_unload() {
  pinned=$(cat /sys/bus/pci/drivers/cunvme/pinned_pages)
  echo "cunvme pinned_pages after the programs: $pinned"
  [ "$pinned" = 0 ] || return 1
  rmmod cunvme || return 2
  [ ! -e "/dev/cunvme/$BDF" ] || { echo "/dev/cunvme/$BDF still there after rmmod"; return 3; }
  [ ! -e "/sys/bus/pci/devices/$BDF/driver" ] || return 4
  # The console shows errors only (loglevel=3): look for kernel warnings in the log itself.
  dmesg | grep -i cunvme
  if dmesg | grep -E "WARNING:|BUG:|Call Trace|general protection"; then return 5; fi
}
# A program given as !PROGRAM must fail cleanly: exit 1 (an error it reported), not 0, not a signal.
cunvme_expect_error() {
  "$@"
  rc=$?
  [ "$rc" = 1 ] && { echo "(exit 1: refused, as expected)"; return 0; }
  echo "expected exit 1 (a reported error), got $rc"; return 1
}
# --vfio: load VFIO, hand the controller to vfio-pci, wait for its group's node; after the
# programs, no IOMMU faults (the controller reached only what was mapped), unbind cleanly.
cunvme_vfio_bind() {
  for m in $VFIO_MODULES; do insmod "/lib/vfio/$m" || { echo "insmod $m failed"; return 1; }; done
  [ -e "/sys/bus/pci/devices/$BDF/iommu_group" ] || { echo "$BDF has no IOMMU group (intel_iommu=on?)"; return 2; }
  echo vfio-pci > "/sys/bus/pci/devices/$BDF/driver_override" || return 3
  echo "$BDF" > /sys/bus/pci/drivers_probe || return 4
  driver=$(readlink "/sys/bus/pci/devices/$BDF/driver")
  [ "${driver##*/}" = vfio-pci ] || { echo "$BDF is bound to '${driver##*/}', not vfio-pci"; return 5; }
  group=$(readlink "/sys/bus/pci/devices/$BDF/iommu_group"); group=${group##*/}
  echo "vfio: $BDF in IOMMU group $group with:" $(ls "/sys/kernel/iommu_groups/$group/devices")
  for i in 1 2 3 4 5 6 7 8 9 10; do [ -c "/dev/vfio/$group" ] && [ -c /dev/vfio/vfio ] && return 0; sleep 0.2; done
  echo "no /dev/vfio/$group or /dev/vfio/vfio after binding"; return 6
}
cunvme_vfio_unbind() {
  if dmesg | grep -E "DMAR: .*fault|DMAR: \[DMA (Read|Write)"; then echo "IOMMU faults (above)"; return 1; fi
  echo "$BDF" > /sys/bus/pci/drivers/vfio-pci/unbind || return 2
  [ ! -e "/sys/bus/pci/devices/$BDF/driver" ] || return 3
  if dmesg | grep -E "WARNING:|BUG:|Call Trace|general protection"; then return 4; fi
}
if [ -n "$BDF" ]; then
EOF
  [ ${#vfio_names[@]} -eq 0 ] || printf '  VFIO_MODULES="%s"\n' "${vfio_names[*]}"
  for i in "${!programs[@]}"; do
    printf '  echo CUNVME-RUN %s\n' "${commands[$i]#/bin/}"
    printf '  %s\n' "${commands[$i]}"
    printf '  echo "CUNVME-RESULT %s $?"\n' "${programs[$i]}"
  done
  cat <<'EOF'
fi
sync
poweroff -f
EOF
} > "$root/init"
chmod 755 "$root/init"
(cd "$root" && find . | cpio -o -H newc -R 0:0 --quiet | gzip -1) > "$work/initramfs.cpio.gz"

# --- The disk: word at byte offset o = (o / 8) ^ 0x5a5a5a5a5a5a5a5a, little-endian -----------
# (or a copy of --disk-image)
disk_bytes=$((disk_mb * 1024 * 1024))
if [ -n "$disk_image" ]; then
  cp --sparse=always "$disk_image" "$work/disk.img"
  disk_bytes=$image_bytes
else
python3 - "$work/disk.img" "$disk_mb" <<'PY'
import sys
path, mb = sys.argv[1], int(sys.argv[2])
# For a chunk of K = 2^17 words starting at a multiple of K, word(start + i) = (i ^ M) ^ start:
# one XOR of two big integers per MiB.
M, K = 0x5a5a5a5a5a5a5a5a, 1 << 17
base = int.from_bytes(b"".join((i ^ M).to_bytes(8, "little") for i in range(K)), "little")
with open(path, "wb") as f:
    for start in range(0, mb * 1024 * 1024 // 8, K):
        f.write((base ^ int.from_bytes(start.to_bytes(8, "little") * K, "little")).to_bytes(8 * K, "little"))
PY
fi

# --- Run ------------------------------------------------------------------------------------
# shellcheck disable=SC2054 # the commas belong to QEMU's option strings
nvme=()
append="console=ttyS0 panic=-1 quiet loglevel=3"
if [ -n "$iommu" ]; then
  # Before the other PCI devices, as QEMU wants. VFIO's type-1 IOMMU refuses a container
  # (EPERM) where interrupts are not remapped, as on a real VFIO host they are: --vfio turns
  # remapping on (TCG needs no split irqchip for it); --iommu alone keeps it off.
  if [ -n "$vfio" ]; then nvme=(-device "intel-iommu,intremap=on"); else nvme=(-device "intel-iommu,intremap=off"); fi
  append="$append intel_iommu=on iommu.strict=1"
fi
if [ "$lba" = 4096 ] || [ -n "$ns_args" ]; then
  nvme+=(-device "nvme,id=nvme0,serial=deadbeef${device_args:+,$device_args}"
        -device "nvme-ns,drive=nvm,bus=nvme0,nsid=1,logical_block_size=$lba,physical_block_size=$lba${ns_args:+,$ns_args}")
else
  nvme+=(-device "nvme,serial=deadbeef,drive=nvm${device_args:+,$device_args}")
fi

echo "== $name: $(basename "$kernel"), QEMU NVMe (${device_args:-default options}, $lba-byte blocks${ns_args:+ ($ns_args)}," \
     "${disk_image:+$(basename "$disk_image"), }$((disk_bytes / 1048576)) MiB${iommu:+, Intel IOMMU}${vfio:+, vfio-pci}, $smp CPU$([ "$smp" = 1 ] || echo s)), running: ${programs[*]}"
start_ms=$(( $(date +%s%N) / 1000000 ))
# QEMU runs in the background (timeout makes it its own process group, out of reach of a
# signal to ours), so a TERM/INT to this script is passed on and the temp dir still goes.
timeout -k 5 "$timeout_s" qemu-system-x86_64 -machine q35 "${cpu_args[@]}" -m 512M \
  -nodefaults -display none -serial stdio -no-reboot \
  -kernel "$kernel" -initrd "$work/initramfs.cpio.gz" \
  -append "$append" \
  -drive file="$work/disk.img",if=none,id=nvm,format=raw "${nvme[@]}" \
  </dev/null >"$work/serial.raw" 2>&1 &
qpid=$!
trap 'kill -TERM "$qpid" 2>/dev/null; echo "== $name: interrupted"; exit 1' TERM INT HUP
tail -s 0.1 -n +1 -f --pid="$qpid" "$work/serial.raw" &   # the serial console, as it comes
set +e
wait "$qpid"
qemu_rc=$?
wait $!
set -e
trap - TERM INT HUP
tr -d '\r' < "$work/serial.raw" > "$work/serial.log"
ms=$(( $(date +%s%N) / 1000000 - start_ms ))
printf '== %s: guest ran %d.%01d s, QEMU exit %s\n' "$name" $((ms / 1000)) $((ms % 1000 / 100)) "$qemu_rc"

# --- Verdict --------------------------------------------------------------------------------
status=0
if grep -q "Kernel panic" "$work/serial.log"; then
  echo "FAIL: the guest kernel panicked"; status=1
fi
if [ "$qemu_rc" -eq 124 ] || [ "$qemu_rc" -eq 137 ]; then
  last=$(grep -o '^CUNVME-RUN [^ ]*' "$work/serial.log" | tail -n1 | cut -d' ' -f2)
  echo "FAIL: the guest did not power off within $timeout_s s${last:+ (last started: $last)}"; status=1
elif [ "$qemu_rc" -ne 0 ]; then
  echo "FAIL: QEMU exited with $qemu_rc (bad --qemu-device-args?)"; status=1
fi
if grep -q '^CUNVME-BDF none' "$work/serial.log"; then
  echo "FAIL: the guest found no NVMe controller (PCI class 0x010802)"; status=1
fi

# Markers in order: the i-th CUNVME-RESULT line belongs to the i-th program.
mapfile -t results < <(grep '^CUNVME-RESULT ' "$work/serial.log" || true)
started=$(grep -c '^CUNVME-RUN ' "$work/serial.log" || true)
for i in "${!programs[@]}"; do
  p=${programs[$i]}
  rp="" rc=""
  read -r _ rp rc _ <<<"${results[$i]:-}" || true
  if [ "${rp:-}" = "$p" ] && [ "${rc:-}" = 0 ]; then
    echo "== $p: PASS"
  elif [ "${rp:-}" = "$p" ]; then
    echo "== $p: FAIL (exit ${rc:-?})"; status=1
  elif [ "$i" -lt "$started" ]; then
    echo "== $p: FAIL (no result: it hung, or the guest died before it finished)"; status=1
  else
    echo "== $p: FAIL (did not start)"; status=1
  fi
done

# The programs may write; the image must still be whole and readable.
size=$(stat -c %s "$work/disk.img" 2>/dev/null || echo 0)
if [ "$size" -ne "$disk_bytes" ] || ! cat "$work/disk.img" > /dev/null; then
  echo "FAIL: the disk image is no longer readable or has the wrong size ($size bytes)"; status=1
elif [ -n "$check_image" ]; then
  # shellcheck disable=SC2086 # one word per argument
  if "$check_image" "$work/disk.img" $check_args; then
    echo "== check-image: PASS"
  else
    echo "== check-image: FAIL ($(basename "$check_image") $check_args)"; status=1
  fi
fi

[ $status -eq 0 ] && echo "== $name: PASS" || echo "== $name: FAIL"
exit $status
