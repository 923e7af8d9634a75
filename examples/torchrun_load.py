"""Load a safetensors checkpoint across the ranks of a torch.distributed group with cunvme: each
rank reads its share straight into its GPU (here through its own emulator over each file), and
the group's collectives hand every rank the tensors it asked for.

    torchrun --nproc-per-node 4 examples/torchrun_load.py model.safetensors.index.json
    torchrun --nproc-per-node 2 examples/torchrun_load.py model.safetensors --shard '*.mlp.*=0' --check

``--check`` compares every tensor on every rank with ``safetensors.torch.load_file`` (torch.equal;
a sharded one with its ``torch.tensor_split`` slice). Each rank prints its metrics as one JSON line.
"""

import argparse
import json
import os
import sys

import cunvme  # first: it sets the CUDA environment variables the GPU path needs

import torch
import torch.distributed as dist


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", nargs="+", help="a .safetensors file, several, or an index JSON")
    p.add_argument("--shard", action="append", default=[], help="NAME_OR_GLOB=DIM: a rank gets its slice along DIM")
    p.add_argument("--names", action="append", help="load only these names or globs")
    p.add_argument("--backend", default=None, help="nccl (default with one GPU per rank) or gloo")
    p.add_argument("--subgroup", action="store_true", help="load in a subgroup of the even ranks (the others wait)")
    p.add_argument("--check", action="store_true", help="compare with safetensors.torch.load_file")
    p.add_argument("--chunk-bytes", type=int, default=None, help="the read/exchange pipeline's step (default 128 MiB)")
    a = p.parse_args(argv)

    local = int(os.environ.get("LOCAL_RANK", "0"))
    gpus = torch.cuda.device_count()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    backend = a.backend or ("nccl" if gpus >= int(os.environ.get("LOCAL_WORLD_SIZE", world)) else "gloo")
    gpu = local % gpus  # gloo may put several ranks on one GPU; nccl needs one each
    torch.cuda.set_device(gpu)
    dist.init_process_group(backend, device_id=torch.device("cuda", gpu) if backend == "nccl" else None)
    members = [r for r in range(dist.get_world_size()) if r % 2 == 0] if a.subgroup else list(range(dist.get_world_size()))
    group = dist.new_group(members)
    if dist.get_rank() not in members:
        dist.barrier()
        dist.destroy_process_group()
        return 0

    try:
        return load_and_check(a, group, gpu, backend)
    finally:
        if a.subgroup:
            dist.barrier()  # the ranks outside the group wait here, whatever happened inside it
        dist.destroy_process_group()


def load_and_check(a, group, gpu, backend):
    shard = {k: int(v) for k, _, v in (s.rpartition("=") for s in a.shard)}
    devices = {}

    def open_file(path):  # each rank its own emulator over the file, serving this rank's GPU
        devices[path] = cunvme.Device(f"emu:file={path},readonly", gpu=gpu)
        return devices[path]

    source = a.checkpoint if len(a.checkpoint) > 1 else a.checkpoint[0]
    try:
        weights = cunvme.load_safetensors(open_file, source, process_group=group, names=a.names, shard=shard or None,
                                          chunk_bytes=a.chunk_bytes)
    finally:
        for d in devices.values():
            d.close()
    line = json.dumps({**weights.metrics, "global_rank": dist.get_rank(), "gpu": gpu, "backend": backend, "tensors": len(weights)})
    os.write(sys.stdout.fileno(), (line + "\n").encode())  # one write: the ranks share the pipe

    status = 0
    if a.check:
        import fnmatch

        from safetensors.torch import load_file

        files = cunvme.distributed.read_index(source)[0] if isinstance(source, str) and source.endswith(".json") else a.checkpoint
        want = {}
        for f in files:
            want.update(load_file(f, device=f"cuda:{gpu}"))
        rank, ranks = dist.get_rank(group), dist.get_world_size(group)
        for name, t in weights.items():
            dim = next((d for pat, d in shard.items() if fnmatch.fnmatchcase(name, pat)), None)
            expected = want[name] if dim is None else torch.tensor_split(want[name], ranks, dim)[rank]
            if not torch.equal(t, expected):
                print(f"rank {rank}: {name} differs from safetensors.torch.load_file", file=sys.stderr)
                status = 1
        missing = set(cunvme.distributed.select(sorted(want), a.names)) - set(weights)
        if missing:
            print(f"rank {rank}: {len(missing)} tensors missing, e.g. {sorted(missing)[0]}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
