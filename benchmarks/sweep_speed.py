"""Configurations per second: vectorized sweep (numpy) vs. a loop over the scalar estimate.

    python benchmarks/sweep_speed.py [--n 1000000] [--scalar-n 20000]

Target: >= 1 M configurations/s for the vectorized path.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.spec import (  # noqa: E402
    Candidate, Checkpointing, Cluster, GpuProfile, ModelSpec, Offload, Precision, Strategy,
    TrainingSpec,
)
from planner.sweep import code_of, step_times  # noqa: E402
from planner.throughput import (  # noqa: E402
    CHECKPOINTING_ORDER, OFFLOAD_ORDER, PRECISION_ORDER, STRATEGY_ORDER, estimate_step,
)

GPU = GpuProfile(
    id="h100-sxm-80gb", name="NVIDIA H100 80GB HBM3", vendor="nvidia", memory_bytes=80 * 2**30,
    bf16_tflops=989.0, fp16_tflops=989.0, tf32_tflops=494.5, fp32_tflops=67.0,
    hbm_bandwidth_bytes_per_s=3.35e12, intra_node_link="nvlink4",
    intra_node_bandwidth_bytes_per_s=450e9, inter_node_bandwidth_bytes_per_s=50e9,
    gpus_per_node=8, host_ram_bytes_per_node=2048 * 2**30, pcie_bandwidth_bytes_per_s=64e9,
    cuda_context_bytes=500 * 2**20,
)  # fmt: skip


def random_configs(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    heads = rng.choice([8, 16, 32, 64], n)
    return {
        "n_layers": rng.integers(2, 128, n),
        "hidden": heads * rng.choice([64, 128], n),
        "n_heads": heads,
        "n_kv_heads": heads // rng.choice([1, 2, 4, 8], n),
        "ffn_hidden": rng.integers(1, 64, n) * 256,
        "vocab": rng.integers(1000, 200000, n),
        "seq": rng.choice([512, 1024, 2048, 4096, 8192], n),
        "micro_batch": rng.integers(1, 16, n),
        "grad_accum": rng.integers(1, 8, n),
        "n_gpus": rng.choice([1, 2, 4, 8, 16, 64, 256, 1024], n),
        "strategy": rng.integers(0, len(STRATEGY_ORDER), n),
        "checkpointing": rng.integers(0, len(CHECKPOINTING_ORDER), n),
        "offload": rng.integers(0, len(OFFLOAD_ORDER), n),
        "precision": rng.integers(0, len(PRECISION_ORDER), n),
    }


def scalar_one(c: dict[str, int]) -> float:
    model = ModelSpec(name="custom", n_layers=c["n_layers"], hidden=c["hidden"],
                      n_heads=c["n_heads"], n_kv_heads=c["n_kv_heads"],
                      ffn_hidden=c["ffn_hidden"], vocab=c["vocab"])  # fmt: skip
    training = TrainingSpec(seq=c["seq"], micro_batch=c["micro_batch"],
                            grad_accum=c["grad_accum"],
                            precision=PRECISION_ORDER[c["precision"]])  # fmt: skip
    cluster = Cluster(gpu=GPU, n_gpus=c["n_gpus"], gpus_per_node=8,
                      host_ram_bytes_per_node=GPU.host_ram_bytes_per_node)  # fmt: skip
    cand = Candidate(strategy=STRATEGY_ORDER[c["strategy"]],
                     checkpointing=CHECKPOINTING_ORDER[c["checkpointing"]],
                     offload=OFFLOAD_ORDER[c["offload"]])  # fmt: skip
    return estimate_step(model, training, cluster, cand).step_time_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--scalar-n", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)

    cfg = random_configs(args.n)
    step_times(gpu=GPU, **{k: v[:1000] for k, v in cfg.items()})  # warm-up
    best = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        out = step_times(gpu=GPU, **cfg)
        best = min(best, time.perf_counter() - t0)
    vec_rate = args.n / best

    rows = [{k: int(v[i]) for k, v in cfg.items()} for i in range(args.scalar_n)]
    t0 = time.perf_counter()
    scalar = [scalar_one(r) for r in rows]
    scalar_rate = args.scalar_n / (time.perf_counter() - t0)

    same = np.array_equal(np.array(scalar), out["step_time_s"][: args.scalar_n])
    print(f"vectorized: {args.n:,} configurations in {best * 1e3:.1f} ms -> {vec_rate:,.0f} /s")
    print(f"scalar loop: {args.scalar_n:,} configurations -> {scalar_rate:,.0f} /s")
    print(f"speed-up: {vec_rate / scalar_rate:,.0f}x   identical step times: {same}")
    print(f"target >= 1,000,000 /s vectorized: {'met' if vec_rate >= 1e6 else 'NOT met'}")
    _ = (Checkpointing, Offload, Precision, Strategy, code_of)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
