"""The DeepSpeed referee: real ZeRO-1/2/3 engines on DeepSpeed's CPU accelerator (gloo, two
processes) at small shapes, with the engine's buffers measured as it runs.

    DS_ACCELERATOR=cpu python -m probes.deepspeed_cpu OUT.json [CASE ...]

Needs ``deepspeed`` (pip; tested with 0.19.8 over torch 2.13.0+cpu). Each case trains the
reference transformer (probes/models.py, the planner's parameter layout) for two optimizer
steps with a client torch AdamW (no C++ op builds) and records, on rank 0, what the engine
holds: the 16-bit flat parameters, the fp32 master partition, the gradient partition buffers,
the reduce buckets (read inside every bucket reduction), ZeRO-3's persistent parameters, the
fp32 gradient handed to the optimizer at each (sub-group) step and the Adam state. The
planner's terms for the same shapes are compared in tests/test_deepspeed.py against the
recorded file tests/data/deepspeed_cpu.json (CI needs no DeepSpeed); with DeepSpeed installed
the test reruns one case live.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

from planner.spec import ModelSpec

MODEL = ModelSpec(name="ds-tiny", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4,
                  ffn_hidden=128, vocab=256)
"""115,008 parameters: 2 blocks of 41,088 and a root of 32,832 (largest tensor 16,384)."""
WORLD = 2
SEQ, MICRO = 16, 2

CASES: dict[str, dict[str, Any]] = {
    "z1": {"stage": 1, "reduce_bucket_size": 30_000, "overlap_comm": False},
    "z1-overlap": {"stage": 1, "reduce_bucket_size": 30_000, "overlap_comm": True},
    "z2": {"stage": 2, "reduce_bucket_size": 30_000, "overlap_comm": False},
    "z2-overlap": {"stage": 2, "reduce_bucket_size": 30_000, "overlap_comm": True},
    "z2-ga2": {"stage": 2, "reduce_bucket_size": 30_000, "overlap_comm": False, "ga": 2},
    "z3": {"stage": 3, "reduce_bucket_size": 30_000, "stage3_prefetch_bucket_size": 10_000,
           "stage3_param_persistence_threshold": 100, "sub_group_size": 20_000},
    "z3-one-group": {"stage": 3, "reduce_bucket_size": 30_000,
                     "stage3_param_persistence_threshold": 100},
    # bf16 model, fp32 gradient accumulation, stage 1, no offload: the engine picks
    # BF16_Optimizer instead of the ZeRO optimizer (engine.py _do_optimizer_sanity_check)
    "z1-bf16-optimizer": {"stage": 1, "reduce_bucket_size": 30_000,
                          "data_types": {"grad_accum_dtype": "fp32"}},
    # bf16 master weights, gradients and optimizer states on the GPU (no offload)
    "z2-bf16-master": {"stage": 2, "reduce_bucket_size": 30_000,
                       "bf16": {"bf16_master_weights_and_grads": True,
                                "bf16_optimizer_states": True}},
    "z3-bf16-master": {"stage": 3, "reduce_bucket_size": 30_000,
                       "stage3_param_persistence_threshold": 100,
                       "bf16": {"bf16_master_weights_and_grads": True,
                                "bf16_optimizer_states": True}},
    # ZeRO++ hpZ: the secondary partition over both ranks (qwZ and qgZ need DeepSpeed's CUDA
    # quantizer op: not on the CPU accelerator)
    "z3-hpz": {"stage": 3, "reduce_bucket_size": 30_000,
               "stage3_param_persistence_threshold": 100, "zero_hpz_partition_size": 2},
}
NOT_ZERO = ("ga", "bf16", "data_types")
"""Case keys that are not zero_optimization's."""


def ds_config(case: dict[str, Any]) -> dict[str, Any]:
    zo = {k: v for k, v in case.items() if k not in NOT_ZERO}
    cfg = {"train_micro_batch_size_per_gpu": MICRO,
           "gradient_accumulation_steps": case.get("ga", 1),
           "bf16": {"enabled": True, **case.get("bf16", {})}, "zero_optimization": zo,
           "zero_allow_untested_optimizer": True, "steps_per_print": 10**9}
    if "data_types" in case:
        cfg["data_types"] = case["data_types"]
    return cfg


def _nbytes(t: Any) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _worker(rank: int, name: str, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), DS_ACCELERATOR="cpu")
    import deepspeed
    import torch
    import torch._dynamo  # zero.Init's signature check fails under torch 2.13 without it

    from probes.models import build_model

    case = CASES[name]
    cfg = ds_config(case)
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    if case["stage"] == 3:
        with deepspeed.zero.Init(config_dict_or_path=cfg):
            model = build_model(MODEL, device="cpu")
    else:
        model = build_model(MODEL, device="cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    engine, zopt, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    rec: dict[str, Any] = {"case": name, "deepspeed": deepspeed.__version__,
                           "torch": torch.__version__, "world": WORLD, "config": cfg}
    stage = case["stage"]
    if type(zopt).__name__ == "BF16_Optimizer":
        _record_bf16_optimizer(rec, model, zopt, engine)
    elif stage == 3:
        rec["grad_flat_buffer"] = _nbytes(zopt.grad_partitions_flat_buffer)
        rec["bucket_at_init"] = sum(_nbytes(b.buffer) for b in zopt.ipg_buckets.values())
        rec["master"] = sum(_nbytes(t) for t in zopt.fp32_partitioned_groups_flat)
        rec["persistent_full"] = sum(p.ds_numel * p.element_size()
                                     for p in model.parameters() if p.ds_persist)
        rec["param_partitions"] = sum(_nbytes(p.ds_tensor) for p in model.parameters())
        rec["sub_groups"] = len(zopt.fp16_partitioned_groups_flat)
    else:
        rec["flat_params"] = sum(_nbytes(t) for t in zopt.bit16_groups_flat)
        rec["master"] = sum(_nbytes(t) for t in zopt.single_partition_of_fp32_groups)
        seen = {"bucket": 0, "grads_in_partition": 0, "grads_at_backward_end": 0}
        inner = zopt.reduce_ipg_grads

        def reduce_ipg_grads(*a: Any, **k: Any) -> Any:
            # inside backward: every bucket allocated, the partition copy so far
            seen["bucket"] = max(seen["bucket"], sum(_nbytes(t) for b in
                                                     zopt.ipg_buckets.values()
                                                     for t in b.buffer))
            seen["grads_in_partition"] = max(seen["grads_in_partition"],
                                             _nbytes(zopt.grads_in_partition))
            return inner(*a, **k)

        zopt.reduce_ipg_grads = reduce_ipg_grads
        outer = zopt.reduce_gradients

        def reduce_gradients(*a: Any, **k: Any) -> Any:
            # end of backward, before the remaining grads are reduced: every param.grad alive
            live = sum(_nbytes(p.grad) for p in model.parameters())
            seen["grads_at_backward_end"] = max(seen["grads_at_backward_end"], live)
            return outer(*a, **k)

        zopt.reduce_gradients = reduce_gradients
        epilogue = zopt.overlapping_partition_gradients_reduce_epilogue

        def overlapping_epilogue(*a: Any, **k: Any) -> Any:  # stage 2's end of backward
            live = sum(_nbytes(p.grad) for p in model.parameters())
            seen["grads_at_backward_end"] = max(seen["grads_at_backward_end"], live)
            return epilogue(*a, **k)

        zopt.overlapping_partition_gradients_reduce_epilogue = overlapping_epilogue
    steps: list[int] = []
    inner_step = opt.step

    secondary: list[int] = []

    def step(*a: Any, **k: Any) -> Any:
        steps.append(sum(_nbytes(p.grad) for g in opt.param_groups for p in g["params"]))
        # hpZ's secondary partitions at the step (freed after it, in _post_step)
        secondary.append(sum(_nbytes(getattr(p, "ds_secondary_tensor", None))
                             for p in model.parameters()))
        return inner_step(*a, **k)

    opt.step = step
    ga = case.get("ga", 1)
    ids = torch.randint(0, MODEL.vocab, (MICRO, SEQ))
    for _ in range(2 * ga):
        loss = engine(ids, ids)
        engine.backward(loss)
        engine.step()
    if stage != 3 and "bf16_optimizer" not in rec:
        rec.update(seen)
    rec.update(rec.pop("_seen", {}))
    if case.get("zero_hpz_partition_size", 1) > 1:
        # the second step's: after one _post_step has dropped the secondary copies (the
        # first step's is the same, 115,008 B: every parameter has one at both)
        rec["hpz_secondary_at_step"] = secondary[-1]
        rec["hpz_secondary_after_step"] = sum(_nbytes(getattr(p, "ds_secondary_tensor", None))
                                              for p in model.parameters())
    rec["step_fp32_grads"] = max(steps)
    rec["steps_per_step"] = len(steps) // 2
    rec["adam_state"] = sum(_nbytes(v) for s in opt.state.values() for v in s.values()
                            if torch.is_tensor(v) and v.dim() > 0)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rec, f)


def _record_bf16_optimizer(rec: dict[str, Any], model: Any, zopt: Any, engine: Any) -> None:
    """BF16_Optimizer (bf16_optimizer.py): the flat bf16 module, the fp32 master partition,
    the full-size gradient accumulation buffer (``grad_acc_dtype``), the bf16 param.grads
    alive when backward ends, and the largest tensor handed to all_reduce (the accumulation
    buffer cast to the communication dtype, engine.py ``allreduce_bucket``)."""
    import deepspeed.comm as dscomm

    rec["bf16_optimizer"] = True
    rec["flat_params"] = sum(_nbytes(t) for t in zopt.bf16_groups_flat)
    rec["master"] = sum(_nbytes(t) for t in zopt.fp32_groups_flat_partition)
    rec["grad_acc_buffer"] = sum(_nbytes(t) for t in zopt.fp32_groups_gradients_flat)
    seen = {"grads_at_backward_end": 0, "allreduce_tensor": 0}
    epilogue = zopt.backward_epilogue

    def backward_epilogue(*a: Any, **k: Any) -> Any:
        live = sum(_nbytes(p.grad) for p in model.parameters())
        seen["grads_at_backward_end"] = max(seen["grads_at_backward_end"], live)
        return epilogue(*a, **k)

    zopt.backward_epilogue = backward_epilogue
    all_reduce = dscomm.all_reduce

    def counting_all_reduce(tensor: Any, *a: Any, **k: Any) -> Any:
        seen["allreduce_tensor"] = max(seen["allreduce_tensor"], _nbytes(tensor))
        return all_reduce(tensor, *a, **k)

    dscomm.all_reduce = counting_all_reduce
    rec["_seen"] = seen


def spawn_ranks(worker: Any, name: str, world: int) -> dict[str, Any]:
    """``worker(rank, name, port, out)`` in ``world`` fresh processes (gloo on a free local
    port); rank 0's record, which it writes to ``out``."""
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rank0.json")
        mp.start_processes(worker, args=(name, port, out), nprocs=world, join=True,
                           start_method="spawn")
        with open(out) as f:
            return json.load(f)


def run_case(name: str) -> dict[str, Any]:
    """One case in two fresh processes (gloo); rank 0's record."""
    return spawn_ranks(_worker, name, WORLD)


def write_records(argv: list[str], cases: Any, run: Any) -> int:
    """``OUT.json [CASE ...]``: each named case (default: every case) run, the records
    written to OUT.json atomically."""
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    out, names = argv[0], argv[1:] or list(cases)
    records = {n: run(n) for n in names}
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(records, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, out)
    return 0


def main(argv: list[str]) -> int:
    return write_records(argv, CASES, run_case)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
