"""Safetensors files into torch and cupy tensors on the GPU path (copy_n into GPU memory), through
the emulator backed by the file. Marked `gpu`; skipped where CUDA finds no GPU, each test also
where its array library is missing. Not run in CI (no GPU there)."""
import importlib.util
import pathlib

import numpy as np
import pytest

import cunvme  # first: it sets the CUDA environment variables before torch or cupy start CUDA

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cunvme.gpu_unavailable_reason() != "", reason=f"no GPU path: {cunvme.gpu_unavailable_reason()}"),
]

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
_spec = importlib.util.spec_from_file_location("make_safetensors", EXAMPLES / "make_safetensors.py")
make_safetensors = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_safetensors)

LAYERS, DIM = 6, 1024  # 6 layers of 6 MiB and 2 KiB norms: 44 MiB


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("st") / "model.safetensors"
    make_safetensors.main([str(path), "--layers", str(LAYERS), "--dim", str(DIM), "--seed", "3"])
    return path


@pytest.fixture(scope="module")
def dev(model):
    with cunvme.Device(f"emu:file={model},readonly,lba=4096", gpu=True) as d:
        yield d


@pytest.fixture(scope="module")
def want():
    return make_safetensors.model(LAYERS, DIM, 3)


# These two open a device of their own: first, before the module's device is opened.
def test_a_misaligned_tensor_is_copied_once_and_right(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "odd.safetensors"
    tensors = {"a": np.arange(3, dtype=np.uint8), "b": np.arange(1000, dtype=np.float32)}
    # Packed: b's F32 data starts 3 bytes into the (4 KiB aligned) data, no element boundary.
    make_safetensors.write_safetensors(path, tensors, align=4096)
    with open(path, "ab") as f:
        f.write(b"\0" * ((-path.stat().st_size) % 4096))
    with cunvme.Device(f"emu:file={path},readonly,lba=4096", gpu=True) as d:
        loaded = cunvme.load_safetensors(d, path, framework="torch")
    np.testing.assert_array_equal(loaded["b"].cpu().numpy(), tensors["b"])
    np.testing.assert_array_equal(loaded["a"].cpu().numpy(), tensors["a"])
    assert loaded.copied_bytes == tensors["b"].nbytes


def test_torch_bf16_loads_as_bfloat16(tmp_path):
    torch = pytest.importorskip("torch")
    import json
    import struct

    values = torch.arange(2048, dtype=torch.float32).to(torch.bfloat16)
    raw = values.view(torch.int16).numpy().tobytes()
    header = json.dumps({"w": {"dtype": "BF16", "shape": [2048], "data_offsets": [0, len(raw)]}}).encode()
    header += b" " * ((-(8 + len(header))) % 4096)
    path = tmp_path / "bf16.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + raw)
    with cunvme.Device(f"emu:file={path},readonly,lba=4096", gpu=True) as d:
        loaded = cunvme.load_safetensors(d, path, framework="torch")
    assert loaded["w"].dtype == torch.bfloat16
    assert torch.equal(loaded["w"].cpu(), values)


def test_torch_load_returns_views_of_one_buffer_with_the_files_values(dev, model, want):
    torch = pytest.importorskip("torch")
    loaded = cunvme.load_safetensors(dev, model, framework="torch")
    assert sorted(loaded) == sorted(want)
    for name, a in want.items():
        t = loaded[name]
        assert t.is_cuda and t.shape == a.shape and t.dtype == getattr(torch, str(a.dtype))
        assert t.untyped_storage().data_ptr() == loaded.buffer.untyped_storage().data_ptr()  # a view: no copy
        np.testing.assert_array_equal(t.cpu().numpy(), a)
    assert loaded.copied_bytes == 0 and loaded.tensor_bytes == sum(a.nbytes for a in want.values())


def test_torch_load_on_a_stream_of_ones_own_and_a_subset(dev, model, want):
    torch = pytest.importorskip("torch")
    stream = torch.cuda.Stream()
    loaded = cunvme.load_safetensors(dev, model, framework="torch", names=["model.layers.3.norm.bias"], stream=stream)
    np.testing.assert_array_equal(loaded["model.layers.3.norm.bias"].cpu().numpy(), want["model.layers.3.norm.bias"])


def test_torch_layers_overlap_and_what_compute_saw_is_the_file(dev, model, want):
    torch = pytest.importorskip("torch")
    it = cunvme.iter_layers(dev, model, framework="torch")
    assert it.layer_keys() == [""] + [f"model.layers.{i}" for i in range(LAYERS)]
    x = torch.randn(256, DIM, device="cuda")
    seen = {}
    for key, layer in it:
        for name, t in layer.items():
            seen[name] = t.clone()  # on the current stream, before the buffer is reused
        if key:
            w = layer[f"{key}.mlp.weight"]
            for _ in range(4):
                x = torch.tanh(x @ w)
    torch.cuda.synchronize()
    for name, a in want.items():
        np.testing.assert_array_equal(seen[name].cpu().numpy(), a, err_msg=name)
    assert len(it.load_events) == len(it)
    for start, end in it.load_events:
        assert start.elapsed_time(end) >= 0


def test_cupy_load_and_layers(dev, model, want):
    cupy = pytest.importorskip("cupy")
    loaded = cunvme.load_safetensors(dev, model, framework="cupy")
    for name, a in want.items():
        assert isinstance(loaded[name], cupy.ndarray)
        np.testing.assert_array_equal(cupy.asnumpy(loaded[name]), a)
    seen = {}
    for _, layer in cunvme.iter_layers(dev, model, framework="cupy"):
        for name, t in layer.items():
            seen[name] = t.copy()
    cupy.cuda.get_current_stream().synchronize()
    for name, a in want.items():
        np.testing.assert_array_equal(cupy.asnumpy(seen[name]), a, err_msg=name)


@pytest.mark.parametrize("attempt", range(4))
def test_two_threads_load_from_one_device(dev, model, want, attempt):
    # Threads that made no CUDA call of their own: the device makes its GPU's context current.
    # Each thread's .cpu() is a synchronous copy on the legacy default stream while the other
    # may be loading: the loads' default stream must not be that one (timed out in about one
    # run in two when it was). Four rounds.
    torch = pytest.importorskip("torch")
    import threading

    outcomes = [None, None]

    def load(i):
        try:
            loaded = cunvme.load_safetensors(dev, model, framework="torch")
            outcomes[i] = {name: t.cpu().numpy() for name, t in loaded.items()}
        except Exception as e:  # reported below, on the test's thread
            outcomes[i] = e

    threads = [threading.Thread(target=load, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got in outcomes:
        assert not isinstance(got, Exception), repr(got)
        assert sorted(got) == sorted(want)
        for name, a in want.items():
            np.testing.assert_array_equal(got[name], a, err_msg=name)


def test_torch_layer_is_intact_while_the_next_one_is_current(dev, model, want):
    # The promise: valid until the iterator has moved two layers on. Everything the load stream
    # was given is drained before each look.
    torch = pytest.importorskip("torch")
    previous = None
    count = 0
    for _, layer in cunvme.iter_layers(dev, model, framework="torch"):
        torch.cuda.synchronize()
        for held in (previous, layer):
            for name, t in (held or {}).items():
                np.testing.assert_array_equal(t.cpu().numpy(), want[name], err_msg=name)
        previous = layer
        count += 1
    assert count == LAYERS + 1


def test_torch_takes_the_fnuz_and_packed_f4_dtypes(tmp_path):
    torch = pytest.importorskip("torch")
    import json
    import struct

    raw = bytes(range(256)) * 16
    wanted = {"F8_E4M3FNUZ": ("float8_e4m3fnuz", [4096], [4096]), "F8_E5M2FNUZ": ("float8_e5m2fnuz", [4096], [4096]),
              "F4": ("float4_e2m1fn_x2", [64, 128], [64, 64])}
    for dtype, (torch_name, shape, torch_shape) in wanted.items():
        if not hasattr(torch, torch_name):
            continue
        header = json.dumps({"t": {"dtype": dtype, "shape": shape, "data_offsets": [0, len(raw)]}}).encode()
        header += b" " * ((-(8 + len(header))) % 4096)
        path = tmp_path / f"{dtype}.safetensors"
        path.write_bytes(struct.pack("<Q", len(header)) + header + raw)
        with cunvme.Device(f"emu:file={path},readonly,lba=4096", gpu=True) as d:
            t = cunvme.load_safetensors(d, path, framework="torch")["t"]
        assert t.dtype == getattr(torch, torch_name) and list(t.shape) == torch_shape
        assert t.view(torch.uint8).cpu().numpy().tobytes() == raw
