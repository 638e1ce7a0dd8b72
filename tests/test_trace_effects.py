"""The training-loop effects (issue 11), fine-tunes and tensor parallel (issue 15) traced for
real (probes/effects_matrix.py, probes/finetune_tp.py) and held to the planner.

Tolerances as tests/test_trace_accuracy.py: peak allocated 3 %; params, gradients and
optimizer state 0.1 %. Cases the planner is known to miss (``KNOWN``: the mechanism, found by
tracing) are strict xfails: they fail the suite once the planner is fixed, so the entry goes.
The mechanism tests below check each effect against numbers derived by hand.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.trace

pytest.importorskip("torch")

from planner.params import total_params
from planner.spec import (
    LINEAR_MODULES,
    Candidate,
    Checkpointing,
    CompileMode,
    FineTune,
    GradSync,
    LossKind,
    Precision,
    Quantize,
    Strategy,
    TrainingSpec,
)
from probes.effects_matrix import CASES, known, run_case
from probes.matrix import ARCHS, MICRO_BATCH, SEQ
from probes.trace import UnsupportedConfig, trace_step

LLAMA = ARCHS["llama"]  # 3 layers, hidden 256, 8 heads / 4 kv heads, ffn 512, vocab 2048
P = total_params(LLAMA)
T = SEQ * MICRO_BATCH  # 512 tokens
TOL = {"params": 0.001, "gradients": 0.001, "optimizer": 0.001}


def _param(case):
    why = known(case)
    marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
    return pytest.param(case, marks=marks, id=case.label())


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_planner_matches_trace(case):
    c = run_case(case)
    assert c.ok, c.reason
    assert abs(c.peak.rel_error) <= 0.03, (c.peak, c.traced_peak_phase, c.predicted_peak_phase)
    for name, pair in c.categories.items():
        if name in TOL:
            assert abs(pair.rel_error) <= TOL[name], (name, pair)


def _train(**kw) -> TrainingSpec:
    return TrainingSpec(seq=SEQ, micro_batch=MICRO_BATCH, **kw)


FS = Candidate(strategy=Strategy.FULL_SHARD)


@pytest.mark.parametrize("precision, grad_bytes", [("bf16-amp", 4), ("bf16", 2)])
def test_no_sync_keeps_unsharded_grads_in_reduce_dtype(precision, grad_bytes):
    # FSDP2 set_requires_gradient_sync(False): after the first micro-batch every unit's
    # unsharded gradient stays, in the reduce dtype (fp32 under MixedPrecisionPolicy(bf16,
    # fp32): FSDPParam.to_accumulated_grad_if_needed), so the second micro-batch's loss
    # backward holds the whole model's gradient, P elements, unsharded.
    r = trace_step(LLAMA, _train(precision=Precision(precision), grad_accum=2,
                                 grad_sync=GradSync.LAST), FS, 2, 8)
    assert r["grad_sync"] == "last"
    assert r["moments"]["loss_bwd"]["at_peak"]["unsharded_grads"] == P * grad_bytes
    every = trace_step(LLAMA, _train(precision=Precision(precision), grad_accum=2), FS, 2, 8)
    assert every["moments"]["loss_bwd"]["at_peak"]["unsharded_grads"] == 0


def test_ddp_no_sync_changes_nothing():
    # DDP's no_sync() only skips the all-reduce: gradients accumulate in param.grad either way
    ddp = Candidate(strategy=Strategy.DDP)
    a = trace_step(LLAMA, _train(grad_accum=2), ddp, 2, 8)
    b = trace_step(LLAMA, _train(grad_accum=2, grad_sync=GradSync.LAST), ddp, 2, 8)
    assert a["peak_bytes"] == b["peak_bytes"]


@pytest.mark.parametrize("loss", [LossKind.FP32, LossKind.BF16])
def test_kept_logits_are_the_bf16_logits(loss):
    # The loop holding the model's output keeps the bf16 (T, V) logits through the optimizer
    # step: 2 B x 512 x 2048 more there; the loss's fp32 copy is not kept (autograd saves
    # log_softmax's output, and _to_copy saves nothing).
    a = trace_step(LLAMA, _train(precision=Precision.BF16, loss=loss), FS, 2, 8)
    b = trace_step(LLAMA, _train(precision=Precision.BF16, loss=loss, keep_logits=True), FS,
                   2, 8)
    opt = "optimizer"
    assert b["moments"][opt]["peak_bytes"] - a["moments"][opt]["peak_bytes"] == 2 * T * 2048


def test_loss_variants_order_the_loss_moment():
    # fp32 upcast > bf16 cross-entropy > chunked (one chunk's fp32 copy) at the loss; fused
    # never materialises the logits
    peaks = {}
    for loss in LossKind:
        r = trace_step(LLAMA, _train(precision=Precision.BF16, loss=loss), FS, 2, 8)
        assert r["loss"] == loss.value
        peaks[loss] = r["moments"]["forward"]["peak_bytes"]
    assert peaks[LossKind.FP32] > peaks[LossKind.BF16] > peaks[LossKind.FUSED]
    assert peaks[LossKind.FP32] > peaks[LossKind.CHUNKED] > peaks[LossKind.FUSED]


def test_lora_trains_only_the_adapters():
    # A: r x in, B: out x r; q: 256 -> 256, v: 256 -> 128 (4 kv heads x 32), 3 blocks
    r = trace_step(LLAMA, _train(precision=Precision.BF16, finetune=FineTune(lora_rank=8)),
                   FS, 2, 8)
    assert r["n_trainable_params"] == 3 * 8 * ((256 + 256) + (256 + 128))
    ft = FineTune(lora_rank=16, lora_targets=LINEAR_MODULES)
    r = trace_step(LLAMA, _train(precision=Precision.BF16, finetune=ft), FS, 2, 8)
    per_block = 16 * (2 * 256 + 2 * (256 + 128) + 2 * 256 + 2 * (256 + 512) + (512 + 256))
    assert r["n_trainable_params"] == 3 * per_block
    # fp32 adapters: grads are 4 B per trainable element, sharded over 2 ranks
    assert r["moments"]["optimizer"]["at_peak"]["grads"] == 3 * per_block * 4 // 2


def test_qlora_stand_in_stores_half_a_byte_per_weight():
    ft = FineTune(lora_rank=16, lora_targets=LINEAR_MODULES, quantize_base=Quantize.NF4,
                  double_quant=False)
    r = trace_step(LLAMA, _train(precision=Precision.BF16, finetune=ft), FS, 2, 8)
    lin = 256 * 256 * 2 + 128 * 256 * 2 + 512 * 256 * 3  # q, o, k, v, gate, up, down
    # the packed codes (0.5 B each, FSDP-sharded), the fp32 absmax per 64 (buffers: bnb's
    # QuantState is not sharded), the bf16 rest, the fp32 adapters
    rest = P - 3 * lin
    per_block = 16 * (2 * 256 + 2 * (256 + 128) + 2 * 256 + 2 * (256 + 512) + (512 + 256))
    assert r["end_of_step"]["params"] == (3 * lin // 2) // 2 + rest * 2 // 2 \
        + 3 * per_block * 4 // 2
    rope = 32 // 2 * 2  # inv_freq, d_head / 2 elements, bf16
    assert r["end_of_step"]["buffers"] == 3 * lin // 64 * 4 + rope
    assert r["quant_const_bytes"] == 3 * lin // 64 * 4


def test_tensor_parallel_shards_params_over_tp_and_dp():
    r = trace_step(LLAMA, _train(precision=Precision.BF16), Candidate(
        strategy=Strategy.FULL_SHARD, tp=2), 4, 8)
    assert r["mesh_shape"] == [2, 2] and r["tp"] == 2
    norms = 3 * 2 * 256 + 256  # replicated over tp (SequenceParallel), sharded over dp
    assert r["end_of_step"]["params"] == (P - norms) * 2 // 4 + norms * 2 // 2


def test_unsupported_effects_are_refused():
    with pytest.raises(UnsupportedConfig, match="tensor parallel with ddp"):
        trace_step(LLAMA, _train(), Candidate(strategy=Strategy.DDP, tp=2), 4, 8)
    with pytest.raises(UnsupportedConfig, match="compile model"):
        trace_step(LLAMA, _train(compile=CompileMode.MODEL), FS, 2, 8)
    with pytest.raises(UnsupportedConfig, match="compile blocks"):  # only without AC
        trace_step(LLAMA, _train(compile=CompileMode.BLOCKS),
                   Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.FULL),
                   2, 8)


def test_compiled_blocks_save_the_partitioners_set():
    # AOTAutograd's min-cut partitioner (inductor decompositions) saves less than eager: per
    # block the planner's table (planner/data/compiled_blocks.json, measured by
    # probes/compiled.py on one block) says what; here the whole step runs it
    eager = trace_step(LLAMA, _train(precision=Precision.BF16), FS, 2, 8)
    comp = trace_step(LLAMA, _train(precision=Precision.BF16, compile=CompileMode.BLOCKS),
                      FS, 2, 8)
    assert comp["compile"] == "blocks"
    e, c = (r["moments"]["loss_bwd"]["at_peak"]["activations"] for r in (eager, comp))
    assert c < e
    # params, grads and optimizer state do not change
    for k in ("params", "grads", "optimizer"):
        assert comp["end_of_step"][k] == eager["end_of_step"][k]


def test_effects_travel_to_the_child_process():
    # probes.runner serialises the fine-tune, the loss, grad_sync, compile and tp; the child
    # (python -m probes.trace) traces them
    from probes.runner import config_from_json, config_to_json, run_trace

    tr = _train(precision=Precision.BF16, grad_accum=2, grad_sync=GradSync.LAST,
                loss=LossKind.CHUNKED, finetune=FineTune(lora_rank=8))
    cand = Candidate(strategy=Strategy.FULL_SHARD, tp=2)
    _, t2, c2, n, _ = config_from_json(config_to_json(LLAMA, tr, cand, 4, 8))
    assert (t2, c2, n) == (tr, cand, 4)
    r = run_trace(LLAMA, _train(precision=Precision.BF16, finetune=FineTune(lora_rank=8),
                                grad_accum=2, grad_sync=GradSync.LAST), FS, 2, 8,
                  timeout_s=300)
    assert r.ok, r.reason
    assert r.data["grad_sync"] == "last"
    assert r.data["n_trainable_params"] == 3 * 8 * ((256 + 256) + (256 + 128))
    r = run_trace(LLAMA, _train(precision=Precision.BF16), cand, 4, 8, timeout_s=300)
    assert r.ok, r.reason
    assert r.data["tp"] == 2 and r.data["mesh_shape"] == [2, 2]
    r = run_trace(LLAMA, _train(precision=Precision.BF16, finetune=FineTune(lora_rank=8)),
                  cand, 4, 8, timeout_s=300)
    assert not r.ok and r.unsupported and "tensor parallel with a fine-tune" in r.reason
