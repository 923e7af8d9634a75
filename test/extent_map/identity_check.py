#!/usr/bin/env python3
"""The extent_map tool's identity checks on a file in /tmp (skipped, 77, where /tmp gives no
extent map): `check` passes for the file the map was taken of and fails, naming the inode, once
the file was deleted and written anew; `verify --file` refuses such a file before it opens the
device."""
import os
import subprocess
import sys
import tempfile


def run(*args):
    return subprocess.run(list(args), capture_output=True, text=True)


def main() -> int:
    tool = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="cunvme-identity-", dir="/tmp") as d:
        path, m = os.path.join(d, "model.bin"), os.path.join(d, "model.map")
        with open(path, "wb") as f:
            f.write(b"o" * (1 << 20))
        take = run(tool, "take", path, "-o", m)
        if take.returncode != 0:
            print(f"skipped: /tmp gives no extent map here: {take.stderr.strip()}")
            return 77
        failures = []
        ok = run(tool, "check", m, path)
        if ok.returncode != 0:
            failures.append(f"check of the unchanged file failed: {ok.stderr.strip()}")
        os.link(path, path + ".old")  # the old blocks stay allocated, holding the old bytes
        os.remove(path)
        with open(path, "wb") as f:
            f.write(b"n" * (1 << 20))
        stale = run(tool, "check", m, path)
        if stale.returncode != 1 or "inode" not in stale.stderr:
            failures.append(f"check of a replaced file: exit {stale.returncode}, {stale.stderr.strip()!r}")
        verify = run(tool, "verify", "emu:blocks=64", m, "--file", path)
        if verify.returncode != 1 or "inode" not in verify.stderr or "Check the file" not in verify.stderr:
            failures.append(f"verify --file of a replaced file: exit {verify.returncode}, {verify.stderr.strip()!r}")
        usage = run(tool, "show", m, "--file", path)
        if usage.returncode != 2:
            failures.append(f"--file outside read/verify: exit {usage.returncode}, not the usage error 2")
        for f in failures:
            print("FAIL", f)
        if not failures:
            print("PASS check and verify --file catch a file deleted and written anew")
        return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
