"""The analytic planner against traces of the real Hugging Face classes at real sizes, and the
cost of tracing; writes its section of docs/accuracy.md (between the hf-trace-accuracy
markers).

    python benchmarks/hf_trace_accuracy.py [--quick] [--out docs/accuracy.md]

1. Accuracy: the real configs of probes/hf_matrix.ARCHS (tests/data/configs: Llama-2-7B,
   Qwen2.5-7B, Mistral-7B, Mixtral-8x7B, Gemma-2-9B, Phi-3-mini, GPT-2, BERT-base; and
   tests/data/configs/archs: Qwen3-8B, Qwen1.5-MoE-A2.7B, Qwen3-30B-A3B, Gemma-3-1B, OLMo-1B,
   OLMo-2-7B, phi-2, Phi-4, DeepSeek-V2-Lite) and Llama-2-70B (Llama-2-7B's config with the
   70B's published widths), each class built by transformers from its config and traced at
   full depth (probes/hf.py, probes/trace.py) beside the planner's estimate of the same
   config.json (planner/hf_config.py): FULL_SHARD at 8 ranks (Mixtral also at 16, more ranks
   than experts), bf16-amp, AdamW foreach, micro-batch 1, sequence 2048 (GPT-2 1024, BERT
   512), no / full checkpointing.
2. Scaling: the peak of each scaled trace (4 and 5 layers, probes/trace_plan.py) against the
   full-depth one.
3. Cost: one full-depth trace subprocess (`fitcheck trace`'s unit) and one trace-backed plan
   (`fitcheck --config X --gpu h100-80 --n 8 --from-trace`, cache empty, then warm) for
   Llama-2-7B, Llama-2-70B and Mixtral-8x7B: wall time and peak RSS (rusage of the
   subprocesses).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.hardware import load_gpu  # noqa: E402
from planner.spec import (  # noqa: E402
    Candidate,
    Checkpointing,
    Cluster,
    LossKind,
    Precision,
    Strategy,
)
from probes.hf_matrix import ARCHS, cross_check, load, training_for  # noqa: E402
from probes.runner import job_to_dict, run_job  # noqa: E402
from trace_accuracy import replace_section  # noqa: E402  (benchmarks/, the script's folder)
from probes.trace_plan import scale_result  # noqa: E402

BEGIN, END = "<!-- hf-trace-accuracy:begin -->", "<!-- hf-trace-accuracy:end -->"
GiB, MiB = 2**30, 2**20
WORLD, SEQ = 8, 2048
LOSS: dict[str, LossKind] = {}
"""Per-architecture --loss (none since issue 13: the planner knows that BertForMaskedLM
computes its cross-entropy in the logits' dtype, ModelSpec.loss_upcast)."""
MOE_WORLD = 16
"""Mixtral is traced again at this many ranks: more ranks than experts (FSDP2 pads each
rank's dim-0 shard of the stacked expert weights to a whole expert)."""
COST_MODELS = ("llama2-7b", "llama2-70b", "mixtral-8x7b")


def config_of(name: str) -> dict:
    if name == "llama2-70b":  # meta-llama/Llama-2-70b-hf's config.json widths
        cfg = load("llama")
        cfg.update(hidden_size=8192, intermediate_size=28672, num_attention_heads=64,
                   num_key_value_heads=8, num_hidden_layers=80)
        return cfg
    arch = next(a for a, n in ARCHS.items() if n == name)
    return load(arch)


def arch_of(name: str) -> str:
    return "llama" if name == "llama2-70b" else next(a for a, n in ARCHS.items() if n == name)


def trace_full(cfg: dict, training, cand, layers=None, timeout=900.0, world=WORLD):
    job = job_to_dict({"kind": "hf", "config": cfg, "layers": layers}, training, cand, world, 8)
    return run_job(job, timeout_s=timeout, env={"FITCHECK_TRACE_CACHE": "off"})


def accuracy(names: list[str], ckpts: list[Checkpointing],
             world: int = WORLD) -> tuple[list[str], list[float]]:
    gpu = load_gpu("h100-80")
    cluster = Cluster(gpu=gpu, n_gpus=world, gpus_per_node=8,
                      host_ram_bytes_per_node=gpu.host_ram_bytes_per_node)
    lines = ["| model (class) | checkpointing | traced GiB | planner GiB | error | traced peak at "
             "| planner peak at | activations at loss_bwd (traced / planner GiB) | trace s | "
             "RSS MiB |", "|---|---|---:|---:|---:|---|---|---|---:|---:|"]
    errs = []
    for name in names:
        arch = arch_of(name)
        cfg = config_of(name)
        for ck in ckpts:
            training = training_for(arch, SEQ, 1, precision=Precision.BF16_AMP,
                                    loss=LOSS.get(arch, LossKind.FP32))
            cand = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=ck)
            r = trace_full(cfg, training, cand, world=world)
            if not r.ok:
                lines.append(f"| {name} | {ck} | failed: {r.reason} | | | | | | | |")
                print(f"{name} {ck}: FAILED {r.reason}", flush=True)
                continue
            c = cross_check(arch, cfg, training, cand, cluster, result=r.data)
            act = c.categories.get("activations")
            errs.append(abs(c.peak.rel_error))
            cls = r.data["model"]["class"]
            seq = f", seq {training.seq}" if training.seq != SEQ else ""
            loss = f", --loss {LOSS[arch]}" if arch in LOSS else ""
            ranks = f", {world} ranks" if world != WORLD else ""
            lines.append(
                f"| {name.removeprefix('archs/')} ({cls}{seq}{loss}{ranks}) | {ck} | {c.peak.traced_bytes / GiB:.2f} | "
                f"{c.peak.predicted_bytes / GiB:.2f} | {100 * c.peak.rel_error:+.1f} % | "
                f"{c.traced_peak_phase} | {c.predicted_peak_phase} | "
                + (f"{act.traced_bytes / GiB:.2f} / {act.predicted_bytes / GiB:.2f} | "
                   if act else "- | ")
                + f"{r.wall_s:.1f} | {r.max_rss_bytes / MiB:.0f} |")
            print(lines[-1], flush=True)
    return lines, errs


def scaling(names: list[str]) -> list[str]:
    lines = ["| model | checkpointing | full depth GiB | scaled from 4 and 5 layers GiB | "
             "difference | 2 shallow traces s |", "|---|---|---:|---:|---:|---:|"]
    for name in names:
        arch = arch_of(name)
        cfg = config_of(name)
        L = cfg.get("num_hidden_layers")
        for ck in (Checkpointing.NONE, Checkpointing.FULL):
            training = training_for(arch, SEQ, 1, precision=Precision.BF16_AMP)
            cand = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=ck)
            full = trace_full(cfg, training, cand)
            a, b = trace_full(cfg, training, cand, 4), trace_full(cfg, training, cand, 5)
            if not (full.ok and a.ok and b.ok):
                lines.append(f"| {name} | {ck} | failed | | | |")
                continue
            s = scale_result(a.data, b.data, 4, 5, L)
            f, g = full.data["peak_bytes"], s["peak_bytes"]
            lines.append(f"| {name} | {ck} | {f / GiB:.3f} | {g / GiB:.3f} | "
                         f"{100 * (g - f) / f:+.2f} % | {a.wall_s + b.wall_s:.1f} |")
            print(lines[-1], flush=True)
    return lines


def cost(names: list[str]) -> list[str]:
    lines = ["| model | full-depth trace (FULL_SHARD, full ckpt, 8 ranks): wall s / RSS MiB | "
             "trace-backed plan, 8 x H100, cold: wall s / peak RSS MiB | warm (cached) s | "
             "plan says |", "|---|---|---|---:|---|"]
    for name in names:
        arch = arch_of(name)
        cfg = config_of(name)
        training = training_for(arch, SEQ, 1, precision=Precision.BF16_AMP)
        one = trace_full(cfg, training, Candidate(strategy=Strategy.FULL_SHARD,
                                                  checkpointing=Checkpointing.FULL))
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "config.json"
            path.write_text(json.dumps(cfg))
            env = dict(os.environ, FITCHECK_TRACE_CACHE=str(Path(d) / "cache"))
            # each plan in its own `python` so that RUSAGE_CHILDREN is that run's
            code = ("import resource, subprocess, sys, time, json\n"
                    "t=time.perf_counter()\n"
                    "p=subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
                    "w=time.perf_counter()-t\n"
                    "ru=resource.getrusage(resource.RUSAGE_CHILDREN)\n"
                    "print(json.dumps({'wall': w, 'rss': ru.ru_maxrss * 1024, "
                    "'rc': p.returncode, 'out': p.stdout}))\n")
            cmd = [sys.executable, "-m", "planner", "--config", str(path), "--gpu", "h100-80",
                   "--n", "8", "--from-trace", "--json"]
            runs = []
            for _ in range(2):
                p = subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True,
                                   text=True, env=env, cwd=ROOT)
                runs.append(json.loads(p.stdout))
        cold, warm = runs
        doc = json.loads(cold["out"]) if cold["out"] else {}
        rec = doc.get("recommendation")
        need = doc.get("min_gpus")
        says = (f"{rec['strategy']} + {rec['checkpointing']} ckpt" if rec else
                f"nothing fits; needs {need} GPUs" if need else
                "nothing fits, and more GPUs do not help (traced)") if doc else \
            f"exit {cold['rc']}"
        lines.append(f"| {name} | {one.wall_s:.1f} / {one.max_rss_bytes / MiB:.0f} | "
                     f"{cold['wall']:.1f} / {cold['rss'] / MiB:.0f} | {warm['wall']:.2f} | "
                     f"{says} |")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="Llama-2-7B and Mixtral, no scaling")
    ap.add_argument("--out", default="docs/accuracy.md")
    args = ap.parse_args()
    t0 = time.perf_counter()
    names = (["llama2-7b", "mixtral-8x7b"] if args.quick else
             [*ARCHS.values(), "llama2-70b"])
    acc, errs = accuracy(names, [Checkpointing.NONE, Checkpointing.FULL])
    more, more_errs = accuracy(["mixtral-8x7b"], [Checkpointing.NONE], MOE_WORLD)
    acc, errs = acc + more[2:], errs + more_errs
    scale = [] if args.quick else scaling(list(COST_MODELS))
    costs = cost(list(COST_MODELS))
    import torch
    import transformers

    lines = [
        "Made by `python benchmarks/hf_trace_accuracy.py` "
        f"({time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}).",
        "",
        f"FULL_SHARD at {WORLD} ranks (Mixtral also at {MOE_WORLD}: more ranks than experts), "
        f"bf16-amp, AdamW foreach, micro-batch 1, sequence {SEQ} (GPT-2 1024, BERT 512), the "
        "default fp32 loss; the class transformers builds from the real config.json, "
        "traced at full depth. Peak allocated excludes what neither side sees "
        "(probes/compare.py). Gemma-2 runs eager attention (transformers has no SDPA for it).",
        "",
        *acc,
        "",
        (f"|error| on peak allocated: median {100 * statistics.median(errs):.1f} %, max "
         f"{100 * max(errs):.1f} % over {len(errs)} traced configurations." if errs else ""),
    ]
    if scale:
        lines += ["", "Scaled traces (what `--from-trace` runs) against the full depth, peak "
                  "allocated:", "", *scale]
    lines += ["", "Cost of tracing (wall time and peak RSS of the subprocesses; the plan traces "
              "DDP and the FSDP strategies x none / selective / full checkpointing, and when "
              "nothing fits, the GPU count it would need):", "", *costs, "",
              f"Whole run {time.perf_counter() - t0:.0f} s."]
    replace_section(args.out, "\n".join(lines), BEGIN, END)


if __name__ == "__main__":
    main()
