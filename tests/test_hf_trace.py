"""Real Hugging Face classes on fake tensors (probes/hf.py), scaled traces and trace-backed
plans (probes/trace_plan.py), the trace cache (probes/trace_cache.py) and their CLI.

The planner is held to the real classes at small shapes (probes/hf_matrix.py: the real
configs of tests/data/configs with every key kept but the sizes). Where the class does
something the planner does not model, the gap is measured and bounded here, not tuned away
(docs/accuracy.md §1.3 has the same table at real sizes):

- Llama-2, Qwen2 (qkv bias), Mistral, Qwen3, OLMo: exact; Mixtral and the Qwen MoEs:
  -0.4 % at most (router / top-k tensors).
- Modelled since issue 13 (each was a gap): Gemma-2's softcapping tanh outputs and its fp32
  norm product, GPT-2's and phi-2's op-by-op ``gelu_new``, Phi-3's fused qkv (v keeps the
  whole qkv output alive), BERT's loss without an fp32 copy and no pooler in
  ``BertForMaskedLM``.
- Also: OLMo-2's and Gemma's norms multiply by the weight in fp32 (an fp32 product saved),
  phi-2's partial RoPE and Phi-3's fused qkv leave SDPA's output in a layout that the
  reshape for o_proj copies, DeepSeek's router runs in fp32 (an fp32 copy of its input),
  topk keeps its int64 indices. FULL_SHARD: every class within 0.4 %.
- Still open, DDP + full checkpointing (torch.autocast): Gemma-2 +6.0 % and Gemma-3 +4.9 %
  (their eager attention masks are inputs every checkpointed layer keeps; the block's
  backward is over-counted), GPT-2 -3.1 % (gelu_new's backward temporaries).
- MLA: the trace runs SDPA with a value head unlike the query's as CUDA does (the
  memory-efficient kernel; probes/hf.py), not as the CPU math fallback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.trace

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from planner.hardware import load_gpu  # noqa: E402
from planner.spec import (  # noqa: E402
    Candidate,
    Checkpointing,
    Cluster,
    LossKind,
    Precision,
    Strategy,
)
from probes.hf import hf_factory, inspect, scaled_depths  # noqa: E402
from probes.hf_matrix import ARCHS, cross_check, load, shrink, training_for  # noqa: E402
from probes.trace import TraceFailure, trace_training_step  # noqa: E402
from probes.trace_plan import scale_result  # noqa: E402

SMALL = dict(hidden=256, heads=8, kv_heads=4, ffn=512, vocab=2048)
SEQ, MB = 256, 2


def small(arch: str, **kw) -> dict:
    return shrink(load(arch), **{**SMALL, **kw})


def cluster(n: int) -> Cluster:
    return Cluster(gpu=load_gpu("h100-80"), n_gpus=n, gpus_per_node=4,
                   host_ram_bytes_per_node=2**40)


# ------------------------------------------------------------------ the planner vs the classes

# arch -> (largest |peak error| allowed, the loss the class computes)
GAP = {
    "llama": (0.005, LossKind.FP32),
    "qwen2": (0.005, LossKind.FP32),
    "mistral": (0.005, LossKind.FP32),
    "mixtral": (0.005, LossKind.FP32),
    "phi3": (0.005, LossKind.FP32),
    "gemma2": (0.07, LossKind.FP32),  # DDP + full: +6.0 % (eager masks kept as inputs)
    # DDP + full: -3.1 % (gelu_new's backward temporaries; -1.8 % while the planner still
    # held the final norm's and the head's saved tensors through the blocks' backward)
    "gpt2": (0.035, LossKind.FP32),
    # BertForMaskedLM's loss takes no fp32 copy: the planner knows it (ModelSpec.loss_upcast)
    "bert": (0.015, LossKind.FP32),
    # issue 13
    "qwen3": (0.005, LossKind.FP32),
    "qwen2_moe": (0.005, LossKind.FP32),
    "qwen3_moe": (0.005, LossKind.FP32),
    "gemma3_text": (0.055, LossKind.FP32),  # DDP + full: +4.9 %, as Gemma-2
    "olmo": (0.005, LossKind.FP32),
    "olmo2": (0.005, LossKind.FP32),
    "phi": (0.01, LossKind.FP32),
    "phi4": (0.005, LossKind.FP32),
    "deepseek_v2": (0.005, LossKind.FP32),
}
MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2")
CANDIDATES = [(Strategy.FULL_SHARD, Checkpointing.NONE, 4),
              (Strategy.DDP, Checkpointing.FULL, 2)]


@pytest.mark.parametrize("arch", list(ARCHS))
def test_planner_against_the_real_class(arch: str) -> None:
    tol, loss = GAP[arch]
    cfg = small(arch)
    for strategy, ck, n in CANDIDATES:
        training = training_for(arch, SEQ, MB, precision=Precision.BF16_AMP, loss=loss)
        cand = Candidate(strategy=strategy, checkpointing=ck)
        if arch in MOE and strategy is Strategy.DDP:
            # transformers' grouped_mm experts under autocast get fp32 weights; the kernel
            # takes bf16 only (on CUDA too): the trace says where and which op
            with pytest.raises(TraceFailure, match=r"mlp\.experts at aten\._grouped_mm"):
                cross_check(arch, cfg, training, cand, cluster(n))
            continue
        c = cross_check(arch, cfg, training, cand, cluster(n))
        assert c.ok, c.reason
        assert abs(c.peak.rel_error) <= tol, (strategy, c.peak, c.traced_peak_phase)
        states = ("params", "gradients", "optimizer")
        if arch == "bert":
            # FSDP pads the 2-row token-type table to n rows, which the planner does not
            # count (2 h fp32); BertForMaskedLM has no pooler and the planner counts none
            h = SMALL["hidden"]
            p = c.categories["params"]
            assert abs(p.predicted_bytes - p.traced_bytes) <= 2 * h * 4, p
        else:
            for name in states:
                assert c.categories[name].rel_error == pytest.approx(0, abs=1e-3), name


@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "gemma2"])
def test_selective_checkpointing_saved_set(arch: str) -> None:
    """torchtitan's op-level SAC keeps every other aten.mm output and SDPA's: the planner's
    list (planner.activations.mm_outputs) follows each class's matmul order (biased linears
    run as addmm and are not kept; Qwen2-MoE runs its shared expert before the router; MLA's
    q/kv projections) and matches the traced activations. (Gemma-2, eager attention: its
    masks are checkpoint inputs the planner does not count, -2.4 %.)"""
    training = training_for(arch, SEQ, MB, precision=Precision.BF16_AMP)
    c = cross_check(arch, small(arch), training,
                    Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.SELECTIVE),
                    cluster(4))
    assert c.ok, c.reason
    assert abs(c.categories["activations"].rel_error) <= 0.011, c.categories["activations"]


def test_moe_sharded_past_the_expert_count() -> None:
    """FSDP2 shards the stacked expert weights (E, ., .) along dim 0: with more ranks than
    experts each rank holds (and all-gathers, and reduce-scatters) a whole expert's rows,
    padded, where an even split gives it E / n of one. 4 experts over 8 ranks: the expert
    states are twice the even split; the planner counts them as the trace does."""
    cfg = small("mixtral", experts=4)
    training = training_for("mixtral", SEQ, MB, precision=Precision.BF16_AMP)
    c = cross_check("mixtral", cfg, training, Candidate(strategy=Strategy.FULL_SHARD),
                    cluster(8))
    assert c.ok, c.reason
    for name in ("params", "gradients", "optimizer", "fsdp_buffers"):
        assert c.categories[name].rel_error == pytest.approx(0, abs=1e-3), name
    # -2.0 % (block_bwd; every other moment within 0.2 %): transformers' grouped_mm experts
    # keep a little more in their backward than the reference module's bmm; +3.0 % (bwd_end
    # -6 %) before the block backward counted the real-size unsharded gradients and the
    # padded sharded ones (issue 24); without the padding: -22 %
    assert abs(c.peak.rel_error) <= 0.025, c.peak


def test_llama_parameters_by_hand() -> None:
    """Llama at hidden 256, 8 heads (4 kv), ffn 512, vocab 2048, 3 layers, untied:
    per layer q,o 256x256, k,v 256x128, gate/up/down 256x512, two norms; root embed + head
    2048x256 each, final norm."""
    h, kv, f, v, L = 256, 128, 512, 2048, 3
    block = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h
    P = L * block + 2 * v * h + h
    facts = inspect({"config": small("llama")})
    assert facts["params"] == P and facts["per_block_params"] == [block] * L
    assert facts["matmul_per_block"] == [block - 2 * h] * L  # norms are not matmuls
    assert facts["matmul_head"] == v * h  # the head; the embedding lookup is not a matmul
    assert facts["q_dim"] == h and facts["period"] == 1
    r = trace_training_step(hf_factory(small("llama")),
                            training_for("llama", SEQ, MB, precision=Precision.FP32),
                            Candidate(strategy=Strategy.FULL_SHARD), 4, 4)
    assert r["end_of_step"]["params"] == P * 4 // 4  # every dim 0 divisible by 4: no padding
    assert r["end_of_step"]["optimizer"] - r["optimizer_scalar_bytes"] == 2 * P * 4 // 4


def test_tied_weights_stay_tied_on_fake_tensors() -> None:
    """GPT-2 ties its head to the embedding; materialising under FakeTensorMode must not
    untie them (they would count twice, with two gradients and two optimizer states)."""
    cfg = small("gpt2")
    P = inspect({"config": cfg})["params"]
    r = trace_training_step(hf_factory(cfg), training_for("gpt2", 64, 1, precision=Precision.FP32),
                            Candidate(strategy=Strategy.DDP), 1, 4)
    assert r["end_of_step"]["params"] == 4 * P
    assert r["end_of_step"]["optimizer"] - r["optimizer_scalar_bytes"] == 8 * P


# ------------------------------------------------------------------ scaling by depth


@pytest.mark.parametrize(("arch", "strategy", "ck"), [
    ("llama", Strategy.FULL_SHARD, Checkpointing.NONE),
    ("llama", Strategy.DDP, Checkpointing.FULL),
    ("mixtral", Strategy.SHARD_GRAD_OP, Checkpointing.SELECTIVE),
    ("gemma2", Strategy.HYBRID_SHARD, Checkpointing.NONE),
])
def test_scaled_trace_matches_full_depth(arch: str, strategy: Strategy,
                                         ck: Checkpointing) -> None:
    """Two shallow traces extended to the real depth equal the full-depth trace, moment by
    moment (Gemma-2 alternates sliding and global layers: period 2, depths 4 and 6)."""
    L = 10
    cfg = small(arch, layers=L, hidden=128, heads=4, kv_heads=2, ffn=256, vocab=1024)
    period = inspect({"config": cfg})["period"]
    assert period == (2 if arch == "gemma2" else 1)
    d1, d2 = scaled_depths(L, period)
    training = training_for(arch, 128, 1, precision=Precision.BF16_AMP)
    cand = Candidate(strategy=strategy, checkpointing=ck)
    r = {d: trace_training_step(hf_factory(cfg, layers=None if d == L else d), training, cand,
                                8, 4) for d in (d1, d2, L)}
    scaled = scale_result(r[d1], r[d2], d1, d2, L)
    assert scaled["n_params"] == r[L]["n_params"]
    for m, full in r[L]["moments"].items():
        assert scaled["moments"][m]["peak_bytes"] == pytest.approx(full["peak_bytes"],
                                                                   rel=0.005), m
    assert scaled["peak_bytes"] == pytest.approx(r[L]["peak_bytes"], rel=0.002)
    assert scaled["end_of_step"] == r[L]["end_of_step"]


def test_scaled_depths() -> None:
    assert scaled_depths(32, 1) == (4, 5)
    assert scaled_depths(42, 2) == (4, 6)
    assert scaled_depths(5, 1) is None  # as deep as the scaled traces: trace it all
    assert scaled_depths(48, None) is None  # layers that do not repeat
    with pytest.raises(ValueError, match="at least 4 layers"):
        scale_result({}, {}, 2, 3, 32)


# ------------------------------------------------------------------ refusals


def test_unknown_model_type_and_attention_refusals(tmp_path) -> None:
    from probes.hf import HfConfigError, transformers_config
    from probes.trace import UnsupportedConfig

    with pytest.raises(HfConfigError, match="'no-such-model' is not known to transformers"):
        transformers_config({"model_type": "no-such-model"})
    from planner.spec import Attention, TrainingSpec

    with pytest.raises(UnsupportedConfig, match="attention sdpa.*try another --attention"):
        trace_training_step(hf_factory(small("gemma2")),
                            TrainingSpec(seq=64, attention=Attention.SDPA),
                            Candidate(strategy=Strategy.DDP), 1, 4)


# ------------------------------------------------------------------ the CLI and the cache


def _fitcheck(*args: str, cache: str, **env_extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, FITCHECK_TRACE_CACHE=cache, COLUMNS="200", **env_extra)
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True,
                          text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    """Small config directories: Llama and OLMo-2 (the planner models them), StableLM (it
    reads it only approximately, as a Llama-style decoder, which it is not: LayerNorm with
    bias, partial rotary) and OPT (its config has no Llama keys: the planner cannot read it
    at all)."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    llama = small("llama", layers=6, hidden=128, heads=4, kv_heads=2, ffn=256, vocab=1024)
    olmo = {"model_type": "olmo2", "architectures": ["Olmo2ForCausalLM"], "hidden_size": 128,
            "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 4,
            "num_hidden_layers": 6, "vocab_size": 1024, "pad_token_id": 0,
            "bos_token_id": 0, "eos_token_id": 0, "tie_word_embeddings": False}
    opt = {"model_type": "opt", "architectures": ["OPTForCausalLM"], "hidden_size": 128,
           "ffn_dim": 256, "num_attention_heads": 4, "num_hidden_layers": 6,
           "vocab_size": 1024, "max_position_embeddings": 512, "word_embed_proj_dim": 128,
           "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2, "dropout": 0.1}
    stablelm = {**olmo, "model_type": "stablelm", "architectures": ["StableLmForCausalLM"]}
    for name, cfg in (("llama", llama), ("olmo2", olmo), ("opt", opt), ("stablelm", stablelm)):
        d = root / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        out[name] = str(d)
    return out


PLAN = ("--gpu", "h100-80", "--n", "8", "--seq", "256", "--strategy", "ddp,full_shard")


def test_from_trace_plan_json_cache_and_table(tiny_dirs, tmp_path) -> None:
    cache = str(tmp_path / "cache")  # its own, empty: the first plan traces, the next reads
    r = _fitcheck("--config", tiny_dirs["opt"], *PLAN, "--from-trace", "--json",
                  cache=cache)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["source"] == "trace" and doc["schema_version"] == 1
    assert doc["inputs"]["model"]["class"] == "OPTForCausalLM"
    assert doc["inputs"]["model"]["layers"] == 6
    assert [c["strategy"] for c in doc["candidates"]] == ["ddp", "full_shard"]
    assert all(c["source"] == "trace" for c in doc["candidates"])
    assert doc["trace"]["from_cache"] == 0 and doc["trace"]["subprocesses"] >= 1
    full = doc["candidates"][1]
    assert full["trace"]["layers_traced"] == [4, 5]  # scaled to 6
    assert full["breakdown_bytes"]["cuda_context"] > 0 and full["fits"]
    # asked again: every trace from the cache, no subprocess, same numbers
    again = _fitcheck("--config", tiny_dirs["opt"], *PLAN, "--from-trace", "--json",
                      cache=cache)
    doc2 = json.loads(again.stdout)
    assert doc2["trace"]["subprocesses"] == 0
    assert doc2["trace"]["from_cache"] == doc2["trace"]["traces"] == 6  # 2 strategies x 3 ckpt
    assert doc2["candidates"][1]["peak_allocated_bytes"] == full["peak_allocated_bytes"]
    table = _fitcheck("--config", tiny_dirs["opt"], *PLAN, "--from-trace", cache=cache)
    assert "OPTForCausalLM" in table.stdout and "[TRACED]" in table.stdout
    assert "trace time" in table.stdout and "recommendation:" in table.stdout


def test_from_trace_refuses_in_one_line(tiny_dirs, trace_cache) -> None:
    cache = str(trace_cache)
    # nothing traceable: ZeRO only (calibration none: under any torch but 2.11 the shipped
    # h100-80 calibration adds a stale warning line before the error)
    r = _fitcheck("--config", tiny_dirs["llama"], *PLAN[:-2], "--strategy", "zero3",
                  "--from-trace", "--calibration", "none", cache=cache)
    assert r.returncode == 5 and r.stderr.count("\n") == 1, r.stderr
    assert "no traceable candidate" in r.stderr
    # a loop the trace does not run
    r = _fitcheck("--config", tiny_dirs["llama"], *PLAN, "--loss", "chunked", "--from-trace",
                  cache=cache)
    assert r.returncode == 5 and "--loss chunked" in r.stderr
    # no config
    r = _fitcheck("--model", "llama2-7b", *PLAN, "--from-trace", cache=cache)
    assert r.returncode == 2 and "needs --config" in r.stderr
    # a hub id not in the local cache: bad input data, nothing downloaded
    r = _fitcheck("--config", "no-such-org/no-such-model", *PLAN, "--from-trace", cache=cache)
    assert r.returncode == 4 and "local Hugging Face cache" in r.stderr


TRACE_ARGS = ("--n", "4", "--seq", "128", "--strategy", "full_shard", "--json")
"""`fitcheck trace` of one tiny class (the four tests below: one each, so that the workers
share them)."""


def test_trace_command_real_class(tiny_dirs, trace_cache) -> None:
    r = _fitcheck("trace", "--config", tiny_dirs["llama"], *TRACE_ARGS, cache=str(trace_cache))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    c = doc["candidates"][0]
    assert doc["planner_compared"] and c["traced_model"]["class"] == "LlamaForCausalLM"
    assert abs(c["peak_rel_error"]) < 0.005
    # scaled
    r = _fitcheck("trace", "--config", tiny_dirs["llama"], "--n", "4", "--seq", "128",
                  "--strategy", "full_shard", "--depth", "scaled", cache=str(trace_cache))
    assert r.returncode == 0 and "scaled from 4 and 5 layers" in r.stdout


def test_trace_command_class_the_planner_cannot_read(tiny_dirs, trace_cache) -> None:
    # an architecture the planner cannot read: traced, the planner's column empty
    r = _fitcheck("trace", "--config", tiny_dirs["opt"], *TRACE_ARGS, cache=str(trace_cache))
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and not doc["planner_compared"], r.stderr
    c = doc["candidates"][0]
    assert c["predicted_peak_allocated_bytes"] is None and c["traced_peak_allocated_bytes"] > 0


def test_trace_command_class_it_models(tiny_dirs, trace_cache) -> None:
    # one it models (OLMo-2: qk-norm, norms after the branches): compared, no notes
    r = _fitcheck("trace", "--config", tiny_dirs["olmo2"], *TRACE_ARGS, cache=str(trace_cache))
    doc = json.loads(r.stdout)
    assert doc["planner_compared"] and not doc["notes"], r.stderr


def test_trace_command_class_it_reads_approximately(tiny_dirs, trace_cache) -> None:
    # one it reads only approximately: traced alone, or compared under --approximate
    cache = str(trace_cache)
    r = _fitcheck("trace", "--config", tiny_dirs["stablelm"], *TRACE_ARGS, cache=cache)
    assert r.returncode == 0 and not json.loads(r.stdout)["planner_compared"], r.stderr
    r = _fitcheck("trace", "--config", tiny_dirs["stablelm"], *TRACE_ARGS, "--approximate",
                  cache=cache)
    doc = json.loads(r.stdout)
    assert doc["planner_compared"] and "model_type 'stablelm'" in doc["notes"][0]


def test_hub_id_from_the_local_cache(tiny_dirs, tmp_path, trace_cache) -> None:
    """org/name resolves to a config.json already in the Hugging Face cache (nothing is
    downloaded): the cache's layout is models--org--name/{refs/main, snapshots/<rev>/}."""
    hub = tmp_path / "hub"
    snap = hub / "models--tiny-org--tiny-llama" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text((Path(tiny_dirs["llama"]) / "config.json").read_text())
    (hub / "models--tiny-org--tiny-llama" / "refs").mkdir()
    (hub / "models--tiny-org--tiny-llama" / "refs" / "main").write_text("abc123")
    r = _fitcheck("trace", "--config", "tiny-org/tiny-llama", "--n", "2", "--seq", "64",
                  "--strategy", "ddp", cache=str(trace_cache), HF_HUB_CACHE=str(hub),
                  HF_HUB_OFFLINE="1")
    assert r.returncode == 0, r.stderr
    assert "LlamaForCausalLM" in r.stdout


def test_cli_surfaces() -> None:
    from planner.cli import cli
    from planner.trace_cli import trace_cmd

    plan = {o for p in cli.commands["plan"].params for o in p.opts}
    assert "--from-trace" in plan
    trace = {o for p in trace_cmd.params for o in p.opts}
    assert {"--config", "--depth", "--reference-model", "--timeout", "--json",
            "--strategy", "--checkpointing", "--precision", "--micro-batch"} <= trace


def test_cache_keys_and_location(tmp_path, monkeypatch) -> None:
    from planner.spec import TrainingSpec
    from probes.runner import job_to_dict
    from probes.trace_cache import ENV, TraceCache, default_dir, key_inputs, key_of

    cfg = small("llama")
    base = job_to_dict({"kind": "hf", "config": cfg, "layers": 4}, TrainingSpec(),
                       Candidate(strategy=Strategy.FULL_SHARD), 8, 8)
    variants = [
        job_to_dict({"kind": "hf", "config": {**cfg, "vocab_size": 4096}, "layers": 4},
                    TrainingSpec(), Candidate(strategy=Strategy.FULL_SHARD), 8, 8),
        job_to_dict({"kind": "hf", "config": cfg, "layers": 5}, TrainingSpec(),
                    Candidate(strategy=Strategy.FULL_SHARD), 8, 8),
        job_to_dict({"kind": "hf", "config": cfg, "layers": 4}, TrainingSpec(seq=4096),
                    Candidate(strategy=Strategy.FULL_SHARD), 8, 8),
        job_to_dict({"kind": "hf", "config": cfg, "layers": 4}, TrainingSpec(),
                    Candidate(strategy=Strategy.FULL_SHARD), 16, 8),
        job_to_dict({"kind": "hf", "config": cfg, "layers": 4}, TrainingSpec(),
                    Candidate(strategy=Strategy.FULL_SHARD,
                              checkpointing=Checkpointing.FULL), 8, 8),
    ]
    keys = {key_of(key_inputs(j)) for j in [base, *variants]}
    assert len(keys) == 1 + len(variants)
    inputs = key_inputs(base)
    assert {"torch", "transformers", "code", "format"} <= set(inputs)
    cache = TraceCache(tmp_path)
    assert cache.get(base) is None
    # a trace has the keys its readers use (probes/trace_cache.py TRACE_KEYS; a result
    # without them is a miss: tests/test_trace_cache_entries.py)
    traced = {"ok": True, "peak_bytes": 1, "peak_phase": "forward", "at_peak": {"total": 1},
              "max_by_category": {}, "moments": {}, "sub_moments": {}, "end_of_step": {},
              "model": {}, "n_blocks": 4, "n_params": 1, "n_trainable_params": 1,
              "optimizer_scalar_bytes": 0, "optimizer_scalars_on_host": True}
    cache.put(base, traced)
    assert cache.get(base) == traced
    cache.put(base, {"ok": True, "peak_bytes": 1})  # not a trace's shape: written, not read
    assert cache.get(base) is None
    cache.put(variants[0], {"ok": False, "reason": "SIGABRT"})  # crashes are not kept
    assert cache.get(variants[0]) is None
    failed = {"ok": False, "reason": "forward failed in ...", "deterministic": True}
    cache.put(variants[1], failed)  # an exception the same inputs repeat is
    assert cache.get(variants[1]) == failed
    (tmp_path / f"{key_of(inputs)}.json").write_text("{torn")
    assert cache.get(base) is None
    monkeypatch.setenv(ENV, "off")
    assert default_dir() is None
    monkeypatch.setenv(ENV, str(tmp_path / "x"))
    assert default_dir() == tmp_path / "x"


def test_batch_runner_isolates_a_crash() -> None:
    from planner.spec import TrainingSpec
    from probes.runner import job_to_dict, run_batch

    cfg = small("llama", layers=2, hidden=64, heads=2, kv_heads=1, ffn=128, vocab=256)
    jobs = [job_to_dict({"kind": "hf", "config": cfg}, TrainingSpec(seq=32),
                        Candidate(strategy=s), 2, 2) for s in (Strategy.DDP, Strategy.ZERO2)]
    out = run_batch(jobs, timeout_s=120)
    assert out[0].ok and out[0].data["model"]["class"] == "LlamaForCausalLM"
    assert not out[1].ok and out[1].unsupported and "zero2" in out[1].reason
    crashed = run_batch(jobs, timeout_s=120, env={"FITCHECK_PROBE_FAULT": "abort"})
    assert all(not r.ok and "SIGABRT" in r.reason for r in crashed)
