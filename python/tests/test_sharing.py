"""Several processes on one controller from Python: the owner's Device.serve(path), and
processes that open Device("attach:" + path) with queue pairs of their own, as torch.distributed
ranks would. Host path (gpu=False): what CI runs; test_gpu.py has the GPU side."""
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pytest

import cunvme

BLOCKS = 512  # blocks of 512 bytes each process writes, at index * BLOCKS

CHILD = textwrap.dedent(
    """
    import sys, numpy as np, cunvme
    path, index, rounds, progress = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    with cunvme.Device("attach:" + path, gpu=False) as d:
        back = np.empty(%(blocks)d * 512, dtype=np.uint8)
        for r in range(rounds):
            data = np.full(%(blocks)d * 512, (index * 16 + r) %% 251, dtype=np.uint8)
            d.write(index * %(blocks)d, %(blocks)d, data)
            d.read(index * %(blocks)d, %(blocks)d, back)
            assert (back == data).all(), "read back differs"
            if r == 0:
                open(progress, "w").close()
    print("ok")
    """
    % {"blocks": BLOCKS}
)


@pytest.fixture
def owner():
    path = os.path.join(tempfile.gettempdir(), "cunvme-py-sharing-%d-%d.sock" % (os.getpid(), time.monotonic_ns()))
    with cunvme.Device("emu:shared,blocks=8192", gpu=False) as d:
        d.serve(path)
        yield d, path


def wait_for(predicate, seconds=30):
    until = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > until:
            return False
        time.sleep(0.01)
    return True


def test_processes_attached_to_one_controller_write_their_own_blocks_and_a_killed_one_is_reclaimed(owner):
    d, path = owner
    rounds, victim = 20, 1
    progress = [path + ".p%d" % i for i in range(3)]
    children = [
        subprocess.Popen([sys.executable, "-c", CHILD, path, str(i), str(10**6 if i == victim else rounds), progress[i]],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(3)
    ]
    try:
        assert wait_for(lambda: os.path.exists(progress[victim]), 60)
        children[victim].send_signal(signal.SIGKILL)
        for i, c in enumerate(children):
            out, err = c.communicate(timeout=120)
            if i == victim:
                assert c.returncode == -signal.SIGKILL
            else:
                assert c.returncode == 0, err
                assert out.strip() == "ok"
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
        for p in progress:
            if os.path.exists(p):
                os.unlink(p)
    assert wait_for(lambda: d.serving["processes_reclaimed"] == 3)
    s = d.serving
    assert (s["processes"], s["queue_ids_held"], s["queues_reclaimed"]) == (0, 0, 2)  # the killed one's SQ and CQ
    # The survivors' last round is on the namespace.
    back = np.empty(BLOCKS * 512, dtype=np.uint8)
    for i in (0, 2):
        d.read(i * BLOCKS, BLOCKS, back)
        assert (back == (i * 16 + rounds - 1) % 251).all()


def test_an_attached_device_in_this_process_has_its_own_queue_pair_and_sees_the_owners_writes(owner):
    d, path = owner
    with cunvme.Device("attach:" + path, gpu=False) as a:
        assert a.blocks == d.blocks and a.name == "attach:" + path
        assert d.serving["processes"] == 1 and d.serving["queue_ids_held"] == 1
        data = np.arange(4096, dtype=np.uint8)
        d.write(100, 8, data)
        back = np.zeros(4096, dtype=np.uint8)
        a.read(100, 8, back)
        assert (back == data).all()
    assert wait_for(lambda: d.serving["processes"] == 0)


def test_sharing_is_refused_clearly(owner):
    d, path = owner
    with pytest.raises(cunvme.DeviceError, match="serves at"):
        d.serve(path + ".second")
    with pytest.raises(cunvme.DeviceError, match="no owner serves this socket"):
        cunvme.Device("attach:" + path + ".nobody", gpu=False)
    with cunvme.Device("emu", gpu=False) as private:
        with pytest.raises(cunvme.DeviceError, match="emu:shared"):
            private.serve(path + ".private")
    d.stop_serving()
    assert d.serving is None


def test_gpu_takes_none_a_bool_or_an_ordinal():
    with pytest.raises(TypeError, match="GPU ordinal"):
        cunvme.Device("emu", gpu="0")
    with pytest.raises(ValueError, match="GPU ordinal"):
        cunvme.Device("emu", gpu=-1)
    with cunvme.Device("emu", gpu=False) as d:
        assert d.gpu_ordinal is None
