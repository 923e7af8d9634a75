"""Safetensors files on a cunvme device: named tensors read straight into torch, cupy or numpy
arrays, all at once or one layer at a time with the next layer's reads running while the caller
computes on the current one.

    import cunvme, torch
    with cunvme.Device("emu:file=model.safetensors,readonly") as dev:
        weights = cunvme.load_safetensors(dev, "model.safetensors")          # {name: torch tensor}
        for key, layer in cunvme.iter_layers(dev, "model.safetensors"):      # double buffered
            y = x @ layer[f"{key}.weight"]

The header is read through the device and parsed by the C++ parser (``include/cunvme/loader``,
through the extension), so Python and C++ accept exactly the same files; a file they refuse
raises ``cunvme.FormatError``. Where the file lies on the device is a ``Placement``: a path means
"the device is the emulator backed by this file" (the file from LBA 0 on, ``emu:file=PATH``);
``Placement.from_extents`` describes a file on a real controller's filesystem.

Zero copies beyond SSD -> GPU: for each group of tensors one array is allocated, the blocks
holding the tensors are read into it (tensors whose blocks touch share one read), and each tensor
is a view of that array at its offset. A tensor whose file offset is not a multiple of its element
size (no well-formed writer makes one) is copied once into an array of its own: torch and cupy
views must be element aligned. ``Loaded.copied_bytes`` counts them.
"""

import os
import time

from . import _cunvme

__all__ = ["Placement", "SafetensorsFile", "Loaded", "LayerIterator", "load_safetensors", "iter_layers"]


class Placement:
    """Where a file's bytes lie on a device's namespace: ``extents`` of
    ``(file_offset, lba, blocks)`` (file offsets multiples of ``block_size``, in file order), and
    the file's size. Bytes in no extent cannot be read (``FormatError`` names them)."""

    def __init__(self, block_size, file_size, extents, source="file"):
        self.block_size = int(block_size)
        self.file_size = int(file_size)
        self.extents = [tuple(int(v) for v in e) for e in extents]
        self.source = source
        # Checked now, by the C++ rules (an empty plan maps nothing but validates the extents).
        _cunvme.plan_reads(self.block_size, self.file_size, self.extents, [])

    @classmethod
    def contiguous(cls, dev, file_size, first_lba=0, source="file"):
        """The file from ``first_lba`` on, one block after another, on ``dev``'s namespace: the
        emulator backed by the file (``emu:file=PATH``) holds it from LBA 0, every byte of it:
        the last block's bytes past the file's end read as zeros."""
        extents = _cunvme.contiguous_extents(dev.block_size, first_lba, file_size, dev.blocks)
        return cls(dev.block_size, file_size, extents, source)

    @classmethod
    def from_extents(cls, block_size, file_size, extents, source="file"):
        """A file given extent by extent (a filesystem's map of it, as LBAs of the namespace)."""
        return cls(block_size, file_size, extents, source)

    def __repr__(self):
        return f"<cunvme.Placement {self.source}: {self.file_size} bytes in {len(self.extents)} extent(s) of {self.block_size}-byte blocks>"


def _torch_dtypes(torch):
    names = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "F16": "float16", "BF16": "bfloat16",
             "I32": "int32", "U32": "uint32", "F32": "float32", "C64": "complex64", "I64": "int64", "U64": "uint64", "F64": "float64",
             "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu"}
    return {k: getattr(torch, v) for k, v in names.items() if hasattr(torch, v)}


def _numpy_dtypes(np):
    names = {"BOOL": "bool_", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "F16": "float16", "I32": "int32",
             "U32": "uint32", "F32": "float32", "C64": "complex64", "I64": "int64", "U64": "uint64", "F64": "float64"}
    return {k: np.dtype(getattr(np, v)).newbyteorder("<") for k, v in names.items()}


class _Framework:
    """Arrays of one library: allocation, byte slices, typed views, streams."""

    def __init__(self, name, device):
        self.name = name
        if name == "torch":
            import torch

            self.mod = torch
            self.device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
            self.dtypes = _torch_dtypes(torch)
        elif name == "cupy":
            import cupy

            self.mod = cupy
            self.device = cupy.cuda.Device(device if device is not None else cupy.cuda.runtime.getDevice())
            self.dtypes = _numpy_dtypes(cupy)
        elif name == "numpy":
            import numpy

            self.mod = numpy
            self.device = None
            self.dtypes = _numpy_dtypes(numpy)
        else:
            raise ValueError(f"framework must be 'torch', 'cupy' or 'numpy', not {name!r}")

    @property
    def gpu(self):
        return self.name != "numpy"

    def empty(self, n):
        if self.name == "torch":
            return self.mod.empty(n, dtype=self.mod.uint8, device=self.device)
        if self.name == "cupy":
            with self.device:
                return self.mod.empty(n, dtype=self.mod.uint8)
        return self.mod.empty(n, dtype=self.mod.uint8)

    def current_stream(self):
        if self.name == "torch":
            return self.mod.cuda.current_stream(self.device)
        if self.name == "cupy":
            return self.mod.cuda.get_current_stream()
        return None

    def new_stream(self):
        if self.name == "torch":
            return self.mod.cuda.Stream(self.device)
        with self.device:
            return self.mod.cuda.Stream(non_blocking=True)

    def event(self, timing=False):
        if self.name == "torch":
            return self.mod.cuda.Event(enable_timing=timing)
        with self.device:
            return self.mod.cuda.Event(disable_timing=not timing)

    @staticmethod
    def wait(stream, event):
        stream.wait_event(event)

    @staticmethod
    def record(event, stream):
        event.record(stream)

    def dtype(self, t):
        d = self.dtypes.get(t["dtype"])
        if d is None:
            raise TypeError(f"tensor '{t['name']}': {self.name} has no {t['dtype']} (load it with framework='torch')")
        return d

    def view(self, buffer, offset, t):
        """Tensor ``t`` at ``offset`` of ``buffer``: a view, or (misaligned) a copy; and whether copied."""
        n = t["end"] - t["begin"]
        raw = buffer[offset:offset + n]
        dtype = self.dtype(t)
        copied = offset % t["element_bytes"] != 0 and self.gpu
        if copied:
            raw = raw.clone() if self.name == "torch" else raw.copy()
        return raw.view(dtype).reshape(t["shape"]), copied


class Loaded(dict):
    """``{name: tensor}``, with what the load took: ``bytes_read`` (whole blocks), ``tensor_bytes``,
    ``copied_bytes`` (misaligned tensors copied once), ``seconds`` (enqueue to done, host clock)
    and ``buffer`` (the one array the tensors are views of)."""

    bytes_read = 0
    tensor_bytes = 0
    copied_bytes = 0
    seconds = 0.0
    buffer = None


class SafetensorsFile:
    """A safetensors file on a device: its header read through ``dev`` and checked.

    ``path_or_placement``: a path (the device is the emulator backed by that file: the file from
    LBA 0 on, its size from the path) or a ``Placement``."""

    def __init__(self, dev, path_or_placement):
        if isinstance(path_or_placement, Placement):
            self.placement = path_or_placement
        else:
            path = os.fspath(path_or_placement)
            self.placement = Placement.contiguous(dev, os.path.getsize(path), source=path)
        if self.placement.block_size != dev.block_size:
            raise ValueError(f"the placement has {self.placement.block_size}-byte blocks, the device {dev.block_size}")
        self.dev = dev
        source = self.placement.source
        first8 = self._read_host(0, 8)
        n = _cunvme.safetensors_header_length(first8, self.placement.file_size, source)
        self.header = _cunvme.safetensors_header(self._read_host(8, n), self.placement.file_size, source)
        self.tensors = {t["name"]: t for t in self.header["tensors"]}
        self.metadata = self.header["metadata"]

    def _read_host(self, offset, length):
        """File bytes [offset, offset + length) through the host path (no numpy needed)."""
        size, reads, offsets = _cunvme.plan_reads(self.placement.block_size, self.placement.file_size, self.placement.extents, [(offset, length)])
        buf = bytearray(size)
        view = memoryview(buf)
        for lba, blocks, at in reads:
            self.dev.read(lba, blocks, view[at:], sync=True)
        view.release()
        return bytes(buf[offsets[0]:offsets[0] + length])

    def names(self):
        """Tensor names in file order."""
        return [t["name"] for t in self.header["tensors"]]

    def _select(self, names):
        if names is None:
            return list(self.header["tensors"])
        missing = [n for n in names if n not in self.tensors]
        if missing:
            raise KeyError(f"no tensor {missing[0]!r} in {self.placement.source} ({len(missing)} of {len(names)} names missing)")
        return [self.tensors[n] for n in names]

    def _enqueue(self, fw, tensors, buffer, stream):
        """Reads for ``tensors`` into ``buffer`` (or a new array); returns (buffer, offsets, transfers, bytes read)."""
        data = self.header["data_offset"]
        size, reads, offsets = _cunvme.plan_reads(self.placement.block_size, self.placement.file_size, self.placement.extents,
                                                  [(data + t["begin"], t["end"] - t["begin"]) for t in tensors])
        if buffer is None:
            buffer = fw.empty(size)
        transfers = []
        bs = self.placement.block_size
        for lba, blocks, at in reads:
            if fw.gpu:
                transfers.append(self.dev.read(lba, blocks, buffer[at:at + blocks * bs], stream=stream))
            else:
                self.dev.read(lba, blocks, buffer[at:at + blocks * bs])
        return buffer, offsets, transfers, sum(b for _, b, _ in reads) * bs

    def _hand_out(self, fw, tensors, buffer, offsets, result):
        for t, at in zip(tensors, offsets):
            v, copied = fw.view(buffer, at, t)
            result[t["name"]] = v
            result.tensor_bytes += t["end"] - t["begin"]
            result.copied_bytes += (t["end"] - t["begin"]) if copied else 0
        return result

    def load(self, names=None, framework="torch", device=None, stream=None):
        """``names`` (all when None) read into one new array and handed out as views of it: a
        ``Loaded`` dict. GPU reads run on ``stream`` (default: the current stream) and are waited
        for before it returns (their errors raised), so the tensors are ready on any stream."""
        fw = _Framework(framework, device)
        tensors = self._select(names)
        for t in tensors:
            fw.dtype(t)  # refuse a dtype the framework lacks before reading anything
        start = time.perf_counter()
        current = fw.current_stream()
        if fw.gpu and stream is not None and stream != current:
            stream.wait_stream(current) if fw.name == "torch" else stream.wait_event(current.record())
        buffer, offsets, transfers, read = self._enqueue(fw, tensors, None, stream if stream is not None else current)
        for tr in transfers:
            tr.wait()
        result = Loaded()
        result.bytes_read = read
        result.buffer = buffer
        self._hand_out(fw, tensors, buffer, offsets, result)
        result.seconds = time.perf_counter() - start
        return result

    def layers(self, framework="torch", device=None, names=None, layer_key=None):
        """A ``LayerIterator`` over groups of tensors (``layer_key(name)``, default
        ``default_layer_key``: 'model.layers.3.w' -> 'model.layers.3'; names without a number
        form the group '' which comes first; groups in natural order)."""
        return LayerIterator(self, _Framework(framework, device), self._select(names), layer_key or _cunvme.default_layer_key)


class LayerIterator:
    """Yields ``(key, Loaded)`` per layer, double buffered: two arrays, each the size of the
    largest layer; while the caller computes on layer k (enqueued on the current stream), layer
    k + 1's reads run on the iterator's own load stream into the other array. Events order
    reuse: layer k + 2's reads wait for the work the caller enqueued on layer k before asking for
    the next one. So: **a layer's tensors are valid until the iterator has moved two layers on**
    (clone what you keep), and enqueue work on them on the stream that was current when they
    were yielded.

    ``load_events``: per layer, (start, end) timing events on the load stream (torch and cupy),
    for measuring how far loads overlapped compute. numpy: no streams; layers load in turn."""

    def __init__(self, file, fw, tensors, layer_key):
        self.file = file
        self.fw = fw
        keys = [layer_key(t["name"]) for t in tensors]
        self.groups = [(key, [tensors[i] for i in idx]) for key, idx in _cunvme.group_keys(keys)]
        data = file.header["data_offset"]
        pl = file.placement
        sizes = [_cunvme.plan_reads(pl.block_size, pl.file_size, pl.extents, [(data + t["begin"], t["end"] - t["begin"]) for t in g])[0]
                 for _, g in self.groups]
        self.buffer_bytes = max(sizes, default=0)
        self.load_events = []
        self.bytes_read = 0

    def __len__(self):
        return len(self.groups)

    def keys(self):
        return [k for k, _ in self.groups]

    def __iter__(self):
        fw = self.fw
        for _, g in self.groups:
            for t in g:
                fw.dtype(t)
        buffers = [fw.empty(self.buffer_bytes), fw.empty(self.buffer_bytes)]
        count = len(self.groups)
        if count == 0:
            return
        if not fw.gpu:
            for k, (key, _) in enumerate(self.groups):
                yield key, self._loaded(k, buffers[k % 2])
            return
        load = fw.new_stream()
        # The buffers were allocated on the current stream: the load stream starts after it.
        allocated = fw.event()
        fw.record(allocated, fw.current_stream())
        fw.wait(load, allocated)
        released = [None, None]
        pending = self._enqueue(0, buffers, load, released)
        for k in range(count):
            following = self._enqueue(k + 1, buffers, load, released) if k + 1 < count else None
            result = self._finish(k, buffers, pending)
            current = fw.current_stream()
            fw.wait(current, pending["loaded"])
            yield self.groups[k][0], result
            # Whatever the caller enqueued on layer k is on `current` now: the buffer is free
            # for layer k + 2 once `current` passes this event.
            released[k % 2] = fw.event()
            fw.record(released[k % 2], current)
            pending = following

    def _enqueue(self, k, buffers, load, released):
        fw = self.fw
        if released[k % 2] is not None:
            fw.wait(load, released[k % 2])
        start, loaded = fw.event(timing=True), fw.event(timing=True)
        fw.record(start, load)
        _, offsets, transfers, read = self.file._enqueue(fw, self.groups[k][1], buffers[k % 2], load)
        fw.record(loaded, load)
        self.load_events.append((start, loaded))
        self.bytes_read += read
        return {"offsets": offsets, "transfers": transfers, "loaded": loaded, "read": read}

    def _finish(self, k, buffers, pending):
        for tr in pending["transfers"]:
            tr.wait()
        result = Loaded()
        result.bytes_read = pending["read"]
        result.buffer = buffers[k % 2]
        return self.file._hand_out(self.fw, self.groups[k][1], buffers[k % 2], pending["offsets"], result)

    def _loaded(self, k, buffer):
        _, offsets, _, read = self.file._enqueue(self.fw, self.groups[k][1], buffer, None)
        self.bytes_read += read
        result = Loaded()
        result.bytes_read = read
        result.buffer = buffer
        return self.file._hand_out(self.fw, self.groups[k][1], buffer, offsets, result)


def load_safetensors(dev, path_or_placement, framework="torch", device=None, names=None, stream=None):
    """The tensors ``names`` (all when None) of the safetensors file ``path_or_placement`` on
    ``dev``: a ``Loaded`` dict of torch, cupy or numpy arrays (see ``SafetensorsFile.load``).
    numpy goes through the host path (no GPU needed)."""
    return SafetensorsFile(dev, path_or_placement).load(names, framework, device, stream)


def iter_layers(dev, path_or_placement, framework="torch", device=None, names=None, layer_key=None):
    """``(key, Loaded)`` per layer, double buffered (see ``LayerIterator``)."""
    return SafetensorsFile(dev, path_or_placement).layers(framework, device, names, layer_key)

