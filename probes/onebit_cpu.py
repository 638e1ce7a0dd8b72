"""The 1-bit optimizers' referee: DeepSpeed v0.19.6's own ``OnebitAdam``, ``ZeroOneAdam`` and
``OnebitLamb`` on its stage-0 engine, on DeepSpeed's CPU accelerator (gloo, 2 or 3
processes), at small shapes, with what they hold and send recorded as they run.

    DS_ACCELERATOR=cpu PYTHONPATH=<deepspeed 0.19.6 on the path first> \\
        python -m probes.onebit_cpu OUT.json [CASE ...]

Needs ``deepspeed==0.19.6`` (0.19.7 and later no longer have the optimizers, PR #8490);
tested over torch 2.13.0+cpu. Their compressed all-reduce (``NcclBackend``,
``runtime/comm/nccl.py``) is DeepSpeed's code as it is, run over gloo; the one thing put in
its place is ``cupy``, which it uses to pack and unpack the sign bits on a CUDA device: a
numpy stand-in here (``_numpy_cupy``: numpy's ``packbits`` / ``unpackbits`` / ``split`` /
``zeros``, the same big-endian bit order, arrays shared with torch as cupy shares them
through DLPack). Each case trains the reference transformer (probes/models.py) in bf16 (or
fp32) for a few optimizer steps past the warm-up and records on rank 0: the engine's wrapper
and flat master, every optimizer state tensor, the bytes of each collective per step
(the gradient all-reduce, the compressed all-to-all and all-gathers) and the tensors made
inside the optimizer's step (``probes.context_parallel.LiveBytes``: the most bytes of torch
storages alive at once above those alive when it starts, whose frees it counts too: its
temporaries; the sign bits packed by numpy here, by cupy's own pool on a GPU, are outside
it). tests/test_onebit.py holds the planner to the recorded file
tests/data/onebit_cpu.json (CI needs no DeepSpeed).
"""

from __future__ import annotations

import json
import os
import sys
import types
from typing import Any

# MODEL: ds-tiny, 115,008 parameters
from probes.deepspeed_cpu import MODEL, spawn_ranks, write_records

SEQ, MICRO, STEPS = 16, 2, 6
CASES: dict[str, dict[str, Any]] = {
    "adam-w2": {"world": 2, "type": "OneBitAdam", "params": {"freeze_step": 2}},
    "adam-w3": {"world": 3, "type": "OneBitAdam", "params": {"freeze_step": 2}},
    "adam-fp32-w3": {"world": 3, "type": "OneBitAdam", "params": {"freeze_step": 2},
                     "fp32": True},
    "zoadam-w3": {"world": 3, "type": "ZeroOneAdam",
                  "params": {"var_freeze_step": 2, "local_step_scaler": 1,
                             "local_step_clipper": 2}},
    "lamb-w3": {"world": 3, "type": "OneBitLamb", "params": {"freeze_step": 2}},
}


def _numpy_cupy() -> types.ModuleType:
    """What NcclBackend and CupyBackend call of cupy, on host arrays."""
    import numpy as np
    import torch

    m = types.ModuleType("cupy")

    class _Stream:
        def synchronize(self) -> None:
            pass

    class _Device:
        def __init__(self, i: int) -> None:
            pass

        def use(self) -> None:
            pass

    m.cuda = types.SimpleNamespace(Device=_Device, get_current_stream=lambda: _Stream())
    # cupy.from_dlpack takes the capsule torch's to_dlpack makes: the same storage, as numpy
    m.from_dlpack = lambda capsule: torch.from_dlpack(capsule).numpy()
    m.packbits = np.packbits
    m.unpackbits = np.unpackbits
    m.split = np.split
    m.zeros = np.zeros
    return m


def ds_config(case: dict[str, Any]) -> dict[str, Any]:
    cfg: dict[str, Any] = {"train_micro_batch_size_per_gpu": MICRO,
                           "gradient_accumulation_steps": 1, "steps_per_print": 10**9,
                           "optimizer": {"type": case["type"],
                                         "params": {"lr": 1e-3, "comm_backend_name": "nccl",
                                                    **case["params"]}}}
    if not case.get("fp32"):
        cfg["bf16"] = {"enabled": True}
    return cfg


def _nbytes(t: Any) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _worker(rank: int, name: str, port: int, out: str) -> None:
    case = CASES[name]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(case["world"]),
                      DS_ACCELERATOR="cpu")
    sys.modules["cupy"] = _numpy_cupy()
    import deepspeed
    import deepspeed.comm as dscomm
    import torch
    from probes.context_parallel import LiveBytes
    from probes.models import build_model

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = build_model(MODEL, device="cpu")
    comm: dict[str, int] = {}

    def counting(fn_name: str) -> None:
        inner = getattr(dscomm, fn_name)

        def wrapped(*a: Any, **k: Any) -> Any:
            t = a[1] if fn_name in ("all_gather", "all_to_all_single") else a[0]
            comm[fn_name] = comm.get(fn_name, 0) + _nbytes(t)
            comm[fn_name + "_calls"] = comm.get(fn_name + "_calls", 0) + 1
            if fn_name == "all_gather" and t.shape != a[0][0].shape:
                # NCCL gathers the 0-d scale into 1-element outputs; gloo asks for the same
                # shape: the same element, viewed as the outputs are
                a = (a[0], t.reshape(a[0][0].shape), *a[2:])
            return inner(*a, **k)

        setattr(dscomm, fn_name, wrapped)

    for fn in ("all_reduce", "all_gather", "all_to_all_single"):
        counting(fn)
    # (FP16_Optimizer's initialize_optimizer_states runs the optimizer's first step here)
    engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                             config=ds_config(case))
    basic = engine.basic_optimizer
    rec: dict[str, Any] = {"case": name, "deepspeed": deepspeed.__version__,
                           "torch": torch.__version__, "world": case["world"],
                           "config": ds_config(case), "wrapper": type(opt).__name__,
                           "optimizer": type(basic).__name__, "init_comm": dict(comm)}
    rec["master_flat"] = sum(_nbytes(t) for t in getattr(opt, "fp32_groups_flat", []))
    rec["optimizer_tensors"] = sum(len(g["params"]) for g in basic.param_groups)
    temps: list[dict[str, int]] = []
    inner_step = basic.step

    def held() -> list[Any]:
        """What lives before the step: parameters, their gradients, the optimizer state
        (1-bit LAMB's flat momentum and errors too), so that a storage the step replaces
        (``set_``) counts as freed."""
        out = []
        for g in basic.param_groups:
            for p in g["params"]:
                out += [p.data] + ([p.grad] if p.grad is not None else [])
                out += [v for v in basic.state[p].values() if torch.is_tensor(v)]
        for attr in ("exp_avg_flat", "worker_errors", "server_errors"):
            out += list(getattr(basic, attr, []))
        return out

    def step(*a: Any, **k: Any) -> Any:
        meter = LiveBytes()
        meter.hold(*held())
        entry = meter.live
        meter.reset()
        with meter:
            r = inner_step(*a, **k)
        temps.append({"peak": meter.peak - entry, "net": meter.live - entry})
        return r

    basic.step = step
    ids = torch.randint(0, MODEL.vocab, (MICRO, SEQ))
    steps = []
    for _ in range(STEPS):
        comm.clear()
        loss = engine(ids, ids)
        engine.backward(loss)
        engine.step()
        steps.append(dict(comm))
    rec["steps"] = steps
    rec["step_allocations"] = temps
    state: dict[str, int] = {}
    for s in basic.state.values():
        for k, v in s.items():
            if torch.is_tensor(v) and v.dim() > 0:
                state[k] = state.get(k, 0) + _nbytes(v)
                state[k + "_dtype"] = str(v.dtype)
    rec["state"] = state
    for attr in ("exp_avg_flat", "worker_errors", "server_errors"):  # 1-bit LAMB's own
        if hasattr(basic, attr):
            rec[attr] = sum(_nbytes(t) for t in getattr(basic, attr))
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rec, f)


def run_case(name: str) -> dict[str, Any]:
    """One case in fresh processes (gloo); rank 0's record."""
    return spawn_ranks(_worker, name, CASES[name]["world"])


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    return write_records(argv, CASES, run_case)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
