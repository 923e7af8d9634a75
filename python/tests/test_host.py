"""The host path, on the embedded emulator: what CI runs (no GPU needed). Each test is one
behaviour, named by it."""
import threading

import numpy as np
import pytest

import cunvme

# 4096 blocks of 512 bytes: 2 MiB. The emulator's MDTS is 512 KiB (1024 such blocks per command).
URI = "emu:blocks=4096"


@pytest.fixture
def dev():
    # gpu=False: the host path even where a GPU is found (test_gpu.py covers the other).
    with cunvme.Device(URI, gpu=False) as d:
        yield d


def random_bytes(n, seed=1):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def test_info_reports_identify_data_and_the_namespace(dev):
    info = dev.info()
    assert info["model"] == "cunvme emulated NVMe controller"
    assert info["serial"] != "" and info["firmware"] != ""
    assert info["max_transfer_bytes"] == 512 * 1024
    assert info["mdts"] == 7
    assert info["device"] == "emu"
    assert info["gpu"] is False
    assert info["namespaces"] == [
        {"nsid": 1, "block_size": 512, "blocks": 4096, "metadata_size": 0, "extended_lba": False, "protection_type": 0}
    ]


def test_block_size_and_blocks_follow_the_uri():
    with cunvme.Device("emu:lba=4096,blocks=100", gpu=False) as d:
        assert (d.block_size, d.blocks, d.nsid) == (4096, 100, 1)


def test_every_namespace_is_listed_and_nsid_selects_one():
    with cunvme.Device("emu:namespaces=3,blocks=64", nsid=2, gpu=False) as d:
        assert [n["nsid"] for n in d.info()["namespaces"]] == [1, 2, 3]
        assert d.nsid == 2


def test_written_bytes_read_back_equal(dev):
    src = random_bytes(64 * 512)
    assert dev.write(100, 64, src) is None  # the host path returns when done
    out = np.zeros_like(src)
    assert dev.read(100, 64, out) is None
    np.testing.assert_array_equal(out, src)


def test_a_transfer_larger_than_mdts_is_split_and_round_trips(dev):
    # The whole namespace: 2 MiB, four commands of 512 KiB.
    src = random_bytes(dev.blocks * dev.block_size, seed=2)
    dev.write(0, dev.blocks, src)
    out = np.empty_like(src)
    dev.read(0, dev.blocks, out)
    np.testing.assert_array_equal(out, src)


def test_any_dtype_and_shape_moves_as_raw_bytes(dev):
    src = np.random.default_rng(3).standard_normal((16, 64)).astype(np.float32)  # 4 KiB: 8 blocks
    dev.write(8, 8, src)
    out = np.zeros((4, 256), dtype=np.float32)
    dev.read(8, 8, out)
    np.testing.assert_array_equal(out.reshape(16, 64), src)


def test_a_larger_array_takes_the_blocks_in_its_first_bytes_and_keeps_the_rest(dev):
    src = random_bytes(512, seed=4)
    dev.write(7, 1, src)
    out = np.full(1500, 0xAB, dtype=np.uint8)
    dev.read(7, 1, out)
    np.testing.assert_array_equal(out[:512], src)
    assert (out[512:] == 0xAB).all()


def test_bytearray_and_memoryview_are_host_arrays(dev):
    src = bytes(range(256)) * 2
    dev.write(3, 1, memoryview(src))
    out = bytearray(512)
    dev.read(3, 1, out)
    assert bytes(out) == src


def test_reading_past_the_namespace_raises_nvme_error_naming_the_failing_command(dev):
    out = np.zeros((dev.blocks + 1) * dev.block_size, dtype=np.uint8)
    with pytest.raises(cunvme.NvmeError) as e:
        dev.read(0, dev.blocks + 1, out)
    # Commands of at most MDTS: the first four cover the namespace, the fifth (one block) fails.
    assert e.value.status == "LBA Out of Range"
    assert e.value.status_code == 0x080
    assert (e.value.lba, e.value.blocks) == (4096, 1)
    assert "LBA Out of Range" in str(e.value)


def test_a_write_past_the_namespace_writes_none_of_its_blocks(dev):
    # The request is planned whole before any command goes: the commands inside the namespace
    # do not run either.
    with pytest.raises(cunvme.NvmeError) as e:
        dev.write(0, dev.blocks + 1, random_bytes((dev.blocks + 1) * 512, seed=3))
    assert (e.value.lba, e.value.blocks) == (4096, 1)
    out = bytearray(512)
    dev.read(0, 1, out)
    assert bytes(out) == bytes(512)


def test_writing_past_the_namespace_raises_nvme_error(dev):
    with pytest.raises(cunvme.NvmeError) as e:
        dev.write(4090, 8, np.zeros(8 * 512, dtype=np.uint8))
    assert (e.value.status, e.value.lba, e.value.blocks) == ("LBA Out of Range", 4090, 8)


def test_writing_a_write_protected_namespace_raises_its_status():
    with cunvme.Device("emu:blocks=64,readonly", gpu=False) as d:
        with pytest.raises(cunvme.NvmeError) as e:
            d.write(0, 1, np.zeros(512, dtype=np.uint8))
        assert e.value.status == "Namespace is Write Protected"


def test_a_fault_rule_in_the_uri_fails_the_nth_read_with_its_status():
    # emu:fault=: the emulator's fault injection (its docs page lists the fields).
    with cunvme.Device("emu:blocks=64,fault=read:status=0x281:nth=2:lba=8-15", gpu=False) as d:
        out = np.zeros(512, dtype=np.uint8)
        d.read(8, 1, out)
        d.read(0, 1, out)  # outside the rule's LBA range: not counted
        with pytest.raises(cunvme.NvmeError) as e:
            d.read(9, 1, out)
        assert (e.value.status, e.value.status_code, e.value.lba, e.value.blocks) == ("Unrecovered Read Error", 0x281, 9, 1)
        d.read(9, 1, out)  # nth fires once


def test_a_lost_completion_from_a_fault_rule_is_a_device_error_naming_the_timeout():
    # timeout bounds admin commands too: 1 s leaves queue creation room on a loaded machine.
    with cunvme.Device("emu:blocks=64,fault=write:lose:nth=1", timeout=1.0, gpu=False) as d:
        with pytest.raises(cunvme.DeviceError, match="no completion within 1000 ms"):
            d.write(0, 1, np.zeros(512, dtype=np.uint8))


@pytest.mark.parametrize(
    "rule, message",
    [
        ("reed:status=0x281:nth=1", "'reed' is no class of commands"),
        ("read:nth=1", "needs an action"),
        ("read:status=0x281", "needs nth=N .* or fraction=F"),
        ("read:status=0x1ff:nth=1", "not a status of the specification"),
        ("read:status=0x281:fraction=2", r"outside \[0, 1\]"),
        ("read:status=0x281:nth=1:bogus", "unknown option 'bogus'"),
    ],
)
def test_a_malformed_fault_rule_raises_device_error_naming_the_rule(rule, message):
    with pytest.raises(cunvme.DeviceError, match=message) as e:
        cunvme.Device("emu:blocks=64,fault=" + rule, gpu=False)
    assert "fault rule 1 ('" + rule + "')" in str(e.value)


def test_the_faults_argument_injects_the_same_rules_as_the_uri():
    out = np.zeros(512, dtype=np.uint8)
    with cunvme.Device("emu:blocks=64", faults="read:status=0x281:nth=1:lba=8-15", gpu=False) as d:
        assert d.uri == "emu:blocks=64,fault=read:status=0x281:nth=1:lba=8-15"
        with pytest.raises(cunvme.NvmeError) as e:
            d.read(8, 1, out)
        assert e.value.status_code == 0x281
    # A list of rules, on the bare scheme: each fires on its own commands.
    with cunvme.Device("emu", faults=["read:status=0x281:nth=1", "write:status=0x280:nth=1"], gpu=False) as d:
        assert d.uri == "emu:fault=read:status=0x281:nth=1+write:status=0x280:nth=1"
        with pytest.raises(cunvme.NvmeError) as e:
            d.write(0, 1, out)
        assert e.value.status_code == 0x280
        with pytest.raises(cunvme.NvmeError) as e:
            d.read(0, 1, out)
        assert e.value.status_code == 0x281
    with cunvme.Device("emu:blocks=64", faults=[], gpu=False) as d:  # no rules: no faults
        assert d.uri == "emu:blocks=64"
        d.read(0, 1, out)


def test_the_faults_argument_is_refused_where_it_cannot_apply():
    with pytest.raises(ValueError, match="not an emu device"):
        cunvme.Device("sysfs:0000:01:00.0", faults="read:status=0x281:nth=1", gpu=False)
    with pytest.raises(TypeError, match="fault rule"):
        cunvme.Device("emu", faults=3, gpu=False)
    with pytest.raises(TypeError, match="must be a str"):
        cunvme.Device("emu", faults=["read:status=0x281:nth=1", 3], gpu=False)
    with pytest.raises(cunvme.DeviceError, match="needs an action"):
        cunvme.Device("emu:blocks=64", faults="read:nth=1", gpu=False)


def test_status_name_gives_the_specification_name():
    assert cunvme.status_name(0x080) == "LBA Out of Range"
    assert cunvme.status_name(0x002) == "Invalid Field in Command"


def test_an_array_smaller_than_the_blocks_is_refused_with_both_sizes(dev):
    with pytest.raises(ValueError, match="out holds 1000 bytes; 2 blocks of 512 bytes need 1024"):
        dev.read(0, 2, np.zeros(1000, dtype=np.uint8))
    with pytest.raises(ValueError, match="src holds 511 bytes"):
        dev.write(0, 1, np.zeros(511, dtype=np.uint8))


def test_a_non_contiguous_array_is_refused(dev):
    strided = np.zeros((8, 256), dtype=np.uint8)[:, ::2]
    with pytest.raises(ValueError, match="not C-contiguous"):
        dev.read(0, 1, strided)
    with pytest.raises(ValueError, match="not C-contiguous"):
        dev.write(0, 1, np.zeros((256, 8), dtype=np.uint8).T)


def test_a_read_only_array_is_refused_as_out_but_taken_as_src(dev):
    ro = np.zeros(512, dtype=np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        dev.read(0, 1, ro)
    with pytest.raises(ValueError, match="out is read-only"):
        dev.read(0, 1, bytes(512))
    dev.write(0, 1, ro)


def test_what_is_not_an_array_of_bytes_is_refused_with_type_error(dev):
    with pytest.raises(TypeError, match="not list"):
        dev.read(0, 1, [0] * 512)
    with pytest.raises(TypeError, match="dtype object"):
        dev.write(0, 1, np.array([object()] * 512))


def test_zero_blocks_and_a_wrapping_range_are_refused(dev):
    out = np.zeros(512, dtype=np.uint8)
    with pytest.raises(ValueError, match="at least 1"):
        dev.read(0, 0, out)
    with pytest.raises(ValueError, match="2\\^64"):
        dev.read(2**64 - 1, 2, np.zeros(1024, dtype=np.uint8))
    with pytest.raises(TypeError):
        dev.read(-1, 1, out)


def test_a_stream_that_is_no_stream_is_refused(dev):
    with pytest.raises(TypeError, match="stream must be"):
        dev.read(0, 1, np.zeros(512, dtype=np.uint8), stream="default")
    with pytest.raises(ValueError, match="non-negative"):
        dev.read(0, 1, np.zeros(512, dtype=np.uint8), stream=-1)


def test_an_object_with_a_ptr_that_is_no_cupy_stream_is_refused_as_a_stream(dev):
    class EventLike:  # a cupy Event or MemoryPointer also has .ptr: it is no cudaStream_t
        ptr = 0x1234

    with pytest.raises(TypeError, match="stream must be"):
        dev.read(0, 1, np.zeros(512, dtype=np.uint8), stream=EventLike())


class FakeGpuArray:
    """__cuda_array_interface__ without a GPU behind it: the checks run before any pointer is used."""

    def __init__(self, nbytes, strides=None, readonly=False, mask=None, typestr="|u1", pointer=0x10000):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,) if strides is None else (nbytes // 2, 2),
            "typestr": typestr,
            "data": (pointer, readonly),
            "strides": strides,
            "mask": mask,
            "version": 3,
        }


def test_cuda_array_interface_arrays_are_checked_for_contiguity_read_only_and_size(dev):
    with pytest.raises(ValueError, match="not C-contiguous"):
        dev.read(0, 1, FakeGpuArray(1024, strides=(1, 512)))
    with pytest.raises(ValueError, match="read-only"):
        dev.read(0, 1, FakeGpuArray(512, readonly=True))
    with pytest.raises(ValueError, match="masked"):
        dev.read(0, 1, FakeGpuArray(512, mask=object()))
    with pytest.raises(ValueError, match="out holds 256 bytes"):
        dev.read(0, 1, FakeGpuArray(256))
    with pytest.raises(TypeError, match="element type"):
        dev.read(0, 1, FakeGpuArray(512, typestr="|O8"))


def test_a_cuda_array_interface_element_size_that_is_no_size_is_refused(dev):
    for typestr in ("<u-4", "<fx", "<f", "<u+4", "<f99999999999999999999", "<u0", "<u65"):
        with pytest.raises(TypeError, match="has element type"):
            dev.read(0, 1, FakeGpuArray(512, typestr=typestr))


def test_a_gpu_array_on_a_device_without_gpu_path_raises_device_error(dev):
    assert dev.gpu is False and dev.gpu_unavailable_reason != ""
    with pytest.raises(cunvme.DeviceError, match="no GPU path"):
        dev.read(0, 1, FakeGpuArray(512))


def test_an_unknown_uri_raises_device_error_naming_it():
    with pytest.raises(cunvme.DeviceError, match="unknown device URI") as e:
        cunvme.Device("nvme:0")
    assert (e.value.operation, e.value.device) == ("Open", "nvme:0")


def test_a_bad_emulator_option_raises_device_error():
    with pytest.raises(cunvme.DeviceError, match="lba"):
        cunvme.Device("emu:lba=1000", gpu=False)


def test_a_missing_namespace_raises_device_error():
    with pytest.raises(cunvme.DeviceError, match="namespace 5"):
        cunvme.Device("emu:blocks=64", nsid=5, gpu=False)


def test_a_timeout_that_is_no_positive_number_is_refused():
    with pytest.raises(ValueError, match="timeout"):
        cunvme.Device("emu:blocks=64", timeout=0, gpu=False)
    with pytest.raises(ValueError, match="timeout"):
        cunvme.Device("emu:blocks=64", timeout=float("nan"), gpu=False)


def test_gpu_true_without_a_gpu_path_raises_device_error():
    if cunvme.gpu_unavailable_reason() == "":
        pytest.skip("this machine has a GPU path")
    with pytest.raises(cunvme.DeviceError, match="gpu=True"):
        cunvme.Device("emu:blocks=64", gpu=True)


def test_a_closed_device_refuses_io_and_closing_twice_is_harmless():
    d = cunvme.Device("emu:blocks=64", gpu=False)
    d.close()
    d.close()
    with pytest.raises(cunvme.DeviceError, match="closed"):
        d.read(0, 1, np.zeros(512, dtype=np.uint8))
    with pytest.raises(cunvme.DeviceError, match="closed"):
        d.info()


def test_flush_succeeds(dev):
    dev.write(0, 1, np.ones(512, dtype=np.uint8))
    dev.flush()


def test_threads_sharing_a_device_each_read_back_their_own_blocks(dev):
    failures = []

    def worker(t):
        try:
            for i in range(20):
                lba = t * 512 + i * 8
                src = random_bytes(8 * 512, seed=t * 1000 + i)
                dev.write(lba, 8, src)
                out = np.empty_like(src)
                dev.read(lba, 8, out)
                if not np.array_equal(out, src):
                    failures.append((t, i))
        except Exception as e:  # reported below, not lost in the thread
            failures.append((t, repr(e)))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert failures == []


def test_exceptions_share_one_base_class():
    assert issubclass(cunvme.NvmeError, cunvme.Error)
    assert issubclass(cunvme.DeviceError, cunvme.Error)
    assert issubclass(cunvme.IoError, cunvme.Error)


def test_an_io_error_carries_the_likely_cause_of_a_timeout_when_there_is_one():
    # The extension passes cause= only for a timeout with a cause (device::describe's text).
    plain = cunvme.IoError("Read: completion timeout at LBA 0 (8 blocks)", "completion timeout", 0, 8)
    assert plain.cause is None
    held = cunvme.IoError("Read: ... (the emulator's data copies were held up ...)", "completion timeout", 0, 8,
                          cause="the emulator's data copies were held up ...")
    assert held.cause.startswith("the emulator's data copies")
    assert (held.reason, held.lba, held.blocks) == ("completion timeout", 0, 8)


def test_repr_names_the_device_the_namespace_and_the_path():
    d = cunvme.Device("emu:blocks=64", gpu=False)
    assert repr(d) == "<cunvme.Device emu nsid 1: 64 blocks of 512 bytes, host path>"
    d.close()
    assert repr(d).startswith("<cunvme.Device (closed)")


def test_closing_while_threads_do_io_ends_their_io_with_success_or_device_error():
    d = cunvme.Device("emu:blocks=4096", gpu=False)
    outcomes = []
    started = threading.Barrier(5)

    def worker(t):
        started.wait()
        out = np.empty(64 * 512, dtype=np.uint8)
        for _ in range(200):
            try:
                d.read(t * 64, 64, out)
            except cunvme.DeviceError as e:
                outcomes.append("closed" if "closed" in str(e) else repr(e))
                return
        outcomes.append("done")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    started.wait()
    d.close()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert len(outcomes) == 4 and set(outcomes) <= {"closed", "done"}
