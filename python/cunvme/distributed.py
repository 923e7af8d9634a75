"""Loading a checkpoint across the ranks of a ``torch.distributed`` process group: every rank reads
a disjoint share of the checkpoint's bytes straight into its own GPU, balanced by bytes, and the
group's own collectives (NCCL, gloo) hand each rank the tensors it asked for.

    import torch, torch.distributed as dist, cunvme
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    tp = dist.new_group(list(range(dist.get_world_size())))
    open_file = lambda path: cunvme.Device(f"emu:file={path},readonly")
    weights = cunvme.load_safetensors(open_file, "model.safetensors.index.json", process_group=tp,
                                      shard={"*.mlp.up_proj.weight": 0, "*.o_proj.weight": 1})

Modes. Tensors not named in ``shard`` are **replicated**: each is read by one rank (the ranks'
shares are runs of the checkpoint in file order, split by bytes) into its place in one flat
array that every rank holds, and each rank's run is then broadcast from it. A tensor matched by
``shard`` (``{name or glob: dim}``) is **sharded**: rank r of the group gets its slice along
``dim`` (``torch.tensor_split`` sizes: the first ``size % ranks`` slices one longer) and reads
only that — the slice's bytes where they are contiguous (dim 0, or leading dimensions of 1),
else runs of whole rows through a staging array of at most ``staging_bytes`` — and nothing is
exchanged for it.

Which group: ``process_group`` is used as given (any subgroup); the world group is never used
unless passed. Which GPU: the group's device (``bound_device_id``, set by ``init_process_group
(device_id=…)``) or else the current CUDA device — never the global rank. A ``Device`` serving
another GPU is refused.

Where the bytes come from: ``dev`` is a ``Device`` (one file, or ``Placement`` s on one real
controller), a mapping ``{path: Device}``, or a callable ``path -> Device`` (each rank its own
emulator over the file, ``emu:file=PATH``, or an ``attach:`` one shared per host). Ranks on
different hosts each read their local copy: the paths are each host's own.

Errors: a rank whose planning or reads fail does not leave the others waiting in a collective:
every rank reaches the status exchange, and then every rank raises ``DistributedLoadError``
naming the failing ranks, files and tensors. A rank that dies is the process group's timeout's.
"""

import bisect
import fnmatch
import hashlib
import json
import os
import sys
import time

from ._errors import Error, FormatError
from .safetensors import Loaded, Placement, SafetensorsFile, _Framework, _hand_out

__all__ = ["Collectives", "DistributedLoadError", "load_distributed", "read_index", "select", "shard_slices", "split_by_bytes", "split_reads"]


class DistributedLoadError(Error):
    """Raised on every rank when any rank's part of a distributed load failed. ``failures``:
    ``[(group rank, message)]``."""

    def __init__(self, message, failures):
        super().__init__(message)
        self.failures = failures


# --- The checkpoint: files, index, selection --------------------------------------------------


def read_index(path):
    """A sharded checkpoint's index (``model.safetensors.index.json``): ``(files, weight_map)``,
    the files (paths beside the index, sorted) and ``{tensor name: path}``. Refuses
    (``FormatError``) what is not JSON, a missing or malformed ``weight_map``, and file names that
    leave the index's folder."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            index = json.loads(f.read().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise FormatError(f"{path}: not a JSON index of safetensors files ({e})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise FormatError(f"{path}: no \"weight_map\" object naming the file of each tensor")
    folder = os.path.dirname(os.path.abspath(path))
    files = {}
    for name, file in weight_map.items():
        if not isinstance(file, str) or not file or os.path.isabs(file) or os.sep in os.path.normpath(file) or os.path.normpath(file) in (os.curdir, os.pardir):
            raise FormatError(f"{path}: tensor {name!r} names {file!r}, not a file beside the index")
        files[name] = os.path.join(folder, file)
    return sorted(set(files.values())), files


def _picks(pattern, name, names):
    """Whether ``pattern`` picks ``name``: a pattern that is the name of a tensor of ``names``
    picks that tensor alone (names may hold '[', '*' or '?'); any other is a glob."""
    return name == pattern if pattern in names else fnmatch.fnmatchcase(name, pattern)


def select(names, patterns):
    """The names (in the given order) that ``patterns`` (exact names or globs) pick; all when
    ``patterns`` is None. A pattern that picks nothing is a ``KeyError``."""
    if patterns is None:
        return list(names)
    if isinstance(patterns, str):
        raise TypeError("names must be a list of names or globs, not one string")
    picked = set()
    known = set(names)
    for p in patterns:
        hit = [n for n in names if _picks(p, n, known)]
        if not hit:
            raise KeyError(f"{p!r} matches no tensor of the checkpoint")
        picked.update(hit)
    return [n for n in names if n in picked]


# --- Planning (pure: every rank computes the same plan) ----------------------------------------


def split_by_bytes(sizes, ranks):
    """Owner rank of each item: contiguous runs in order, balanced by bytes (item i goes to the
    rank whose equal share of the total holds the middle of its bytes)."""
    if ranks < 1:
        raise ValueError("a group has at least one rank")
    total = sum(sizes)
    owners, at = [], 0
    for s in sizes:
        owners.append(min(ranks - 1, (2 * at + s) * ranks // (2 * total)) if total else 0)
        at += s
    return owners


def shard_slices(length, ranks):
    """``[(begin, end)]`` per rank along a dimension of ``length``, as ``torch.tensor_split``
    cuts it: the first ``length % ranks`` slices one longer."""
    base, extra = divmod(length, ranks)
    out, at = [], 0
    for r in range(ranks):
        n = base + (1 if r < extra else 0)
        out.append((at, at + n))
        at += n
    return out


def _shard_dims(tensors, shard):
    """``{name: dim}`` for the selected tensors ``shard`` matches (first pattern in order)."""
    if not shard:
        return {}
    dims, used = {}, set()
    known = {t["name"] for t in tensors}
    for t in tensors:
        for pattern, dim in shard.items():
            if _picks(pattern, t["name"], known):
                rank = len(t["shape"])
                if not isinstance(dim, int) or not -rank <= dim < rank:
                    raise ValueError(f"tensor {t['name']!r} of shape {list(t['shape'])} has no dimension {dim!r} to shard along")
                if t["element_bits"] % 8 != 0:
                    raise ValueError(f"tensor {t['name']!r}: {t['dtype']} packs several elements per byte and cannot be sharded")
                dims[t["name"]] = dim % rank
                used.add(pattern)
                break
    unused = [p for p in shard if p not in used]
    if unused:
        raise KeyError(f"shard pattern {unused[0]!r} matches no selected tensor")
    return dims


def _rows(t, dim):
    """``(outer, length, inner_bytes)``: ``t`` as [outer][length][inner bytes] around ``dim``."""
    outer = 1
    for s in t["shape"][:dim]:
        outer *= s
    inner = t["element_bytes"]
    for s in t["shape"][dim + 1:]:
        inner *= s
    return outer, t["shape"][dim], inner


# --- Collectives ------------------------------------------------------------------------------


class Collectives:
    """The two collectives a distributed load needs, over the group's ranks ``0..size-1``.
    ``load_distributed`` wraps a ``torch.distributed`` process group in one; a subclass may
    stand in for it (tests run ranks as threads that way)."""

    rank = 0
    size = 1

    def broadcast(self, array, src):
        """Every rank's ``array`` (same size everywhere) becomes rank ``src``'s."""
        raise NotImplementedError

    def all_gather_object(self, obj):
        """Every rank's ``obj``, in rank order, on every rank."""
        raise NotImplementedError

    def fence(self):
        """Waits until what the collectives wrote is in memory (torch: its current stream)."""


class _TorchGroup(Collectives):
    def __init__(self, pg):
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.pg = torch, dist, pg
        self.rank, self.size = dist.get_rank(pg), dist.get_world_size(pg)
        if self.rank < 0:
            raise ValueError("this process is not a member of process_group")

    def broadcast(self, array, src):
        t = array if isinstance(array, self.torch.Tensor) else self.torch.as_tensor(array)
        self.dist.broadcast(t, src=self.dist.get_global_rank(self.pg, src), group=self.pg)

    def all_gather_object(self, obj):
        out = [None] * self.size
        self.dist.all_gather_object(out, obj, group=self.pg)
        return out

    def fence(self):
        if self.torch.cuda.is_available():
            self.torch.cuda.current_stream().synchronize()


def _group_device(pg, framework, device):
    """The GPU this rank loads into: ``device`` if given, else the group's bound device, else
    the current one."""
    if device is not None or framework == "numpy":
        return device
    bound = getattr(pg, "bound_device_id", None)
    if bound is not None:
        return bound if framework == "torch" else bound.index  # cupy takes an ordinal
    if framework == "torch":
        import torch

        return torch.device("cuda", torch.cuda.current_device())
    return None


# --- The load ---------------------------------------------------------------------------------


class _Progress:
    """One line on stderr, rewritten (only on a terminal, and only where asked)."""

    def __init__(self, on, total_bytes):
        self.on, self.total, self.started = on, total_bytes, time.perf_counter()

    def show(self, phase, done):
        if self.on:
            gb = done / 1e9
            rate = gb / max(time.perf_counter() - self.started, 1e-9)
            sys.stderr.write(f"\rcunvme: {phase} {gb:.2f}/{self.total / 1e9:.2f} GB ({rate:.1f} GB/s)   ")
            sys.stderr.flush()

    def close(self):
        if self.on:
            sys.stderr.write("\n")


def _open_files(dev, source):
    """``[(SafetensorsFile, path or None)]`` and the index's ``{name: path}`` (or None)."""
    items = source if isinstance(source, (list, tuple)) else [source]
    weight_map = None
    expanded = []
    for item in items:
        if not isinstance(item, Placement) and os.fspath(item).endswith(".json"):
            files, names = read_index(item)
            weight_map = {**(weight_map or {}), **names}
            expanded.extend(files)
        else:
            expanded.append(item)
    opened = []
    for item in expanded:
        path = None if isinstance(item, Placement) else os.fspath(item)
        if not hasattr(dev, "read") and path is None:
            raise TypeError("a Placement is read through the one Device given as dev, not a mapping or a callable of paths")
        if callable(dev) and not hasattr(dev, "read"):
            d = dev(path)
        elif hasattr(dev, "get") and not hasattr(dev, "read"):
            d = dev.get(path)
            if d is None:
                raise KeyError(f"no Device given for {path}")
        else:
            d = dev
        opened.append((SafetensorsFile(d, item), path))
    if weight_map is not None:
        for f, path in opened:
            listed = {n for n, p in weight_map.items() if p == path}
            mine = set(f.tensors)
            if listed - mine:
                raise FormatError(f"the index lists {sorted(listed - mine)[0]!r} in {path}, which has no such tensor")
            if mine - listed:
                raise FormatError(f"{path} holds {sorted(mine - listed)[0]!r}, which the index does not list there")
    seen = {}
    for f, _ in opened:
        for n in f.tensors:
            if n in seen:
                raise FormatError(f"tensor {n!r} is in both {seen[n]} and {f.placement.source}")
            seen[n] = f.placement.source
    return [f for f, _ in opened]


def _align(n, a):
    return (n + a - 1) // a * a


def load_distributed(dev, source, process_group, framework="torch", device=None, names=None, shard=None, staging_bytes=None,
                     progress=None, chunk_bytes=128 << 20):
    """See the module's text. Returns a ``Loaded`` dict of this rank's tensors, with
    ``metrics``: this rank's bytes read, the time of its reads and of the whole exchange.
    ``chunk_bytes``: the pipeline's step (see ``split_reads``); a group of one rank reads in one step."""
    group = process_group if isinstance(process_group, Collectives) else _TorchGroup(process_group)
    rank, ranks = group.rank, group.size
    started = time.perf_counter()
    fw = layout = flat = None
    failure = digest = None
    try:
        fw = _Framework(framework, _group_device(process_group, framework, device))
        files = _open_files(dev, source)
        layout = _plan(files, names, shard, ranks)
        if not isinstance(chunk_bytes, int) or chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be a positive number of bytes, not {chunk_bytes!r}")
        for f in files:
            _check_gpu(f.dev, fw, rank)
        for f, t, _ in layout["tensors"]:
            fw.check(t)
        for f, t, _ in layout["sliced"]:
            fw.check(t)
        # The collectives' schedule: every rank must make the same calls with the same sizes,
        # which the digest compares (block sizes or chunk_bytes that differ between ranks change it).
        segments = layout["segments"]
        if ranks == 1:
            # Nothing to exchange, so nothing to pipeline with: one step (``chunk_bytes`` is not
            # used), which lets each file's reads go out as whole runs. On an H200 a 7.3 GB load
            # ran at 10.0-10.4 GB/s in 128 MiB steps and 12.8-14.2 in 1 GiB ones (P9 in
            # bench/RESULTS.md).
            chunk_bytes = max(chunk_bytes, layout["flat_bytes"], 1)
        chunks = [_chunk_count(lo, hi, chunk_bytes) for lo, hi in segments]
        pieces = split_reads(layout["reads"][rank], segments[rank][0], chunk_bytes)
        digest = hashlib.sha256(repr((layout["digest"], segments, layout["flat_bytes"], chunk_bytes)).encode()).hexdigest()
        # The result is allocated now, so that a rank without the memory for it fails here,
        # before any collective that would need its buffer; so are the streams and events.
        flat = fw.empty(max(layout["flat_bytes"], 1))
        main = fw.current_stream()
        reads = fw.new_stream() if fw.name == "torch" else main
        timing = (fw.event(timing=True), fw.event(timing=True)) if fw.gpu else None
    except Exception as e:  # every rank must reach the status exchange below
        failure = f"{type(e).__name__}: {e}"
    plan_seconds = time.perf_counter() - started
    _agree(group, "planning", failure, digest)

    # Reading and exchange, pipelined: chunk k of every rank's run is read, then broadcast from
    # its reader, while chunk k + 1 is read. On torch the reads run on a stream of their own and
    # the collectives wait for each chunk by event (a blocking collective makes the current
    # stream wait for it: reads on that stream would wait for every broadcast before them).
    # A failed read stops this rank's reading, not the schedule: every rank makes the same
    # collective calls, and the failure is raised on every rank after the status exchange.
    current = {"file": None, "tensor": None}
    transfers, sharded = [], {}
    exchange_started = time.perf_counter()
    if fw.name == "torch":
        reads.wait_stream(main)  # the result was allocated on the main stream
    host_read_seconds = 0.0
    bar = _Progress(progress if progress is not None else (rank == 0 and sys.stderr.isatty()), layout["flat_bytes"])
    if timing:
        fw.record(timing[0], reads)
    exchanged = 0
    for k in range(max(chunks, default=0)):
        if failure is None and k < len(pieces):
            began = time.perf_counter()
            try:
                for f, lba, blocks, at, first in pieces[k]:
                    current["file"], current["tensor"] = f, first
                    _read(f, fw, lba, blocks, flat, at, reads, transfers, first)
                if fw.gpu and fw.name != "torch":
                    _wait(transfers, current)  # other frameworks' streams are not the collectives'
            except Exception as e:
                failure = f"{type(e).__name__}{_where(current, e)}: {e}"
            host_read_seconds += time.perf_counter() - began
        if fw.name == "torch":
            chunk_read = fw.event()
            fw.record(chunk_read, reads)
            fw.wait(main, chunk_read)
        for r in range(ranks):
            if k < chunks[r]:
                lo, hi = segments[r]
                part = (lo + k * chunk_bytes, min(hi, lo + (k + 1) * chunk_bytes))
                if ranks > 1:
                    group.broadcast(flat[part[0]:part[1]], r)
                exchanged += part[1] - part[0]
        bar.show("exchange", exchanged)
    if failure is None:
        began = time.perf_counter()
        try:
            sharded = _read_slices(layout, fw, rank, ranks, reads, transfers, staging_bytes, current)
            _wait(transfers, current)
        except Exception as e:
            failure = f"{type(e).__name__}{_where(current, e)}: {e}"
        host_read_seconds += time.perf_counter() - began
    try:  # a failure here too must reach the status exchange rather than leave the others in it
        if timing:
            fw.record(timing[1], reads)
            fw.wait(main, timing[1])
            timing[1].synchronize()
            ended = fw.event()
            fw.record(ended, main)
            ended.synchronize()
        if fw.gpu and fw.name != "torch":
            group.fence()  # the collectives wrote on their own streams, not this framework's
    except Exception as e:
        failure = failure or f"{type(e).__name__} while waiting for the reads and the exchange: {e}"
    bar.close()
    exchange_seconds = time.perf_counter() - exchange_started
    _agree(group, "reading", failure, None)

    result = _hand_out(fw, [t for _, t, _ in layout["tensors"]], flat, [at for _, _, at in layout["tensors"]], Loaded())
    for name, tensor in sharded.items():
        result[name] = tensor
        result.tensor_bytes += tensor.nbytes
    result.buffer = flat
    result.bytes_read = layout["bytes_read"][rank]
    result.seconds = time.perf_counter() - started
    read_seconds = fw.elapsed_seconds(*timing) if timing else host_read_seconds  # both events done: waited for above
    received = sum(hi - lo for r, (lo, hi) in enumerate(segments) if r != rank)
    result.metrics = {
        "rank": rank, "ranks": ranks, "bytes_read": result.bytes_read, "plan_seconds": plan_seconds,
        "read_seconds": read_seconds, "read_gb_per_s": result.bytes_read / max(read_seconds, 1e-9) / 1e9,
        "received_bytes": received, "exchange_seconds": exchange_seconds,
        "exchange_gb_per_s": received / max(exchange_seconds, 1e-9) / 1e9, "seconds": result.seconds,
    }
    return result


def _chunk_count(lo, hi, chunk_bytes):
    return -(-(hi - lo) // chunk_bytes) if hi > lo else 0


def split_reads(reads, start, chunk_bytes):
    """``reads`` (``(file, lba, blocks, at, first tensor)``, ``at`` in the flat array) cut at
    whole blocks into the pipeline's chunks of ``chunk_bytes`` counted from ``start``: a list per
    chunk. A piece belongs to the chunk its first byte lies in and ends at the first block
    boundary at or past the chunk's end, so a chunk's bytes are all read by pieces of that chunk
    or an earlier one."""
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    out = []
    for f, lba, blocks, at, first in reads:
        bs = f.placement.block_size
        while blocks:
            k = (at - start) // chunk_bytes
            boundary = start + (k + 1) * chunk_bytes
            n = min(blocks, max(1, -(-(boundary - at) // bs)))
            while len(out) <= k:
                out.append([])
            out[k].append((f, lba, n, at, first))
            lba, blocks, at = lba + n, blocks - n, at + n * bs
    return out


def _wait(transfers, current):
    """Waits for every transfer in ``transfers`` (and empties it); raises the first failure."""
    while transfers:
        tr, (f, tensor) = transfers.pop(0)
        current["file"], current["tensor"] = f, tensor
        tr.wait()


def _where(current, error):
    """" (file, tensor 'x')" for a failed read: the tensors the failed command covered where the
    error names its blocks (a command may cover several tensors), else the one being read."""
    f = current["file"]
    if f is None:
        return ""
    lba, blocks = getattr(error, "lba", None), getattr(error, "blocks", None)
    covered = []
    if lba is not None and blocks:
        bs, data = f.placement.block_size, f.header["data_offset"]
        for file_offset, first, count in f.placement.extents:
            lo, hi = max(lba, first), min(lba + blocks, first + count)
            if lo < hi:
                a, b = file_offset + (lo - first) * bs, file_offset + (hi - first) * bs
                covered += [t["name"] for t in f.header["tensors"] if data + t["begin"] < b and data + t["end"] > a]
    if len(covered) > 1:
        return f" ({f.placement.source}, tensors {covered[0]!r} … {covered[-1]!r}, {len(covered)} in the failed command)"
    name = covered[0] if covered else current["tensor"]
    return f" ({f.placement.source}, tensor {name!r})"


def _check_gpu(d, fw, rank):
    ordinal = getattr(d, "gpu_ordinal", None)
    if not fw.gpu or ordinal is None or fw.device is None:
        return
    want = fw.device.index if hasattr(fw.device, "index") else getattr(fw.device, "id", None)
    if want is not None and ordinal != want:
        raise ValueError(f"rank {rank}: the Device serves GPU {ordinal}, the process group's device is GPU {want}")


def _agree(group, phase, failure, digest):
    """Every rank's status of ``phase``; raises the same error on every rank if any failed or
    (planning) the ranks' plans differ."""
    statuses = group.all_gather_object((failure, digest))
    failures = [(r, f) for r, (f, _) in enumerate(statuses) if f is not None]
    if failures:
        lines = "; ".join(f"rank {r}: {f}" for r, f in failures)
        raise DistributedLoadError(f"distributed load failed while {phase} on {len(failures)} of {group.size} rank(s): {lines}", failures)
    digests = {d for _, d in statuses}
    if len(digests) > 1:
        raise DistributedLoadError("the ranks planned different loads (other files, names or shard patterns on some ranks): "
                                   + ", ".join(f"rank {r}: {d[:12]}" for r, (_, d) in enumerate(statuses)), [])


def _read(f, fw, lba, blocks, buffer, at, stream, transfers, tensor):
    """``f.read_blocks``, its transfer (a GPU read's) noted with the file and tensor it serves."""
    tr = f.read_blocks(fw, lba, blocks, buffer, at, stream)
    if tr is not None:
        transfers.append((tr, (f, tensor)))


def _plan(files, names, shard, ranks):
    """Every rank's reads and the tensors' places: the same on every rank for the same inputs."""
    everything = [(f, t) for f in files for t in f.header["tensors"]]
    picked = set(select([t["name"] for _, t in everything], names))
    chosen = [(f, t) for f, t in everything if t["name"] in picked]
    dims = _shard_dims([t for _, t in chosen], shard)
    replicated = [(f, t) for f, t in chosen if t["name"] not in dims]
    owners = split_by_bytes([t["end"] - t["begin"] for _, t in replicated], ranks)
    reads = [[] for _ in range(ranks)]
    bytes_read = [0] * ranks
    segments, tensors = [], []
    cursor = 0
    for r in range(ranks):
        start = None
        mine = [(f, t) for (f, t), o in zip(replicated, owners) if o == r]
        for f in files:
            ts = [t for g, t in mine if g is f]
            if not ts:
                continue
            pl = f.placement
            # Each file's run starts block aligned: its tensors keep the file's alignment.
            cursor = _align(cursor, max(pl.block_size, 256))
            start = cursor if start is None else start
            size, plan, offsets = f.plan_tensors(ts)
            ends = [o + t["end"] - t["begin"] for t, o in zip(ts, offsets)]  # increasing: tensors in file order
            for lba, blocks, at in plan:
                first = ts[min(bisect.bisect_right(ends, at), len(ts) - 1)]["name"]  # the first tensor ending past `at`
                reads[r].append((f, lba, blocks, cursor + at, first))
                bytes_read[r] += blocks * pl.block_size
            tensors.extend((f, t, cursor + o) for t, o in zip(ts, offsets))
            cursor += size
        segments.append((cursor if start is None else start, cursor))
    sliced = [(f, t, dims[t["name"]]) for f, t in chosen if t["name"] in dims]
    for f, t, dim in sliced:
        outer, length, inner = _rows(t, dim)
        for r, (lo, hi) in enumerate(shard_slices(length, ranks)):
            bytes_read[r] += 0 if hi == lo else (hi - lo) * inner if outer == 1 else outer * length * inner
    h = hashlib.sha256(repr([(f.placement.file_size, t["name"], t["begin"], t["end"], tuple(t["shape"]), dims.get(t["name"])) for f, t in chosen]).encode())
    h.update(repr(ranks).encode())
    return {"reads": reads, "tensors": tensors, "segments": segments, "flat_bytes": cursor, "sliced": sliced, "bytes_read": bytes_read,
            "digest": h.hexdigest()}


def _read_slices(layout, fw, rank, ranks, stream, transfers, staging_bytes, current):
    """This rank's slices of the sharded tensors: ``{name: tensor}``. Read on ``stream``; the
    arrays are allocated on the current stream and marked as used on ``stream`` too (torch's
    allocator would otherwise hand their memory out again while ``stream`` still writes it)."""
    out = {}
    sliced = layout["sliced"]
    if not sliced:
        return out
    # Default: twice the largest sharded tensor, plus the block slack a read of rows may need.
    largest = max(t["end"] - t["begin"] + 2 * f.placement.block_size for f, t, _ in sliced)
    budget = 2 * largest if staging_bytes is None else int(staging_bytes)
    staging = None
    for f, t, dim in sliced:
        current["file"], current["tensor"] = f, t["name"]
        outer, length, inner = _rows(t, dim)
        lo, hi = shard_slices(length, ranks)[rank]
        pl, data = f.placement, f.header["data_offset"] + t["begin"]
        shape = list(t["shape"])
        shape[dim] = hi - lo
        piece = (hi - lo) * inner
        if outer * piece == 0:
            out[t["name"]], _ = fw.view(fw.empty(1), 0, dict(t, shape=shape, begin=0, end=0))  # no elements: nothing to read
            continue
        if outer == 1:
            # Contiguous: read just the slice's blocks, the tensor a view of them.
            size, plan, offsets = f.plan([(data + lo * inner, piece)])
            buffer = fw.empty(size)
            fw.used_on(buffer, stream)
            for lba, blocks, at in plan:
                _read(f, fw, lba, blocks, buffer, at, stream, transfers, t["name"])
            out[t["name"]], _ = fw.view(buffer, offsets[0], dict(t, shape=shape, begin=0, end=piece))
            continue
        # Strided: runs of whole rows into staging, the slice's part of each row copied out.
        row = length * inner
        per_chunk = (budget - 2 * pl.block_size) // row
        if per_chunk < 1:
            raise ValueError(f"staging_bytes={budget} cannot hold one row ({row} bytes, plus {2 * pl.block_size} of block slack) of "
                             f"{t['name']!r}, sharded along dimension {dim}: raise staging_bytes")
        per_chunk = min(per_chunk, outer)
        if staging is None or staging.shape[0] < per_chunk * row + 2 * pl.block_size:
            staging = fw.empty(per_chunk * row + 2 * pl.block_size)
            fw.used_on(staging, stream)
        result = fw.empty(outer * piece)
        fw.used_on(result, stream)
        for o0 in range(0, outer, per_chunk):
            o1 = min(outer, o0 + per_chunk)
            size, plan, offsets = f.plan([(data + o0 * row, (o1 - o0) * row)])
            for lba, blocks, at in plan:
                _read(f, fw, lba, blocks, staging, at, stream, transfers, t["name"])
            rows = staging[offsets[0]:offsets[0] + (o1 - o0) * row].reshape(o1 - o0, row)[:, lo * inner:hi * inner]
            dst = result[o0 * piece:o1 * piece].reshape(o1 - o0, piece)
            with fw.stream_scope(stream):  # after the reads into staging, before the next ones
                if fw.name == "torch":
                    dst.copy_(rows)
                else:
                    dst[...] = rows
        out[t["name"]], _ = fw.view(result, 0, dict(t, shape=shape, begin=0, end=outer * piece))
    return out
