"""Trace probes (probes/trace.py), the subprocess runner and the autocast emulation."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.trace

torch = pytest.importorskip("torch")

from planner.params import numel, param_tensors, total_params  # noqa: E402
from planner.spec import (  # noqa: E402
    Attention,
    Candidate,
    Checkpointing,
    MlpKind,
    ModelSpec,
    NormKind,
    Offload,
    OptimizerImpl,
    OptimizerKind,
    PositionKind,
    Precision,
    Strategy,
    TrainingSpec,
)
from probes.autocast_emul import CudaAutocastEmulation  # noqa: E402
from probes.runner import (  # noqa: E402
    config_from_json,
    config_to_json,
    run_trace,
)
from probes.trace import UnsupportedConfig, trace_step  # noqa: E402

# Every parameter's first dimension is divisible by 4: FSDP at world size 4 needs no padding.
TINY = ModelSpec(
    name="tiny", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=128, vocab=256
)
TINY_GQA = ModelSpec(
    name="tiny-gqa", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128, vocab=256
)
P = total_params(TINY)


def _training(**kw) -> TrainingSpec:
    base = dict(seq=32, micro_batch=2, precision=Precision.FP32)
    base.update(kw)
    return TrainingSpec(**base)


def _opt_state(r: dict) -> int:
    """Optimizer bytes after the step, without Adam's 0-dim step counters."""
    return r["end_of_step"]["optimizer"] - r["optimizer_scalar_bytes"]


def test_fp32_adamw_single_rank_exact() -> None:
    r = trace_step(TINY, _training(), Candidate(strategy=Strategy.DDP), 1, 8)
    assert r["ok"] and r["tracker"] == "MemTracker"
    assert r["n_params"] == P
    assert r["end_of_step"]["params"] == P * 4
    assert r["max_by_category"]["grads"] == P * 4
    assert r["end_of_step"]["grads"] == 0  # zero_grad(set_to_none=True)
    assert _opt_state(r) == 2 * P * 4
    # AdamW keeps one fp32 step counter per parameter tensor.
    assert r["optimizer_scalar_bytes"] == 4 * len(list(TINY_param_names()))
    assert r["peak_bytes"] == r["at_peak"]["total"]
    assert r["peak_bytes"] >= r["max_by_category"]["activations"]
    assert r["max_by_category"]["activations"] > 0
    assert r["peak_phase"] in {"forward", "backward", "optimizer", "zero_grad"}


def TINY_param_names():
    from planner.params import param_tensors

    return [n for n, _ in param_tensors(TINY)]


def test_full_shard_world4_shards_exactly_a_quarter() -> None:
    r = trace_step(TINY, _training(), Candidate(strategy=Strategy.FULL_SHARD), 4, 8)
    assert r["tracker"] == "FSDPMemTracker" and r["mesh_shape"] == [4]
    assert r["end_of_step"]["params"] == P * 4 // 4
    assert r["max_by_category"]["grads"] == P * 4 // 4
    assert _opt_state(r) == 2 * P * 4 // 4
    # Communication buffers and unsharded parameters are reported for FSDP.
    for cat in ("all_gather", "reduce_scatter", "unsharded_params"):
        assert r["max_by_category"][cat] > 0, cat


def test_no_shard_keeps_full_params_and_hybrid_uses_2d_mesh() -> None:
    r = trace_step(TINY, _training(), Candidate(strategy=Strategy.NO_SHARD), 4, 8)
    assert r["mesh_shape"] == [4, 1]
    assert r["end_of_step"]["params"] == P * 4
    r = trace_step(TINY, _training(), Candidate(strategy=Strategy.HYBRID_SHARD), 4, 2)
    assert r["mesh_shape"] == [2, 2]
    assert r["end_of_step"]["params"] == P * 4 // 2


def test_bf16_params_and_fsdp_mixed_precision() -> None:
    r = trace_step(TINY, _training(precision=Precision.BF16), Candidate(strategy=Strategy.DDP))
    assert r["end_of_step"]["params"] == P * 2
    assert _opt_state(r) == 2 * P * 2
    fp32 = trace_step(TINY, _training(), Candidate(strategy=Strategy.FULL_SHARD), 2, 8)
    amp = trace_step(
        TINY, _training(precision=Precision.BF16_AMP), Candidate(strategy=Strategy.FULL_SHARD), 2
    )
    assert amp["autocast"] == "fsdp-mp"
    assert amp["end_of_step"]["params"] == fp32["end_of_step"]["params"] == P * 4 // 2
    assert amp["max_by_category"]["activations"] < fp32["max_by_category"]["activations"]


def test_ddp_amp_uses_cuda_autocast_emulation() -> None:
    # seq 256: at seq 32 the cached bf16 weight copies (counted as activations, as on CUDA)
    # outweigh what bf16 saves on the activations of so few tokens.
    fp32 = trace_step(TINY, _training(seq=256), Candidate(strategy=Strategy.DDP))
    amp = trace_step(
        TINY, _training(seq=256, precision=Precision.BF16_AMP), Candidate(strategy=Strategy.DDP)
    )
    assert amp["autocast"] == "cuda-emulation"
    assert amp["end_of_step"]["params"] == P * 4  # fp32 master weights
    assert amp["max_by_category"]["grads"] == P * 4  # fp32 grads
    assert amp["max_by_category"]["activations"] < fp32["max_by_category"]["activations"]


@pytest.mark.parametrize("strategy", [Strategy.DDP, Strategy.FULL_SHARD])
def test_checkpointing_orders_activation_memory(strategy: Strategy) -> None:
    acts = {}
    for mode, policy in (("none", "regions"), ("selective", "regions"), ("selective", "op"),
                         ("full", "regions")):  # fmt: skip
        r = trace_step(
            TINY_GQA,
            _training(precision=Precision.BF16_AMP, attention=Attention.EAGER),
            Candidate(strategy=strategy, checkpointing=Checkpointing(mode)),
            2,
            selective_policy=policy,
        )
        acts[mode, policy] = r["max_by_category"]["activations"]
    assert (
        acts["full", "regions"]
        < acts["selective", "op"]
        < acts["selective", "regions"]
        < acts["none", "regions"]
    )


def test_dropout_keeps_masks() -> None:
    gpt = ModelSpec(
        name="gpt", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=256, vocab=256,
        tied_embeddings=True, mlp=MlpKind.GELU, norm=NormKind.LAYERNORM,
        position=PositionKind.LEARNED, max_positions=64, bias=True,
    )  # fmt: skip
    import dataclasses

    acts = []
    for p in (0.0, 0.1):
        spec = dataclasses.replace(gpt, dropout=p)
        r = trace_step(spec, _training(), Candidate(strategy=Strategy.DDP))
        acts.append(r["max_by_category"]["activations"])
    # sdpa: 1-byte masks on the embeddings and on both branch outputs of every block.
    t = 2 * 32
    assert acts[1] - acts[0] == t * 64 * (1 + 2 * 2)


def test_moe_and_encoder_models_trace() -> None:
    moe = ModelSpec(
        name="moe", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128, vocab=256,
        n_experts=4, experts_per_token=2,
    )
    bert = ModelSpec(
        name="bert", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=256, vocab=256,
        tied_embeddings=True, mlp=MlpKind.GELU, norm=NormKind.LAYERNORM,
        position=PositionKind.LEARNED, max_positions=64, bias=True, type_vocab=2,
        embedding_norm=True, encoder_head=True,
    )
    for spec in (moe, bert):
        r = trace_step(
            spec,
            _training(precision=Precision.BF16_AMP),
            Candidate(strategy=Strategy.FULL_SHARD),
            4,
        )
        # FSDP2 pads each parameter's dim 0 to a multiple of the world size (BERT's 2-row
        # token-type table becomes 4 rows).
        padded = sum(-(-s[0] // 4) * (numel(s) // s[0]) for _, s in param_tensors(spec))
        assert r["end_of_step"]["params"] == padded * 4


def test_grad_accumulation_runs_two_micro_batches() -> None:
    r = trace_step(TINY, _training(grad_accum=8), Candidate(strategy=Strategy.DDP))
    assert r["iterations"]["micro_batches"] == 2
    # The second micro-batch's incoming gradient of a parameter briefly coexists with the
    # accumulated one: at most one extra tensor (the embedding, the last one, here).
    largest = max(numel(s) for _, s in param_tensors(TINY))
    assert P * 4 <= r["max_by_category"]["grads"] <= (P + largest) * 4


def test_warmup_modes_agree() -> None:
    kw = dict(model=TINY_GQA, training=_training(precision=Precision.BF16_AMP),
              candidate=Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.FULL),
              world_size=2)  # fmt: skip
    a = trace_step(**kw, warmup="optimizer")
    b = trace_step(**kw, warmup="iteration")
    for key in ("peak_bytes", "at_peak", "max_by_category", "end_of_step"):
        assert a[key] == b[key], key


@pytest.mark.parametrize(
    ("candidate", "training"),
    [
        (Candidate(strategy=Strategy.ZERO3), _training()),
        (Candidate(strategy=Strategy.FULL_SHARD, offload=Offload.OPTIMIZER), _training()),
        (Candidate(strategy=Strategy.DDP), _training(optimizer=OptimizerKind.LION)),
        (Candidate(strategy=Strategy.DDP), _training(optimizer=OptimizerKind.ADAMW_8BIT)),
        (Candidate(strategy=Strategy.DDP), _training(optimizer=OptimizerKind.ADAFACTOR)),
        (Candidate(strategy=Strategy.DDP, checkpointing=Checkpointing.AUTO), _training()),
    ],
)
def test_unsupported_configs_raise_clearly(candidate: Candidate, training: TrainingSpec) -> None:
    with pytest.raises(UnsupportedConfig):
        trace_step(TINY, training, candidate, 4)


# ----------------------------------------------------------------------------- autocast


def test_autocast_emulation_follows_cuda_policy() -> None:
    lin = torch.nn.Linear(8, 8)
    ln = torch.nn.LayerNorm(8)
    x = torch.randn(2, 8)
    with CudaAutocastEmulation(torch.bfloat16) as mode:
        y = lin(x)
        assert y.dtype == torch.bfloat16  # lower_precision_fp
        assert (x @ x.T).dtype == torch.bfloat16
        assert ln(y).dtype == torch.float32  # fp32 on CUDA (stays bf16 under CPU autocast)
        assert torch.softmax(y, -1).dtype == torch.float32  # fp32_set_opt_dtype
        assert y.softmax(-1, dtype=torch.bfloat16).dtype == torch.bfloat16  # dtype given
        assert y.sum().dtype == torch.float32
        assert torch.nn.functional.gelu(y).dtype == torch.bfloat16  # not listed: unchanged
        lin(x)
        assert len(mode._cache) == 2  # weight and bias cast once, cached
    assert len(mode._cache) == 0  # cleared when the region exits
    y.float().sum().backward()
    assert lin.weight.grad.dtype == torch.float32


# ----------------------------------------------------------------------------- runner


def test_config_json_round_trip() -> None:
    training = _training(
        precision=Precision.FP16_AMP, optimizer=OptimizerKind.SGD_MOMENTUM,
        optimizer_impl=OptimizerImpl.FUSED, attention=Attention.EAGER,
    )  # fmt: skip
    cand = Candidate(strategy=Strategy.HYBRID_SHARD, checkpointing=Checkpointing.SELECTIVE)
    text = config_to_json(TINY, training, cand, 16, 8)
    assert config_from_json(text) == (TINY, training, cand, 16, 8)


def test_runner_ok_and_measures_child() -> None:
    r = run_trace(TINY, _training(), Candidate(strategy=Strategy.FULL_SHARD), 4, 8, timeout_s=120)
    assert r.ok, r.reason + r.stderr_tail
    assert r.data["end_of_step"]["params"] == P * 4 // 4
    assert r.wall_s > 0 and r.max_rss_bytes > 50 * 2**20


def test_runner_reports_unsupported() -> None:
    r = run_trace(TINY, _training(), Candidate(strategy=Strategy.ZERO2), 4, 8, timeout_s=60)
    assert not r.ok and r.unsupported and "zero2" in r.reason


@pytest.mark.parametrize(
    ("fault", "expect"),
    [
        ("raise", "injected failure"),
        ("abort", "SIGABRT"),
        ("segv", "SIGSEGV"),
        ("exit3", "status 3"),
    ],
)
def test_runner_reports_crashes(fault: str, expect: str) -> None:
    r = run_trace(
        TINY, _training(), Candidate(strategy=Strategy.DDP), 1, 8, timeout_s=60,
        env={"FITCHECK_PROBE_FAULT": fault},
    )  # fmt: skip
    assert not r.ok and not r.unsupported
    assert expect in r.reason, r.reason


def test_runner_times_out_without_hanging() -> None:
    t0 = time.monotonic()
    r = run_trace(
        TINY, _training(), Candidate(strategy=Strategy.DDP), 1, 8, timeout_s=3,
        env={"FITCHECK_PROBE_FAULT": "hang"},
    )  # fmt: skip
    assert not r.ok and "timeout" in r.reason
    assert time.monotonic() - t0 < 20
