#!/usr/bin/env python3
"""Writes a small safetensors model with known content, for cunvme's loader (numpy only).

    python3 examples/make_safetensors.py model.safetensors [--layers 8] [--dim 1024] [--seed 0]

Tensors, in this order in the file: ``model.embed.weight`` [dim, dim] F16; per layer i
``model.layers.{i}.attn.weight`` [dim, dim] F16, ``model.layers.{i}.mlp.weight`` [dim, dim] F32,
``model.layers.{i}.norm.weight`` and ``.norm.bias`` [dim] F16 (2 KiB each at dim 1024: not on
4 KiB boundaries, so the loader's shared-block reads are exercised); ``model.norm.weight`` [dim]
F32; ``lm_head.weight`` [dim, dim] F16. Values are seeded normal numbers, so the same arguments
write the same bytes.

The header is padded with spaces (the format allows it) so that the data starts on a 4 KiB
boundary; with dim a multiple of 1024 every layer is then whole 4 KiB blocks, and so is the file,
so a layer's reads (``emu:file=PATH``, or the file written raw onto a namespace) bring no bytes of
its neighbours. ``write_safetensors`` is the writer, for tests.
"""

import argparse
import json
import struct
import sys

import numpy as np

DTYPES = {np.dtype("bool"): "BOOL", np.dtype("uint8"): "U8", np.dtype("int8"): "I8", np.dtype("int16"): "I16",
          np.dtype("uint16"): "U16", np.dtype("float16"): "F16", np.dtype("int32"): "I32", np.dtype("uint32"): "U32",
          np.dtype("float32"): "F32", np.dtype("complex64"): "C64", np.dtype("int64"): "I64", np.dtype("uint64"): "U64",
          np.dtype("float64"): "F64"}


def write_safetensors(path, tensors, metadata=None, align=4096, gap=0):
    """Writes ``tensors`` ({name: numpy array}, in the dict's order) to ``path``: header padded so
    the data starts on ``align`` bytes, ``gap`` bytes of zeros between tensors (0: packed, as the
    format's reference writes). Returns the header dict."""
    header = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        header[name] = {"dtype": DTYPES[a.dtype.newbyteorder("=")], "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes + gap
    text = json.dumps(header, separators=(",", ":")).encode()
    pad = (-(8 + len(text))) % align if align > 1 else 0
    text += b" " * pad
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for a in tensors.values():
            f.write(np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes())
            f.write(b"\0" * gap)
    return header


def model(layers, dim, seed):
    """The model's tensors, {name: array}, in file order."""
    rng = np.random.default_rng(seed)
    scale = 1.0 / np.sqrt(dim)
    t = {"model.embed.weight": (rng.standard_normal((dim, dim)) * scale).astype(np.float16)}
    for i in range(layers):
        p = f"model.layers.{i}"
        t[f"{p}.attn.weight"] = (rng.standard_normal((dim, dim)) * scale).astype(np.float16)
        t[f"{p}.mlp.weight"] = (rng.standard_normal((dim, dim)) * scale).astype(np.float32)
        t[f"{p}.norm.weight"] = (1 + 0.1 * rng.standard_normal(dim)).astype(np.float16)
        t[f"{p}.norm.bias"] = (0.1 * rng.standard_normal(dim)).astype(np.float16)
    t["model.norm.weight"] = (1 + 0.1 * rng.standard_normal(dim)).astype(np.float32)
    t["lm_head.weight"] = (rng.standard_normal((dim, dim)) * scale).astype(np.float16)
    return t


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.layers < 1 or a.dim < 1:
        p.error("--layers and --dim must be at least 1")
    tensors = model(a.layers, a.dim, a.seed)
    write_safetensors(a.out, tensors, metadata={"format": "pt", "generator": "cunvme examples/make_safetensors.py"})
    size = sum(t.nbytes for t in tensors.values())
    with open(a.out, "rb") as f:
        f.seek(0, 2)
        file_size = f.tell()
    print(f"{a.out}: {len(tensors)} tensors, {a.layers} layers of dim {a.dim}, {size / 2**20:.1f} MiB of data, {file_size} bytes"
          + ("" if file_size % 4096 == 0 else " (not whole 4 KiB blocks: use lba=512, or a dim that is a multiple of 1024)"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
