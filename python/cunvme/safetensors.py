"""Safetensors files on a cunvme device: named tensors read straight into torch, cupy or numpy
arrays, all at once or one layer at a time with the next layer's reads running while the caller
computes on the current one.

    import cunvme, torch
    with cunvme.Device("emu:file=model.safetensors,readonly") as dev:
        weights = cunvme.load_safetensors(dev, "model.safetensors")          # {name: torch tensor}
        for key, layer in cunvme.iter_layers(dev, "model.safetensors"):      # the next layer read meanwhile
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
    # F4 is packed two to a byte: torch's float4_e2m1fn_x2 holds such a pair (see _PACKED).
    # F6_E2M3 and F6_E3M2 have no torch dtype (nor numpy's, nor cupy's).
    names = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "F16": "float16", "BF16": "bfloat16",
             "I32": "int32", "U32": "uint32", "F32": "float32", "C64": "complex64", "I64": "int64", "U64": "uint64", "F64": "float64",
             "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu",
             "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz", "F4": "float4_e2m1fn_x2"}
    return {k: getattr(torch, v) for k, v in names.items() if hasattr(torch, v)}


# Sub-byte types a framework holds as several elements per item: the last dimension shrinks by
# this factor (as safetensors' own torch loader does).
_PACKED = {"F4": 2}


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

    def used_on(self, array, stream):
        """Tells the allocator that ``array`` (allocated on the current stream) is used on
        ``stream`` too (torch; cupy and numpy need nothing)."""
        if self.name == "torch" and stream is not None:
            array.record_stream(stream)

    def stream_scope(self, stream):
        """A context in which ``stream`` is the current stream (numpy: nothing)."""
        if self.name == "torch":
            return self.mod.cuda.stream(stream)
        if self.name == "cupy":
            return stream
        import contextlib

        return contextlib.nullcontext()

    def elapsed_seconds(self, start, end):
        """Seconds between two timing events (recorded, and ``end`` done)."""
        if self.name == "torch":
            return start.elapsed_time(end) / 1e3
        return self.mod.cuda.get_elapsed_time(start, end) / 1e3

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
            other = " (load it with framework='torch')" if t["dtype"] in _torch_dtype_names() and self.name != "torch" else ""
            raise TypeError(f"tensor '{t['name']}': {self.name} has no {t['dtype']}{other}")
        return d

    def shape(self, t):
        """``t``'s shape in items of its framework dtype (packed types: fewer in the last dimension)."""
        shape = tuple(t["shape"])
        per = _PACKED.get(t["dtype"], 1) if self.name == "torch" else 1
        if per == 1:
            return shape
        if not shape or shape[-1] % per != 0:
            raise TypeError(f"tensor '{t['name']}': {t['dtype']} of shape {list(shape)} does not fill whole {self.dtypes[t['dtype']]} "
                            f"items ({per} elements each, along the last dimension)")
        return shape[:-1] + (shape[-1] // per,)

    def check(self, t):
        """Refuses, before anything is read, a tensor this framework cannot hold."""
        self.dtype(t)
        self.shape(t)

    def view(self, buffer, offset, t):
        """Tensor ``t`` at ``offset`` of ``buffer``: a view, or (misaligned) a copy; and whether copied."""
        n = t["end"] - t["begin"]
        raw = buffer[offset:offset + n]
        dtype = self.dtype(t)
        copied = offset % t["element_bytes"] != 0 and self.gpu
        if copied:
            raw = raw.clone() if self.name == "torch" else raw.copy()
        return raw.view(dtype).reshape(self.shape(t)), copied


def _hand_out(fw, tensors, buffer, offsets, result):
    """Tensors ``tensors`` at ``offsets`` of ``buffer`` into ``result`` (a ``Loaded``), counted."""
    for t, at in zip(tensors, offsets):
        v, copied = fw.view(buffer, at, t)
        result[t["name"]] = v
        result.tensor_bytes += t["end"] - t["begin"]
        result.copied_bytes += (t["end"] - t["begin"]) if copied else 0
    return result


class Loaded(dict):
    """``{name: tensor}``, with what the load took: ``bytes_read`` (whole blocks), ``tensor_bytes``,
    ``copied_bytes`` (misaligned tensors copied once), ``seconds`` (enqueue to done, host clock)
    and ``buffer`` (the one array the tensors are views of); a distributed load also sets
    ``metrics`` (``cunvme.distributed``)."""

    metrics = None
    bytes_read = 0
    tensor_bytes = 0
    copied_bytes = 0
    seconds = 0.0
    buffer = None


def _torch_dtype_names():
    return {"BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "I64", "U64", "F64", "F8_E5M2", "F8_E4M3",
            "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F4"}


def _emulator_file(uri):
    """The ``file=`` option of an ``emu:`` URI; "" for an emulator without one; None for any other device."""
    scheme, _, options = uri.partition(":")
    if scheme != "emu":
        return None
    for option in options.split(","):
        key, _, value = option.partition("=")
        if key == "file":
            return value
    return ""


def _check_backing_file(dev, path):
    """A path names the file the device serves from LBA 0: the emulator opened on it. Checked
    where the device says (``emu:file=``: the same file by st_dev and st_ino, so another name for
    it is fine); a real controller cannot tell which file lies on it, and the path is then taken
    at its word."""
    uri = getattr(dev, "uri", None)
    backing = None if uri is None else _emulator_file(uri)
    if backing is None:
        return
    if backing == "":
        raise ValueError(f"{uri} is not backed by a file, so {path!r} cannot be on it: open the device as 'emu:file={path}' "
                         "or give a Placement")
    mine, theirs = os.stat(path), os.stat(backing)
    if (mine.st_dev, mine.st_ino) != (theirs.st_dev, theirs.st_ino):
        raise ValueError(f"{path!r} is not the file the device serves ({uri} is backed by {backing!r}): the tensors would be read "
                         "from the wrong bytes")


class SafetensorsFile:
    """A safetensors file on a device: its header read through ``dev`` and checked.

    ``path_or_placement``: a path or a ``Placement``. A path says "the device is the emulator
    backed by this file" (the file from LBA 0 on): its size comes from the path, and the device
    must be ``emu:file=`` that same file (compared by st_dev and st_ino; ``ValueError`` if not).
    For any other device the bytes are read from the device, never from the path, which then
    only gives the size: use a ``Placement`` for a file on a real controller."""

    def __init__(self, dev, path_or_placement):
        if isinstance(path_or_placement, Placement):
            self.placement = path_or_placement
        else:
            path = os.fspath(path_or_placement)
            _check_backing_file(dev, path)
            self.placement = Placement.contiguous(dev, os.path.getsize(path), source=path)
        if self.placement.block_size != dev.block_size:
            raise ValueError(f"the placement has {self.placement.block_size}-byte blocks, the device {dev.block_size}")
        self.dev = dev
        source = self.placement.source
        first8 = self._read_host(0, min(8, self.placement.file_size))
        n = _cunvme.safetensors_header_length(first8, self.placement.file_size, source)
        self.header = _cunvme.safetensors_header(self._read_host(8, n), self.placement.file_size, source)
        self.tensors = {t["name"]: t for t in self.header["tensors"]}
        self.metadata = self.header["metadata"]

    def plan(self, ranges):
        """The reads of file byte ranges ``[(offset, length)]`` by the C++ planner: ``(buffer
        bytes, [(lba, blocks, buffer offset)], [each range's offset in the buffer])``."""
        pl = self.placement
        return _cunvme.plan_reads(pl.block_size, pl.file_size, pl.extents, ranges)

    def plan_tensors(self, tensors):
        """``plan`` for the data of ``tensors`` (header dicts), in their order."""
        data = self.header["data_offset"]
        return self.plan([(data + t["begin"], t["end"] - t["begin"]) for t in tensors])

    def read_blocks(self, fw, lba, blocks, buffer, at, stream):
        """One planned read into ``buffer[at:]``: a GPU array's is enqueued on ``stream`` and its
        ``Transfer`` returned; a host array's is done when this returns (None)."""
        part = buffer[at:at + blocks * self.placement.block_size]
        if fw.gpu:
            return self.dev.read(lba, blocks, part, stream=stream)
        self.dev.read(lba, blocks, part)
        return None

    def _read_host(self, offset, length):
        """File bytes [offset, offset + length) through the host path (no numpy needed)."""
        if length == 0:
            return b""
        size, reads, offsets = self.plan([(offset, length)])
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
        size, reads, offsets = self.plan_tensors(tensors)
        if buffer is None:
            buffer = fw.empty(size)
        transfers = [self.read_blocks(fw, lba, blocks, buffer, at, stream) for lba, blocks, at in reads]
        return buffer, offsets, [tr for tr in transfers if tr is not None], sum(b for _, b, _ in reads) * self.placement.block_size

    def load(self, names=None, framework="torch", device=None, stream=None):
        """``names`` (all when None) read into one new array and handed out as views of it: a
        ``Loaded`` dict. GPU reads run on ``stream`` (default: a new non-blocking stream that
        waits for the current one) and are waited for before it returns (their errors raised),
        so the tensors are ready on any stream."""
        fw = _Framework(framework, device)
        tensors = self._select(names)
        for t in tensors:
            fw.check(t)  # refuse a dtype the framework lacks before reading anything
        start = time.perf_counter()
        current = fw.current_stream()
        if fw.gpu and stream is None:
            # Not the current stream, which is torch's and cupy's legacy default stream unless
            # the caller chose another: another thread's synchronous copy there (``.cpu()``)
            # would wait for these reads' kernels while holding a driver lock that the
            # emulator's data copies for those kernels need, and the reads would time out.
            stream = fw.new_stream()
        if fw.gpu and stream != current:
            stream.wait_stream(current) if fw.name == "torch" else stream.wait_event(current.record())
        buffer, offsets, transfers, read = self._enqueue(fw, tensors, None, stream if stream is not None else current)
        for tr in transfers:
            tr.wait()
        result = Loaded()
        result.bytes_read = read
        result.buffer = buffer
        _hand_out(fw, tensors, buffer, offsets, result)
        result.seconds = time.perf_counter() - start
        return result

    def layers(self, framework="torch", device=None, names=None, layer_key=None):
        """A ``LayerIterator`` over groups of tensors (``layer_key(name)``, default
        ``default_layer_key``: 'model.layers.3.w' -> 'model.layers.3'; names without a number
        form the group '' which comes first; groups in natural order)."""
        return LayerIterator(self, _Framework(framework, device), self._select(names), layer_key or _cunvme.default_layer_key)


class LayerIterator:
    """Yields ``(key, Loaded)`` per layer, the next layer's reads running while the caller
    computes on the current one. **A layer's tensors are valid until the iterator has moved two
    layers on**: while layer k + 1 is the current one, layer k's tensors are intact (compute on k
    may still run under k + 1's); asking for layer k + 2 ends them (clone what you keep). Enqueue
    work on a layer on the stream that was current when it was yielded.

    torch and cupy: three arrays, each the size of the largest layer, taken in turn. When layer k
    is asked for, layer k + 1's reads are enqueued on the iterator's own load stream into the
    array of layer k - 2 (which the caller has just moved two layers past), after an event
    recorded then on the stream layer k - 2 was yielded on: the reads wait for the work the
    caller enqueued on it. Two arrays would have to choose between the promise and the overlap:
    layer k + 1's reads would go into layer k - 1's array while k - 1 must stay valid.

    numpy: no streams; each layer is read when asked for, into two arrays taken in turn.

    ``load_events``: per layer, (start, end) timing events on the load stream (torch and cupy),
    for measuring how far loads overlapped compute. An iterator of pairs: ``dict(iter_layers(…))``
    maps keys to layers (the promise above still holds for their tensors)."""

    # Arrays the GPU path takes in turn: the current layer, the one before it (still valid) and
    # the one being read.
    gpu_buffers = 3

    def __init__(self, file, fw, tensors, layer_key):
        self.file = file
        self.fw = fw
        keys = [layer_key(t["name"]) for t in tensors]
        self.groups = [(key, [tensors[i] for i in idx]) for key, idx in _cunvme.group_keys(keys)]
        self.buffer_bytes = max((file.plan_tensors(g)[0] for _, g in self.groups), default=0)
        self.load_events = []
        self.bytes_read = 0

    def __len__(self):
        return len(self.groups)

    def layer_keys(self):
        """The layers' keys, in the order they come. (Not ``keys()``: ``dict()`` would take the
        iterator for a mapping.)"""
        return [k for k, _ in self.groups]

    def __iter__(self):
        fw = self.fw
        for _, g in self.groups:
            for t in g:
                fw.check(t)
        count = len(self.groups)
        if count == 0:
            return
        if not fw.gpu:
            buffers = [fw.empty(self.buffer_bytes), fw.empty(self.buffer_bytes)]
            for k, (key, _) in enumerate(self.groups):
                yield key, self._loaded(k, buffers[k % 2])
            return
        buffers = [fw.empty(self.buffer_bytes) for _ in range(self.gpu_buffers)]
        load = fw.new_stream()
        # The buffers were allocated on the current stream: the load stream starts after it.
        allocated = fw.event()
        fw.record(allocated, fw.current_stream())
        fw.wait(load, allocated)
        # Per array: the stream its layer was yielded on (None before the first).
        used_on = [None] * self.gpu_buffers
        pending = self._enqueue(0, buffers, load, used_on)
        for k in range(count):
            following = self._enqueue(k + 1, buffers, load, used_on) if k + 1 < count else None
            result = self._finish(k, buffers, pending)
            current = fw.current_stream()
            fw.wait(current, pending["loaded"])
            used_on[k % self.gpu_buffers] = current
            yield self.groups[k][0], result
            pending = following

    def _enqueue(self, k, buffers, load, used_on):
        fw = self.fw
        slot = k % self.gpu_buffers
        if used_on[slot] is not None:
            # Everything the caller enqueued on the layer that held this array is on that stream
            # now: the reads start after it.
            released = fw.event()
            fw.record(released, used_on[slot])
            fw.wait(load, released)
        start, loaded = fw.event(timing=True), fw.event(timing=True)
        fw.record(start, load)
        _, offsets, transfers, read = self.file._enqueue(fw, self.groups[k][1], buffers[slot], load)
        fw.record(loaded, load)
        self.load_events.append((start, loaded))
        self.bytes_read += read
        return {"offsets": offsets, "transfers": transfers, "loaded": loaded, "read": read}

    def _finish(self, k, buffers, pending):
        for tr in pending["transfers"]:
            tr.wait()
        result = Loaded()
        result.bytes_read = pending["read"]
        result.buffer = buffers[k % self.gpu_buffers]
        return _hand_out(self.fw, self.groups[k][1], result.buffer, pending["offsets"], result)

    def _loaded(self, k, buffer):
        _, offsets, _, read = self.file._enqueue(self.fw, self.groups[k][1], buffer, None)
        self.bytes_read += read
        result = Loaded()
        result.bytes_read = read
        result.buffer = buffer
        return _hand_out(self.fw, self.groups[k][1], buffer, offsets, result)


def load_safetensors(dev, path_or_placement, framework="torch", device=None, names=None, stream=None, process_group=None, shard=None,
                     staging_bytes=None, progress=None, chunk_bytes=None):
    """The tensors ``names`` (all when None) of the safetensors file ``path_or_placement`` on
    ``dev``: a ``Loaded`` dict of torch, cupy or numpy arrays (see ``SafetensorsFile.load``).
    numpy goes through the host path (no GPU needed).

    With ``process_group`` (a ``torch.distributed`` group, never the world group implicitly) the
    ranks of the group load together (``cunvme.distributed``): ``path_or_placement`` may then
    also be an index JSON or a list of files, ``names`` may hold globs, ``shard`` gives the
    tensors sliced along a dimension per rank, ``staging_bytes`` bounds the staging array,
    ``chunk_bytes`` is the step of the read/exchange pipeline (default 128 MiB), and ``dev`` may
    be a ``{path: Device}`` mapping or a ``path -> Device`` callable."""
    if process_group is not None:
        from .distributed import load_distributed

        if stream is not None:
            raise ValueError("a distributed load runs on the current stream: stream= cannot be combined with process_group=")
        more = {} if chunk_bytes is None else {"chunk_bytes": chunk_bytes}
        return load_distributed(dev, path_or_placement, process_group, framework, device, names, shard, staging_bytes, progress, **more)
    if shard is not None or staging_bytes is not None or chunk_bytes is not None or progress is not None:
        raise ValueError("shard=, staging_bytes=, chunk_bytes= and progress= need process_group=: without a group there is no one to "
                         "share with")
    return SafetensorsFile(dev, path_or_placement).load(names, framework, device, stream)


def iter_layers(dev, path_or_placement, framework="torch", device=None, names=None, layer_key=None):
    """``(key, Loaded)`` per layer, the next one read while the caller computes (see ``LayerIterator``)."""
    return SafetensorsFile(dev, path_or_placement).layers(framework, device, names, layer_key)

