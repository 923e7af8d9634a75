"""Safetensors files through the loader, on the host path (numpy, no GPU): headers checked by the
C++ parser, tensors byte for byte as in the file, layers in order, extents, and refusals."""
import importlib.util
import json
import pathlib
import struct

import numpy as np
import pytest

import cunvme
from cunvme import _cunvme

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
_spec = importlib.util.spec_from_file_location("make_safetensors", EXAMPLES / "make_safetensors.py")
make_safetensors = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_safetensors)


def file_bytes(path):
    return np.fromfile(path, dtype=np.uint8)


def expect_tensor(raw, header, name, got):
    t = next(t for t in header["tensors"] if t["name"] == name)
    o = header["data_offset"]
    assert got.shape == tuple(t["shape"])
    assert np.ascontiguousarray(got).tobytes() == raw[o + t["begin"]:o + t["end"]].tobytes(), name


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model.safetensors"
    make_safetensors.main([str(path), "--layers", "3", "--dim", "256", "--seed", "7"])
    return path


@pytest.mark.parametrize("lba", [512, 4096])
def test_every_tensor_loads_byte_for_byte_as_in_the_file(model, lba):
    with cunvme.Device(f"emu:file={model},readonly,lba={lba}", gpu=False) as dev:
        loaded = cunvme.load_safetensors(dev, model, framework="numpy")
        f = cunvme.SafetensorsFile(dev, model)
    raw = file_bytes(model)
    assert sorted(loaded) == sorted(f.names()) and len(loaded) == 3 * 4 + 3
    for name, a in loaded.items():
        expect_tensor(raw, f.header, name, a)
    assert loaded["model.layers.1.mlp.weight"].dtype == np.float32
    assert loaded["model.layers.1.attn.weight"].dtype == np.float16
    # Packed tensors read as one run: exactly the data's blocks, no copy.
    assert loaded.tensor_bytes == raw.size - f.header["data_offset"]
    assert loaded.bytes_read == loaded.tensor_bytes and loaded.copied_bytes == 0
    assert f.metadata["format"] == "pt"


def test_the_values_are_the_generators(model):
    with cunvme.Device(f"emu:file={model},readonly", gpu=False) as dev:
        loaded = cunvme.load_safetensors(dev, model, framework="numpy", names=["model.layers.2.mlp.weight", "lm_head.weight"])
    want = make_safetensors.model(3, 256, 7)
    assert sorted(loaded) == ["lm_head.weight", "model.layers.2.mlp.weight"]
    np.testing.assert_array_equal(loaded["model.layers.2.mlp.weight"], want["model.layers.2.mlp.weight"])
    np.testing.assert_array_equal(loaded["lm_head.weight"], want["lm_head.weight"])


def test_an_unknown_name_is_a_key_error(model):
    with cunvme.Device(f"emu:file={model},readonly", gpu=False) as dev:
        with pytest.raises(KeyError, match="no tensor 'nope'"):
            cunvme.load_safetensors(dev, model, framework="numpy", names=["lm_head.weight", "nope"])


def test_layers_come_in_natural_order_and_alternate_two_buffers(tmp_path):
    path = tmp_path / "m.safetensors"
    make_safetensors.main([str(path), "--layers", "11", "--dim", "64"])
    raw = file_bytes(path)
    with cunvme.Device(f"emu:file={path},readonly", gpu=False) as dev:
        f = cunvme.SafetensorsFile(dev, path)
        it = f.layers(framework="numpy")
        assert it.layer_keys() == [""] + [f"model.layers.{i}" for i in range(11)]
        buffers = []
        for key, layer in it:
            names = sorted(layer)
            if key:
                assert names == sorted(f"{key}.{n}" for n in ("attn.weight", "mlp.weight", "norm.bias", "norm.weight"))
            for name, a in layer.items():
                expect_tensor(raw, f.header, name, a)
            buffers.append(layer.buffer)
        assert buffers[0] is buffers[2] and buffers[1] is buffers[3] and buffers[0] is not buffers[1]
        # Layers that share a block each read it: at most two extra blocks per layer.
        data = raw.size - f.header["data_offset"]
        assert data <= it.bytes_read <= data + 2 * 512 * len(it)
        # A key function of one's own: everything in one group.
        assert f.layers(framework="numpy", layer_key=lambda name: "all").layer_keys() == ["all"]


def test_a_file_placed_extent_by_extent_loads_from_scattered_blocks(model):
    # The file's blocks written out of order on a RAM namespace, as a filesystem might place them.
    raw = file_bytes(model)
    bs = 4096
    blocks = raw.size // bs
    assert raw.size % bs == 0
    cut = [0, 5, blocks // 2, blocks]
    extents = [(cut[0] * bs, 1000, cut[1] - cut[0]), (cut[1] * bs, 10, cut[2] - cut[1]), (cut[2] * bs, 500, cut[3] - cut[2])]
    with cunvme.Device("emu:lba=4096,blocks=2048", gpu=False) as dev:
        for offset, lba, n in extents:
            dev.write(lba, n, raw[offset:offset + n * bs])
        where = cunvme.Placement.from_extents(bs, raw.size, extents, source="scattered")
        loaded = cunvme.load_safetensors(dev, where, framework="numpy")
        f = cunvme.SafetensorsFile(dev, where)
    for name, a in loaded.items():
        expect_tensor(raw, f.header, name, a)


def test_gaps_and_odd_offsets_load_exactly(tmp_path):
    # 3 zero bytes after each tensor: F32 data at odd offsets (numpy views them unaligned).
    path = tmp_path / "gaps.safetensors"
    tensors = {"a": np.arange(5, dtype=np.uint8), "b": np.arange(300, dtype=np.float32), "c": np.full((2, 3), 7, dtype=np.int64)}
    make_safetensors.write_safetensors(path, tensors, align=1, gap=3)
    with open(path, "ab") as f:
        f.write(b"\0" * ((-path.stat().st_size) % 512))  # whole blocks for the emulator
    with cunvme.Device(f"emu:file={path},readonly", gpu=False) as dev:
        loaded = cunvme.load_safetensors(dev, path, framework="numpy")
    for name, a in tensors.items():
        np.testing.assert_array_equal(loaded[name], a)


def test_a_tensor_in_a_partial_last_block_loads(tmp_path):
    path = tmp_path / "short.safetensors"
    x = np.arange(1000, dtype=np.float32)
    make_safetensors.write_safetensors(path, {"x": x}, align=512)
    assert path.stat().st_size % 512 != 0  # the tensor ends inside the emulator's last block
    size = path.stat().st_size
    with cunvme.Device(f"emu:file={path},readonly", gpu=False) as dev:
        assert dev.blocks == (size + 511) // 512
        loaded = cunvme.load_safetensors(dev, path, framework="numpy")
    np.testing.assert_array_equal(loaded["x"], x)
    assert path.stat().st_size == size  # the file is left as it was


def test_a_dtype_numpy_lacks_is_refused_before_reading(tmp_path):
    path = tmp_path / "bf16.safetensors"
    header = json.dumps({"w": {"dtype": "BF16", "shape": [256], "data_offsets": [0, 512]}}).encode()
    header += b" " * ((-(8 + len(header))) % 512)
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(512))
    with cunvme.Device(f"emu:file={path},readonly", gpu=False) as dev:
        with pytest.raises(TypeError, match="numpy has no BF16"):
            cunvme.load_safetensors(dev, path, framework="numpy")
        assert cunvme.SafetensorsFile(dev, path).tensors["w"]["dtype"] == "BF16"


def test_a_placement_with_another_block_size_is_refused(model):
    with cunvme.Device(f"emu:file={model},readonly", gpu=False) as dev:
        where = cunvme.Placement.from_extents(4096, model.stat().st_size, [(0, 0, 1)])
        with pytest.raises(ValueError, match="4096-byte blocks, the device 512"):
            cunvme.SafetensorsFile(dev, where)
        with pytest.raises(cunvme.FormatError, match="does not start on"):
            cunvme.Placement.from_extents(512, 4096, [(100, 0, 1)])


# The C++ parser's rules, through the binding (test/loader/safetensors_test.cpp has the full list).
BAD_HEADERS = [
    (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}', "appears twice"),
    (b'{"a":{"dtype":"F5","shape":[2],"data_offsets":[0,1]}}', "unknown dtype"),
    (b'{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}', "not whole bytes"),
    (b'{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', "is 12 bytes"),
    (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0.0,8]}}', "not an integer"),
    (b'{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}}', "not an integer"),
    (b'{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}', "more than 2^64"),
    (b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}', "overlap"),
    (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[60,68]}}', "past the end of the file"),
    (b'{"a":', "not valid JSON"),
    (b'[]', "does not start with"),
    (b'{"__metadata__":{"k":1}}', "not a string"),
]


@pytest.mark.parametrize("json_text,reason", BAD_HEADERS)
def test_the_cpp_parser_refuses_malformed_headers(json_text, reason):
    with pytest.raises(cunvme.FormatError, match=reason.replace("^", r"\^")) as e:
        _cunvme.safetensors_header(json_text, 8 + len(json_text) + 64, "bad.safetensors")
    assert "bad.safetensors" in str(e.value)
    assert isinstance(e.value, ValueError)


def test_the_header_length_is_checked():
    with pytest.raises(cunvme.FormatError, match="exceeds the format's limit"):
        _cunvme.safetensors_header_length(struct.pack("<Q", 100_000_001), 1 << 40, "f")
    with pytest.raises(cunvme.FormatError, match="runs past the end"):
        _cunvme.safetensors_header_length(struct.pack("<Q", 100), 50, "f")
    assert _cunvme.safetensors_header_length(struct.pack("<Q", 100), 108, "f") == 100


def test_a_damaged_file_on_the_device_is_a_format_error(tmp_path):
    path = tmp_path / "damaged.safetensors"
    path.write_bytes(struct.pack("<Q", 1 << 40) + bytes(504))
    with cunvme.Device(f"emu:file={path},readonly", gpu=False) as dev:
        with pytest.raises(cunvme.FormatError, match="exceeds the format's limit"):
            cunvme.load_safetensors(dev, path, framework="numpy")


def test_plans_and_keys_match_the_cpp_rules():
    size, reads, offsets = _cunvme.plan_reads(512, 1 << 20, [(0, 0, 2048)], [(600, 400), (5000, 4), (100, 500)])
    assert reads == [(0, 2, 0), (9, 1, 4096)] and offsets == [600, 4096 + 5000 - 9 * 512, 100] and size == 4096 + 512
    assert _cunvme.default_layer_key("model.layers.12.attn.weight") == "model.layers.12"
    assert _cunvme.group_keys(["b.10", "", "b.9", "b.10"]) == [("", [1]), ("b.9", [2]), ("b.10", [0, 3])]


# ---- every malformed header is a FormatError, whichever way it is reached -----------------------

def write_raw(path, header, data=b"", length=None):
    """A file: the length (``length`` or the header's), ``header`` as given, ``data``, zeros to 512 bytes."""
    n = len(header) if length is None else length
    body = struct.pack("<Q", n) + header + data
    path.write_bytes(body + b"\0" * ((-len(body)) % 512))
    return path


MALFORMED_FILES = [
    pytest.param(b'{"a\xff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', None, "not valid JSON", id="invalid UTF-8 in a name"),
    pytest.param(b'{"a":{"dtype":"U\xc3","shape":[1],"data_offsets":[0,1]}}', None, "not valid JSON", id="invalid UTF-8 in a dtype"),
    pytest.param(b'{"__metadata__":{"k":"\xed\xa0\x80"}}', None, "not valid JSON", id="a UTF-16 surrogate as UTF-8"),
    pytest.param(b'\xff\xfe{}', None, "does not start with", id="invalid UTF-8 before the object"),
    pytest.param(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},', None, "not valid JSON", id="bad JSON"),
    pytest.param(b'{"a":{"dtype":"U8","shape":"1","data_offsets":[0,1]}}', None, "not an array", id="a shape that is a string"),
    pytest.param(b'{"a":{"dtype":["U8"],"shape":[1],"data_offsets":[0,1]}}', None, "unknown dtype", id="a dtype that is a list"),
    pytest.param(b'{"a":[1,2]}', None, "not an object", id="an entry that is a list"),
    pytest.param(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551615,18446744073709551616]}}', None, "not an integer",
                 id="offsets past 2^64"),
    pytest.param(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551614,18446744073709551615]}}', None, "past the end",
                 id="offsets that wrap"),
    pytest.param(b'{"a":{"dtype":"F64","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,8]}}', None, r"more than 2\^64",
                 id="a shape that overflows"),
    pytest.param(b'{}', 1 << 20, "runs past the end of the file", id="a header length beyond the file"),
    pytest.param(b'{}', 1, "too short", id="a header length of 1"),
    pytest.param(b'{}', 100_000_001, "exceeds the format's limit", id="a header length over the cap"),
]


@pytest.mark.parametrize("header,length,reason", MALFORMED_FILES)
def test_every_malformed_header_on_a_device_is_a_format_error(tmp_path, header, length, reason):
    path = write_raw(tmp_path / "bad.safetensors", header, b"\0" * 64, length)
    with cunvme.Device(f"emu:file={path},readonly", gpu=False) as dev:
        for load in (lambda: cunvme.load_safetensors(dev, path, framework="numpy"),
                     lambda: cunvme.iter_layers(dev, path, framework="numpy"),
                     lambda: cunvme.SafetensorsFile(dev, path)):
            with pytest.raises(cunvme.FormatError, match=reason) as e:
                load()
            assert str(path) in str(e.value)


def test_an_error_message_with_invalid_utf8_keeps_its_bytes_readable():
    # nlohmann's parse error quotes the bytes it read: they come back escaped, not as a decode error.
    with pytest.raises(cunvme.FormatError) as e:
        _cunvme.safetensors_header(b'{"\xff\xfe":1}', 1 << 10, "f")
    assert "\\xff" in str(e.value)


def test_a_file_shorter_than_the_header_length_field_is_a_format_error():
    with cunvme.Device("emu:lba=512,blocks=8", gpu=False) as dev:
        where = cunvme.Placement.from_extents(512, 5, [(0, 0, 1)], source="tiny")
        with pytest.raises(cunvme.FormatError, match="tiny"):
            cunvme.SafetensorsFile(dev, where)


# ---- a path must be the file the emulator serves -------------------------------------------------

def test_a_path_that_is_not_the_emulators_file_is_refused(model, tmp_path):
    other = tmp_path / "other.safetensors"
    other.write_bytes(model.read_bytes())  # the same bytes, another file
    with cunvme.Device(f"emu:file={model},readonly", gpu=False) as dev:
        with pytest.raises(ValueError, match="not the file"):
            cunvme.load_safetensors(dev, other, framework="numpy")
        # The same file by another name is fine.
        link = tmp_path / "link.safetensors"
        link.symlink_to(model)
        assert len(cunvme.load_safetensors(dev, link, framework="numpy")) == 3 * 4 + 3
    with cunvme.Device("emu:lba=512,blocks=4096", gpu=False) as dev:
        with pytest.raises(ValueError, match="not backed by a file"):
            cunvme.load_safetensors(dev, model, framework="numpy")


# ---- layers --------------------------------------------------------------------------------------

def test_a_layer_iterator_builds_a_dict_of_its_pairs(tmp_path):
    path = tmp_path / "m.safetensors"
    make_safetensors.main([str(path), "--layers", "2", "--dim", "64"])
    with cunvme.Device(f"emu:file={path},readonly", gpu=False) as dev:
        it = cunvme.iter_layers(dev, path, framework="numpy")
        layers = dict(it)
        assert list(layers) == ["", "model.layers.0", "model.layers.1"] == it.layer_keys()
        assert sorted(layers["model.layers.1"]) == sorted(f"model.layers.1.{n}" for n in ("attn.weight", "mlp.weight", "norm.bias", "norm.weight"))
        assert list(dict(cunvme.iter_layers(dev, path, framework="numpy", names=["lm_head.weight"]))) == [""]


class _Done:
    def wait(self):
        pass


class _EagerDevice:
    """A device whose GPU reads land the moment they are enqueued: the earliest a real one could
    write. Whatever the iterator lets the load stream write, a layer still in use would show."""

    def __init__(self, dev):
        self.dev = dev
        self.block_size = dev.block_size
        self.blocks = dev.blocks

    def read(self, lba, blocks, out, stream=None, sync=False):
        self.dev.read(lba, blocks, out)
        return _Done()


class _Event:
    def record(self, stream):
        pass


class _EagerFramework(cunvme.safetensors._Framework):
    """numpy arrays driven through the GPU path's streams and events (which order nothing here)."""

    def __init__(self):
        super().__init__("numpy", None)

    gpu = True

    def current_stream(self):
        return "current"

    def new_stream(self):
        return "load"

    def event(self, timing=False):
        return _Event()

    @staticmethod
    def wait(stream, event):
        pass

    def view(self, buffer, offset, t):
        n = t["end"] - t["begin"]
        return buffer[offset:offset + n].view(self.dtype(t)).reshape(t["shape"]), False


def test_a_streamed_layer_stays_intact_while_the_next_one_is_current(tmp_path):
    path = tmp_path / "m.safetensors"
    make_safetensors.main([str(path), "--layers", "11", "--dim", "64"])
    raw = file_bytes(path)
    with cunvme.Device(f"emu:file={path},readonly", gpu=False) as dev:
        f = cunvme.SafetensorsFile(_EagerDevice(dev), path)
        it = cunvme.safetensors.LayerIterator(f, _EagerFramework(), list(f.header["tensors"]), _cunvme.default_layer_key)
        previous = None
        seen = 0
        for key, layer in it:
            if previous is not None:
                # The promise: valid until the iterator has moved two layers on.
                for name, a in previous.items():
                    expect_tensor(raw, f.header, name, a)
            for name, a in layer.items():
                expect_tensor(raw, f.header, name, a)
            previous = layer
            seen += 1
        assert seen == 12


# ---- dtypes --------------------------------------------------------------------------------------

ALL_DTYPES = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
              "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
              "C64": 64, "F64": 64, "I64": 64, "U64": 64}


def test_every_safetensors_dtype_parses_with_its_size():
    for dtype, bits in ALL_DTYPES.items():
        text = json.dumps({"t": {"dtype": dtype, "shape": [2, 8], "data_offsets": [0, 2 * bits]}}).encode()
        t = _cunvme.safetensors_header(text, 8 + len(text) + 2 * bits, "f")["tensors"][0]
        assert (t["dtype"], t["element_bits"], t["end"]) == (dtype, bits, 2 * bits)
    with pytest.raises(cunvme.FormatError, match="12 bits, not whole bytes"):
        _cunvme.safetensors_header(b'{"t":{"dtype":"F6_E3M2","shape":[2],"data_offsets":[0,2]}}', 100, "f")


def test_dtypes_numpy_has_load_and_the_others_are_refused_by_name(tmp_path):
    raw = bytes(range(48))  # whole elements of every type: 384 bits
    for dtype, bits in ALL_DTYPES.items():
        path = tmp_path / f"{dtype}.safetensors"
        elements = len(raw) * 8 // bits
        header = json.dumps({"t": {"dtype": dtype, "shape": [elements], "data_offsets": [0, len(raw)]}}).encode()
        header += b" " * ((-(8 + len(header))) % 64)
        write_raw(path, header, raw)
        with cunvme.Device(f"emu:file={path},readonly", gpu=False) as dev:
            want = cunvme.safetensors._numpy_dtypes(np).get(dtype)
            if want is None:
                with pytest.raises(TypeError, match=f"numpy has no {dtype}"):
                    cunvme.load_safetensors(dev, path, framework="numpy")
                continue
            got = cunvme.load_safetensors(dev, path, framework="numpy")["t"]
            assert got.dtype == want and got.shape == (elements,) and got.tobytes() == raw, dtype
