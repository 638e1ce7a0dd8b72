"""The planner against the fake-tensor trace on real model sizes; writes its section of
docs/accuracy.md (between the trace-accuracy markers).

    python benchmarks/trace_accuracy.py [--quick] [--out docs/accuracy.md]

Rows: Llama-2-7B, Llama-3-8B (128k vocabulary), Llama-2-13B, Llama-2-70B x 8 and 64 ranks x
sequence 2048 and 8192 x no / full checkpointing, FULL_SHARD, bf16-amp AdamW (foreach),
micro-batch 1. Each configuration is traced in its own subprocess (probes.runner), which also
measures the probe's wall time and peak RSS. Target: |error| <= 2 % on peak allocated.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

from planner.hardware import load_gpu as load_profile
from planner.presets import get_preset
from planner.spec import Candidate, Checkpointing, Cluster, Precision, Strategy, TrainingSpec
from probes.compare import compare
from probes.runner import run_trace

MODELS = ("llama2-7b", "llama3-8b", "llama2-13b", "llama2-70b")
WORLDS = (8, 64)
SEQS = (2048, 8192)
CKPTS = (Checkpointing.NONE, Checkpointing.FULL)
GiB = 2**30


BEGIN, END = "<!-- trace-accuracy:begin -->", "<!-- trace-accuracy:end -->"


def write_section(path: str, body: str, begin: str = BEGIN, end: str = END) -> str:
    """The file's text with the marked section replaced by body (markers appended if absent)."""
    try:
        with open(path) as fh:
            old = fh.read()
    except FileNotFoundError:
        old = ""
    block = f"{begin}\n{body}\n{end}"
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        return head + block + rest.split(end, 1)[1]
    return old + ("\n" if old and not old.endswith("\n") else "") + block + "\n"


def replace_section(path: str, body: str, begin: str = BEGIN, end: str = END) -> None:
    """Write the marked section of ``path`` atomically (temporary file beside it, then
    rename), the rest of the file unchanged."""
    text = write_section(path, body, begin, end)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".accuracy-", suffix=".md")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)
    print(f"wrote {path}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="world 8, seq 2048 only")
    ap.add_argument("--out", default="docs/accuracy.md")
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args()
    gpu = load_profile("h100-80")
    rows = []
    t_all = time.perf_counter()
    for name in MODELS:
        model = get_preset(name)
        for world in WORLDS[:1] if args.quick else WORLDS:
            for seq in SEQS[:1] if args.quick else SEQS:
                for ck in CKPTS:
                    training = TrainingSpec(seq=seq, micro_batch=1, precision=Precision.BF16_AMP)
                    cand = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=ck)
                    cluster = Cluster(gpu=gpu, n_gpus=world, gpus_per_node=8,
                                      host_ram_bytes_per_node=gpu.host_ram_bytes_per_node)
                    r = run_trace(model, training, cand, world, 8, timeout_s=args.timeout)
                    data = r.data if r.ok else {"ok": False, "reason": r.reason}
                    c = compare(model, training, cluster, cand, data, wall_s=r.wall_s,
                                max_rss_bytes=r.max_rss_bytes)
                    rows.append((name, world, seq, ck, c))
                    if c.ok:
                        print(f"{name:11s} n={world:3d} seq={seq:5d} ckpt={ck!s:5s} traced "
                              f"{c.peak.traced_bytes / GiB:8.2f} GiB planner "
                              f"{c.peak.predicted_bytes / GiB:8.2f} GiB error "
                              f"{100 * c.peak.rel_error:+6.2f}%  {c.wall_s:5.1f} s "
                              f"{c.max_rss_bytes / 2**20:5.0f} MiB", flush=True)
                    else:
                        print(f"{name} n={world} seq={seq} ckpt={ck}: FAILED {c.reason}", flush=True)
    total_s = time.perf_counter() - t_all
    ok = [c for *_, c in rows if c.ok]
    errs = [abs(c.peak.rel_error) for c in ok]
    lines = [
        "Made by `python benchmarks/trace_accuracy.py` "
        f"({time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}).",
        "",
        "FULL_SHARD, bf16-amp (FSDP2 MixedPrecisionPolicy bf16 params, fp32 reduce), AdamW "
        "foreach, micro-batch 1, one rank of the given world size traced on fake tensors "
        "(probes/trace.py). Peak allocated excludes what neither side sees (cuBLAS workspace, "
        "token ids, host-side step counters; probes/compare.py). Wall time and peak RSS are "
        "of the whole probe subprocess (torch import included).",
        "",
        "| model | ranks | seq | checkpointing | traced GiB | planner GiB | error | traced peak at | planner peak at | probe wall s | probe RSS MiB |",
        "|---|---:|---:|---|---:|---:|---:|---|---|---:|---:|",
    ]
    for name, world, seq, ck, c in rows:
        if not c.ok:
            lines.append(f"| {name} | {world} | {seq} | {ck} | failed: {c.reason} | | | | | | |")
            continue
        lines.append(
            f"| {name} | {world} | {seq} | {ck} | {c.peak.traced_bytes / GiB:.2f} | "
            f"{c.peak.predicted_bytes / GiB:.2f} | {100 * c.peak.rel_error:+.2f} % | "
            f"{c.traced_peak_phase} | {c.predicted_peak_phase} | {c.wall_s:.1f} | "
            f"{c.max_rss_bytes / 2**20:.0f} |")
    if errs:
        lines += [
            "",
            f"{len(ok)} of {len(rows)} configurations traced; |error| on peak allocated: median "
            f"{100 * statistics.median(errs):.2f} %, max {100 * max(errs):.2f} % (target 2 %). "
            f"Whole run {total_s:.0f} s.",
        ]
        for name in ("llama2-7b", "llama2-70b"):
            walls = [c.wall_s for n, w, *_, c in rows if n == name and w == 8 and c.ok]
            rss = [c.max_rss_bytes for n, w, *_, c in rows if n == name and w == 8 and c.ok]
            if walls:
                lines.append(f"- {name} at 8 ranks: probe wall {min(walls):.1f}-{max(walls):.1f} s, "
                             f"peak RSS up to {max(rss) / 2**20:.0f} MiB.")
    replace_section(args.out, "\n".join(lines))


if __name__ == "__main__":
    main()
