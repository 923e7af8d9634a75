"""cunvme's exceptions. The extension raises them; they live here so that they are plain Python
classes with plain attributes."""


class Error(Exception):
    """Base of every exception cunvme raises (besides ValueError/TypeError for bad arguments)."""


class DeviceError(Error):
    """A setup failure (the C++ library's ``host::error``): the device could not be opened,
    queues created or memory mapped, a command timed out on the host path, or the device is
    closed or has no GPU path.

    ``operation`` and ``device`` say what was being done where (None when the extension itself
    refused); ``status`` is the NVMe status name when the controller refused a command."""

    def __init__(self, message, operation=None, device=None, status=None):
        super().__init__(message)
        self.operation = operation
        self.device = device
        self.status = status


class NvmeError(Error):
    """A read, write or flush completed with an NVMe error status.

    ``status`` is the status's name in the NVMe specification ("LBA Out of Range"),
    ``status_code`` its value (SCT << 8) | SC, and ``lba`` and ``blocks`` the range of the
    command that failed."""

    def __init__(self, message, status, status_code, lba, blocks):
        super().__init__(message)
        self.status = status
        self.status_code = status_code
        self.lba = lba
        self.blocks = blocks


class IoError(Error):
    """A GPU read or write that ended without an NVMe status: a completion timeout, or a request
    the device's readers refused. ``reason`` says which; ``lba`` and ``blocks`` the command's range;
    ``cause``, for a timeout, what the device saw meanwhile that likely explains it (the
    emulator's copies held up in the CUDA driver), else None. The message includes it too."""

    def __init__(self, message, reason, lba, blocks, cause=None):
        super().__init__(message)
        self.reason = reason
        self.lba = lba
        self.blocks = blocks
        self.cause = cause


class FormatError(Error, ValueError):
    """A file the loader refuses: a safetensors header that breaks the format (the C++ parser's
    rules: length, JSON, dtype, shape, offsets, overlaps, duplicate keys), or file bytes that lie
    on no block of the device (see ``cunvme.Placement``)."""
