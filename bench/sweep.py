#!/usr/bin/env python3
"""Runs the figures of bench/RESULTS.md back to back on one GPU machine, so every ratio is
taken in one run: `python3 bench/sweep.py --build build --out results/`. Writes one JSON line
per measurement to OUT/results.jsonl (each tagged with its figure and the exact command line)
and prints a one-line summary per run. `bench/plot.py OUT` then draws the plots and tables.

Every run that moves data reads a namespace filled with the pattern and passes --verify
(`moves_data` checks the list): a run whose commands failed or whose data did not verify
prints a record with "error" and no figure, and counts as a failure here.

Only the standard library: the GPU machine has python3 but no extra packages.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time

SMS = 132  # H100 SXM/PCIe SM count; only sizes the thread sweeps


def moves_data(args):
    """Whether a cunvme_bench run moves data (an emulator without nodata, the null controller
    with copy): such a run must check what it read."""
    if "--baseline" in args:
        return False
    device = args[args.index("--device") + 1] if "--device" in args else "emu"
    if device.startswith("gpu-null"):
        return device == "gpu-null:copy"
    scheme, _, options = device.partition(":")
    return scheme != "emu" or "nodata" not in options.split(",")


def figures(quick):
    """(figure, label, arguments) for every run, in order."""
    t = "0.5" if quick else "1.5"
    runs = []
    # Limits measured in the same run as the figures that divide by them.
    runs.append(("P3", "pinned cudaMemcpy H2D", ["--baseline", "h2d", "--size", "8G"]))
    runs.append(("P4", "GPU-CPU ping-pong", ["--baseline", "pingpong"]))
    # P1s: the command path on shared queues against the on-GPU null controller, 512 B reads:
    # at most 128 queue pairs per controller, at least 32 K threads (issue 18).
    for threads, devices, queues, qd, null_blocks, slots, doorbell in [
            (32768, 1, 128, 2, 16, "warp_aggregated", "coalescing"), (32768, 1, 128, 2, 16, "multi_producer", "mmio"),
            (65536, 1, 128, 1, 16, "warp_aggregated", "coalescing"), (65536, 1, 128, 2, 32, "warp_aggregated", "coalescing"),
            (131072, 4, 512, 2, 8, "warp_aggregated", "coalescing")]:
        runs.append(("P1s", f"null 512B shared {threads} thr {devices} ctrl x {queues // devices} q qd{qd} ctrl-blocks{null_blocks} {slots}/{doorbell}",
                     ["--device", "gpu-null", "--devices", str(devices), "--rw", "randread", "--bs", "512", "--threads", str(threads),
                      "--block-threads", "256", "--queues", str(queues), "--entries", "1024", "--qd", str(qd), "--null-blocks", str(null_blocks),
                      "--slots", slots, "--doorbell", doorbell, "--time", t, "--buffer", "256M"]))
    # The shared-queue runs of the first report (132 to 528 queues on one controller).
    for threads, queues, qd, null_blocks in [(SMS * 512, 132, 2, 16), (SMS * 2048, 528, 2, 32)]:
        runs.append(("P1", f"null 512B {threads} thr {queues} q qd{qd} ctrl{null_blocks}",
                     ["--device", "gpu-null", "--rw", "randread", "--bs", "512", "--threads", str(threads), "--block-threads", "256",
                      "--queues", str(queues), "--entries", "1024", "--qd", str(qd), "--null-blocks", str(null_blocks), "--time", t,
                      "--buffer", "256M"]))
    # P1x: one queue pair per thread (no shared-slot atomics), 16 or 32 commands in flight each.
    for threads, qd, null_blocks in [(1024, 32, 32), (2048, 16, 64), (2048, 32, 64), (4096, 16, 64)]:
        runs.append(("P1x", f"null 512B exclusive {threads} thr {threads} q qd{qd} ctrl{null_blocks}",
                     ["--device", "gpu-null", "--rw", "randread", "--bs", "512", "--threads", str(threads), "--block-threads", "32",
                      "--queues", str(threads), "--entries", "64", "--qd", str(qd), "--null-blocks", str(null_blocks), "--time", t,
                      "--buffer", "256M", "--slots", "exclusive", "--doorbell", "mmio"]))
    # P2: four modelled SSDs (datacenter-gen4: 1.5 M IOPS, 80 µs each) modelled on the GPU (the
    # null controller with the timing model), a queue pair per thread; one drive alone for its cap.
    for qd in [4, 8]:
        for threads in [64, 128, 256, 512]:
            runs.append(("P2", f"4 modelled SSDs on the GPU 4K randread {threads} threads qd{qd}",
                         ["--device", "gpu-null:timing=datacenter-gen4", "--devices", "4", "--slots", "exclusive", "--queues", str(threads),
                          "--threads", str(threads), "--qd", str(qd), "--block-threads", "32", "--bs", "4K", "--time", t]))
    runs.append(("P2", "1 modelled SSD on the GPU 4K randread 256 threads qd8",
                 ["--device", "gpu-null:timing=datacenter-gen4", "--devices", "1", "--slots", "exclusive", "--queues", "256",
                  "--threads", "256", "--qd", "8", "--block-threads", "32", "--bs", "4K", "--time", t]))
    # P2e: the emulator's host threads without data movement, GPU threads submitting.
    # One queue pair per worker, then four and about 4.6 per worker (up to the emulator's 64): a
    # shared queue pair is drained by one thread at a time, so more queue pairs take more.
    for workers, queues, threads in [(8, 8, 4096), (14, 14, 4096), (14, 14, 16384), (14, 56, 7168), (14, 64, 8192)]:
        runs.append(("P2e", f"emu nodata {workers} workers {queues} q 4K randread {threads} threads",
                     ["--device", f"emu:workers={workers},nodata", "--queues", str(queues), "--rw", "randread", "--bs", "4096",
                      "--threads", str(threads), "--block-threads", "128", "--qd", "4", "--time", t, "--tier", "2", "--buffer", "256M"]))
    # P3: 128 KiB sequential reads into GPU memory through the emulator.
    for workers, queues, threads, qd in [(8, 8, 1024, 2), (12, 12, 1536, 2), (14, 14, 2048, 2)]:
        runs.append(("P3", f"emu 128K seqread tier2 {workers} workers {threads} thr qd{qd}",
                     ["--device", f"emu:workers={workers},blocks=2097152,pattern", "--queues", str(queues), "--rw", "read", "--bs", "128K",
                      "--threads", str(threads), "--block-threads", "128", "--qd", str(qd), "--time", t, "--tier", "2", "--buffer", "1G",
                      "--verify"]))
    # Bandwidth against block size (plot), tier 2. 2 GiB of buffer: --verify needs a slot per
    # command in flight (1536 threads x qd 2 x 512 KiB = 1.5 GiB at the largest size).
    for bs in ["4K", "16K", "64K", "128K", "256K", "512K"]:
        runs.append(("BW", f"emu seqread tier2 bs {bs}",
                     ["--device", "emu:workers=12,blocks=2097152,pattern", "--queues", "12", "--rw", "read", "--bs", bs, "--threads", "1536",
                      "--block-threads", "128", "--qd", "2", "--time", t, "--tier", "2", "--buffer", "2G", "--verify"]))
    # P4: QD1 4 KiB read latency, tier 1, one thread.
    runs.append(("P4", "emu 4K randread QD1 tier1", ["--device", "emu:pattern", "--rw", "randread", "--bs", "4096", "--threads", "1", "--block-threads", "32",
                                                     "--qd", "1", "--time", t, "--tier", "1", "--buffer", "64M", "--verify"]))
    runs.append(("P4", "emu 4K randread QD1 tier1 exclusive mmio", ["--device", "emu:pattern", "--rw", "randread", "--bs", "4096", "--threads", "1", "--block-threads", "32",
                                                                   "--qd", "1", "--time", t, "--tier", "1", "--buffer", "64M", "--slots", "exclusive", "--doorbell", "mmio",
                                                                   "--verify"]))
    runs.append(("P4", "emu:spin 4K randread QD1 tier1 exclusive mmio", ["--device", "emu:spin,pattern", "--rw", "randread", "--bs", "4096", "--threads", "1", "--block-threads", "32",
                                                                        "--qd", "1", "--time", t, "--tier", "1", "--buffer", "64M", "--slots", "exclusive", "--doorbell", "mmio",
                                                                        "--verify"]))
    runs.append(("P4", "emu 4K randread QD1 tier2", ["--device", "emu:pattern", "--rw", "randread", "--bs", "4096", "--threads", "1", "--block-threads", "32",
                                                     "--qd", "1", "--time", t, "--tier", "2", "--buffer", "64M", "--verify"]))
    # P6: host CPU per million emulated I/Os, with data (tier 2, 4 KiB) and without (nodata).
    runs.append(("P6", "emu 4K randread tier2 data", ["--device", "emu:workers=8,pattern", "--queues", "8", "--rw", "randread", "--bs", "4096", "--threads", "4096",
                                                      "--block-threads", "128", "--qd", "2", "--time", t, "--tier", "2", "--buffer", "256M", "--verify"]))
    runs.append(("P6", "emu 4K randread tier2 nodata", ["--device", "emu:workers=8,nodata", "--queues", "8", "--rw", "randread", "--bs", "4096",
                                                        "--threads", "4096", "--block-threads", "128", "--qd", "2", "--time", t, "--tier", "2",
                                                        "--buffer", "256M"]))
    # Policies side by side on the null controller (IOPS, latency).
    for slots, completion, doorbell in [("warp_aggregated", "cooperative", "coalescing"), ("multi_producer", "cooperative", "mmio"),
                                        ("warp_aggregated", "dedicated_poller", "coalescing"), ("multi_producer", "dedicated_poller", "coalescing")]:
        runs.append(("POL", f"null 512B {slots}/{completion}/{doorbell}",
                     ["--device", "gpu-null", "--rw", "randread", "--bs", "512", "--threads", str(SMS * 256), "--block-threads", "256",
                      "--queues", "132", "--qd", "2", "--null-blocks", "16", "--slots", slots, "--completion", completion, "--doorbell", doorbell,
                      "--time", t, "--buffer", "256M"]))
    return runs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="meson build directory holding bench/cunvme_bench")
    ap.add_argument("--out", required=True, help="directory for results.jsonl and logs")
    ap.add_argument("--only", default="", help="comma-separated figure ids to run (default: all)")
    ap.add_argument("--quick", action="store_true", help="0.5 s per run instead of 1.5 s")
    ap.add_argument("--peers-file", default="", help="also run file_peers (P5) on this path, creating a 4 GiB file there")
    ap.add_argument("--cufile-trace", default="", help="directory for file_peers' cuFile TRACE log")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    bench = os.path.join(a.build, "bench", "cunvme_bench")
    only = set(filter(None, a.only.split(",")))
    unchecked = [label for _, label, args in figures(a.quick) if moves_data(args) and "--verify" not in args]
    if unchecked:
        sys.exit(f"sweep.py: runs that move data without --verify: {unchecked}")
    out = open(os.path.join(a.out, "results.jsonl"), "a")
    failures = 0
    for fig, label, args in figures(a.quick):
        if only and fig not in only:
            continue
        # --probe on every I/O run: its record says where the commands waited (queue_probe.hpp).
        cmd = [bench] + args + ([] if "--baseline" in args else ["--probe"]) + ["--json"]
        started = time.time()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=25)
        except subprocess.TimeoutExpired as e:
            p = subprocess.CompletedProcess(cmd, 124, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "timed out after 25 s")
        line = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = {"error": (p.stderr or p.stdout)[-2000:]}
        # A failed run reports no figure: its record holds "error" (plot.py leaves it out).
        if p.returncode != 0 and "error" not in record:
            record = {"error": f"exit code {p.returncode}: " + (p.stderr or p.stdout)[-2000:]}
        if "error" in record:
            failures += 1
        record.update({"figure": fig, "label": label, "command": " ".join(shlex.quote(c) for c in ["cunvme_bench"] + args), "rc": p.returncode,
                       "wall_s": round(time.time() - started, 2)})
        out.write(json.dumps(record) + "\n")
        out.flush()
        brief = {k: record.get(k) for k in ("iops", "gb_per_s", "errors", "rtt_ns", "cpu_s_per_million_ios") if k in record}
        if "lat_ns" in record:
            brief["p50"] = record["lat_ns"]["p50"]
            brief["p99"] = record["lat_ns"]["p99"]
        print(f"{fig} {label}: rc={p.returncode} {brief} {record.get('error', '')[:300]}", flush=True)
    if a.peers_file:
        peers = os.path.join(a.build, "bench", "file_peers")
        cmd = [peers, "--file", a.peers_file, "--create-size", "4G", "--json"]
        if a.cufile_trace:
            cmd += ["--cufile-trace", a.cufile_trace]
        started = time.time()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            p = subprocess.CompletedProcess(cmd, 124, "", "timed out after 300 s")
        try:
            record = json.loads(p.stdout.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            record = {"error": (p.stderr + p.stdout)[-3000:]}
        if p.returncode != 0 and "error" not in record:
            record = {"error": f"exit code {p.returncode}: " + (p.stderr + p.stdout)[-3000:]}
        if "error" in record:
            failures += 1
        record.update({"figure": "P5", "label": "4 GiB file into GPU memory",
                       "command": " ".join(["file_peers", "--file", "FILE", "--create-size", "4G", "--json"] + (["--cufile-trace", "DIR"] if a.cufile_trace else [])),
                       "rc": p.returncode, "wall_s": round(time.time() - started, 2), "stderr_tail": p.stderr[-3000:]})
        out.write(json.dumps(record) + "\n")
        print(f"P5: rc={p.returncode} {json.dumps(record)[:1500]}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
