#!/usr/bin/env python3
"""The layering of include/cunvme, checked from its #include lines (DESIGN.md, "Layers").

  check_layers.py graph   INCLUDE_DIR   fails naming every edge that runs to a higher layer
  check_layers.py lengths INCLUDE_DIR   fails naming every header outside spec/ longer than MAX_LINES
  check_layers.py access  INCLUDE_DIR   fails naming every volatile access, asm or fence outside ACCESS_LAYER
  check_layers.py self-test             the checks against small trees made on the spot

Layers, bottom to top: spec (0, beside it kmod: the kernel module's ioctl ABI, a plain C
header shared with kmod/) < detail (1: access.cuh, checked.cuh, write_combined.cuh) < policy (2) < io (3)
< volume (4: several namespaces as one, over the readers) < cache (5: the page cache and arrays over a
namespace or a volume) < host (6) < emu (7). Inside host/, its folders have an order of their own
(HOST_ORDER): error.cuh, cuda_error.cuh < memory/ < backend/ < controller/ = queue/ < gpu/ < owners/ = sharing/ < open.cuh. A header may include its own layer and those below. The
facade (8) sits beside them: it may include everything up to host, but not emu; the loader (9) may
include the facade and what it may. config.cuh (macros
and the ABI namespace) and cunvme.cuh (the umbrella) are exempt. A header in a folder not
named here fails too, so a new folder has to be placed in the order before it is used.

Standard library only: it runs wherever Meson does.
"""

import os
import re
import sys
import tempfile

LAYERS = {'spec': 0, 'kmod': 0, 'detail': 1, 'policy': 2, 'io': 3, 'volume': 4, 'cache': 5, 'host': 6, 'emu': 7, 'facade': 8, 'loader': 9}
# Which layers each layer may include (itself and those below, but the facade skips emu:
# it drives devices through host::open, never the emulator's own types).
ALLOWED = {name: {other for other, at in LAYERS.items() if at <= level} for name, level in LAYERS.items()}
ALLOWED['facade'] = {'spec', 'detail', 'policy', 'io', 'volume', 'cache', 'host', 'facade'}
# The loader (safetensors over a device) sits on the facade, and likewise never on emu.
ALLOWED['loader'] = ALLOWED['facade'] | {'loader'}
EXEMPT = {'config.cuh', 'cunvme.cuh'}

# host/ in folders, each answering one question, bottom to top; a host header may include host
# headers of its own rank and below. controller/ and queue/ share a rank: a controller owns its
# queue pairs and a queue pair names its controller (controller.cuh includes queue_pair.cuh at its
# end, for the definitions). Top-level files are placed by name; anything else in host/ fails.
HOST_ORDER = {
    'error.cuh': 0,        # the one error type
    'cuda_error.cuh': 0,   # CUDA runtime and driver failures as that error
    'memory': 1,           # what a controller can DMA to; host and GPU memory made reachable
    'backend': 2,          # how the host reaches a controller: emulator, sysfs, VFIO, kmod
    'controller': 3,       # bring-up, admin commands, namespaces, recovery
    'queue': 3,            # I/O queue pairs and the host's synchronous I/O
    'gpu': 4,              # GPU threads as drivers: contexts, reach, dma-bufs, queue pairs for kernels
    'owners': 5,           # host objects that own the memory of device-side structures
    'sharing': 5,          # a controller shared by processes: its owner, and those attached to it
    'open.cuh': 6,         # one entry point for every way to reach a controller
}

# Edges allowed although they run upward, each with its reason. Nothing broader than one edge.
ALLOWED_EDGES = {
    # The emulator is a device behind the host's backend concept (register_backend): this
    # header is the one bridge that wires emu::controller in as a backend, as sysfs_backend
    # and vfio_backend wire in kernel interfaces.
    ('host/backend/emu_backend.cuh', 'emu/controller.cuh'),
    # The same bridge builds the emulator an `emu:` URI describes (host::open_emulator).
    ('host/backend/emu_backend.cuh', 'emu/controller_config.cuh'),
    ('host/backend/emu_backend.cuh', 'emu/timing_model.cuh'),
    # The CUDA side of that bridge: host::gpu_reach() hands the emulator its CUDA memory hooks,
    # so that host::open itself names no emulator type.
    ('host/gpu/gpu_reach.cuh', 'emu/cuda_memory.cuh'),
}

# Headers outside spec/ longer than this fail the check (issue 15: "no header outside spec/
# longer than about 500 lines"). False would only report them.
MAX_LINES = 500
LENGTH_LIMIT_ENFORCED = True

INCLUDE = re.compile(r'^\s*#\s*include\s*<cunvme/([^>]+)>')

# Rule 3 (STYLE.md): inline PTX, volatile accesses and fences live in the access layer only, so
# every ordering decision is made, named and explained in one file.
ACCESS_LAYER = 'detail/access.cuh'
LOW_LEVEL = re.compile(r'\bvolatile\b|\basm\b|\b__asm__\b|\b__atomic_\w+|\b_mm_[lsm]fence\b|\batomic_(thread|signal)_fence\b|\b__threadfence\w*')
# Comments and string literals (a "volatile write cache" is no volatile access).
NOT_CODE = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)


def headers(root):
    """Every header under `root`, as a path relative to it with '/' separators."""
    found = []
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(('.cuh', '.hpp', '.h')):
                found.append(os.path.relpath(os.path.join(folder, name), root).replace(os.sep, '/'))
    return sorted(found)


def layer_of(header):
    """The layer name of a header path, None for an exempt one, '?' for an unplaced one."""
    if header in EXEMPT:
        return None
    top = header.split('/', 1)[0] if '/' in header else ''
    return top if top in LAYERS else '?'


def host_rank(header):
    """The rank in HOST_ORDER of a header under host/, None when it is placed nowhere."""
    return HOST_ORDER.get(header.split('/')[1])


def graph_problems(root):
    problems = []
    for header in headers(root):
        source = layer_of(header)
        if source == '?':
            problems.append(f'{header}: in no layer (place its folder in LAYERS)')
            continue
        if source is None:
            continue
        if source == 'host' and host_rank(header) is None:
            problems.append(f'{header}: in no folder of host/ (place it in HOST_ORDER)')
            continue
        with open(os.path.join(root, header), encoding='utf-8') as f:
            for number, line in enumerate(f, 1):
                match = INCLUDE.match(line)
                if not match:
                    continue
                target = match.group(1)
                where = f'{header}:{number}: includes <cunvme/{target}>'
                if not os.path.isfile(os.path.join(root, target)):
                    problems.append(f'{where}, which does not exist')
                    continue
                to = layer_of(target)
                if to is None or (header, target) in ALLOWED_EDGES:
                    continue
                if to == '?':
                    problems.append(f'{where}, which is in no layer')
                elif to not in ALLOWED[source]:
                    problems.append(f'{where}: {source} ({LAYERS[source]}) may not include {to} ({LAYERS[to]})')
                elif source == 'host' and to == 'host' and (host_rank(target) is None or host_rank(target) > host_rank(header)):
                    problems.append(f'{where}: host/{header.split("/")[1]} ({host_rank(header)}) may not include '
                                    f'host/{target.split("/")[1]} ({host_rank(target)}) (HOST_ORDER)')
    return problems


def long_headers(root):
    found = []
    for header in headers(root):
        if header.startswith('spec/'):
            continue
        with open(os.path.join(root, header), encoding='utf-8') as f:
            lines = sum(1 for _ in f)
        if lines > MAX_LINES:
            found.append((header, lines))
    return found


def report(problems, kind, summary, success):
    """Prints each problem as `kind: problem`, then `summary` (failure, 1) or `success` (0)."""
    for p in problems:
        print(f'{kind}: {p}')
    print(summary if problems else success)
    return 1 if problems else 0


def check_graph(root):
    problems = graph_problems(root)
    return report(problems, 'upward include',
                  f'{len(problems)} include(s) against the layer order spec < detail < policy < io < volume < cache < host < emu '
                  '(facade: up to host); see test/layers/check_layers.py',
                  f'include graph of {root}: every include runs downward')


def check_lengths(root):
    found = long_headers(root)
    for header, lines in found:
        print(f'long header: {header}: {lines} lines (limit {MAX_LINES} outside spec/)')
    if not found:
        print(f'every header outside spec/ has at most {MAX_LINES} lines')
        return 0
    if LENGTH_LIMIT_ENFORCED:
        return 1
    print('reporting only (LENGTH_LIMIT_ENFORCED = False in test/layers/check_layers.py)')
    return 0


def access_problems(root):
    """Each volatile access, asm statement or fence in a header other than ACCESS_LAYER."""
    problems = []
    for header in headers(root):
        if header == ACCESS_LAYER:
            continue
        with open(os.path.join(root, header), encoding='utf-8') as f:
            code = NOT_CODE.sub(lambda m: '\n' * m.group(0).count('\n'), f.read())
        for number, line in enumerate(code.split('\n'), 1):
            for match in LOW_LEVEL.finditer(line):
                problems.append(f'{header}:{number}: {match.group(0)}')
    return problems


def check_access(root):
    problems = access_problems(root)
    return report(problems, 'outside the access layer',
                  f'{len(problems)} volatile access(es), asm or fence(s) outside {ACCESS_LAYER}: move them there, named for what they order',
                  f'every volatile access, asm and fence of {root} is in {ACCESS_LAYER}')


def self_test():
    """Both checks see what they must: a clean tree passes, each kind of bad edge fails."""
    with tempfile.TemporaryDirectory(prefix='cunvme_layers_') as base:
        return self_test_in(base)


def self_test_in(base):
    """The self-test, its trees made under `base` (removed afterwards)."""
    def tree(files):
        root = tempfile.mkdtemp(dir=base)
        for path, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), 'w', encoding='utf-8') as f:
                f.write(text)
        return root

    clean = {
        'config.cuh': '',
        'cunvme.cuh': '#include <cunvme/io/reader.cuh>\n',
        'spec/a.cuh': '#include <cunvme/config.cuh>\n',
        'policy/b.cuh': '#include <cunvme/spec/a.cuh>\n',
        'io/reader.cuh': '#include <cunvme/policy/b.cuh>\n',
        'host/backend/emu_backend.cuh': '#include <cunvme/emu/controller.cuh>\n',
        'emu/controller.cuh': '#include <cunvme/policy/b.cuh>\n',
        'facade/copy.cuh': '#include <cunvme/host/backend/emu_backend.cuh>\n#include <cunvme/io/reader.cuh>\n',
        'volume/volume.cuh': '#include <cunvme/io/reader.cuh>\n',
        'cache/page_cache.cuh': '#include <cunvme/io/reader.cuh>\n#include <cunvme/volume/volume.cuh>\n',
        'host/owners/page_cache_memory.cuh': '#include <cunvme/cache/page_cache.cuh>\n#include <cunvme/host/memory/m.cuh>\n',
        'host/memory/m.cuh': '#include <cunvme/host/error.cuh>\n',
        'host/error.cuh': '',
        'host/controller/c.cuh': '#include <cunvme/host/queue/q.cuh>\n',
        'host/queue/q.cuh': '#include <cunvme/host/controller/c.cuh>\n',
    }
    failures = []
    if graph_problems(tree(clean)):
        failures.append(f'a clean tree was refused: {graph_problems(tree(clean))}')
    bad_edges = {
        'policy -> io': ('policy/b.cuh', '#include <cunvme/io/reader.cuh>\n'),
        'spec -> detail': ('spec/a.cuh', '#  include <cunvme/detail/x.cuh>\n'),
        'host -> emu outside the bridge': ('host/open.cuh', '#include <cunvme/emu/controller.cuh>\n'),
        'facade -> emu': ('facade/copy.cuh', '#include <cunvme/emu/controller.cuh>\n'),
        'an include of a missing header': ('io/w.cuh', '#include <cunvme/io/missing.cuh>\n'),
        'a header in no layer': ('array/stripe.cuh', '#include <cunvme/io/reader.cuh>\n'),
        'volume -> cache': ('volume/volume.cuh', '#include <cunvme/cache/page_cache.cuh>\n'),
        'cache -> host': ('cache/page_cache.cuh', '#include <cunvme/host/backend/emu_backend.cuh>\n'),
        'io -> cache': ('io/reader.cuh', '#include <cunvme/cache/page_cache.cuh>\n'),
        'host/memory -> host/controller': ('host/memory/m.cuh', '#include <cunvme/host/controller/c.cuh>\n'),
        'host/controller -> host/owners': ('host/controller/c.cuh', '#include <cunvme/host/owners/page_cache_memory.cuh>\n'),
        'a header in no folder of host/': ('host/stray.cuh', '#include <cunvme/host/error.cuh>\n'),
        'a header in an unplaced host folder': ('host/misc/x.cuh', '#include <cunvme/host/error.cuh>\n'),
    }
    for what, (path, text) in bad_edges.items():
        files = dict(clean)
        files['detail/x.cuh'] = ''
        files[path] = files.get(path, '') + text
        problems = graph_problems(tree(files))
        if not any(p.startswith(path) for p in problems):
            failures.append(f'{what} was not reported (got {problems})')
    long = dict(clean)
    long['emu/controller.cuh'] = '//\n' * (MAX_LINES + 1)
    long['spec/a.cuh'] = '//\n' * (MAX_LINES + 1)
    if long_headers(tree(long)) != [('emu/controller.cuh', MAX_LINES + 1)]:
        failures.append(f'long headers: expected only emu/controller.cuh, got {long_headers(tree(long))}')
    low_level = dict(clean)
    low_level['detail/access.cuh'] = 'asm volatile("fence.sc.sys;");\n'
    low_level['policy/b.cuh'] = '// a volatile write cache\nconst char* s = "asm volatile";\n'
    if access_problems(tree(low_level)):
        failures.append(f'the access layer or words in comments and strings were refused: {access_problems(tree(low_level))}')
    for text in ('*static_cast<volatile int*>(p) = 1;\n', '__atomic_store_n(p, 1, __ATOMIC_RELAXED);\n', 'asm("membar.sys;");\n',
                 '_mm_sfence();\n', 'std::atomic_thread_fence(std::memory_order_seq_cst);\n', '__threadfence_system();\n'):
        files = dict(low_level)
        files['detail/write_combined.cuh'] = '// copies\n' + text
        if access_problems(tree(files)) != [f'detail/write_combined.cuh:2: {LOW_LEVEL.search(text).group(0)}']:
            failures.append(f'{text.strip()} outside the access layer was not reported (got {access_problems(tree(files))})')
    for f in failures:
        print(f'self-test: {f}')
    if not failures:
        print('self-test: the checks report every kind of bad include, long header and low-level access, and pass a clean tree')
    return 1 if failures else 0


def main(argv):
    if len(argv) == 2 and argv[1] == 'self-test':
        return self_test()
    checks = {'graph': check_graph, 'lengths': check_lengths, 'access': check_access}
    if len(argv) == 3 and argv[1] in checks and os.path.isdir(argv[2]):
        return checks[argv[1]](argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == '__main__':
    sys.exit(main(sys.argv))
