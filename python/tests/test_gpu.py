"""The GPU path (cunvme::device and copy_n) with torch and cupy arrays, on the emulator opened for
GPU threads. Marked `gpu`; skipped where CUDA finds no GPU, each test also where its array library
is not installed. Not run in CI (no GPU there)."""
import numpy as np
import pytest

import cunvme  # first: it sets the CUDA environment variables before torch or cupy start CUDA

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cunvme.gpu_unavailable_reason() != "", reason=f"no GPU path: {cunvme.gpu_unavailable_reason()}"),
]

BLOCKS = 8192  # 4 MiB of 512-byte blocks


@pytest.fixture(scope="module")
def dev():
    with cunvme.Device(f"emu:blocks={BLOCKS}", gpu=True) as d:
        yield d


def random_bytes(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def test_a_device_with_a_gpu_says_so(dev):
    assert dev.gpu is True and dev.gpu_unavailable_reason == ""
    assert dev.info()["gpu"] is True


def test_torch_tensors_round_trip_on_a_torch_stream(dev):
    torch = pytest.importorskip("torch")
    data = random_bytes(256 * dev.block_size, seed=1)
    src = torch.from_numpy(data).cuda()
    out = torch.zeros_like(src)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # src and out were made on the current stream
    t = dev.write(0, 256, src, stream=stream)
    assert isinstance(t, cunvme.Transfer)
    t.wait()
    assert t.ready()
    dev.read(0, 256, out, stream=stream).wait()
    stream.synchronize()
    assert torch.equal(out, src)


def test_data_written_from_the_gpu_is_read_back_by_the_host_path(dev):
    torch = pytest.importorskip("torch")
    data = random_bytes(64 * dev.block_size, seed=2)
    src = torch.from_numpy(data).cuda()
    torch.cuda.synchronize()
    dev.write(1000, 64, src, sync=True)
    out = np.zeros_like(data)
    assert dev.read(1000, 64, out) is None  # a numpy array: the host path, on a GPU-enabled device
    np.testing.assert_array_equal(out, data)


def test_an_int_stream_handle_and_a_float_tensor_are_taken(dev):
    torch = pytest.importorskip("torch")
    src = torch.randn(32 * dev.block_size // 4, device="cuda")  # float32: 32 blocks
    out = torch.empty_like(src)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    dev.write(2000, 32, src, stream=stream.cuda_stream, sync=True)
    dev.read(2000, 32, out, stream=stream.cuda_stream, sync=True)
    assert torch.equal(out, src)


def test_a_dlpack_only_gpu_array_is_taken(dev):
    torch = pytest.importorskip("torch")

    class DlpackOnly:  # no __cuda_array_interface__: nanobind's DLPack import finds the GPU pointer
        def __init__(self, tensor):
            self.tensor = tensor

        def __dlpack__(self, **kwargs):
            return self.tensor.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.tensor.__dlpack_device__()

    src = torch.from_numpy(random_bytes(16 * dev.block_size, seed=3)).cuda()
    out = torch.zeros_like(src)
    torch.cuda.synchronize()
    dev.write(3000, 16, DlpackOnly(src), sync=True)
    dev.read(3000, 16, DlpackOnly(out), sync=True)
    assert torch.equal(out, src)


def test_cupy_arrays_round_trip_on_a_cupy_stream(dev):
    cp = pytest.importorskip("cupy")
    src = cp.asarray(random_bytes(128 * dev.block_size, seed=4))
    out = cp.zeros_like(src)
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    dev.write(4000, 128, src, stream=stream, sync=True)
    dev.read(4000, 128, out, stream=stream).wait()
    assert bool(cp.array_equal(out, src))


def test_a_gpu_read_past_the_namespace_raises_nvme_error_from_wait(dev):
    torch = pytest.importorskip("torch")
    out = torch.zeros(16 * dev.block_size, dtype=torch.uint8, device="cuda")
    t = dev.read(BLOCKS - 8, 16, out)
    with pytest.raises(cunvme.NvmeError) as e:
        t.wait()
    assert e.value.status == "LBA Out of Range"
    with pytest.raises(cunvme.NvmeError):
        dev.read(BLOCKS - 8, 16, out, sync=True)


def test_a_gpu_array_not_on_a_4_byte_boundary_is_refused(dev):
    torch = pytest.importorskip("torch")
    out = torch.zeros(dev.block_size + 1, dtype=torch.uint8, device="cuda")[1:]
    with pytest.raises(ValueError, match="multiple of 4"):
        dev.read(0, 1, out)


def test_a_gpu_array_too_small_or_strided_is_refused(dev):
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="out holds 100 bytes"):
        dev.read(0, 1, torch.zeros(100, dtype=torch.uint8, device="cuda"))
    with pytest.raises(ValueError, match="not C-contiguous"):
        dev.read(0, 1, torch.zeros((512, 4), dtype=torch.uint8, device="cuda").t())


def test_a_transfer_dropped_before_its_stream_ran_the_copy_waits_for_it(dev):
    torch = pytest.importorskip("torch")
    data = random_bytes(64 * dev.block_size, seed=9)
    src = torch.from_numpy(data).cuda()
    torch.cuda.synchronize()
    dev.write(3000, 64, src, sync=True)
    out = torch.zeros_like(src)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(200_000_000)  # holds the stream (about 0.1 s) before the copy runs
    t = dev.read(3000, 64, out, stream=stream)
    del t  # the array must not go back to its allocator while the kernel may still write it
    assert stream.query()  # so dropping the Transfer waited for the copy behind the sleep
    assert torch.equal(out, src)


def test_a_device_per_gpu_reads_into_that_gpus_memory():
    torch = pytest.importorskip("torch")
    gpus = torch.cuda.device_count()
    pattern = np.arange(64 * 512 // 8, dtype=np.uint64) ^ np.uint64(0x5A5A5A5A5A5A5A5A)  # emu:pattern's first 64 blocks
    for g in range(gpus):
        with cunvme.Device("emu:pattern", gpu=g) as d:
            assert d.gpu_ordinal == g
            out = torch.zeros(64 * 512, dtype=torch.uint8, device=f"cuda:{g}")
            d.read(0, 64, out, sync=True)
            assert np.array_equal(out.cpu().numpy().view(np.uint64), pattern)


ATTACHED_GPU_CHILD = """
import sys, numpy as np, cunvme, torch
path, gpu = sys.argv[1], int(sys.argv[2])
with cunvme.Device("attach:" + path, gpu=gpu) as d:
    assert d.gpu_ordinal == gpu
    out = torch.zeros(64 * 512, dtype=torch.uint8, device=f"cuda:{gpu}")
    d.read(gpu * 64, 64, out, sync=True)
    want = (np.arange(gpu * 64 * 64, (gpu + 1) * 64 * 64, dtype=np.uint64) ^ np.uint64(0x5A5A5A5A5A5A5A5A))
    assert np.array_equal(out.cpu().numpy().view(np.uint64), want)
print("ok")
"""


def test_a_process_per_gpu_attached_to_a_served_emulator_reads_into_its_gpu(tmp_path):
    # The owner: this process (GPU path, so its emulator opens the children's CUDA IPC exports).
    torch = pytest.importorskip("torch")
    import subprocess
    import sys

    path = str(tmp_path / "owner.sock")
    with cunvme.Device("emu:shared,pattern", gpu=0) as owner:
        owner.serve(path)
        children = [subprocess.Popen([sys.executable, "-c", ATTACHED_GPU_CHILD, path, str(g)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                    for g in range(torch.cuda.device_count())]
        for c in children:
            out, err = c.communicate(timeout=180)
            assert c.returncode == 0, err
            assert out.strip() == "ok"
        import time

        until = time.monotonic() + 30  # each child's socket closes as it exits; the owner then reclaims it
        while owner.serving["processes_reclaimed"] < len(children) and time.monotonic() < until:
            time.sleep(0.01)
        assert owner.serving["processes_reclaimed"] == len(children)
