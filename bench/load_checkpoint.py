"""load_checkpoint: wall time from nothing to every rank holding a checkpoint's tensors on its GPU,
for cunvme and its peers, in one run and one process group, every tensor checked:

    python bench/load_checkpoint.py make /tmp/ckpt --gb 8 --files 4        # bf16, written by safetensors
    torchrun --nproc-per-node 4 bench/load_checkpoint.py run /tmp/ckpt --repeat 3 > results/….jsonl

``make`` writes a Llama-shaped bf16 checkpoint (hidden 4096, MLP 14336, vocabulary 128256; as
many layers as reach ``--gb``) in ``--files`` shards plus ``model.safetensors.index.json``, with
``safetensors.torch.save_file``, then reads every file once so that it sits in the page cache.

``run`` measures, per loader and repeat, on the ranks of one group (NCCL, one GPU per rank):
a barrier, the load, a CUDA synchronize, a barrier; the figure is the slowest rank's time, and
bytes are the checkpoint's tensor bytes (every rank ends with all of them: replicated). Loaders:

- ``cunvme``: ``load_safetensors(..., process_group=group)``, each rank its own emulator over each
  file (``emu:file=``, ``--workers`` threads each; opened inside the timing): a share read by
  each rank, broadcast over NCCL, pipelined.
- ``safetensors``: ``safetensors.torch.load_file(f, device=cuda:N)`` of every file on every rank.
- ``instanttensor-mmap``, ``instanttensor-buffered``, ``instanttensor`` (its default, direct I/O)
  and ``fastsafetensors`` (``nogds=True``): see ``PEERS`` (run only where importable).

The machine's limits are measured in the same run: pinned host → GPU copies on every rank at
once, and an NCCL broadcast of 1 GiB. After each load every tensor on every rank is compared
with ``safetensors.torch.load_file`` (``torch.equal``); a loader that fails or differs prints an
``error`` and no figure. One JSON object per line, from rank 0.

Caveats: a peer that fails on some ranks only leaves the others in its collectives until the
group's timeout (run one loader per invocation with ``--loaders`` to isolate one). Importing
cunvme sets ``CUDA_DEVICE_MAX_CONNECTIONS=32`` and ``CUDA_MODULE_LOADING=EAGER`` for the whole
process, the peers' runs included: say so beside their figures.
"""

import argparse
import glob
import json
import os
import sys
import time

LLAMA = {"hidden": 4096, "mlp": 14336, "vocab": 128256, "heads_kv": 8, "head_dim": 128}


def make(out, gb, files):
    import torch
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    h, m, v, kv = LLAMA["hidden"], LLAMA["mlp"], LLAMA["vocab"], LLAMA["heads_kv"] * LLAMA["head_dim"]
    g = torch.Generator().manual_seed(0)

    def t(*shape):
        return torch.randn(*shape, generator=g).to(torch.bfloat16)

    tensors = {"model.embed_tokens.weight": t(v, h)}
    layer = 0
    target = gb * 1e9 - 2 * v * h * 2
    while sum(x.numel() * 2 for x in tensors.values()) < target:
        p = f"model.layers.{layer}"
        tensors.update({f"{p}.self_attn.q_proj.weight": t(h, h), f"{p}.self_attn.k_proj.weight": t(kv, h),
                        f"{p}.self_attn.v_proj.weight": t(kv, h), f"{p}.self_attn.o_proj.weight": t(h, h),
                        f"{p}.mlp.gate_proj.weight": t(m, h), f"{p}.mlp.up_proj.weight": t(m, h), f"{p}.mlp.down_proj.weight": t(h, m),
                        f"{p}.input_layernorm.weight": t(h), f"{p}.post_attention_layernorm.weight": t(h)})
        layer += 1
    tensors["model.norm.weight"] = t(h)
    tensors["lm_head.weight"] = t(v, h)
    names = list(tensors)
    per = -(-len(names) // files)
    weight_map = {}
    for k in range(files):
        part = names[k * per:(k + 1) * per]
        name = f"model-{k + 1:05d}-of-{files:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, os.path.join(out, name))
        weight_map.update({n: name for n in part})
    total = sum(x.numel() * 2 for x in tensors.values())
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    warm(out)
    print(json.dumps({"made": out, "layers": layer, "tensors": len(names), "bytes": total, "files": files}))


def warm(folder):
    """Reads every shard once: the page cache holds them for the runs."""
    for path in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        with open(path, "rb") as f:
            while f.read(64 << 20):
                pass


# --- loaders: each returns {name: tensor on this rank's GPU} ------------------------------------


def load_cunvme(ctx):
    import cunvme

    devices = {}

    def open_file(path):
        devices[path] = cunvme.Device(f"emu:file={path},readonly,workers={ctx['workers']}", gpu=ctx["gpu"])
        return devices[path]

    try:
        out = cunvme.load_safetensors(open_file, ctx["index"], process_group=ctx["group"])
    except BaseException:
        for d in devices.values():
            d.close()
        raise
    ctx["finish"] = lambda: [d.close() for d in devices.values()]
    ctx["metrics"] = out.metrics
    return out


def load_safetensors_torch(ctx):
    from safetensors.torch import load_file

    out = {}
    for f in ctx["files"]:
        out.update(load_file(f, device=f"cuda:{ctx['gpu']}"))
    return out


def load_instanttensor(ctx, backend):
    """InstantTensor 0.2.x (as vLLM calls it): ``safe_open`` over every file with the group (its
    NCCL mode: each rank reads a slice of each chunk, then an all-gather), ``backend`` through
    ``INSTANTTENSOR_BACKEND`` (None: its default, direct I/O on a disk file)."""
    import instanttensor

    if backend is None:
        os.environ.pop("INSTANTTENSOR_BACKEND", None)
    else:
        os.environ["INSTANTTENSOR_BACKEND"] = backend
    out = {}
    group = ctx["group"] if ctx["ranks"] > 1 else None  # a one-rank group is refused
    with instanttensor.safe_open(list(ctx["files"]), framework="pt", device=ctx["gpu"], process_group=group) as f:
        for name, t in f.tensors():
            out[name] = t
    return out


def load_fastsafetensors(ctx):
    """fastsafetensors (as vLLM used it): one file per rank per round, ``nogds=True`` with its
    documented 16 copy threads; ``get_tensor`` broadcasts from the rank that read the file."""
    from fastsafetensors import SafeTensorsFileLoader, SingleGroup

    group = ctx["group"] if ctx["ranks"] > 1 else SingleGroup()
    loader = SafeTensorsFileLoader(group, f"cuda:{ctx['gpu']}", nogds=True, max_threads=16)
    out = {}
    try:
        files = ctx["files"]
        for i in range(0, len(files), ctx["ranks"]):
            loader.add_filenames({r: [f] for r, f in enumerate(files[i:i + ctx["ranks"]])})
            buffer = loader.copy_files_to_device()
            for name in list(buffer.key_to_rank_lidx):
                out[name] = buffer.get_tensor(name)
            buffer.close()
            loader.reset()
    finally:
        loader.close()
    return out


# Peers that need their own wheels (installed offline on the GPU machines): name -> loader; the
# module is the name up to its first "-".
PEERS = {
    "instanttensor-mmap": lambda ctx: load_instanttensor(ctx, "MMAP"),
    "instanttensor-buffered": lambda ctx: load_instanttensor(ctx, "BUFFERED"),
    "instanttensor": lambda ctx: load_instanttensor(ctx, None),
    "fastsafetensors": load_fastsafetensors,
}


def peers_available():
    import importlib.util

    return {name: fn for name, fn in PEERS.items() if importlib.util.find_spec(name.split("-")[0]) is not None}


# --- the run ---------------------------------------------------------------------------------


def limits(ctx):
    """Pinned host → GPU on every rank at once, and a 1 GiB NCCL broadcast: GB/s each."""
    import torch
    import torch.distributed as dist

    n = 1 << 30
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    gpu = torch.empty(n, dtype=torch.uint8, device=f"cuda:{ctx['gpu']}")
    best_h2d = best_bcast = 0.0
    for _ in range(3):
        dist.barrier(group=ctx["group"])
        t0 = time.perf_counter()
        gpu.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        dist.barrier(group=ctx["group"])
        best_h2d = max(best_h2d, n * ctx["ranks"] / (time.perf_counter() - t0) / 1e9)
        t0 = time.perf_counter()
        dist.broadcast(gpu, src=dist.get_global_rank(ctx["group"], 0), group=ctx["group"])
        torch.cuda.synchronize()
        dist.barrier(group=ctx["group"])
        best_bcast = max(best_bcast, n / (time.perf_counter() - t0) / 1e9)
    del host, gpu
    torch.cuda.empty_cache()
    return {"pinned_h2d_all_ranks_gb_per_s": best_h2d, "nccl_broadcast_gb_per_s": best_bcast}


def run(a):
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    group = dist.new_group(list(range(dist.get_world_size())))
    index = os.path.join(a.checkpoint, "model.safetensors.index.json")
    with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    files = sorted({os.path.join(a.checkpoint, v) for v in weight_map.values()})
    ctx = {"gpu": local, "group": group, "ranks": dist.get_world_size(group), "index": index, "files": files, "workers": a.workers}
    rank0 = dist.get_rank(group) == 0

    def say(obj):
        if rank0:
            print(json.dumps({"ranks": ctx["ranks"], "gpu_name": torch.cuda.get_device_name(local), **obj}), flush=True)

    say({"limits": limits(ctx), "checkpoint": a.checkpoint, "tensors": len(weight_map)})
    reference = load_safetensors_torch(ctx)
    total = sum(t.numel() * t.element_size() for t in reference.values())
    loaders = {"cunvme": load_cunvme, "safetensors": load_safetensors_torch, **peers_available()}
    chosen = a.loaders.split(",") if a.loaders else list(loaders)
    for name in chosen:
        for repeat in range(a.repeat):
            ctx.pop("metrics", None)
            error, got = None, None
            dist.barrier(group=group)
            t0 = time.perf_counter()
            try:
                got = loaders[name](ctx)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - a loader's failure is a result, reported
                error = f"{type(e).__name__}: {e}"
            seconds = time.perf_counter() - t0
            if error is None:
                wrong = [n for n, t in reference.items() if n not in got or not torch.equal(got[n], t)]
                error = f"{len(wrong)} tensors differ or are missing, e.g. {wrong[0]}" if wrong else None
            slowest = torch.tensor([seconds, 1.0 if error else 0.0], device=f"cuda:{local}")
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
            record = {"loader": name, "repeat": repeat}
            if slowest[1].item() > 0:
                record["error"] = error or "failed on another rank"
            else:
                record.update({"seconds": slowest[0].item(), "bytes": total, "gb_per_s_per_rank": total / slowest[0].item() / 1e9,
                               "verified": "torch.equal with safetensors.torch.load_file, every tensor, every rank"})
                if "metrics" in ctx:
                    record["rank0_metrics"] = ctx["metrics"]
            say(record)
            if "finish" in ctx:
                ctx.pop("finish")()
            del got
            torch.cuda.empty_cache()
    dist.destroy_process_group()


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make", help="write a bf16 checkpoint with safetensors")
    m.add_argument("out")
    m.add_argument("--gb", type=float, default=8.0)
    m.add_argument("--files", type=int, default=4)
    r = sub.add_parser("run", help="measure the loaders (under torchrun)")
    r.add_argument("checkpoint")
    r.add_argument("--repeat", type=int, default=3)
    r.add_argument("--loaders", default=None, help="comma-separated (default: every one available)")
    r.add_argument("--workers", type=int, default=8, help="cunvme: worker threads of each file's emulator")
    a = p.parse_args(argv)
    if a.command == "make":
        make(a.out, a.gb, a.files)
    else:
        if "cunvme" not in sys.modules:
            import cunvme  # noqa: F401 - first: it sets the CUDA environment the GPU path needs
        run(a)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
