"""Distributed loading (``cunvme.distributed``) on the host path: the planner's rules, and whole
loads by 1–4 ranks run as threads over a stand-in for a process group (``ThreadGroup``: the same
two collectives, torch not needed), each rank with its own emulator over the files. What every
rank ends with is compared with the files' bytes; failures must reach every rank as one error."""
import importlib.util
import json
import os
import pathlib
import tempfile
import threading
import time

import numpy as np
import pytest

import cunvme
from cunvme import distributed

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
_spec = importlib.util.spec_from_file_location("make_safetensors", EXAMPLES / "make_safetensors.py")
make_safetensors = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_safetensors)


class ThreadGroup(distributed.Collectives):
    """Rank ``rank`` of ``size`` ranks that are threads of this process (``shared`` is theirs).
    Every step checks that all ranks make the same call (operation, source, size), as a real
    group would need: a rank that differs fails the test instead of pairing with another call."""

    def __init__(self, shared, rank):
        self.shared, self.rank, self.size = shared, rank, shared["size"]

    def _step(self):
        self.shared["barrier"].wait(timeout=60)  # a hang becomes a BrokenBarrierError

    def _same_call(self, call):
        self.shared.setdefault("calls", [None] * self.size)[self.rank] = call
        self._step()
        calls = list(self.shared["calls"])
        if len(set(calls)) != 1:
            self.shared["barrier"].abort()
            raise AssertionError(f"the ranks made different collective calls: {calls}")

    def broadcast(self, array, src):
        self._same_call(("broadcast", src, array.shape, str(array.dtype)))
        if self.rank == src:
            self.shared["slot"] = np.array(array, copy=True)
        self._step()
        if self.rank != src:
            array[...] = self.shared["slot"]
        self._step()

    def all_gather_object(self, obj):
        self._same_call(("all_gather_object",))
        self.shared.setdefault("objects", [None] * self.size)[self.rank] = obj
        self._step()
        out = list(self.shared["objects"])
        self._step()
        return out


def run_ranks(size, body):
    """``body(group)`` on ``size`` thread ranks: each rank's result or exception, in rank order."""
    shared = {"size": size, "barrier": threading.Barrier(size)}
    out = [None] * size

    def one(r):
        try:
            out[r] = body(ThreadGroup(shared, r))
        except BaseException as e:  # noqa: BLE001 - every outcome is the test's to judge
            out[r] = e

    threads = [threading.Thread(target=one, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a rank did not finish"
    return out


def emulator_for(path, faults=None):
    return cunvme.Device(f"emu:file={path},readonly", gpu=False, faults=faults)


def load(group, source, opened, faults=None, faulty_rank=-1, **kw):
    """One rank's load, each rank opening its own emulators (rank ``faulty_rank``'s with
    ``faults``); closes them and notes how many it opened in ``opened``."""
    devices = {}

    def open_file(path):
        devices[path] = emulator_for(path, faults if group.rank == faulty_rank else None)
        return devices[path]

    try:
        return cunvme.load_safetensors(open_file, source, framework="numpy", process_group=group, **kw)
    finally:
        for d in devices.values():
            d.close()
        opened.append(len(devices))


@pytest.fixture
def model(tmp_path):
    tensors = make_safetensors.model(3, 96, 5)
    path = tmp_path / "model.safetensors"
    make_safetensors.write_safetensors(path, tensors, align=8)
    return path, tensors


@pytest.fixture
def sharded_checkpoint(tmp_path):
    """Two files and their index, as ``save_pretrained`` writes them."""
    tensors = make_safetensors.model(4, 64, 11)
    names = list(tensors)
    parts = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for k, part in enumerate(parts):
        file = f"model-{k + 1:05d}-of-00002.safetensors"
        make_safetensors.write_safetensors(tmp_path / file, {n: tensors[n] for n in part}, align=8)
        weight_map.update({n: file for n in part})
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": sum(a.nbytes for a in tensors.values())}, "weight_map": weight_map}))
    return index, tensors


# --- the planner ------------------------------------------------------------------------------


def test_shares_are_runs_in_file_order_balanced_by_bytes():
    sizes = [100, 100, 100, 100, 400, 50, 50, 100]
    for ranks in (1, 2, 3, 4, 8):
        owners = distributed.split_by_bytes(sizes, ranks)
        assert owners == sorted(owners), "each rank's share is one run"
        per = [sum(s for s, o in zip(sizes, owners) if o == r) for r in range(ranks)]
        assert sum(per) == sum(sizes)
        assert max(per) - min(per) <= max(sizes), per
    assert distributed.split_by_bytes([], 3) == []
    assert distributed.split_by_bytes([0, 0], 2) == [0, 0]
    with pytest.raises(ValueError):
        distributed.split_by_bytes([1], 0)


def test_slices_are_cut_as_torch_tensor_split_cuts_them():
    for length in (0, 1, 7, 8, 10):
        for ranks in (1, 2, 3, 4):
            cuts = distributed.shard_slices(length, ranks)
            want = np.array_split(np.arange(length), ranks)  # the same sizes as torch.tensor_split
            assert [hi - lo for lo, hi in cuts] == [len(w) for w in want]
            assert [lo for lo, _ in cuts] == [int(w[0]) if len(w) else lo for w, (lo, _) in zip(want, cuts)]


def test_names_pick_exact_names_and_globs_in_checkpoint_order():
    names = ["a.0.w", "a.0.b", "a.1.w", "head"]
    assert distributed.select(names, None) == names
    assert distributed.select(names, ["head", "a.*.w"]) == ["a.0.w", "a.1.w", "head"]
    with pytest.raises(KeyError, match="'nope'"):
        distributed.select(names, ["nope"])
    with pytest.raises(KeyError, match="matches no tensor"):
        distributed.select(names, ["b.*"])
    with pytest.raises(TypeError):
        distributed.select(names, "head")


def test_a_name_with_glob_characters_picks_that_tensor_exactly():
    # Tensor names may hold '[', '*' or '?' (an index in a name): the name itself picks the one
    # tensor so named, not what it would match as a glob ('w[0]' as a glob is 'w0').
    names = ["w[0]", "w0", "x*", "xy", "p?", "pq"]
    assert distributed.select(names, ["w[0]"]) == ["w[0]"]
    assert distributed.select(names, ["x*"]) == ["x*"]
    assert distributed.select(names, ["p?"]) == ["p?"]
    assert distributed.select(names, ["w[0-9]"]) == ["w0"]  # no such name: a glob
    tensors = [{"name": n, "shape": [4, 2], "element_bits": 16, "dtype": "BF16"} for n in names]
    assert distributed._shard_dims(tensors, {"w[0]": 1}) == {"w[0]": 1}
    assert distributed._shard_dims(tensors, {"x*": 0}) == {"x*": 0}


@pytest.mark.parametrize("text, why", [
    ("{not json", "not a JSON index"),
    ("[1, 2]", "weight_map"),
    ('{"weight_map": {}}', "weight_map"),
    ('{"weight_map": {"w": 3}}', "not a file beside the index"),
    ('{"weight_map": {"w": "../elsewhere.safetensors"}}', "not a file beside the index"),
    ('{"weight_map": {"w": "/abs/model.safetensors"}}', "not a file beside the index"),
    ('{"weight_map": {"w": "sub/model.safetensors"}}', "not a file beside the index"),
])
def test_a_malformed_index_is_refused(tmp_path, text, why):
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(text)
    with pytest.raises(cunvme.FormatError, match=why):
        distributed.read_index(index)


# --- whole loads --------------------------------------------------------------------------------


class _File:
    class placement:  # noqa: N801 - stands in for a SafetensorsFile's attribute
        block_size = 512


def test_pipeline_pieces_cover_every_byte_at_or_before_its_chunk():
    f = _File()
    reads = [(f, 100, 9, 1024, "a"), (f, 300, 1, 1024 + 9 * 512, "b"), (f, 900, 40, 8192, "c")]
    for chunk in (512, 1000, 1536, 4096, 1 << 20):
        pieces = distributed.split_reads(reads, 1024, chunk)
        flat = [p for k, ps in enumerate(pieces) for p in ((k,) + q[1:4] for q in ps)]
        # Every block of every read exactly once, LBAs matching their places.
        blocks = sorted((lba + i, at + i * 512) for _, lba, n, at in flat for i in range(n))
        assert blocks == sorted((lba + i, at + i * 512) for _, lba, n, at, _ in reads for i in range(n))
        for k, lba, n, at in flat:
            assert 1024 + k * chunk <= at < 1024 + (k + 1) * chunk, "a piece starts in its chunk"
            assert at + (n - 1) * 512 < 1024 + (k + 1) * chunk, "and goes at most one block past it"
    with pytest.raises(ValueError):
        distributed.split_reads(reads, 0, 0)


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_every_rank_ends_with_every_tensor_each_read_once(model, ranks):
    path, want = model
    opened = []
    out = run_ranks(ranks, lambda g: load(g, path, opened))
    for r, loaded in enumerate(out):
        assert not isinstance(loaded, BaseException), loaded
        assert sorted(loaded) == sorted(want)
        for name, a in want.items():
            np.testing.assert_array_equal(loaded[name], a, err_msg=f"rank {r}: {name}")
        assert loaded.metrics["rank"] == r and loaded.metrics["ranks"] == ranks
    read = [l.metrics["bytes_read"] for l in out]
    total = sum(a.nbytes for a in want.values())
    largest = max(a.nbytes for a in want.values())
    assert total <= sum(read) <= total + ranks * 2 * 512, "the shares are disjoint: each byte read by one rank"
    assert max(read) - min(read) <= largest + 2 * 512, read
    if ranks > 1:
        assert all(l.metrics["received_bytes"] > 0 for l in out)


@pytest.mark.parametrize("chunk", [512, 5000, 1 << 16])
def test_the_pipeline_in_small_chunks_gives_the_same_tensors(model, chunk):
    path, want = model
    out = run_ranks(3, lambda g: load(g, path, [], chunk_bytes=chunk, shard={"model.layers.1.attn.weight": 1}))
    for r, loaded in enumerate(out):
        assert not isinstance(loaded, BaseException), loaded
        for name, a in want.items():
            expected = np.array_split(a, 3, axis=1)[r] if name == "model.layers.1.attn.weight" else a
            np.testing.assert_array_equal(loaded[name], expected, err_msg=f"rank {r}: {name}")


def test_a_placement_on_one_device_per_rank(model):
    path, want = model

    def body(group):
        with emulator_for(path) as dev:
            placement = cunvme.Placement.contiguous(dev, path.stat().st_size, source="on the device")
            return cunvme.load_safetensors(dev, placement, framework="numpy", process_group=group)

    for loaded in run_ranks(2, body):
        assert not isinstance(loaded, BaseException), loaded
        for name, a in want.items():
            np.testing.assert_array_equal(loaded[name], a)


def test_a_placement_with_devices_by_path_is_refused_on_every_rank(model):
    path, _ = model

    def body(group):
        with emulator_for(path) as dev:
            placement = cunvme.Placement.contiguous(dev, path.stat().st_size)
            return cunvme.load_safetensors(lambda p: dev, placement, framework="numpy", process_group=group)

    out = run_ranks(2, body)
    assert all(isinstance(e, cunvme.DistributedLoadError) and "Placement is read through the one Device" in str(e) for e in out), out


def test_a_sharded_checkpoint_through_its_index_with_globs(sharded_checkpoint):
    index, want = sharded_checkpoint
    names = ["model.layers.*.mlp.weight", "lm_head.weight", "model.embed.weight"]
    opened = []
    out = run_ranks(3, lambda g: load(g, index, opened, names=names))
    picked = [n for n in want if n in {"lm_head.weight", "model.embed.weight"} or ".mlp.weight" in n]
    for loaded in out:
        assert not isinstance(loaded, BaseException), loaded
        assert sorted(loaded) == sorted(picked)
        for name in picked:
            np.testing.assert_array_equal(loaded[name], want[name])
    assert opened == [2, 2, 2], "every rank opened both files"


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("staging", [None, 3000])
def test_sharded_tensors_give_each_rank_its_slice_and_the_rest_is_replicated(model, ranks, staging):
    path, want = model
    shard = {"model.layers.*.mlp.weight": 0, "model.layers.*.attn.weight": 1, "model.norm.weight": -1}
    opened = []
    out = run_ranks(ranks, lambda g: load(g, path, opened, shard=shard, staging_bytes=staging))
    for r, loaded in enumerate(out):
        assert not isinstance(loaded, BaseException), loaded
        assert sorted(loaded) == sorted(want)
        for name, a in want.items():
            if ".mlp.weight" in name:
                expected = np.array_split(a, ranks, axis=0)[r]
            elif ".attn.weight" in name:
                expected = np.array_split(a, ranks, axis=1)[r]
            elif name == "model.norm.weight":
                expected = np.array_split(a, ranks, axis=0)[r]
            else:
                expected = a
            assert loaded[name].shape == expected.shape, name
            np.testing.assert_array_equal(loaded[name], expected, err_msg=f"rank {r}: {name}")
    # A rank reads its dim-0 slices only: less than the whole of those tensors.
    dim0 = sum(a.nbytes for n, a in want.items() if ".mlp.weight" in n)
    assert all(l.metrics["bytes_read"] < sum(a.nbytes for a in want.values()) - dim0 // 2 for l in out)


def test_a_staging_budget_below_one_row_fails_on_every_rank_naming_the_tensor(model):
    path, _ = model
    out = run_ranks(2, lambda g: load(g, path, [], shard={"model.layers.0.attn.weight": 1}, staging_bytes=100))
    for e in out:
        assert isinstance(e, cunvme.DistributedLoadError), e
        assert "staging_bytes=100" in str(e) and "model.layers.0.attn.weight" in str(e)
        assert [r for r, _ in e.failures] == [0, 1]


@pytest.mark.parametrize("chunk", [None, 2048])
def test_a_rank_whose_read_fails_makes_every_rank_raise_naming_rank_file_and_tensor(model, chunk):
    path, want = model
    blocks = (path.stat().st_size + 511) // 512
    fault = f"read:status=0x281:fraction=1:lba={blocks - 4}-{blocks - 1}"  # the last tensor: rank 1's share
    kw = {} if chunk is None else {"chunk_bytes": chunk}  # small chunks: the failure comes mid-pipeline
    out = run_ranks(2, lambda g: load(g, path, [], faults=fault, faulty_rank=1, **kw))
    for e in out:
        assert isinstance(e, cunvme.DistributedLoadError), e
        assert [r for r, _ in e.failures] == [1]
        assert "rank 1" in str(e) and str(path) in str(e) and "lm_head.weight" in str(e), str(e)


def test_ranks_that_plan_different_loads_all_raise(model):
    path, _ = model
    out = run_ranks(2, lambda g: load(g, path, [], names=["lm_head.weight"] if g.rank == 0 else None))
    for e in out:
        assert isinstance(e, cunvme.DistributedLoadError) and "planned different loads" in str(e), e


def test_an_index_that_does_not_match_its_files_fails_on_every_rank(sharded_checkpoint):
    index, _ = sharded_checkpoint
    text = json.loads(index.read_text())
    text["weight_map"]["model.ghost.weight"] = "model-00001-of-00002.safetensors"
    index.write_text(json.dumps(text))
    out = run_ranks(2, lambda g: load(g, index, []))
    for e in out:
        assert isinstance(e, cunvme.DistributedLoadError), e
        assert "model.ghost.weight" in str(e) and "FormatError" in str(e)


def test_a_malformed_index_fails_on_every_rank(tmp_path):
    index = tmp_path / "model.safetensors.index.json"
    index.write_text("{")
    out = run_ranks(2, lambda g: load(g, index, []))
    assert all(isinstance(e, cunvme.DistributedLoadError) and "not a JSON index" in str(e) for e in out), out


def test_a_shard_pattern_or_dimension_that_fits_nothing_is_refused(model):
    path, _ = model
    for shard, why in (({"nothing.*": 0}, "matches no selected tensor"), ({"lm_head.weight": 2}, "no dimension 2")):
        out = run_ranks(2, lambda g, s=shard: load(g, path, [], shard=s))
        assert all(isinstance(e, cunvme.DistributedLoadError) and why in str(e) for e in out), out


def test_shard_and_staging_need_a_process_group(model):
    path, _ = model
    with emulator_for(path) as dev:
        for kw in ({"shard": {"lm_head.weight": 0}}, {"staging_bytes": 1 << 20}, {"chunk_bytes": 4096}, {"progress": True}):
            with pytest.raises(ValueError, match="process_group"):
                cunvme.load_safetensors(dev, path, framework="numpy", **kw)


# --- edge cases --------------------------------------------------------------------------------


def write(tmp_path, tensors, name="edge.safetensors"):
    path = tmp_path / name
    make_safetensors.write_safetensors(path, tensors, align=8)
    return path


def test_tensors_without_elements_replicated_and_sharded(tmp_path):
    tensors = {"z": np.zeros((0,), np.float32), "a": np.arange(10, dtype=np.float32), "y": np.zeros((3, 0), np.float64),
               "w": np.zeros((0, 8), np.float32)}
    path = write(tmp_path, tensors)
    for shard in (None, {"w": 1, "y": 0}):
        out = run_ranks(3, lambda g, s=shard: load(g, path, [], shard=s))
        for r, loaded in enumerate(out):
            assert not isinstance(loaded, BaseException), loaded
            for name, a in tensors.items():
                expected = np.array_split(a, 3, axis=shard[name])[r] if shard and name in shard else a
                assert loaded[name].shape == expected.shape, name
                np.testing.assert_array_equal(loaded[name], expected)


def test_more_ranks_than_tensors_and_everything_sharded(tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    path = write(tmp_path, {"a": a})
    for loaded in run_ranks(4, lambda g: load(g, path, [])):
        assert not isinstance(loaded, BaseException), loaded
        np.testing.assert_array_equal(loaded["a"], a)
    out = run_ranks(2, lambda g: load(g, path, [], shard={"a": 1}))
    for r, loaded in enumerate(out):
        assert not isinstance(loaded, BaseException), loaded
        np.testing.assert_array_equal(loaded["a"], np.array_split(a, 2, axis=1)[r])


def test_a_small_tensor_sharded_across_rows_fits_the_default_staging(tmp_path):
    a = np.arange(2 * 64, dtype=np.float32).reshape(2, 64)  # 512 bytes: a row is 256
    path = write(tmp_path, {"a": a, "b": np.arange(10, dtype=np.float32)})
    out = run_ranks(2, lambda g: load(g, path, [], shard={"a": 1}))
    for r, loaded in enumerate(out):
        assert not isinstance(loaded, BaseException), loaded
        np.testing.assert_array_equal(loaded["a"], np.array_split(a, 2, axis=1)[r])


def test_ranks_whose_schedules_differ_all_raise_instead_of_hanging(model):
    path, _ = model

    def other_blocks(group):  # the same file seen through 512- and 4096-byte blocks
        with cunvme.Device(f"emu:file={path},readonly,lba={512 if group.rank == 0 else 4096}", gpu=False) as dev:
            return cunvme.load_safetensors(dev, path, framework="numpy", process_group=group, chunk_bytes=4096)

    for body in (other_blocks, lambda g: load(g, path, [], chunk_bytes=4096 if g.rank == 0 else 1 << 20)):
        out = run_ranks(2, body)
        assert all(isinstance(e, cunvme.DistributedLoadError) and "planned different loads" in str(e) for e in out), out


def test_a_bad_chunk_size_fails_on_every_rank(model):
    path, _ = model
    out = run_ranks(2, lambda g: load(g, path, [], chunk_bytes=0 if g.rank == 1 else 4096))
    assert all(isinstance(e, cunvme.DistributedLoadError) and "chunk_bytes" in str(e) for e in out), out


def test_ranks_sharing_one_emulator_per_host_through_attach(model):
    # Rank 0 owns the emulator over the file and serves it; the other ranks attach to it, each
    # with queue pairs of its own (docs/sharing.md), as the ranks of one host would. (A short
    # socket path: Unix sockets take at most 107 bytes.)
    path, want = model
    socket = os.path.join(tempfile.gettempdir(), f"cunvme-dist-{os.getpid()}-{time.monotonic_ns()}.sock")
    served = threading.Event()

    def body(group):
        if group.rank == 0:
            with cunvme.Device(f"emu:shared,file={path},readonly", gpu=False) as owner:
                owner.serve(socket)
                served.set()
                out = cunvme.load_safetensors(owner, path, framework="numpy", process_group=group, chunk_bytes=8192)
                group.all_gather_object("done")  # the owner outlives the others' use of it
                return out
        assert served.wait(30)
        with cunvme.Device("attach:" + socket, gpu=False) as attached:
            out = cunvme.load_safetensors(attached, path, framework="numpy", process_group=group, chunk_bytes=8192)
            group.all_gather_object("done")
            return out

    for r, loaded in enumerate(run_ranks(3, body)):
        assert not isinstance(loaded, BaseException), loaded
        for name, a in want.items():
            np.testing.assert_array_equal(loaded[name], a, err_msg=f"rank {r}: {name}")
