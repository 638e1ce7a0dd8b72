"""Configurations per second: the report's vectorized sweep vs. the scalar planner loop.

    python benchmarks/sweep_speed.py [--scalar-n 5000]

Sweeps 10 models x 10 GPU types x 14 GPU counts x 5 sequence lengths x 4 micro-batches x
8 strategies x 3 checkpointing modes (about 0.9 M configurations, plus the tensor-parallel and
offload rows the plan adds where nothing else fits, and the min-GPU searches) with
``planner.report.sweep.run_sweep``, then times ``planner.memory.estimate`` +
``planner.throughput.estimate_step`` per configuration on a sample of the same rows, and
prints both rates and their ratio. Target: a million configurations in at most 10 s.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.hardware import load_gpu  # noqa: E402
from planner.memory import estimate  # noqa: E402
from planner.presets import get_preset  # noqa: E402
from planner.report.request import build_request  # noqa: E402
from planner.report.sweep import run_sweep  # noqa: E402
from planner.spec import (  # noqa: E402
    Candidate, Checkpointing, Cluster, Offload, Strategy, TrainingSpec,
)
from planner.throughput import estimate_step  # noqa: E402

MODELS = ("llama3-8b,llama2-13b,llama3-70b,llama3.1-405b,mistral-7b,qwen2.5-7b,gemma2-9b,"
          "gpt2-xl,mixtral-8x7b,falcon-7b")
GPUS = "a100-80,h100-80,h200,mi300x,a100-40,l40s,rtx-4090,b200,v100-32,a10g"
NS = "1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192"
TARGET_S = 10.0
"""Seconds for a million configurations."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scalar-n", type=int, default=5000, help="rows timed with the scalar loop")
    args = ap.parse_args(argv)
    req = build_request(models=MODELS, gpus=GPUS, ns=NS, seqs="1024,2048,4096,8192,16384",
                        micro_batches="1,2,4,8")
    t = time.perf_counter()
    rows = run_sweep(req).rows
    vec_s = time.perf_counter() - t
    vec_rate = len(rows) / vec_s
    sample = rows.sample(n=min(args.scalar_n, len(rows)), random_state=0)
    gpus = {g: load_gpu(g) for g in GPUS.split(",")}
    t = time.perf_counter()
    for r in sample.itertuples(index=False):
        g = gpus[r.gpu]
        cl = Cluster(gpu=g, n_gpus=int(r.n), gpus_per_node=g.gpus_per_node,
                     host_ram_bytes_per_node=g.host_ram_bytes_per_node)
        tr = TrainingSpec(seq=int(r.seq), micro_batch=int(r.micro_batch))
        c = Candidate(strategy=Strategy(r.strategy), offload=Offload(r.offload),
                      checkpointing=Checkpointing(r.checkpointing), tp=int(r.tp))
        m = get_preset(r.model)
        estimate(m, tr, cl, c)
        estimate_step(m, tr, cl, c)
    scalar_rate = len(sample) / (time.perf_counter() - t)
    print(f"report sweep: {len(rows):,} configurations (with min-GPU searches) in {vec_s:.2f} s "
          f"= {vec_rate:,.0f} configurations/s")
    print(f"scalar loop:  {len(sample):,} configurations at {scalar_rate:,.0f} configurations/s "
          f"(the same grid would take {len(rows) / scalar_rate:.0f} s)")
    print(f"ratio: {vec_rate / scalar_rate:.1f}x")
    per_million = 1e6 / vec_rate
    print(f"target: 1 M configurations <= {TARGET_S:.0f} s: {per_million:.1f} s "
          f"({'met' if per_million <= TARGET_S else 'MISSED'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
