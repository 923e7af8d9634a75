"""cunvme for Python: NVMe controllers (the embedded emulator by default) driven from Python, with
reads and writes into numpy arrays through the host path and into GPU arrays (torch, cupy: DLPack or
``__cuda_array_interface__``) through ``cunvme::copy_n``.

    import numpy as np, cunvme
    with cunvme.Device("emu:blocks=4096") as dev:
        src = np.arange(dev.block_size * 8, dtype=np.uint8)
        dev.write(0, 8, src)
        out = np.empty_like(src)
        dev.read(0, 8, out)

``Device(uri="emu", nsid=1, timeout=10.0, gpu=None, faults=None)`` opens the controller ``uri`` names (the
C++ library's URIs: ``emu[:key=value,...]``, ``sysfs:BDF``, ``vfio:BDF``, ``kmod:BDF``). Where a
CUDA GPU is found (and ``gpu`` is not False) it is opened for GPU threads, as ``cunvme::device``;
otherwise for CPU threads only, and GPU arrays are refused. ``faults`` (an ``emu`` device only):
the emulator's fault injection, one rule or a list, as the URI's ``fault=`` key takes them.

``dev.read(lba, blocks, out, stream=None, sync=False)`` and ``dev.write(lba, blocks, src, ...)``:

- a host array (numpy, bytearray, memoryview, a CPU tensor): done when the call returns, through
  the host path (one queue pair, a bounce buffer, one command of at most MDTS at a time); returns None.
- a GPU array: enqueued on ``stream`` (None: the legacy default stream; an int handle, a torch stream,
  a cupy stream) as ``copy_n`` does, and a ``Transfer`` is returned at once; its ``wait()`` blocks
  until the stream has run the copy and raises if it failed. ``sync=True`` waits before returning
  (and returns None). Ordering against work that produced or will consume the array is the
  stream's: pass the stream that work runs on.

The array must be C-contiguous and hold at least ``blocks * dev.block_size`` bytes (a larger array
is fine: the first bytes are used); a GPU array must start on a 4-byte boundary. Bad arguments
raise ValueError (size, contiguity, alignment, read-only ``out``) or TypeError (not an array,
object dtype); NVMe statuses raise ``NvmeError``; setup failures ``DeviceError``; GPU timeouts
``IoError``.

Safetensors files (``cunvme.safetensors``): ``load_safetensors(dev, path_or_placement,
framework='torch'|'cupy'|'numpy', device=None, names=None)`` returns ``{name: tensor}`` read
straight into one array per call, ``iter_layers(...)`` yields ``(layer key, {name: tensor})``
with the next layer's reads overlapping the caller's compute (a layer valid until the iterator
has moved two layers on); ``Placement`` says where the file lies on the device (a path: the
emulator ``emu:file=`` that same file, checked); headers are checked by
the C++ parser, and a file it refuses raises ``FormatError``. With ``process_group=`` the ranks of
a ``torch.distributed`` group load a checkpoint together (``cunvme.distributed``): each reads a
share into its GPU and the group's collectives hand every rank its tensors (replicated, or sliced
per rank with ``shard=``).

Importing cunvme sets ``CUDA_DEVICE_MAX_CONNECTIONS=32`` and ``CUDA_MODULE_LOADING=EAGER`` where
they are not set (``cunvme::host::prepare_cuda_environment``: kernels that wait for the emulator
need them). CUDA reads them once, at its first call in the process: import cunvme before torch or
cupy touch the GPU, or set them yourself.
"""

import os as _os

for _name, _value in (("CUDA_DEVICE_MAX_CONNECTIONS", "32"), ("CUDA_MODULE_LOADING", "EAGER")):
    _os.environ.setdefault(_name, _value)

from ._errors import DeviceError, Error, FormatError, IoError, NvmeError  # noqa: E402
from ._cunvme import Device, Transfer, __version__, gpu_unavailable_reason, status_name  # noqa: E402
from .safetensors import LayerIterator, Loaded, Placement, SafetensorsFile, iter_layers, load_safetensors  # noqa: E402
from .distributed import DistributedLoadError  # noqa: E402

__all__ = [
    "Device",
    "DeviceError",
    "DistributedLoadError",
    "Error",
    "FormatError",
    "IoError",
    "LayerIterator",
    "Loaded",
    "NvmeError",
    "Placement",
    "SafetensorsFile",
    "Transfer",
    "__version__",
    "gpu_unavailable_reason",
    "iter_layers",
    "load_safetensors",
    "status_name",
]
