"""The training-loop effects (issue 11) and fine-tuning / tensor-parallel runs (issue 15) that
the trace runs for real, on the Llama-style shape of the CI matrix (probes/matrix.py):

- grad_sync last with grad_accum 2 (FSDP2 ``set_requires_gradient_sync(False)`` on the first
  micro-batch), and every (the baseline);
- each loss: fp32, bf16, chunked (8 chunks), fused; keep_logits with fp32 / bf16 / chunked;
- LoRA r 8 on q,v (with and without dropout, fp32 and bf16 adapters), r 16 on every linear,
  QLoRA nf4 r 16 on every linear (a stand-in for bitsandbytes, probes/finetune_tp.py), the
  first 2 of 3 blocks frozen, the embeddings frozen;
- compile blocks: each block AOTAutograd-compiled with the min-cut partitioner
  (probes/compile_step.py);
- tensor parallel 2 and 4 with sequence parallel on a 2-D (dp x tp) fake mesh, FSDP2 over dp.

Each under full_shard at 2 ranks (TP: 4 ranks) and bf16-amp / bf16, a few under DDP or
shard_grad_op. ``KNOWN`` names the cases where the planner is known to disagree with the
trace beyond the matrix's tolerance, and why (docs/accuracy.md "Training-loop effects").
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.spec import (
    LINEAR_MODULES,
    Candidate,
    Cluster,
    CompileMode,
    FineTune,
    GradSync,
    LossKind,
    Precision,
    Quantize,
    Strategy,
    TrainingSpec,
)
from probes.matrix import ARCHS, MICRO_BATCH, SEQ

GPUS_PER_NODE = 8

EFFECTS: dict[str, dict] = {
    "accum2-sync-every": {"grad_accum": 2},
    "accum2-sync-last": {"grad_accum": 2, "grad_sync": GradSync.LAST},
    "loss-bf16": {"loss": LossKind.BF16},
    "loss-chunked8": {"loss": LossKind.CHUNKED, "loss_chunks": 8},
    "loss-fused": {"loss": LossKind.FUSED},
    "keep-logits-fp32": {"keep_logits": True},
    "keep-logits-bf16": {"keep_logits": True, "loss": LossKind.BF16},
    "keep-logits-chunked8": {"keep_logits": True, "loss": LossKind.CHUNKED},
    "lora-r8-qv": {"finetune": FineTune(lora_rank=8)},
    "lora-r8-qv-dropout": {"finetune": FineTune(lora_rank=8, lora_dropout=True)},
    "lora-r8-qv-bf16-adapters": {"finetune": FineTune(lora_rank=8, lora_fp32=False)},
    "lora-r16-all": {"finetune": FineTune(lora_rank=16, lora_targets=LINEAR_MODULES)},
    "qlora-nf4-r16-all": {"finetune": FineTune(lora_rank=16, lora_targets=LINEAR_MODULES,
                                               quantize_base=Quantize.NF4)},
    "freeze-2-layers": {"finetune": FineTune(freeze_layers=2)},
    "freeze-embeddings": {"finetune": FineTune(freeze_embeddings=True)},
    "compile-blocks": {"compile": CompileMode.BLOCKS},
    "tp2": {"tp": 2},
    "tp4": {"tp": 4},
}


@dataclass(frozen=True, slots=True)
class EffectCase:
    effect: str
    strategy: str
    precision: str

    @property
    def world_size(self) -> int:
        return 4 if EFFECTS[self.effect].get("tp", 1) > 1 else 2

    def label(self) -> str:
        return f"{self.effect}/{self.strategy}/n{self.world_size}/{self.precision}"

    def specs(self) -> tuple[TrainingSpec, Candidate]:
        kw = dict(EFFECTS[self.effect])
        tp = kw.pop("tp", 1)
        training = TrainingSpec(seq=SEQ, micro_batch=MICRO_BATCH,
                                precision=Precision(self.precision), **kw)
        return training, Candidate(strategy=Strategy(self.strategy), tp=tp)


CASES = [EffectCase(e, "full_shard", p) for e in EFFECTS for p in ("bf16-amp", "bf16")] + [
    EffectCase("accum2-sync-last", "shard_grad_op", "bf16-amp"),
    EffectCase("accum2-sync-last", "ddp", "bf16-amp"),
    EffectCase("loss-chunked8", "ddp", "bf16-amp"),
    EffectCase("lora-r8-qv", "ddp", "bf16"),
    EffectCase("lora-r16-all", "ddp", "bf16-amp"),
    EffectCase("compile-blocks", "ddp", "bf16-amp"),
]

_FP32_ADAPTERS = ("planner: adapters assumed cast to bf16 under FSDP (estimator.adapter_input_bytes 0"
                  " for FSDP);"
                  " in pure bf16 there is no MixedPrecisionPolicy param_dtype, FSDP2 keeps the"
                  " fp32 adapters and peft casts each adapted input to fp32 (4 B x tokens x in"
                  " per adapted linear, saved by lora_A)")
_TP_NORMS = ("planner: params, gradients and optimizer state -0.2 % at tp 4 (-0.1 % at tp 2,"
             " within tolerance): the planner divides the norm weights by tp too,"
             " SequenceParallel keeps them replicated over tp (peak +1.4 / +1.9 %)")
KNOWN: dict[tuple[str, str], str] = {
    ("tp4", "*"): _TP_NORMS + "; at dp 1 FSDP's gathered params/buffers are over-counted (+36 %"
                  " on that category)",
}
"""(effect, precision or "*") -> why the planner's peak disagrees with the trace by more than
3 % (filled from the measured matrix; docs/accuracy.md)."""


def known(case: EffectCase) -> str:
    why = KNOWN.get((case.effect, case.precision)) or KNOWN.get((case.effect, "*"), "")
    if why is _FP32_ADAPTERS and not Strategy(case.strategy).is_fsdp:
        return ""  # without FSDP the planner casts the adapters' inputs to fp32 too
    return why


def run_case(case: EffectCase, *, with_result: bool = False):
    """Trace the case in this process and compare it with the planner (probes.compare)."""
    from planner.hardware import load_gpu
    from probes.compare import compare
    from probes.trace import trace_step

    model = ARCHS["llama"]
    training, cand = case.specs()
    cluster = Cluster(gpu=load_gpu("h100-80"), n_gpus=case.world_size,
                      gpus_per_node=GPUS_PER_NODE, host_ram_bytes_per_node=2**40)
    result = trace_step(model, training, cand, case.world_size, GPUS_PER_NODE)
    c = compare(model, training, cluster, cand, result)
    return (c, result) if with_result else c


def breakdown(result: dict) -> dict[str, dict[str, int]]:
    """Per moment, the traced bytes in the planner's five groups: params (sharded or local
    parameters, and a quantized base's constants), grads (sharded + unsharded), optimizer (state, without Adam's 0-dim step
    counters), activations (saved tensors + backward temporaries), working (FSDP gathered
    parameters and communication buffers); plus inputs/buffers, which neither side models."""
    out = {}
    scalars = result.get("optimizer_scalar_bytes", 0)
    quant = result.get("quant_const_bytes", 0)  # module buffers, but resident params
    for m, v in result.get("moments", {}).items():
        s = v["at_peak"]
        out[m] = {
            "total": v["peak_bytes"],
            "params": s.get("params", 0) + quant,
            "grads": s.get("grads", 0) + s.get("unsharded_grads", 0),
            "optimizer": s.get("optimizer", 0) - (scalars if s.get("optimizer") else 0),
            "activations": s.get("activations", 0) + s.get("temp", 0),
            "working": s.get("unsharded_params", 0) + s.get("all_gather", 0)
            + s.get("reduce_scatter", 0),
            "other": s.get("inputs", 0) + s.get("buffers", 0) - quant
            + (scalars if s.get("optimizer") else 0),
        }
    return out


__all__ = ["CASES", "EFFECTS", "KNOWN", "EffectCase", "breakdown", "known", "run_case"]
