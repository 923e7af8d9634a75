#!/usr/bin/env python3
"""stream_layers — load a safetensors model layer by layer into torch through cunvme, running a
matmul per layer while the next layer loads; prints GB/s and the overlap achieved, and checks
every byte the compute saw against the file.

    python3 examples/make_safetensors.py /tmp/model.safetensors --layers 16 --dim 2048
    python3 examples/stream_layers.py /tmp/model.safetensors                 # emu:file=PATH,readonly,lba=4096
    python3 examples/stream_layers.py /tmp/model.safetensors --uri kmod:0000:01:00.0 --first-lba 2048

With ``--uri`` other than the emulator the file must lie contiguously on the namespace from
``--first-lba`` (written there raw, e.g. with dd); extent maps of files in a filesystem go
through ``cunvme.Placement.from_extents``.

Three passes: (1) everything at once (``load_safetensors``): load GB/s; (2) compute alone on
weights already loaded: the compute time; (3) layer by layer (``iter_layers``): each layer's
reads run on the loader's stream while the matmuls of the layer before run on the current
stream. Overlap = time the load stream and the compute stream were both busy / load time (from
CUDA events). Exit status 0 when every tensor matched the file, 1 otherwise, 77 without a GPU.
"""

import argparse
import sys
import time

import numpy as np

import cunvme  # before torch: cunvme sets CUDA_DEVICE_MAX_CONNECTIONS for the emulator's kernels


def intervals_overlap(a, b):
    """Total length of the intersection of two lists of [start, end) intervals (ms)."""
    total = 0.0
    for s1, e1 in a:
        for s2, e2 in b:
            total += max(0.0, min(e1, e2) - max(s1, s2))
    return total


def compute_layer(torch, x, layer, key, repeat):
    """The per-layer compute: x @ W for each 2-D weight of the layer, `repeat` times."""
    for name, w in layer.items():
        if w.dim() == 2 and w.shape[0] == w.shape[1] == x.shape[1]:
            w = w if w.dtype == x.dtype else w.to(x.dtype)
            for _ in range(repeat):
                x = torch.tanh(x @ w)
    return x


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--uri", help="device URI (default: emu:file=MODEL,readonly,lba=4096)")
    p.add_argument("--first-lba", type=int, default=0, help="where the file starts on the namespace (not with the emulator)")
    p.add_argument("--batch", type=int, default=1024, help="rows of the activations")
    p.add_argument("--repeat", type=int, default=4, help="matmuls per weight (more: more compute per layer)")
    a = p.parse_args(argv)

    reason = cunvme.gpu_unavailable_reason()
    if reason:
        print(f"stream_layers: no GPU path ({reason})")
        return 77
    import torch

    uri = a.uri or f"emu:file={a.model},readonly,lba=4096"
    raw = np.memmap(a.model, dtype=np.uint8, mode="r")
    with cunvme.Device(uri, gpu=True) as dev:
        where = cunvme.Placement.contiguous(dev, raw.size, first_lba=a.first_lba, source=a.model)
        f = cunvme.SafetensorsFile(dev, where)
        data = f.header["data_offset"]

        def expected(name):
            t = f.tensors[name]
            return raw[data + t["begin"]:data + t["end"]]

        def matches(name, t):
            return np.array_equal(t.reshape(-1).view(torch.uint8).cpu().numpy(), expected(name))

        # 1: all at once; twice, timing the second: the first also maps the new buffer for the
        # controller (its page table), which the second finds cached (torch hands the same
        # memory back).
        first = f.load(framework="torch")
        first_seconds = first.seconds
        del first
        torch.cuda.synchronize()
        everything = f.load(framework="torch")
        torch.cuda.synchronize()
        bad = [n for n, t in everything.items() if not matches(n, t)]
        dim = next((t.shape[1] for t in everything.values() if t.dim() == 2 and t.shape[0] == t.shape[1]), None)
        if dim is None:
            print("stream_layers: the model has no square 2-D weight to multiply by")
            return 1
        print(f"{a.model}: {len(everything)} tensors, {everything.tensor_bytes / 1e6:.1f} MB on {dev.name} "
              f"({dev.block_size}-byte blocks)")
        print(f"  all at once:     {everything.bytes_read / everything.seconds / 1e9:6.2f} GB/s ({everything.seconds * 1e3:.1f} ms; "
              f"the first load, which also mapped the buffer: {first_seconds * 1e3:.1f} ms)")

        # 2: compute alone, on the weights already in GPU memory.
        it = f.layers(framework="torch")
        groups = [(k, {n: everything[n] for n in names}) for k, names in ((k, [t["name"] for t in g]) for k, g in it.groups)]
        x0 = torch.randn(a.batch, dim, device="cuda")
        compute_layer(torch, x0, groups[-1][1], groups[-1][0], 1)  # warm up cuBLAS
        torch.cuda.synchronize()
        start = time.perf_counter()
        x = x0
        for key, layer in groups:
            x = compute_layer(torch, x, layer, key, a.repeat)
        torch.cuda.synchronize()
        compute_alone = time.perf_counter() - start
        reference = x
        del everything, groups

        # 3: layer by layer, the next layer's reads under this layer's compute.
        current = torch.cuda.current_stream()
        t0 = torch.cuda.Event(enable_timing=True)
        t0.record(current)
        compute_events, seen = [], {}
        torch.cuda.synchronize()
        start = time.perf_counter()
        x = x0
        for key, layer in it:
            c0, c1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            c0.record(current)
            x = compute_layer(torch, x, layer, key, a.repeat)
            c1.record(current)
            compute_events.append((c0, c1))
            for name, t in layer.items():
                seen[name] = t.clone()  # what the compute saw, kept past the buffer's reuse
        torch.cuda.synchronize()
        layered = time.perf_counter() - start
        loads = [(t0.elapsed_time(s), t0.elapsed_time(e)) for s, e in it.load_events]
        computes = [(t0.elapsed_time(s), t0.elapsed_time(e)) for s, e in compute_events]
        load_ms = sum(e - s for s, e in loads)
        both_ms = intervals_overlap(loads, computes)
        bad += [n for n, t in seen.items() if not matches(n, t)]
        same = torch.allclose(x, reference, rtol=1e-3, atol=1e-3)

        print(f"  compute alone:   {compute_alone * 1e3:8.1f} ms ({len(it)} layers, {a.repeat} matmuls of {a.batch}x{dim} per weight)")
        print(f"  layer by layer:  {layered * 1e3:8.1f} ms, {it.bytes_read / layered / 1e9:.2f} GB/s of weights while computing; "
              f"loads {load_ms:.1f} ms in all")
        print(f"  overlap:         {100 * both_ms / load_ms if load_ms else 0:.0f} % of the load time ran under compute "
              f"(ideal wall time max(load, compute) = {max(load_ms / 1e3, compute_alone) * 1e3:.1f} ms, "
              f"serial {load_ms + compute_alone * 1e3:.1f} ms)")
        print(f"  verified:        {len(seen) - len(set(bad))} of {len(seen)} tensors byte for byte against the file; "
              f"result {'equals' if same else 'DIFFERS FROM'} the all-at-once run's")
        if bad:
            print(f"  MISMATCH: {sorted(set(bad))[:5]}")
        return 0 if not bad and same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
