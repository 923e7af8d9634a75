#!/usr/bin/env python3
"""nvme_info --doctor on fake sysfs trees: the command line, its output and exit statuses.

  doctor_cli.py NVME_INFO

Builds a tree under a temp dir (a root port, a PCIe switch, an NVMe controller and an NVIDIA
GPU below it, config space with the PCI Express capability and ACS), runs
`NVME_INFO --doctor --root TREE` with and without a BDF, and an empty tree; fails naming what
differs from what is expected. Standard library only.
"""

import os
import struct
import subprocess
import sys
import tempfile


def add_function(root, path, class_code, vendor, device, port_type, bars=(), driver=None, acs_control=None, speed=(4, 16, 4, 16)):
    """One function at sys/devices/PATH, linked from sys/bus/pci/devices (PCIe Base 6.0 layouts)."""
    d = os.path.join(root, 'sys', 'devices', path)
    os.makedirs(d)
    config = bytearray(4096)
    struct.pack_into('<HHHH', config, 0, vendor, device, 0, 0x10)  # status: capability list
    struct.pack_into('<I', config, 8, class_code << 8)
    config[0x0e] = 1 if class_code >> 8 == 0x0604 else 0
    config[0x34] = 0x40
    struct.pack_into('<BBH', config, 0x40, 0x10, 0, 2 | port_type << 4)  # PCI Express capability
    struct.pack_into('<I', config, 0x4c, speed[2] | speed[3] << 4)  # Link Capabilities
    struct.pack_into('<H', config, 0x52, speed[0] | speed[1] << 4)  # Link Status
    if acs_control is not None:
        struct.pack_into('<IHH', config, 0x100, 0x0d | 1 << 16, 0x1f, acs_control)
    with open(os.path.join(d, 'config'), 'wb') as f:
        f.write(config)
    for name, value in (('class', '0x%06x' % class_code), ('vendor', '0x%04x' % vendor), ('device', '0x%04x' % device)):
        with open(os.path.join(d, name), 'w') as f:
            f.write(value + '\n')
    lines, base = [], 0xf000000000
    for i in range(13):
        size = bars[i] if i < len(bars) else 0
        lines.append('0x%016x 0x%016x 0x%016x\n' % ((base, base + size - 1, 0x140204) if size else (0, 0, 0)))
        base += size
    with open(os.path.join(d, 'resource'), 'w') as f:
        f.writelines(lines)
    bus = os.path.join(root, 'sys', 'bus', 'pci', 'devices')
    os.makedirs(bus, exist_ok=True)
    os.symlink(os.path.relpath(d, bus), os.path.join(bus, os.path.basename(path)))
    if driver:
        drv = os.path.join(root, 'sys', 'bus', 'pci', 'drivers', driver)
        os.makedirs(drv, exist_ok=True)
        os.symlink(os.path.relpath(drv, d), os.path.join(d, 'driver'))


def switch_tree(root):
    rp = 'pci0000:00/0000:00:01.0'
    usp = rp + '/0000:01:00.0'
    add_function(root, rp, 0x060400, 0x8086, 0x1234, 4)
    add_function(root, usp, 0x060400, 0x1000, 0xc010, 5)
    add_function(root, usp + '/0000:02:00.0', 0x060400, 0x1000, 0xc010, 6, acs_control=0)
    add_function(root, usp + '/0000:02:01.0', 0x060400, 0x1000, 0xc010, 6, acs_control=0)
    add_function(root, usp + '/0000:02:00.0/0000:03:00.0', 0x010802, 0x144d, 0xa808, 0, bars=(16384,), speed=(4, 4, 4, 4))
    add_function(root, usp + '/0000:02:01.0/0000:04:00.0', 0x030200, 0x10de, 0x2330, 0,
                 bars=(16 << 20, 256 << 20, 0, 32 << 20), driver='nvidia', speed=(5, 16, 5, 16))
    os.makedirs(os.path.join(root, 'proc'))
    with open(os.path.join(root, 'proc', 'meminfo'), 'w') as f:
        f.write('HugePages_Total:      64\nHugePages_Free:       64\nHugepagesize:       2048 kB\n')
    os.makedirs(os.path.join(root, 'sys', 'module', 'nvidia'))


def run(nvme_info, *args):
    done = subprocess.run([nvme_info, '--doctor', *args], capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout, done.stderr


def main():
    nvme_info = sys.argv[1]
    problems = []

    def expect(what, condition):
        if not condition:
            problems.append(what)

    with tempfile.TemporaryDirectory(prefix='cunvme-doctor-') as tree, tempfile.TemporaryDirectory(prefix='cunvme-empty-') as empty:
        switch_tree(tree)
        status, out, err = run(nvme_info, '--root', tree)
        print(out, err)
        expect('exit status 0 on the switch tree', status == 0)
        for line in ('controller 0000:03:00.0  144d:a808  driver none', 'PCIe path         common PCIe switch: 0000:01:00.0',
                     'GPU 0  0000:04:00.0  10de:2330  driver nvidia  BAR1 256 MiB', 'the GPU\'s BAR1 is 256 MiB',
                     'not checked here (needs CUDA: cudaHostRegister with cudaHostRegisterIoMemory)'):
            expect('the output holds "%s"' % line, line in out)

        status, out, err = run(nvme_info, '0000:03:00.0', '--gpu', '0', '--root', tree)
        expect('exit status 0 with a BDF and --gpu 0', status == 0 and 'controller 0000:03:00.0' in out)

        status, out, err = run(nvme_info, '0000:3f:00.0', '--root', tree)
        expect('a missing BDF fails with a message naming it (got %d, %r)' % (status, err),
               status != 0 and '0000:3f:00.0: no such PCI device' in err)

        status, out, err = run(nvme_info, '--gpu', '3', '--root', tree)
        expect('a GPU index past the GPUs fails (got %d, %r)' % (status, err), status != 0 and 'no such NVIDIA GPU' in err)

        status, out, err = run(nvme_info, '--root', tree, '--bogus')
        expect('an unknown option fails with the usage (got %d)' % status, status != 0 and 'usage:' in err)

        status, out, err = run(nvme_info, '--root', empty)
        expect('an empty tree is a clean "no NVMe controller found" (got %d, %r)' % (status, out),
               status == 0 and 'no NVMe controller found' in out)

    for p in problems:
        print('FAILED: ' + p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
