"""Predict every public measurement in throughput_measurements.csv and report the error.

    python benchmarks/throughput_accuracy.py [--csv PATH] [--md docs/throughput_accuracy.md]

Prints predicted vs measured tokens/s/GPU, the relative error per row and the median absolute
relative error, and writes the same table as Markdown. No per-row tuning: every row uses the
global defaults of ``planner.throughput`` (the calibrated ones are the per-GPU-family compute
efficiencies: each profile's ``compute_efficiency``); the only per-row inputs are the facts the
source states (model, GPUs, strategy, precision, seq, batch, checkpointing, network speed).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.spec import (  # noqa: E402
    Candidate,
    Checkpointing,
    Cluster,
    GpuProfile,
    MlpKind,
    ModelSpec,
    NormKind,
    PositionKind,
    Precision,
    Strategy,
    TrainingSpec,
)
from planner.hardware import load_gpu as load_profile  # noqa: E402
from planner.throughput import default_compute_efficiency, estimate_step  # noqa: E402

GIB = 2**30

# The embedded profiles (datasheet numbers, dense). Inter-node bandwidth is replaced per row by
# what the source states (column inter_node_gbit_per_gpu).
GPUS: dict[str, GpuProfile] = {
    "a100-sxm-80gb": load_profile("a100-80"),
    "h100-sxm-80gb": load_profile("h100-80"),
}


def _mpt(name: str, n_layers: int, d_model: int, n_heads: int, max_seq: int) -> ModelSpec:
    # llm-foundry MPT (scripts/train/yamls/pretrain/mpt-*.yaml): GELU MLP with expansion 4,
    # vocab 50368, tied embeddings, LayerNorm, no biases; the benchmark's NumParams grows with
    # seq by seq x d_model, i.e. learned positions of max_seq_len rows.
    return ModelSpec(
        name=name, n_layers=n_layers, hidden=d_model, n_heads=n_heads, n_kv_heads=n_heads,
        ffn_hidden=4 * d_model, vocab=50368, tied_embeddings=True, mlp=MlpKind.GELU,
        norm=NormKind.LAYERNORM, position=PositionKind.LEARNED, max_positions=max_seq,
    )  # fmt: skip


_MPT_SHAPES = {
    "mpt-760m": (24, 1536, 12),
    "mpt-1b": (24, 2048, 16),
    "mpt-3b": (32, 2560, 20),
    "mpt-7b": (32, 4096, 32),
    "mpt-13b": (40, 5120, 40),
    "mpt-30b": (48, 7168, 56),
    "mpt-70b": (80, 8192, 64),
}


def model_for(name: str, seq: int) -> ModelSpec:
    if name in _MPT_SHAPES:
        return _mpt(name, *_MPT_SHAPES[name], max_seq=seq)
    if name == "llama2-34b":
        # fms-fsdp fms_fsdp/utils/config_utils.py "llama2_34b": 48 x 8192, 64 heads, 8 kv heads,
        # ffn 22016, Llama-2 vocab 32000.
        return ModelSpec(
            name=name, n_layers=48, hidden=8192, n_heads=64, n_kv_heads=8, ffn_hidden=22016,
            vocab=32000,
        )
    try:
        from planner.presets import get_preset
    except ImportError:  # pragma: no cover - presets module not there yet
        raise SystemExit(f"no shape for {name}: planner.presets is missing") from None
    return get_preset(name)


def predict(row: dict[str, str]):
    gpu = GPUS[row["gpu"]]
    gbit = float(row["inter_node_gbit_per_gpu"])
    from dataclasses import replace

    gpu = replace(gpu, inter_node_bandwidth_bytes_per_s=gbit * 1e9 / 8)
    seq = int(row["seq"])
    model = model_for(row["model"], seq)
    training = TrainingSpec(
        seq=seq,
        micro_batch=int(row["micro_batch"]),
        grad_accum=int(row["grad_accum"]),
        precision=Precision(row["precision"]),
    )
    gpn = int(row["gpus_per_node"])
    cluster = Cluster(gpu=gpu, n_gpus=int(row["n_gpus"]), gpus_per_node=gpn,
                      host_ram_bytes_per_node=gpu.host_ram_bytes_per_node)  # fmt: skip
    cand = Candidate(strategy=Strategy(row["strategy"]),
                     checkpointing=Checkpointing(row["checkpointing"]))  # fmt: skip
    return estimate_step(model, training, cluster, cand)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=str(ROOT / "benchmarks" / "throughput_measurements.csv"))
    ap.add_argument("--md", default=str(ROOT / "docs" / "throughput_accuracy.md"))
    args = ap.parse_args(argv)

    rows = list(csv.DictReader(open(args.csv, newline="")))
    results = []
    for row in rows:
        est = predict(row)
        measured = float(row["measured_tokens_per_s_per_gpu"])
        err = (est.tokens_per_s_per_gpu - measured) / measured
        results.append((row, est, measured, err))

    head = (f"{'id':28} {'gpu':14} {'n':>4} {'strategy':13} {'ckpt':9} {'meas tok/s':>10}"
            f" {'pred tok/s':>10} {'err':>7} {'meas MFU':>8} {'pred MFU':>8} {'exp.comm':>8}")  # fmt: skip
    print(head)
    print("-" * len(head))
    for row, est, measured, err in results:
        mfu = row["reported_mfu"]
        mfu_s = f"{float(mfu):8.1%}" if mfu else f"{'-':>8}"
        print(f"{row['id']:28} {row['gpu']:14} {row['n_gpus']:>4} {row['strategy']:13}"
              f" {row['checkpointing']:9} {measured:10.0f} {est.tokens_per_s_per_gpu:10.0f}"
              f" {err:+7.1%} {mfu_s} {est.mfu:8.1%}"
              f" {est.exposed_comm_s / est.step_time_s:8.1%}")  # fmt: skip
    abs_errs = [abs(r[3]) for r in results]
    median = statistics.median(abs_errs)
    signed = statistics.median(r[3] for r in results)
    print(f"\nrows: {len(results)}  median |error|: {median:.1%}  median signed error: "
          f"{signed:+.1%}  max |error|: {max(abs_errs):.1%}")  # fmt: skip
    effs = {g: default_compute_efficiency(p) for g, p in GPUS.items()}
    print("compute efficiency defaults used: " + ", ".join(f"{g} {e:.2f}" for g, e in effs.items()))

    lines = [
        "# Throughput model accuracy",
        "",
        "Generated by `python benchmarks/throughput_accuracy.py` from",
        "`benchmarks/throughput_measurements.csv` (public measurements; sources and quotes are in",
        "the CSV). Prediction: `planner.throughput.estimate_step` with global defaults only.",
        "Error = (predicted - measured) / measured tokens/s/GPU.",
        "",
        f"**{len(results)} rows, median |error| {median:.1%}, median signed error {signed:+.1%},"
        f" max |error| {max(abs_errs):.1%}.**",
        "",
        "| id | model | GPU | GPUs | strategy | precision | seq | mb x ga | ckpt"
        " | measured tok/s/GPU | predicted | error | reported MFU | predicted MFU |",
        "|---|---|---|---:|---|---|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for row, est, measured, err in results:
        mfu = f"{float(row['reported_mfu']):.1%}" if row["reported_mfu"] else "-"
        lines.append(
            f"| {row['id']} | {row['model']} | {row['gpu']} | {row['n_gpus']} | {row['strategy']}"
            f" | {row['precision']} | {row['seq']} | {row['micro_batch']} x {row['grad_accum']}"
            f" | {row['checkpointing']} | {measured:.0f} | {est.tokens_per_s_per_gpu:.0f}"
            f" | {err:+.1%} | {mfu} | {est.mfu:.1%} |"
        )
    lines += [
        "",
        "Compute-efficiency defaults (the only calibrated constants): "
        + ", ".join(f"{g}: {e:.2f}" for g, e in effs.items())
        + ". All other constants are the documented defaults of `ThroughputAssumptions`.",
        "",
    ]
    md = Path(args.md)
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text("\n".join(lines))
    print(f"wrote {md}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
