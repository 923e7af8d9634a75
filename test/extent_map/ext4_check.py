#!/usr/bin/env python3
"""Extent maps against implementations we did not write: e2fsprogs and QEMU's NVMe controller.

  ext4_check.py --tool EXTENT_MAP [--device-block-bytes N] [--partition-offset BYTES] [--require-mount]
                [--guest RUN_GUEST --guest-tool EXTENT_MAP_STATIC]

1. A safetensors file with known content (an 8-byte header length, a JSON header, three tensors,
   the middle one all zeros) goes into an ext4 image built by `mke2fs -d` (4 KiB blocks, small
   block groups so that the file is fragmented by backup superblocks; mke2fs -d leaves all-zero
   blocks as holes).
2. Its extents as `debugfs -R 'dump_extents'` reads them from the image, turned into a map (the
   map format written here, independently of the C++ writer) with the SHA-256 Python computes;
   `extent_map show` must parse it.
3. Where the image can be loop-mounted (root, loop devices): `extent_map take` on the mounted file
   must give the same map (the device name aside: the tool names the loop device).
4. With --guest: the image is the NVMe disk of a QEMU guest (run_guest.sh --disk-image), the map
   (the tool's where it was taken, else debugfs's) is in /files, and the static tool reads the
   file by the map through sysfs:<BDF>, checking the SHA-256 (verify, then read to a file).

With --partition-offset the image is a disk: an MBR whose one partition starts at BYTES holds the
file system (mke2fs -E offset), debugfs reads it at that offset, and the tool must find the
partition's start itself: the image on a loop device with partitions (losetup -P, partx -a) and
the partition mounted, so that FIEMAP's offsets are partition-relative and `take` reads the start
from sysfs. Where no partition device appears, the loop mount starts at the offset instead and
`take --partition-offset` is given it. The guest's namespace is the whole disk.

Exit 0 when all of it passed, 1 on a failure, 77 (skipped) when mke2fs or debugfs is missing, or
when the loop mount fails and there is no guest to run (or --require-mount was given).
"""
import argparse
import hashlib
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile

FS_BLOCK = 4096


def safetensors_bytes():
    """A small safetensors file: random F32 tensors around one of zeros (a hole in ext4)."""
    rng = random.Random(20261124)
    w1 = rng.randbytes(3 * 1024 * 1024)
    zeros = bytes(96 * 1024)
    w2 = rng.randbytes(5 * 1024 * 1024 + 4 * 123)
    tensors, offset = {}, 0
    for name, data in (('w1', w1), ('zeros', zeros), ('w2', w2)):
        tensors[name] = {'dtype': 'F32', 'shape': [len(data) // 4], 'data_offsets': [offset, offset + len(data)]}
        offset += len(data)
    header = json.dumps({'__metadata__': {'format': 'pt', 'source': 'cunvme extent map test'}, **tensors}).encode()
    header += b' ' * (-len(header) % 8)
    return struct.pack('<Q', len(header)) + header + w1 + zeros + w2


def run(cmd, **kw):
    return subprocess.run(cmd, check=False, capture_output=True, text=True, **kw)


def debugfs_extents(image, path):
    """(logical block, physical block, blocks, flags) of the file's leaf extents, and its size."""
    out = run(['debugfs', '-R', f'dump_extents {path}', image])
    if out.returncode != 0:
        sys.exit(f'FAIL: debugfs dump_extents: {out.stderr}')
    rows = []
    # "Level Entries Logical Physical Length Flags": a leaf line has a physical range, an index
    # line one block; leaves are at the deepest level (depth = the number after the '/').
    leaf = re.compile(r'^\s*(\d+)/\s*(\d+)\s+\d+/\s*\d+\s+(\d+)\s+-\s+(\d+)\s+(\d+)\s+-\s+(\d+)\s+(\d+)\s*(\S*)\s*$')
    for line in out.stdout.splitlines():
        m = leaf.match(line)
        if m and m.group(1) == m.group(2):
            lstart, lend, pstart, pend, length = (int(m.group(i)) for i in range(3, 8))
            assert lend - lstart + 1 == length and pend - pstart + 1 == length, line
            rows.append((lstart, pstart, length, m.group(8)))
    st = run(['debugfs', '-R', f'stat {path}', image])
    size = re.search(r'\bSize: (\d+)', st.stdout)
    if st.returncode != 0 or not size:
        sys.exit(f'FAIL: debugfs stat: {st.stderr}')
    return rows, int(size.group(1))


def map_from_debugfs(rows, size, dbs, sha, partition_offset):
    """The map text the C++ writer must produce for these extents (see loader/extent_map.cuh)."""
    extents = []
    for lblk, pblk, n, flags in rows:
        if flags:
            sys.exit(f'FAIL: debugfs reports flags {flags!r} (uninitialized?) on the test file')
        start = lblk * FS_BLOCK
        if start >= size:
            continue
        end = min((lblk + n) * FS_BLOCK, size)
        e = [start, (partition_offset + pblk * FS_BLOCK) // dbs, (end - start + dbs - 1) // dbs]
        if extents and extents[-1][0] + extents[-1][2] * dbs == e[0] and extents[-1][1] + extents[-1][2] == e[1]:
            extents[-1][2] += e[2]
        else:
            extents.append(e)
    lines = ['cunvme-extent-map 1', f'file_size {size}', f'fs_block_bytes {FS_BLOCK}', f'device_block_bytes {dbs}', 'device -',
             f'partition - {partition_offset}', f'sha256 {sha}', f'extents {len(extents)}'] + [f'{a} {b} {c}' for a, b, c in extents] + ['end']
    return '\n'.join(lines) + '\n', extents


def without_device(text):
    text = re.sub(r'^partition \S+ ', 'partition - ', text, flags=re.M)
    return re.sub(r'^device .*$', 'device -', without_identity(text), flags=re.M)


def without_identity(text):
    """A version 2 map as version 1: debugfs knows no file identity (inode, times)."""
    text = re.sub(r'^identity .*\n', '', text, flags=re.M)
    return re.sub(r'^cunvme-extent-map 2$', 'cunvme-extent-map 1', text, flags=re.M)


def mount_image(image, mnt, offset, cleanups):
    """Mounts the file system; returns (how, extra take arguments) or None."""
    if offset:
        # The partition as the kernel sees it: a loop device with a partition table.
        loop = run(['losetup', '-f', '--show', '-P', image])
        if loop.returncode == 0:
            dev = loop.stdout.strip()
            cleanups.append(['losetup', '-d', dev])
            name = os.path.basename(dev) + 'p1'
            if not os.path.exists(f'/sys/class/block/{name}'):
                run(['partx', '-a', dev])
            part = f'/dev/{name}'
            if os.path.exists(f'/sys/class/block/{name}/dev') and not os.path.exists(part):
                with open(f'/sys/class/block/{name}/dev') as f:
                    major, minor = f.read().strip().split(':')
                if run(['mknod', part, 'b', major, minor]).returncode == 0:
                    cleanups.append(['rm', '-f', part])
            if os.path.exists(part) and run(['mount', part, mnt]).returncode == 0:
                cleanups.append(['umount', mnt])
                return f'partition {name} of {dev}', []
    m = run(['mount', '-o', f'loop,offset={offset}', image, mnt])
    if m.returncode != 0:
        print(f'== loop mount not possible here ({m.stderr.strip()}): the tool\'s FIEMAP is not compared')
        return None
    cleanups.append(['umount', mnt])
    if offset:
        return f'loop device starting at byte {offset}', ['--partition-offset', str(offset)]
    return 'loop device', []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--tool', required=True)
    ap.add_argument('--device-block-bytes', type=int, default=512)
    ap.add_argument('--partition-offset', type=int, default=0)
    ap.add_argument('--require-mount', action='store_true')
    ap.add_argument('--guest')
    ap.add_argument('--guest-tool')
    args = ap.parse_args()
    dbs = args.device_block_bytes
    offset = args.partition_offset
    missing = [t for t in ('mke2fs', 'debugfs') if not shutil.which(t) and not os.path.exists(f'/usr/sbin/{t}') and not os.path.exists(f'/sbin/{t}')]
    if missing:
        print(f'skipped: {", ".join(missing)} missing (install e2fsprogs)')
        return 77
    os.environ['PATH'] += ':/usr/sbin:/sbin'

    work = tempfile.mkdtemp(prefix='cunvme-ext4-')
    mnt = os.path.join(work, 'mnt')
    cleanups = []  # commands undoing mounts and loop devices, run last first
    try:
        src = os.path.join(work, 'src')
        os.makedirs(src)
        os.makedirs(mnt)
        content = safetensors_bytes()
        with open(os.path.join(src, 'model.safetensors'), 'wb') as f:
            f.write(content)
        with open(os.path.join(src, 'small.txt'), 'w') as f:
            f.write('a second file, so that the model is not alone\n')
        sha = hashlib.sha256(content).hexdigest()
        image = os.path.join(work, 'ext4.img')
        fs_at = image
        if offset:
            # A disk with an MBR: one Linux partition (type 0x83) from `offset` for 32 MiB.
            with open(image, 'wb') as f:
                f.truncate(offset + 40 * 1024 * 1024)
                f.seek(446)
                f.write(bytes([0, 0, 0, 0, 0x83, 0, 0, 0]) + struct.pack('<II', offset // 512, 32 * 2048))
                f.seek(510)
                f.write(b'\x55\xaa')
            fs_at = f'{image}?offset={offset}'
        mk = run(['mke2fs', '-q', '-F', '-t', 'ext4', '-b', str(FS_BLOCK), '-g', '1024', '-d', src] +
                 (['-E', f'offset={offset}'] if offset else []) + [image, '32M'])
        if mk.returncode != 0:
            print(f'FAIL: mke2fs -d: {mk.stderr}')
            return 1
        rows, size = debugfs_extents(fs_at, '/model.safetensors')
        if size != len(content):
            print(f'FAIL: debugfs says {size} bytes, the file has {len(content)}')
            return 1
        ref_text, extents = map_from_debugfs(rows, size, dbs, sha, offset)
        ref_map = os.path.join(work, 'debugfs.map')
        with open(ref_map, 'w') as f:
            f.write(ref_text)
        holes = size - sum(min(c * dbs, size - a) for a, b, c in extents)
        print(f'== mke2fs -d: {size} bytes in {len(rows)} ext4 extents ({len(extents)} map extents, {holes} bytes of holes), sha256 {sha}')
        if len(extents) < 2 or holes == 0:
            print('FAIL: the test file should be fragmented and have a hole (mke2fs -d makes holes of zero blocks)')
            return 1
        # The image at each extent's LBA holds the file: the debugfs map checked against the bytes.
        with open(image, 'rb') as f:
            for a, b, c in extents:
                f.seek(b * dbs)
                n = min(c * dbs, size - a)
                if f.read(n) != content[a:a + n]:
                    print(f'FAIL: the image at LBA {b} does not hold file bytes {a}..{a + n}')
                    return 1
        show = run([args.tool, 'show', ref_map])
        if show.returncode != 0:
            print(f'FAIL: extent_map show rejects the debugfs map: {show.stderr}')
            return 1
        print(f'== debugfs map parsed by the tool: {show.stdout.strip()}')

        guest_map = ref_map
        mounted = mount_image(image, mnt, offset, cleanups)
        if mounted is None:
            if args.require_mount or not args.guest:
                print('skipped: no loop mount')
                return 77
        else:
            how, extra = mounted
            tool_map = os.path.join(work, 'model.map')
            mounted_file = os.path.join(mnt, 'model.safetensors')
            take = run([args.tool, 'take', mounted_file, '-o', tool_map, '--device-block-bytes', str(dbs)] + extra)
            print(f'== extent_map take on the {how}: {take.stdout.strip()} {take.stderr.strip()}')
            if take.returncode != 0:
                print('FAIL: extent_map take failed')
                return 1
            with open(tool_map) as f:
                tool_text = f.read()
            if without_device(tool_text) != ref_text:
                print('FAIL: the tool\'s map differs from debugfs\'s')
                print('-- tool:\n' + tool_text + '-- debugfs:\n' + ref_text)
                return 1
            if not re.search(r'^device loop\d+$', tool_text, flags=re.M):
                print('FAIL: the tool should name the loop device the file system was on')
                return 1
            if how.startswith('partition') and not re.search(rf'^partition loop\d+p1 {offset}$', tool_text, flags=re.M):
                print('FAIL: the tool should name the partition and its start, from sysfs')
                return 1
            print('== the tool\'s map equals debugfs\'s (extents, size, blocks, partition, sha256)')
            guest_map = tool_map
            # The rule: the file must not change after its map is taken. Overwritten in place
            # (ext4 keeps the blocks), the old map is stale: same blocks, another hash.
            changed = bytearray(content)
            changed[len(content) // 2:len(content) // 2 + 16] = b'changed in place'
            with open(mounted_file, 'r+b') as f:
                f.seek(len(content) // 2)
                f.write(changed[len(content) // 2:len(content) // 2 + 16])
                f.flush()
                os.fsync(f.fileno())
            fresh_map = os.path.join(work, 'fresh.map')
            take = run([args.tool, 'take', mounted_file, '-o', fresh_map, '--device-block-bytes', str(dbs)] + extra)
            if take.returncode != 0:
                print(f'FAIL: extent_map take after the change: {take.stderr.strip()}')
                return 1
            with open(fresh_map) as f:
                fresh_text = f.read()
            if without_identity(fresh_text) != without_identity(tool_text).replace(sha, hashlib.sha256(changed).hexdigest()):
                print('FAIL: after an in-place change the map should differ in its sha256 (and identity) only')
                print('-- before:\n' + tool_text + '-- after:\n' + fresh_text)
                return 1
            # While mounted, the old map is caught by the file's identity too (its times changed).
            check = run([args.tool, 'check', tool_map, mounted_file])
            if check.returncode != 1 or 'modification time' not in check.stderr:
                print(f'FAIL: check of the old map against the changed file: exit {check.returncode}, {check.stderr.strip()}')
                return 1
            check = run([args.tool, 'check', fresh_map, mounted_file])
            if check.returncode != 0:
                print(f'FAIL: check of the fresh map: {check.stderr.strip()}')
                return 1
            print('== changed in place: the new map has the same extents and the new content\'s sha256; the old one is stale, and check says so')
        while cleanups:
            run(cleanups.pop())

        if args.guest:
            # With the tool's maps: the fresh one reads the changed file, the stale one is refused
            # (exit 1: the SHA-256 differs). With debugfs's map: the unchanged file.
            files = [fresh_map, tool_map] if guest_map != ref_map else [ref_map]
            cmd = [args.guest, '--name', f'ext4-extent-map-{dbs}' + (f'-partition-at-{offset}' if offset else ''), '--lba', str(dbs),
                   '--disk-image', image]
            for f in files:
                cmd += ['--guest-file', f]
            first = '/files/' + os.path.basename(files[0])
            cmd += ['--', args.guest_tool, 'verify', '@URI@', first, '---', args.guest_tool, 'read', '@URI@', first, '-o', '/tmp/model.safetensors']
            if len(files) > 1:
                cmd += ['---', '!' + args.guest_tool, 'verify', '@URI@', '/files/' + os.path.basename(files[1])]
            print('== guest: ' + ('the tool\'s fresh map, then its stale one' if guest_map != ref_map else 'the debugfs map (no loop mount)'), flush=True)
            g = subprocess.run(cmd, check=False)
            if g.returncode != 0:
                return g.returncode
        print('PASS')
        return 0
    finally:
        while cleanups:
            run(cleanups.pop())
        shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    sys.exit(main())
