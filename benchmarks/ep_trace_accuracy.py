"""The planner against the whole training step under torchtitan's expert parallel, traced on
fake tensors (probes/ep_trace.py), at widths larger than the tests' (tests/test_ep_trace.py):
every moment of the step, 8 fake ranks (beside context parallel: every cp rank, the worst).
Writes its section of docs/accuracy.md (between the ep-trace markers) with ``--out``.

    python benchmarks/ep_trace_accuracy.py [--quick | --cp-only] [--out docs/accuracy.md]

Each configuration is traced in its own subprocess (probes.runner), the cases beside CP in
this process (one fake process group per cp rank). Target: |error| <= 2 % at every moment.
"""

from __future__ import annotations

import argparse
import sys

from benchmarks.trace_accuracy import write_section
from planner.hardware import load_gpu
from planner.spec import Candidate, Checkpointing, Cluster, ModelSpec, Strategy, TrainingSpec
from probes.compare import compare
from probes.runner import run_trace

SHAPES = {
    "mixtral-like": ModelSpec(name="mixtral-like", n_layers=4, hidden=1024, n_heads=8,
                              n_kv_heads=2, ffn_hidden=3584, vocab=8192, n_experts=8,
                              experts_per_token=2),
    "dsv3-like": ModelSpec(name="dsv3-like", n_layers=4, hidden=1024, n_heads=8, n_kv_heads=8,
                           ffn_hidden=288, vocab=8192, n_experts=16, experts_per_token=6),
    # DeepSeek-V3's layout: a shared expert of the routed width and a dense first block
    "dsv3-full-like": ModelSpec(name="dsv3-full-like", n_layers=4, hidden=1024, n_heads=8,
                                n_kv_heads=8, ffn_hidden=288, vocab=8192, n_experts=16,
                                experts_per_token=6, shared_ffn=288, n_dense_layers=1,
                                dense_ffn_hidden=3072),
    # 8 kv heads: TP 4 and 8 split them
    "mixtral-kv8-like": ModelSpec(name="mixtral-kv8-like", n_layers=4, hidden=1024, n_heads=8,
                                  n_kv_heads=8, ffn_hidden=3584, vocab=8192, n_experts=8,
                                  experts_per_token=2),
}
CASES = [  # (shape, ep, imbalance, checkpointing, seq[, tp])
    ("mixtral-like", 2, 1.0, "none", 2048),
    ("mixtral-like", 8, 1.0, "none", 2048),
    ("mixtral-like", 4, 2.0, "none", 2048),
    ("mixtral-like", 2, 1.0, "full", 4096),
    ("mixtral-like", 4, 1.0, "full", 4096),
    ("mixtral-like", 8, 1.0, "full", 4096),
    ("mixtral-like", 8, 2.0, "selective", 2048),
    ("dsv3-like", 8, 1.0, "none", 2048),
    ("dsv3-like", 4, 2.0, "full", 2048),
    # beside TP 2 (docs/model.md §8.8 "Beside tensor parallel")
    ("mixtral-like", 2, 1.0, "none", 2048, 2),
    ("mixtral-like", 4, 1.0, "full", 4096, 2),
    ("dsv3-like", 2, 1.0, "none", 2048, 2),
    # shared experts and a dense first block beside TP; TP 4 and 8
    ("dsv3-full-like", 4, 1.0, "full", 2048, 2),
    ("dsv3-full-like", 4, 1.0, "none", 2048, 4),
    ("mixtral-kv8-like", 4, 1.0, "none", 2048, 4),
    ("mixtral-kv8-like", 8, 1.0, "full", 4096, 8),
    # op-level selective checkpointing beside TP (activations.tp_sac_kept; the planner's
    # request refuses it, the estimator is compared). Measured 2026-11-26, worst moment:
    # Mixtral-like -0.65 % (bwd_end), DeepSeek-V3's layout +2.68 % (block_bwd; forward
    # -3.72 % before tp_sac_kept, -0.86 % since), TP 4 -0.39 % (bwd_end)
    ("mixtral-like", 2, 1.0, "selective", 2048, 2),
    ("dsv3-full-like", 4, 1.0, "selective", 2048, 2),
    ("mixtral-kv8-like", 4, 1.0, "selective", 2048, 4),
]
CP_CASES = [  # beside context parallel 2 (docs/model.md "Beside context parallel"), every cp
    # rank traced in this process, the worst held to the planner: (shape, ep, checkpointing,
    # seq)
    ("mixtral-like", 2, "none", 4096),
    ("mixtral-like", 4, "full", 4096),
    ("mixtral-like", 2, "selective", 4096),
    ("dsv3-like", 4, "none", 4096),
    ("dsv3-like", 2, "full", 4096),
    ("dsv3-like", 4, "selective", 4096),
]
MOMENTS = ("forward", "loss_bwd", "block_bwd", "bwd_end", "optimizer")
BEGIN, END = "<!-- ep-trace-accuracy:begin -->", "<!-- ep-trace-accuracy:end -->"


def row(shape: str, ep: int, imb: float, ck: str, seq: int, tp: int = 1) -> str:
    model = SHAPES[shape]
    training = TrainingSpec(seq=seq, micro_batch=1, ep=ep, ep_imbalance=imb)
    cand = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing(ck), tp=tp)
    gpu = load_gpu("h200")
    cluster = Cluster(gpu=gpu, n_gpus=8, gpus_per_node=8,
                      host_ram_bytes_per_node=gpu.host_ram_bytes_per_node)
    r = run_trace(model, training, cand, 8, 8, timeout_s=1200)
    data = r.data if r.ok else {"ok": False, "reason": r.reason}
    c = compare(model, training, cluster, cand, data, wall_s=r.wall_s)
    head = f"| {shape} | {ep} | {tp} | 1 | {imb:g} | {ck} | {seq} |"
    if not c.ok:
        return head + f" failed: {c.reason} |" + " |" * len(MOMENTS)
    cells = " | ".join(f"{c.moments[m].rel_error * 100:+.2f} %" if m in c.moments else "-"
                       for m in MOMENTS)
    return f"{head} {c.peak.traced_bytes / 2**30:.3f} | {cells} | {r.wall_s:.0f} s |"


def row_cp(shape: str, ep: int, ck: str, seq: int, cp: int = 2) -> str:
    """A CP case's row: every cp rank traced (probes/compare.py ``every_cp_rank``),
    planner - the largest traced over them, per moment."""
    import time

    from probes.compare import every_cp_rank

    model = SHAPES[shape]
    training = TrainingSpec(seq=seq, micro_batch=1, ep=ep, cp=cp)
    cand = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing(ck))
    gpu = load_gpu("h200")
    cluster = Cluster(gpu=gpu, n_gpus=8, gpus_per_node=8,
                      host_ram_bytes_per_node=gpu.host_ram_bytes_per_node)
    head = f"| {shape} | {ep} | 1 | {cp} | 1 | {ck} | {seq} |"
    start = time.perf_counter()
    try:
        worst = every_cp_rank(model, training, cand, cluster, 8, 8)
    except Exception as exc:  # a failed trace is a row, not the end of the run
        return head + f" failed: {exc} |" + " |" * len(MOMENTS)
    cells = " | ".join(f"{(worst[m][1] - worst[m][0]) / worst[m][0] * 100:+.2f} %"
                       if m in worst else "-" for m in MOMENTS)
    peak = max(t for t, _ in worst.values())
    return f"{head} {peak / 2**30:.3f} | {cells} | {time.perf_counter() - start:.0f} s |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the first three cases only")
    ap.add_argument("--cp-only", action="store_true", help="the cases beside CP only")
    ap.add_argument("--out", help="write the table into this Markdown file's section")
    args = ap.parse_args(argv)
    cases = [] if args.cp_only else CASES[:3] if args.quick else CASES
    lines = ["| shape (h 1024, 4 blocks) | EP | TP | CP | imbalance | checkpointing | seq | "
             "traced peak GiB | " + " | ".join(MOMENTS) + " | trace |",
             "|---" * (9 + len(MOMENTS)) + "|"]
    for case in cases:
        lines.append(row(*case))
        print(lines[-1], flush=True)
    for cp_case in [] if args.quick else CP_CASES:
        lines.append(row_cp(*cp_case))
        print(lines[-1], flush=True)
    body = ("Planner − trace over trace per moment, 8 fake ranks, full_shard, bf16-amp AdamW; "
            "beside CP over the largest of the cp ranks' traces "
            "(`python benchmarks/ep_trace_accuracy.py`; docs/model.md \"Expert parallel\"):"
            "\n\n" + "\n".join(lines))
    if args.out:
        text = write_section(args.out, body, BEGIN, END)
        with open(args.out, "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
