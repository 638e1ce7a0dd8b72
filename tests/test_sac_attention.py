"""Op-level selective checkpointing keeps the SDPA kernel's outputs whichever backend runs it.

torchtitan's save list holds every SDPA backend's op since b39377f9f (#2095, 2025-12-01); on
SM 9.x with cuDNN > 9.15 torch picks cuDNN's kernel (``sdp_utils.cpp``,
``check_prefer_cudnn_attention``). The probe's policy lacked ``_scaled_dot_product_cudnn_attention``
until this fix, so the H100 / H200 runs of 2026-11-26 recomputed attention and kept
n_layers x (out + logsumexp) less than the planner (docs/accuracy.md, GPU section;
tests/test_gpu_run.py holds the planner to those records)."""

from __future__ import annotations

from collections import defaultdict

import pytest

from planner.activations import op_sac_kept
from planner.presets import get_preset
from planner.spec import Attention


def test_op_sac_kept_per_block_llama31_8b_seq_8192():
    """Llama-3.1-8B (h 4096, 32 heads of 128, 8 kv heads, f 14336), one sequence of 8192
    tokens, bf16 activations and residual (FSDP2 bf16 params: c = r = 2), by hand:
      block input  2 * 8192 * 4096  =  67,108,864
      q (mm 1)     2 * 8192 * 4096  =  67,108,864
      v (mm 3)     2 * 8192 * 1024  =  16,777,216
      gate (mm 5)  2 * 8192 * 14336 = 234,881,024
      down (mm 7)  2 * 8192 * 4096  =  67,108,864
      SDPA out     2 * 8192 * 4096  =  67,108,864
      logsumexp    4 * 1 * 32 * 8192 =  1,048,576  (fp32, per head and query)
      total                          = 521,142,272"""
    kept = {s.name: s.nbytes for s in op_sac_kept(get_preset("llama3.1-8b"), 8192, 1, 8192,
                                                   Attention.SDPA, 2, 2)}
    assert kept == {"block.input": 67_108_864, "q.out": 67_108_864, "v.out": 16_777_216,
                    "gate.out": 234_881_024, "down.out": 67_108_864,
                    "sdpa.out": 67_108_864, "sdpa.logsumexp": 1_048_576}
    assert sum(kept.values()) == 521_142_272


def test_op_sac_kept_eager_attention_has_no_kernel_outputs():
    """Eager attention runs bmm / softmax, none in the save list: no SDPA term."""
    kept = {s.name for s in op_sac_kept(get_preset("llama3.1-8b"), 8192, 1, 8192,
                                        Attention.EAGER, 2, 2)}
    assert not {"sdpa.out", "sdpa.logsumexp"} & kept


# --------------------------------------------------------------------------- the probe's policy


class _Ctx:
    def __init__(self, recompute: bool) -> None:
        self.is_recompute = recompute


def test_the_probe_policy_saves_every_sdpa_backend_and_every_other_mm():
    """The pre-2026-03-23 list (the current one also saves bmm: tests/test_sac_list.py)."""
    torch = pytest.importorskip("torch")
    from torch.utils.checkpoint import CheckpointPolicy

    from probes.models import _op_sac_policy

    aten = torch.ops.aten
    policy = _op_sac_policy(defaultdict(int), "pre-2026-03-23")
    fwd = _Ctx(False)
    for op in (aten._scaled_dot_product_cudnn_attention.default,
               aten._scaled_dot_product_flash_attention.default,
               aten._scaled_dot_product_efficient_attention.default,
               aten._scaled_dot_product_flash_attention_for_cpu.default):
        assert policy(fwd, op) == CheckpointPolicy.MUST_SAVE, op
    assert policy(fwd, aten.bmm.default) == CheckpointPolicy.PREFER_RECOMPUTE
    got = [policy(fwd, aten.mm.default) for _ in range(4)]
    assert got == [CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE] * 2
    # the recompute pass counts on its own
    assert policy(_Ctx(True), aten.mm.default) == CheckpointPolicy.MUST_SAVE


# --------------------------------------------------------------------------- the referee


def _cudnn_sdpa(torch):
    """``F.scaled_dot_product_attention`` as CUDA runs it where torch prefers cuDNN: the
    ``_scaled_dot_product_cudnn_attention`` op (it has a fake kernel, so it runs on the
    trace's fake CPU tensors; GQA kept, as cuDNN supports it)."""
    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             enable_gqa=False):
        assert attn_mask is None
        return torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, dropout_p, is_causal, False, scale=scale)[0]
    return sdpa


@pytest.mark.trace
def test_the_trace_keeps_the_same_bytes_under_cudnn_and_recomputes_without_its_op(monkeypatch):
    """A tiny GQA Llama (2 blocks, h 64, 4 heads of 16, 2 kv heads), pure bf16, 2 x 32
    tokens, selective checkpointing, traced three ways: CPU's flash kernel; SDPA dispatched as
    cuDNN's op; cuDNN's op under the save list without it (the probe before this fix, the
    GPU runs of 2026-11-26). By hand, per block: out 2 * 2 * 32 * 64 = 8,192 and logsumexp
    4 * 2 * 4 * 32 = 1,024 bytes; cuDNN also returns its philox seed and offset (two int64
    one-element tensors, attention.cu), saved with the outputs: 16 bytes."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    import probes.models as pm
    from planner.spec import (Candidate, Checkpointing, ModelSpec, Precision, SacList,
                              Strategy, TrainingSpec)
    from probes.trace import trace_step

    spec = ModelSpec(name="tiny-gqa", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2,
                     ffn_hidden=128, vocab=256)
    # the per-model list (OP_SAC_SAVE_OPS) the runs of 2026-11-26 took, cuDNN's op removed below
    training = TrainingSpec(seq=32, micro_batch=2, precision=Precision.BF16,
                            sac_list=SacList.PRE_2026_03_23)
    cand = Candidate(strategy=Strategy.DDP, checkpointing=Checkpointing.SELECTIVE)

    def moments() -> dict[str, int]:
        r = trace_step(spec, training, cand, 1, 8)
        return {m: v["peak_bytes"] for m, v in r["moments"].items()}

    flash = moments()
    monkeypatch.setattr(F, "scaled_dot_product_attention", _cudnn_sdpa(torch))
    cudnn = moments()
    monkeypatch.setattr(pm, "OP_SAC_SAVE_OPS",
                        tuple(n for n in pm.OP_SAC_SAVE_OPS if "cudnn" not in n))
    stale = moments()
    per_block, seeds, L = 8_192 + 1_024, 16, 2
    for m in ("forward", "loss_bwd"):  # every block's kept set alive
        assert cudnn[m] - flash[m] == L * seeds, m
        assert stale[m] - flash[m] == -L * per_block, m
    for m in ("bwd_end", "optimizer"):
        assert cudnn[m] == stale[m] == flash[m], m


@pytest.mark.trace
def test_a_gpu_case_record_names_its_policy_and_sdpa_backend():
    """probes/gpu_cases.py records the save list of a selective case and the SDPA backend
    torch picked (here CPU's flash kernel), so a record says which policy it measured
    (tests/test_gpu_run.py ``_attention_not_kept`` reads it)."""
    pytest.importorskip("torch")
    from probes.gpu_cases import Dev, _tiny_llama_dict, run_case

    rec = run_case(Dev("cpu"), {
        "id": "t", "model": {**_tiny_llama_dict(), "name": "t"},
        "training": {"seq": 64, "micro_batch": 1, "precision": "bf16"},
        "candidate": {"strategy": "ddp", "checkpointing": "selective"},
        "warmup": 0, "steps": 1}, 1, False)
    assert rec["ok"], rec["error"]
    assert rec["sdpa_backend"] == "FLASH_ATTENTION"
    assert "aten._scaled_dot_product_cudnn_attention.default" in rec["sac_save_ops"]
