"""The float8 step-time model's per-linear check: one linear's forward + backward as
planner/float8.py costs it, against one H100's ``record: float8_layer``.

    PYTHONPATH=. python benchmarks/float8_layer_check.py [RUN_FOLDER]

For each measured shape (8,192 tokens, K in-features, N out-features) and recipe: the bf16
layer's measured time with its three matmuls sped up by the profile's measured float8 rates
(``fp8_matmul_speedup``: tensorwise, ``fp8_rowwise_matmul_speedup``: rowwise's forward), plus
the casts, layout copies and rowwise rescale at planner/float8.py's bytes over the h100-80
bandwidth; printed beside the measured float8 time. Compiled records past torch.compile's
recompile limit (``torch._dynamo hit config.recompile_limit (8)`` in run3.log: the ninth
module compiled in that process, 1b.down rowwise, and every later one ran eager) are marked
and left out. Reads no planner step-time path: it checks the per-linear terms alone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner import float8 as f8  # noqa: E402
from planner.hardware import load_gpu  # noqa: E402

RUN = ROOT / "benchmarks" / "gpu_runs" / "2026-11-26-h100-b"
RECOMPILE_LIMIT = 8
"""torch._dynamo.config.recompile_limit: the layer part compiles bf16, tensorwise, rowwise
per shape in one process; from the ninth on, Sequential.forward runs eager."""


def modelled(m: int, k: int, n: int, recipe: str, compiled: bool, bf16_s: float) -> float:
    """One linear's float8 forward + backward, seconds, as planner/float8.py costs it."""
    gpu = load_gpu("h100-80")
    tw = gpu.fp8_matmul_speedup or 1.0
    rw = gpu.fp8_rowwise_matmul_speedup or 1.0
    fwd, bwd = (tw, tw) if recipe == "tensorwise" else (rw, tw)
    gemms = bf16_s * (1 / fwd + 2 / bwd) / 3
    hbm = gpu.hbm_bandwidth_bytes_per_s
    casts = 2 * (m * k + m * n + k * n)  # input, weight, output gradient, each twice
    if compiled:
        return gemms + casts * f8.CAST_EQUIV_COMPILED / hbm
    unit = 1 / f8.EAGER_EFFICIENCY / hbm
    copies = (k * n + m * n + m * k) * f8.COPY_COUNTED * unit
    rescale = (m * k + k * n) * f8.RESCALE_COUNTED * unit if recipe == "rowwise" else 0.0
    return gemms + casts * f8.CAST_EQUIV_EAGER / hbm + copies + rescale


def main(argv: list[str]) -> int:
    folder = Path(argv[0]) if argv else RUN
    recs = [r for p in sorted(folder.glob("run*-records.jsonl"))
            for r in map(json.loads, p.read_text().splitlines())
            if r["record"] == "float8_layer"]
    print(f"{'shape':8s} {'mode':8s} {'recipe':10s} {'bf16 ms':>8s} {'meas ms':>8s} "
          f"{'model ms':>8s} {'err':>7s}")
    compiled = 0  # modules compiled so far in the part's process: bf16, tensorwise, rowwise
    for r in recs:
        mode = "compiled" if r["compiled"] else "eager"
        for i, recipe in enumerate(("tensorwise", "rowwise")):
            stale = r["compiled"] and compiled + 2 + i > RECOMPILE_LIMIT
            got = r[f"{recipe}_s"]
            pred = modelled(r["tokens"], r["k"], r["n"], recipe, r["compiled"], r["bf16_s"])
            note = "  (ran eager: recompile limit)" if stale else ""
            print(f"{r['shape']:8s} {mode:8s} {recipe:10s} {r['bf16_s'] * 1e3:8.3f} "
                  f"{got * 1e3:8.3f} {pred * 1e3:8.3f} {pred / got - 1:+7.1%}{note}")
        compiled += 3 if r["compiled"] else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
