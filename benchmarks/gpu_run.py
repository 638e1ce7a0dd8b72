"""The prepared GPU session (issue 28): one command that measures, on one GPU, what no trace can.

    PYTHONPATH=. python3 benchmarks/gpu_run.py --out DIR [--budget-s 540] [--device cuda|cpu]
                                               [--tiny] [--parts p1,p2,...]

Writes, as it goes, ``DIR/records.jsonl`` (one JSON object per line, appended and fsynced per
record: a run cut short keeps everything measured before) and ``DIR/run.log`` (every child's
stderr). Each part runs in a fresh process (``python -m probes.gpu_cases``) in its own process
session with its own time cap; a part that overruns is killed with all its processes and the
next part starts. Parts, in order of value:

================  ============================================================================
runtime           CUDA context, lazily loaded kernels, cuBLAS/cuBLASLt workspaces, a 1-rank
                  NCCL communicator, device used - reserved
matrix            world size 1 (a real 1-rank NCCL group): Llama-3.2-1B/3B (and 8B with >= 100
                  GiB), GPT-2 large; DDP (the plain module at world size 1) and FSDP2 on a
                  1-rank mesh; checkpointing none/selective/full; bf16-amp and pure bf16;
                  foreach and fused AdamW; accumulation with sync every/last; loss
                  fp32/chunked, kept logits; a long sequence; one deliberate out-of-memory
                  (8B, bf16-amp, one GPU)
least, least8,    the least allocator limit each step runs under (bisection over
least_more, ...   ``set_per_process_memory_fraction``): what the fit verdict must compare
fake8, fake64     FSDP2 over torch's fake process group of 8 / 64 ranks with real CUDA
                  tensors: Llama-3.1-8B at full depth (torchtitan's 8B recipe), Mixtral-8x7B
                  with 4 layers, Llama-3.1-8B with 4 layers at 32k tokens
moe16/32/48       Mixtral-8x7B (4 layers) past its 8 experts: FSDP2's padded expert shards
expandable        matrix cases again under ``expandable_segments:True`` (and least_expandable)
snapshot          ``torch.cuda.memory._dump_snapshot`` of a small step
                  (DIR/memory_snapshot.pickle)
compile           compiled blocks (``torch.compile`` per block, inductor), DDP and FSDP2
gemm              achieved TFLOP/s of bf16 and float8 matmuls at Llama 8B/70B linear shapes
float8_layer      one linear's forward + backward, bf16 vs torchao float8, eager and
                  compiled, and the dynamic cast alone (1B and 8B shapes)
float8            torchao float8 training (tensorwise, with float8 all-gather, rowwise) beside
                  bf16, Llama-3.2-1B/3B; float8_fake8: Llama-3.1-8B on 8 fake ranks;
                  float8_compile: with compiled blocks; float8_compile8: 8B compiled
                  on 8 fake ranks (torchtitan's float8 recipe)
offload           activation offloading (torchtune's OffloadActivations and TRL's copy, loaded
                  from the folder ``FITCHECK_OFFLOAD_DIR`` names) beside the same case
compile_model     the whole model compiled, with gradient accumulation, DDP
================  ============================================================================

A default run takes the parts in the order of ``PARTS`` (value first); ``--parts`` picks and
orders them, ``--only`` keeps the named cases. ``--device cpu --tiny`` runs the same parts on
the CPU with tiny shapes (the tests do): the memory fields are null there.

``--budget-s`` bounds the whole run; a part gets the smaller of
its cap and what is left. The first record (``record: env``) holds the GPU, driver, CUDA,
torch, NCCL versions and the allocator settings.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from probes.gpu_cases import append_record  # noqa: E402  (imports torch: versions below)

GiB = 2**30


# --------------------------------------------------------------------------- the cases


def _t(**kw: Any) -> dict[str, Any]:
    base = {"seq": 2048, "micro_batch": 4, "precision": "bf16-amp", "optimizer": "adamw",
            "optimizer_impl": "foreach"}
    return {**base, **kw}


def _c(strategy: str, ckpt: str = "none") -> dict[str, Any]:
    return {"strategy": strategy, "checkpointing": ckpt}


def _case(cid: str, model: Any, training: dict[str, Any], cand: dict[str, Any], *,
          layers: int | None = None, big: bool = False, **kw: Any) -> dict[str, Any]:
    return {"id": cid, "model": model, "layers": layers, "training": training,
            "candidate": cand, "big": big, **kw}


def matrix_cases() -> list[dict[str, Any]]:
    one, three, eight = "llama3.2-1b", "llama3.2-3b", "llama3.1-8b"
    t3 = dict(seq=4096, micro_batch=2)
    t8 = dict(seq=4096, micro_batch=1)
    return [
        _case("w1-1b-ddp-none", one, _t(), _c("ddp")),
        _case("w1-1b-fsdp-none", one, _t(), _c("full_shard")),
        _case("w1-1b-ddp-full", one, _t(), _c("ddp", "full")),
        _case("w1-1b-fsdp-full", one, _t(), _c("full_shard", "full")),
        _case("w1-1b-ddp-sel", one, _t(), _c("ddp", "selective")),
        _case("w1-1b-fsdp-sel", one, _t(), _c("full_shard", "selective")),
        _case("w1-1b-ddp-none-bf16", one, _t(precision="bf16"), _c("ddp")),
        _case("w1-1b-fsdp-none-bf16", one, _t(precision="bf16"), _c("full_shard")),
        _case("w1-1b-ddp-none-fused", one, _t(optimizer_impl="fused"), _c("ddp")),
        _case("w1-1b-fsdp-none-fused", one, _t(optimizer_impl="fused"), _c("full_shard")),
        _case("w1-1b-ddp-none-ga2", one, _t(grad_accum=2), _c("ddp")),
        _case("w1-1b-fsdp-none-ga2-every", one, _t(grad_accum=2), _c("full_shard")),
        _case("w1-1b-fsdp-none-ga2-last", one, _t(grad_accum=2, grad_sync="last"),
              _c("full_shard")),
        _case("w1-1b-ddp-none-chunked", one, _t(loss="chunked"), _c("ddp")),
        _case("w1-1b-fsdp-none-chunked", one, _t(loss="chunked"), _c("full_shard")),
        _case("w1-1b-ddp-none-keeplogits", one, _t(keep_logits=True), _c("ddp")),
        _case("w1-1b-ddp-full-s16k", one, _t(seq=16384, micro_batch=1), _c("ddp", "full")),
        _case("w1-1b-sgo-none", one, _t(), _c("shard_grad_op")),
        _case("w1-3b-ddp-none", three, _t(**t3), _c("ddp")),
        _case("w1-3b-fsdp-full", three, _t(**t3), _c("full_shard", "full")),
        _case("w1-3b-ddp-sel-bf16", three, _t(precision="bf16", **t3), _c("ddp", "selective")),
        _case("w1-3b-fsdp-none-fused", three, _t(optimizer_impl="fused", **t3),
              _c("full_shard")),
        _case("w1-gpt2l-ddp-none", "gpt2-large", _t(seq=1024, micro_batch=8), _c("ddp")),
        _case("w1-gpt2l-fsdp-full", "gpt2-large", _t(seq=1024, micro_batch=8),
              _c("full_shard", "full")),
        _case("w1-8b-fsdp-full-bf16", eight, _t(precision="bf16", **t8),
              _c("full_shard", "full"), big=True),
        _case("w1-8b-ddp-sel-bf16", eight, _t(precision="bf16", **t8), _c("ddp", "selective"),
              big=True),
        # the deliberate out-of-memory: fp32 master weights, gradients and AdamW state of 8B
        # (128 GB) plus activations do not fit one GPU
        _case("w1-8b-ddp-none-amp-oom", eight, _t(**t8), _c("ddp"), big=True, steps=1,
              warmup=1),
    ]


def expandable_cases() -> list[dict[str, Any]]:
    one = "llama3.2-1b"
    return [
        _case("exp-1b-ddp-none", one, _t(allocator="expandable"), _c("ddp")),
        _case("exp-1b-fsdp-full", one, _t(allocator="expandable"), _c("full_shard", "full")),
        _case("exp-1b-fsdp-none-ga2-last", one,
              _t(allocator="expandable", grad_accum=2, grad_sync="last"), _c("full_shard")),
        _case("exp-3b-fsdp-full", "llama3.2-3b",
              _t(allocator="expandable", seq=4096, micro_batch=2), _c("full_shard", "full")),
    ]


def fake8_cases() -> list[dict[str, Any]]:
    eight = "llama3.1-8b"
    tt = dict(seq=8192, micro_batch=1)  # torchtitan llama3_8b.toml: seq 8192, local batch 1
    long = dict(seq=32768, micro_batch=1)
    return [
        _case("w8-8b-fsdp-sel", eight, _t(**tt), _c("full_shard", "selective")),
        _case("w8-8b-fsdp-full", eight, _t(**tt), _c("full_shard", "full")),
        _case("w8-mixtral4L-fsdp-full", "mixtral-8x7b", _t(seq=4096, micro_batch=1),
              _c("full_shard", "full"), layers=4),
        _case("w8-8b4L-fsdp-full-s32k", eight, _t(**long), _c("full_shard", "full"), layers=4),
        _case("w8-8b4L-fsdp-full-s32k-chunked", eight, _t(loss="chunked", **long),
              _c("full_shard", "full"), layers=4),
        _case("w8-8b-fsdp-none", eight, _t(**tt), _c("full_shard")),
    ]


def fake64_cases() -> list[dict[str, Any]]:
    return [
        _case("w64-mixtral4L-fsdp-full", "mixtral-8x7b", _t(seq=4096, micro_batch=1),
              _c("full_shard", "full"), layers=4),
        _case("w64-8b-fsdp-sel", "llama3.1-8b", _t(seq=8192, micro_batch=1),
              _c("full_shard", "selective")),
        _case("w64-mixtral4L-fsdp-none", "mixtral-8x7b", _t(seq=4096, micro_batch=1),
              _c("full_shard"), layers=4),
    ]


def moe_cases(world: int):
    """Mixtral-8x7B (4 layers) at a world size past its 8 experts: FSDP2 shards the stacked
    (8, f, h) expert weights on dim 0, so each rank's shard is padded to one row."""
    def cases() -> list[dict[str, Any]]:
        return [_case(f"w{world}-mixtral4L-fsdp-full", "mixtral-8x7b",
                      _t(seq=4096, micro_batch=1), _c("full_shard", "full"), layers=4)]
    return cases


def compile_cases() -> list[dict[str, Any]]:
    one = "llama3.2-1b"
    return [
        _case("cmp-1b-fsdp-none", one, _t(compile="blocks"), _c("full_shard"), warmup=3),
        _case("cmp-1b-ddp-none", one, _t(compile="blocks"), _c("ddp"), warmup=3),
    ]


def float8_cases() -> list[dict[str, Any]]:
    """torchao float8 training (``convert_to_float8_training``, torchtitan's filter: every
    linear but the output layer) beside its bf16 reference on the same machine."""
    one, three = "llama3.2-1b", "llama3.2-3b"
    t3 = dict(seq=4096, micro_batch=2)
    tw = dict(float8="tensorwise")
    ag = dict(float8="tensorwise", float8_all_gather=True)
    rw = dict(float8="rowwise")
    return [
        _case("f8-1b-fsdp-none-ref", one, _t(), _c("full_shard")),
        _case("f8-1b-fsdp-none-tw", one, _t(**tw), _c("full_shard")),
        _case("f8-1b-fsdp-none-twag", one, _t(**ag), _c("full_shard")),
        _case("f8-1b-fsdp-none-rw", one, _t(**rw), _c("full_shard")),
        _case("f8-1b-fsdp-full-twag", one, _t(**ag), _c("full_shard", "full")),
        _case("f8-1b-fsdp-sel-twag", one, _t(**ag), _c("full_shard", "selective")),
        _case("f8-1b-ddp-none-tw", one, _t(**tw), _c("ddp")),
        _case("f8-3b-fsdp-full-ref", three, _t(**t3), _c("full_shard", "full")),
        _case("f8-3b-fsdp-full-twag", three, _t(**ag, **t3), _c("full_shard", "full")),
        _case("f8-3b-fsdp-full-rw", three, _t(**rw, **t3), _c("full_shard", "full")),
    ]


def float8_fake8_cases() -> list[dict[str, Any]]:
    """torchtitan's Llama-3.1-8B recipe (seq 8192, local batch 1, selective checkpointing)
    with float8, one rank of 8 on the fake process group: the compute of the public 8-GPU
    float8 runs without their communication."""
    eight = "llama3.1-8b"
    tt = dict(seq=8192, micro_batch=1)
    return [
        _case("f8w8-8b-fsdp-sel-ref", eight, _t(**tt), _c("full_shard", "selective")),
        _case("f8w8-8b-fsdp-sel-twag", eight, _t(float8="tensorwise", float8_all_gather=True,
                                                 **tt), _c("full_shard", "selective")),
        _case("f8w8-8b-fsdp-sel-rw", eight, _t(float8="rowwise", **tt),
              _c("full_shard", "selective")),
        _case("f8w8-8b-fsdp-full-twag", eight, _t(float8="tensorwise", float8_all_gather=True,
                                                  **tt), _c("full_shard", "full")),
    ]


def float8_compile_cases() -> list[dict[str, Any]]:
    """Compiled blocks with and without float8 (torchtitan compiles the float8 casts into the
    blocks' graphs)."""
    one = "llama3.2-1b"
    return [
        _case("cf8-1b-fsdp-none-ref", one, _t(compile="blocks"), _c("full_shard"), warmup=3),
        _case("cf8-1b-fsdp-none-twag", one, _t(compile="blocks", float8="tensorwise",
                                               float8_all_gather=True), _c("full_shard"),
              warmup=3),
        _case("cf8-1b-fsdp-none-rw", one, _t(compile="blocks", float8="rowwise"),
              _c("full_shard"), warmup=3),
    ]


def float8_compile8_cases() -> list[dict[str, Any]]:
    """torchtitan's Llama-3.1-8B float8 recipe as its public runs ran it (compiled blocks, seq
    8192, local batch 1; full checkpointing here), one rank of 8 on the fake group."""
    eight = "llama3.1-8b"
    tt = dict(seq=8192, micro_batch=1, compile="blocks")  # full checkpointing: the
    # probe's selective policy does not compile (its context_fn), and 8B without any OOMs
    return [
        _case("cf8w8-8b-fsdp-full-ref", eight, _t(**tt), _c("full_shard", "full"),
              warmup=3),
        _case("cf8w8-8b-fsdp-full-twag", eight, _t(float8="tensorwise", float8_all_gather=True,
                                                  **tt), _c("full_shard", "full"),
              warmup=3),
        _case("cf8w8-8b-fsdp-full-rw", eight, _t(float8="rowwise", **tt),
              _c("full_shard", "full"), warmup=3),
    ]


def offload_cases() -> list[dict[str, Any]]:
    """Activation offloading (torchtune's OffloadActivations; two cases with TRL's copy) beside
    the same case without it. Needs CUDA and ``FITCHECK_OFFLOAD_DIR`` (probes.gpu_cases)."""
    one, three = "llama3.2-1b", "llama3.2-3b"
    t3 = dict(seq=4096, micro_batch=2)
    off = dict(activation_offload=True)
    return [
        _case("off-1b-ddp-none-ref", one, _t(), _c("ddp")),
        _case("off-1b-ddp-none", one, _t(**off), _c("ddp")),
        _case("off-1b-ddp-full", one, _t(**off), _c("ddp", "full")),
        _case("off-1b-fsdp-none", one, _t(**off), _c("full_shard")),
        _case("off-1b-fsdp-full-ref", one, _t(), _c("full_shard", "full")),
        _case("off-1b-fsdp-full", one, _t(**off), _c("full_shard", "full")),
        _case("off-3b-fsdp-full-ref", three, _t(**t3), _c("full_shard", "full")),
        _case("off-3b-fsdp-full", three, _t(**off, **t3), _c("full_shard", "full")),
        _case("off-1b-ddp-none-trl", one, _t(**off), _c("ddp"), offload_impl="trl"),
        # pure bf16: no autocast weight copies among the saved tensors
        _case("off-1b-ddp-none-bf16", one, _t(precision="bf16", **off), _c("ddp")),
        _case("off-1b-ddp-none-bf16-ref", one, _t(precision="bf16"), _c("ddp")),
        _case("off-1b-fsdp-full-trl", one, _t(**off), _c("full_shard", "full"),
              offload_impl="trl"),
    ]


def compile_model_cases() -> list[dict[str, Any]]:
    """The whole model compiled (``model.compile()``) with gradient accumulation, DDP at world
    size 1 (planner.memory.compiled_model), beside eager."""
    one = "llama3.2-1b"
    return [
        _case("cm-1b-ddp-none-ga2-ref", one, _t(grad_accum=2), _c("ddp")),
        _case("cm-1b-ddp-none-ga2", one, _t(compile="model", grad_accum=2), _c("ddp"),
              warmup=3),
        _case("cm-1b-ddp-none", one, _t(compile="model"), _c("ddp"), warmup=3),
    ]


def least_cases() -> list[dict[str, Any]]:
    """The least allocator limit under which each step runs (probes.gpu_cases.least_memory):
    what the fit verdict compares with the device, between the allocated and reserved peaks."""
    keep = ("w1-1b-ddp-none", "w1-1b-fsdp-none", "w1-1b-fsdp-full", "w1-1b-ddp-full",
            "w1-1b-fsdp-none-ga2-last", "w1-3b-fsdp-full", "w1-3b-ddp-none",
            "w1-1b-ddp-full-s16k")
    by_id = {c["id"]: c for c in matrix_cases()}
    return [{**by_id[k], "id": f"least-{k[3:]}", "least_memory": True} for k in keep]


def least_more_cases() -> list[dict[str, Any]]:
    keep = ("w1-1b-fsdp-sel", "w1-1b-ddp-sel", "w1-gpt2l-ddp-none", "w1-gpt2l-fsdp-full",
            "w1-1b-ddp-none-chunked", "w1-1b-fsdp-none-chunked", "w1-1b-ddp-none-keeplogits",
            "w1-3b-ddp-sel-bf16", "w1-3b-fsdp-none-fused", "w1-1b-fsdp-none-bf16",
            "w1-8b-fsdp-full-bf16", "w1-8b-ddp-sel-bf16")
    by_id = {c["id"]: c for c in matrix_cases()}
    return [{**by_id[k], "id": f"least-{k[3:]}", "least_memory": True, "budget_s": 20}
            for k in keep]


def least8_more_cases() -> list[dict[str, Any]]:
    by_id = {c["id"]: c for c in fake8_cases()}
    return [{**by_id[k], "id": f"least-{k}", "least_memory": True, "budget_s": 30}
            for k in ("w8-8b-fsdp-full", "w8-mixtral4L-fsdp-full",
                      "w8-8b4L-fsdp-full-s32k-chunked")]


def least64_cases() -> list[dict[str, Any]]:
    by_id = {c["id"]: c for c in fake64_cases()}
    return [{**by_id["w64-8b-fsdp-sel"], "id": "least-w64-8b-fsdp-sel", "least_memory": True,
             "budget_s": 35}]


def least_expandable_cases() -> list[dict[str, Any]]:
    return [{**c, "id": "least-" + c["id"], "least_memory": True}
            for c in expandable_cases()[:2]]


def least8_cases() -> list[dict[str, Any]]:
    by_id = {c["id"]: c for c in fake8_cases()}
    return [{**by_id[k], "id": f"least-{k}", "least_memory": True, "budget_s": 45}
            for k in ("w8-8b-fsdp-sel", "w8-8b4L-fsdp-full-s32k")]


def tiny(case: dict[str, Any]) -> dict[str, Any]:
    """The case at CPU-test size: same structure (experts, tying, position), tiny widths."""
    from planner.presets import get_preset
    from probes.runner import spec_to_dict

    d = spec_to_dict(get_preset(case["model"]))
    heads = 4
    kv = heads if d["n_kv_heads"] == d["n_heads"] else 2
    d.update(name=f"tiny-{d['name']}", n_layers=2, hidden=64, n_heads=heads, n_kv_heads=kv,
             ffn_hidden=128, vocab=256, head_dim=0,
             max_positions=min(d.get("max_positions") or 0, 256) or d.get("max_positions", 0))
    tr = dict(case["training"])
    tr["seq"] = min(int(tr["seq"]), 64) if tr["seq"] <= 8192 else 128
    tr["micro_batch"] = min(int(tr["micro_batch"]), 2)
    return {**case, "model": d, "layers": None, "training": tr, "warmup": 1, "steps": 1}


PARTS: dict[str, dict[str, Any]] = {
    "runtime": {"cap_s": 45, "mode": "runtime"},
    "matrix": {"cap_s": 200, "cases": matrix_cases, "world": 1},
    "least": {"cap_s": 170, "cases": least_cases, "world": 1},
    "fake8": {"cap_s": 100, "cases": fake8_cases, "world": 8, "fake": True},
    "moe16": {"cap_s": 40, "cases": moe_cases(16), "world": 16, "fake": True},
    "moe32": {"cap_s": 40, "cases": moe_cases(32), "world": 32, "fake": True},
    "moe48": {"cap_s": 40, "cases": moe_cases(48), "world": 48, "fake": True},
    "least8": {"cap_s": 110, "cases": least8_cases, "world": 8, "fake": True},
    "expandable": {"cap_s": 45, "cases": expandable_cases, "world": 1,
                   "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}},
    "least_expandable": {"cap_s": 40, "cases": least_expandable_cases, "world": 1,
                         "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}},
    "fake64": {"cap_s": 45, "cases": fake64_cases, "world": 64, "fake": True},
    "snapshot": {"cap_s": 25, "mode": "snapshot"},
    "least_more": {"cap_s": 150, "cases": least_more_cases, "world": 1},
    "least8_more": {"cap_s": 95, "cases": least8_more_cases, "world": 8, "fake": True},
    "least64": {"cap_s": 50, "cases": least64_cases, "world": 64, "fake": True},
    "compile": {"cap_s": 90, "cases": compile_cases, "world": 1},
    "gemm": {"cap_s": 45, "mode": "gemm"},
    "float8_layer": {"cap_s": 150, "mode": "float8-layer"},
    "float8": {"cap_s": 100, "cases": float8_cases, "world": 1},
    "float8_fake8": {"cap_s": 90, "cases": float8_fake8_cases, "world": 8, "fake": True},
    "offload": {"cap_s": 100, "cases": offload_cases, "world": 1},
    "float8_compile": {"cap_s": 110, "cases": float8_compile_cases, "world": 1},
    "compile_model": {"cap_s": 110, "cases": compile_model_cases, "world": 1},
    "float8_compile8": {"cap_s": 240, "cases": float8_compile8_cases, "world": 8,
                        "fake": True},
}
"""Every part, in the order of value a default run takes them (the budget cuts the tail)."""


# --------------------------------------------------------------------------- environment


def _smi() -> dict[str, Any] | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    q = "name,memory.total,memory.used,driver_version,pci.bus_id,clocks.max.sm,power.limit"
    try:
        out = subprocess.run([exe, f"--query-gpu={q}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": str(exc)}
    rows = [r.split(", ") for r in out.stdout.strip().splitlines()]
    keys = q.split(",")
    return {"gpus": [dict(zip(keys, r)) for r in rows], "rc": out.returncode}


def env_record(device: str) -> dict[str, Any]:
    import torch

    smi = _smi()
    try:
        nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
        nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
    except Exception:  # noqa: BLE001 - a CPU build has no NCCL
        nccl = None
    mem_mib = None
    if smi and smi.get("gpus"):
        try:
            mem_mib = int(float(smi["gpus"][0]["memory.total"]))
        except (KeyError, ValueError):
            mem_mib = None
    return {
        "record": "env", "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device, "hostname": socket.gethostname(), "python": sys.version.split()[0],
        "platform": platform.platform(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": (torch.backends.cudnn.version() if torch.backends.cudnn.is_available()
                  else None),
        "nccl": nccl, "nvidia_smi": smi, "memory_total_mib": mem_mib,
        "allocator_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "cuda_module_loading": os.environ.get("CUDA_MODULE_LOADING"),
        "env": {k: v for k, v in os.environ.items()
                if k.startswith(("NCCL_", "TORCH_NCCL", "CUDA_", "CUBLAS", "PYTORCH_"))},
        "cpu_count": os.cpu_count(),
    }


# --------------------------------------------------------------------------- running parts


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def run_part(name: str, part: dict[str, Any], out_dir: Path, records: Path, log: Path,
             device: str, cap_s: float, mem_gib: float | None, tiny_mode: bool,
             only: set[str] | None = None) -> dict[str, Any]:
    argv = [sys.executable, "-m", "probes.gpu_cases", "--out", str(records), "--device", device]
    n_cases = None
    if part.get("mode") == "runtime":
        argv.append("--runtime-terms")
    elif part.get("mode") == "snapshot":
        argv += ["--snapshot", str(out_dir)]
    elif part.get("mode") in ("gemm", "float8-layer"):
        argv += [f"--{part['mode']}"] + (["--tiny"] if tiny_mode else [])
    else:
        cases = part["cases"]()
        if only:
            cases = [c for c in cases if c["id"] in only]
        if mem_gib is not None and mem_gib < 100:
            cases = [c for c in cases if not c.get("big")]
        if tiny_mode:
            cases = [tiny(c) for c in cases]
        for c in cases:
            c.update(part=name, world=part.get("world", 1), fake=part.get("fake", False))
            c.pop("big", None)
        n_cases = len(cases)
        # the case list beside the run, not in DIR (whose files travel back)
        cfg = Path(tempfile.gettempdir()) / f"fitcheck-gpu-run-{os.getpid()}-{name}.json"
        cfg.write_text(json.dumps(cases, indent=1))
        argv += ["--cases", str(cfg)]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"]
                                     if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(part.get("env", {}))
    t0 = time.monotonic()
    with open(log, "ab") as lf:
        lf.write(f"\n==== part {name} (cap {cap_s:.0f} s) ====\n".encode())
        lf.flush()
        proc = subprocess.Popen(argv, cwd=str(REPO), env=env, stdin=subprocess.DEVNULL,
                                stdout=lf, stderr=subprocess.STDOUT, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=cap_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        except KeyboardInterrupt:
            _kill_group(proc)
            raise
    wall = time.monotonic() - t0
    rec = {"record": "part", "part": name, "rc": proc.returncode, "timed_out": timed_out,
           "cap_s": round(cap_s, 1), "wall_s": round(wall, 2), "cases": n_cases,
           "env_overrides": part.get("env", {})}
    append_record(str(records), rec)
    print(f"[gpu_run] part {name}: rc {proc.returncode}{' (timed out)' if timed_out else ''}"
          f", {wall:.1f} s", file=sys.stderr, flush=True)
    return rec


def _nccl_worked(records: Path) -> bool:
    for line in records.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("record") == "runtime_nccl":
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder (created)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--budget-s", type=float, default=540.0,
                    help="wall-clock budget of the whole run, seconds (default 540)")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU tests)")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated parts, in order (default {','.join(PARTS)})")
    ap.add_argument("--cap-scale", type=float, default=1.0,
                    help="multiply every part's time cap (tests)")
    ap.add_argument("--only", default="",
                    help="comma-separated case ids: run only these cases of the parts")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    records, log = out_dir / "records.jsonl", out_dir / "run.log"
    names = [p.strip() for p in args.parts.split(",") if p.strip()]
    only = {c.strip() for c in args.only.split(",") if c.strip()}
    unknown = [p for p in names if p not in PARTS]
    if unknown:
        print(f"gpu_run: --parts: unknown part(s) {', '.join(unknown)}; known: "
              f"{', '.join(PARTS)}", file=sys.stderr)
        return 2
    env = env_record(args.device)
    env.update(budget_s=args.budget_s, parts=names, tiny=args.tiny)
    append_record(str(records), env)
    mem_gib = env["memory_total_mib"] / 1024 if env["memory_total_mib"] else None
    print(f"[gpu_run] {env['nvidia_smi']} torch {env['torch']} cuda {env['cuda']} "
          f"nccl {env['nccl']}", file=sys.stderr, flush=True)
    for name in names:
        left = args.budget_s - (time.monotonic() - t0)
        cap = min(PARTS[name]["cap_s"] * args.cap_scale, left - 3)
        if cap < 10 * args.cap_scale:
            append_record(str(records), {"record": "part", "part": name, "skipped": True,
                                         "reason": f"{left:.0f} s of the budget left"})
            continue
        run_part(name, PARTS[name], out_dir, records, log, args.device, cap, mem_gib,
                 args.tiny, only)
        if name == "runtime" and not _nccl_worked(records):
            # a 1-rank NCCL group failed or hung: the world-1 parts use a fake group
            os.environ["FITCHECK_GPU_GROUP"] = "fake"
            append_record(str(records), {"record": "note", "note": "no working 1-rank group "
                                         "in the runtime part: world-1 parts use a fake "
                                         "process group (FITCHECK_GPU_GROUP=fake)"})
    append_record(str(records), {"record": "end",
                                 "wall_s": round(time.monotonic() - t0, 2)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
