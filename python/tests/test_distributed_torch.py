"""Distributed loading through real torch.distributed process groups: ``examples/torchrun_load.py``
under ``torchrun``, every rank's tensors compared with ``safetensors.torch.load_file`` (torch.equal)
for a bf16 checkpoint the ``safetensors`` library wrote. Needs torch, safetensors and a GPU (the
GPU machines have them; CI has none, and ``test_distributed.py`` covers the host path there)."""
import json
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

import cunvme  # noqa: E402

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "torchrun_load.py"

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or cunvme.gpu_unavailable_reason() != "", reason="needs a CUDA GPU and the GPU path")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """Two files and their index, bf16 and f32, written by safetensors."""
    d = tmp_path_factory.mktemp("ckpt")
    g = torch.Generator().manual_seed(3)
    parts = [{}, {}]
    for i in range(4):
        part = parts[i // 2]
        part[f"model.layers.{i}.mlp.up_proj.weight"] = torch.randn(384, 256, generator=g).to(torch.bfloat16)
        part[f"model.layers.{i}.self_attn.o_proj.weight"] = torch.randn(256, 384, generator=g).to(torch.bfloat16)
        part[f"model.layers.{i}.input_layernorm.weight"] = torch.randn(256, generator=g)
    parts[1]["lm_head.weight"] = torch.randn(1000, 256, generator=g).to(torch.bfloat16)
    weight_map = {}
    for k, part in enumerate(parts):
        name = f"model-{k + 1:05d}-of-00002.safetensors"
        safetensors_torch.save_file(part, str(d / name))
        weight_map.update({n: name for n in part})
    index = d / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index


def torchrun(ranks, *args):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", str(EXAMPLE), *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    decoder, out, at = json.JSONDecoder(), [], done.stdout.find("{")
    while at >= 0:  # the ranks' JSON objects, whatever lines they shared
        obj, end = decoder.raw_decode(done.stdout, at)
        out.append(obj)
        at = done.stdout.find("{", end)
    return out


def test_two_ranks_on_gloo_every_tensor_equal_to_safetensors(checkpoint):
    metrics = torchrun(2, checkpoint, "--backend", "gloo", "--check")
    assert sorted(m["rank"] for m in metrics) == [0, 1]
    assert all(m["tensors"] == 13 and m["bytes_read"] > 0 for m in metrics)


def test_sharded_in_a_subgroup_on_gloo(checkpoint):
    metrics = torchrun(3, checkpoint, "--backend", "gloo", "--subgroup", "--check", "--shard", "*.up_proj.weight=0", "--shard", "*.o_proj.weight=1",
                       "--chunk-bytes", 65536)
    assert sorted(m["global_rank"] for m in metrics) == [0, 2], "rank 1 is not in the subgroup"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank")
def test_one_rank_per_gpu_on_nccl(checkpoint):
    ranks = min(torch.cuda.device_count(), 4)
    metrics = torchrun(ranks, checkpoint, "--backend", "nccl", "--check", "--shard", "*.up_proj.weight=0", "--shard", "*.o_proj.weight=1",
                       "--chunk-bytes", 65536)  # many chunks: the reads' stream and the broadcasts' order
    assert sorted(m["gpu"] for m in metrics) == list(range(ranks))
