#!/usr/bin/env python3
"""Checks a guest's disk image on the host after cpu_readers ran in the guest (run_guest.sh
--check-image): the region holds the sealed words cpu_readers wrote, everything else still
holds the harness's pattern.

    check_image.py IMAGE --seed N --region OFFSET_MIB:SIZE_MIB

The 8-byte little-endian word at byte offset o is
  inside the region:  (o/8)·0x9e3779b97f4a7c15 XOR (seed+1)·0xd1b54a32d192ed03  (mod 2^64;
                      test::word_at(o, seed), cpu_readers' sealed_word)
  elsewhere:          (o/8) XOR 0x5a5a5a5a5a5a5a5a  (host::pattern_word)
Exit 0 when every word matches, 1 (naming the first wrong word and how many differ per MiB)
when not, 2 for bad usage.
"""
import argparse
import sys
from array import array

M64 = (1 << 64) - 1
PATTERN = 0x5A5A5A5A5A5A5A5A


def sealed(first_word, count, seed):
    key = ((seed + 1) * 0xD1B54A32D192ED03) & M64
    return array("Q", (((w * 0x9E3779B97F4A7C15) & M64) ^ key for w in range(first_word, first_word + count)))


def pattern(first_word, count):
    return array("Q", (w ^ PATTERN for w in range(first_word, first_word + count)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("image")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--region", required=True, help="OFFSET_MIB:SIZE_MIB")
    args = parser.parse_args()
    try:
        offset_mib, size_mib = (int(v) for v in args.region.split(":"))
    except ValueError:
        parser.error("--region takes OFFSET_MIB:SIZE_MIB")
    if sys.byteorder != "little" or array("Q").itemsize != 8:
        print("check_image.py: needs a little-endian host with 8-byte array('Q')")
        return 2
    mib = 1 << 20
    begin, end = offset_mib * mib, (offset_mib + size_mib) * mib
    bad_mibs = []
    first_bad = None
    with open(args.image, "rb") as f:
        image_bytes = f.seek(0, 2)
        f.seek(0)
        if end > image_bytes or image_bytes % mib != 0:
            print(f"FAIL: the region ends at {end} bytes, the image has {image_bytes}")
            return 1
        for at in range(0, image_bytes, mib):
            got = array("Q")
            got.frombytes(f.read(mib))
            inside = begin <= at < end
            want = sealed(at // 8, mib // 8, args.seed) if inside else pattern(at // 8, mib // 8)
            if got != want:
                wrong = sum(1 for g, w in zip(got, want) if g != w)
                bad_mibs.append(f"MiB {at // mib} ({'region' if inside else 'outside'}): {wrong} words")
                if first_bad is None:
                    i = next(i for i, (g, w) in enumerate(zip(got, want)) if g != w)
                    first_bad = f"word at byte {at + 8 * i}: 0x{got[i]:016x}, want 0x{want[i]:016x}"
    if bad_mibs:
        print(f"FAIL: the image differs from what the guest wrote; first {first_bad}")
        for line in bad_mibs[:16]:
            print("  " + line)
        return 1
    print(f"check_image: {image_bytes // mib} MiB as expected ({size_mib} MiB at {offset_mib} MiB sealed with seed {args.seed}, the rest the pattern)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
