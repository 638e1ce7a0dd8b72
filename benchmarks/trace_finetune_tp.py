"""Fine-tunes (LoRA, QLoRA stand-in, frozen layers) and tensor parallel + FSDP traced on fake
tensors, per moment of the step, beside the planner (issue 15).

    python benchmarks/trace_finetune_tp.py            # the CI shape (probes/matrix.py llama)
    python benchmarks/trace_finetune_tp.py --real 8b  # Llama-3-8B shapes (or 70b), --layers N

Prints, per configuration, one markdown table: for each moment (planner.memory.Phase) the
traced bytes by group (params, grads, optimizer, activations = saved + backward temporaries,
working = FSDP gathered params + comm buffers) and the planner's total for that moment
(without the cuBLAS workspace and what no trace holds, probes/compare.py), with the ratio
planner / trace. At real shapes the trace runs ``--layers`` blocks (default 2) of the real
width; the planner is asked about the same depth.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from planner.spec import (
    LINEAR_MODULES,
    Candidate,
    Checkpointing,
    Cluster,
    FineTune,
    ModelSpec,
    Precision,
    Quantize,
    Strategy,
    TrainingSpec,
)

REAL = {
    # Llama-3-8B / 70B (meta-llama config.json: hidden, heads, kv heads, intermediate, vocab)
    "8b": ModelSpec(name="llama3-8b", n_layers=32, hidden=4096, n_heads=32, n_kv_heads=8,
                    ffn_hidden=14336, vocab=128256),
    "70b": ModelSpec(name="llama3-70b", n_layers=80, hidden=8192, n_heads=64, n_kv_heads=8,
                     ffn_hidden=28672, vocab=128256),
}

CONFIGS = [
    ("full", FineTune(), 1),
    ("lora r8 q,v", FineTune(lora_rank=8), 1),
    ("lora r16 all-linear", FineTune(lora_rank=16, lora_targets=LINEAR_MODULES), 1),
    ("qlora nf4 r16 all-linear", FineTune(lora_rank=16, lora_targets=LINEAR_MODULES,
                                          quantize_base=Quantize.NF4), 1),
    ("freeze first 2 layers", FineTune(freeze_layers=2), 1),
    ("tp 2", FineTune(), 2),
    # torchtitan's op-level selective checkpointing under TP (activations.tp_sac_kept)
    ("tp 2 selective", FineTune(), 2),
]


def mib(x: int) -> str:
    return f"{x / 2**20:.2f}"


def run(model: ModelSpec, label: str, ft: FineTune, tp: int, world: int, seq: int,
        micro_batch: int, precision: Precision) -> str:
    from planner.hardware import load_gpu
    from probes.compare import compare
    from probes.effects_matrix import breakdown
    from probes.trace import trace_step

    training = TrainingSpec(seq=seq, micro_batch=micro_batch, precision=precision,
                            finetune=ft)
    ck = Checkpointing.SELECTIVE if label.endswith("selective") else Checkpointing.NONE
    cand = Candidate(strategy=Strategy.FULL_SHARD, tp=tp, checkpointing=ck)
    n = world * tp if tp > 1 else world
    t0 = time.perf_counter()
    r = trace_step(model, training, cand, n, 8)
    wall = time.perf_counter() - t0
    cluster = Cluster(gpu=load_gpu("h100-80"), n_gpus=n, gpus_per_node=8,
                      host_ram_bytes_per_node=2**40)
    c = compare(model, training, cluster, cand, r)
    mesh = f" (dp {n // tp} x tp {tp})" if tp > 1 else ""
    rows = [(f"### {label}: {model.name} ({model.n_layers} layers), {precision.value}, "
             f"full_shard, {n} ranks{mesh}, seq {seq} x micro-batch {micro_batch}; trainable "
             f"{r['n_trainable_params']:,} of {r['n_params']:,} params; traced in {wall:.1f} s"),
            "",
            ("| moment | params | grads | optimizer | activations | working | other | traced "
             "total | planner | planner/trace |"),
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for m, b in breakdown(r).items():
        pair = c.moments.get(m)
        pred = pair.predicted_bytes if pair else None
        traced = pair.traced_bytes if pair else b["total"] - b["other"]
        ratio = f"{pred / traced:.3f}" if pred else "-"
        rows.append(f"| {m} | {mib(b['params'])} | {mib(b['grads'])} | {mib(b['optimizer'])} "
                    f"| {mib(b['activations'])} | {mib(b['working'])} | {mib(b['other'])} | "
                    f"{mib(traced)} | {mib(pred) if pred else '-'} | {ratio} |")
    rows.append(f"\npeak: traced {mib(c.peak.traced_bytes)} MiB ({c.traced_peak_phase}), "
                f"planner {mib(c.peak.predicted_bytes)} MiB ({c.predicted_peak_phase}), "
                f"error {100 * c.peak.rel_error:+.2f} %\n")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--real", choices=sorted(REAL), help="real widths instead of CI's shape")
    ap.add_argument("--layers", type=int, default=2, help="blocks traced at real widths")
    ap.add_argument("--seq", type=int, default=0)
    ap.add_argument("--world", type=int, default=2, help="data-parallel ranks")
    ap.add_argument("--precision", default="bf16", choices=[p.value for p in Precision])
    ap.add_argument("--only", default="", help="run the configurations whose label contains "
                    "this (e.g. 'tp')")
    ap.add_argument("--tp", type=int, default=0, help="with --only tp: this degree instead of 2")
    args = ap.parse_args()
    if args.real:
        model = dataclasses.replace(REAL[args.real], n_layers=args.layers)
        seq = args.seq or 2048
    else:
        from probes.matrix import ARCHS, SEQ

        model, seq = ARCHS["llama"], args.seq or SEQ
    print("All sizes MiB (2**20 bytes), one rank. MiB = traced bytes by group; 'other' = "
          "token ids, buffers, host-side step counters (neither side counts them).\n")
    for label, ft, tp in CONFIGS:
        if args.only not in label:
            continue
        if tp > 1 and args.tp:
            label, tp = label.replace("tp 2", f"tp {args.tp}"), args.tp
        print(run(model, label, ft, tp, args.world, seq, 1 if args.real else 2,
                  Precision(args.precision)), flush=True)


if __name__ == "__main__":
    main()
