#!/usr/bin/env python3
"""Draws the plots of bench/RESULTS.md from a sweep's results.jsonl and prints its tables:
`python3 bench/plot.py results/ --png bench/plots/`. Needs matplotlib (Debian:
python3-matplotlib); the tables alone need nothing: `--tables-only`.
"""
import argparse
import json
import os
import sys


def load(path):
    """A sweep's results: its directory (results.jsonl inside) or the .jsonl file itself."""
    if os.path.isdir(path):
        path = os.path.join(path, "results.jsonl")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def by_figure(records, figure, clean=False):
    """The runs of one figure; `clean`: only those without failed commands (for plots)."""
    rows = [r for r in records if r.get("figure") == figure and "error" not in r]
    return [r for r in rows if not r.get("errors")] if clean else rows


def fmt_iops(v):
    return f"{v / 1e6:.2f} M" if v >= 1e6 else f"{v / 1e3:.1f} k"


def table(records, figure):
    rows = by_figure(records, figure)
    if not rows:
        return ""
    out = ["| run | IOPS | GB/s | p50 µs | p99 µs | p99.9 µs | CPU-s / M I/Os | failed | command |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "baseline" in r:
            if r["baseline"] == "h2d":
                out.append(f"| {r['label']} | | {r['gb_per_s']:.2f} | | | | | | `{r['command']}` |")
            else:
                rtt = r["rtt_ns"]
                out.append(f"| {r['label']} (round trip) | | | {rtt['p50'] / 1e3:.2f} | {rtt['p99'] / 1e3:.2f} | | | | `{r['command']}` |")
            continue
        lat = r["lat_ns"]
        cpu = f"{r['cpu_s_per_million_ios']:.2f}" if r.get("emulator_commands") else ""
        out.append(f"| {r['label']} | {fmt_iops(r['iops'])} | {r['gb_per_s']:.2f} | {lat['p50'] / 1e3:.2f} | {lat['p99'] / 1e3:.2f} | "
                   f"{lat['p999'] / 1e3:.2f} | {cpu} | {r.get('errors') or ''} | `{r['command']}` |")
    return "\n".join(out)


def cdf_points(hist):
    total = sum(c for _, c in hist)
    seen = 0
    xs, ys = [], []
    for low, count in hist:
        seen += count
        xs.append(max(low, 1) / 1e3)
        ys.append(seen / total)
    return xs, ys


def plots(records, directory):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    gpu = next((r.get("gpu") for r in records if r.get("gpu")), "GPU")
    date = next((r.get("date", "")[:10] for r in records if r.get("date")), "")

    def save(fig, ax, name, title, xlabel, ylabel, log_base=2):
        ax.set_xscale("log", base=log_base)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}\n{gpu}, {date}", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(directory, name), dpi=120)
        plt.close(fig)

    # IOPS against GPU threads: four modelled SSDs (P2), one line per queue depth.
    p2 = [r for r in by_figure(records, "P2", clean=True) if r.get("devices") == 4]
    if p2:
        fig, ax = plt.subplots(figsize=(6, 4))
        for qd in sorted({r["qd"] for r in p2}):
            rows = sorted((r for r in p2 if r["qd"] == qd), key=lambda r: r["threads"])
            ax.plot([r["threads"] for r in rows], [r["iops"] / 1e6 for r in rows], "o-", label=f"cunvme, a queue pair per thread, qd {qd}")
        ax.axhline(6.0, color="gray", ls="--", label="4 × 1.5 M IOPS (model)")
        ax.axhline(0.95 * 6.0, color="gray", ls=":", label="95 %")
        save(fig, ax, "iops_vs_threads.png", "4 SSDs modelled on the GPU (null controller + timing model)", "GPU threads issuing I/O",
             "M IOPS (4 KiB random reads)")

    # Bandwidth against block size, with the pinned H2D limit.
    bw = sorted(by_figure(records, "BW", clean=True), key=lambda r: r["bs"])
    h2d = [r for r in by_figure(records, "P3") if r.get("baseline") == "h2d"]
    if bw:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([r["bs"] / 1024 for r in bw], [r["gb_per_s"] for r in bw], "o-", label="cunvme reads into GPU memory (emulator, tier 2)")
        if h2d:
            ax.axhline(h2d[0]["gb_per_s"], color="gray", ls="--", label="pinned cudaMemcpy H2D")
        save(fig, ax, "bw_vs_block_size.png", "Sequential reads, bandwidth against block size", "block size (KiB)", "GB/s")

    # Latency CDFs: QD 1, a saturated shared-queue null-controller run (P1s), the largest P2 run.
    fig, ax = plt.subplots(figsize=(6, 4))
    for figure, pick in [("P4", None), ("P1s", 0), ("P2", -1)]:
        rows = [r for r in by_figure(records, figure, clean=True) if r.get("hist")]
        if pick is not None and rows:
            rows = [sorted(rows, key=lambda r: r["threads"])[pick]]
        for r in rows:
            xs, ys = cdf_points(r["hist"])
            ax.plot(xs, ys, label=r["label"])
    save(fig, ax, "latency_cdf.png", "Latency CDF", "completion latency (µs, globaltimer)", "fraction of commands", log_base=10)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="a sweep's directory (with results.jsonl) or a .jsonl file")
    ap.add_argument("--png", default="bench/plots", help="where the PNGs go")
    ap.add_argument("--tables-only", action="store_true")
    a = ap.parse_args()
    records = load(a.results)
    for figure in ["P1s", "P1x", "P1", "P2", "P2e", "P3", "BW", "P4", "P6", "POL"]:
        t = table(records, figure)
        if t:
            print(f"\n### {figure}\n\n{t}")
    for r in records:
        if "error" in r:
            print(f"\nFAILED {r.get('figure')} {r.get('label')}: {r['error'][:500]}", file=sys.stderr)
    if not a.tables_only:
        plots(records, a.png)


if __name__ == "__main__":
    main()
