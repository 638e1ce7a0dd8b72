"""Generated inputs for the fuzz and metamorphic tests (tests/test_fuzz.py) and the longer runs
of benchmarks/fuzz.py: command lines built from the field registry, gate specs, and plans.

Values are drawn to hit the edges people and attackers reach: zero, negatives, huge and
4,000-digit integers, nan/inf/1e308, empty and odd strings, wrong types in specs.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from planner.fields import FIELDS, SECTIONS
from planner.presets import list_presets

FEW = 20
"""A property's examples in the fast unit tier; the rest of its examples run in CI (``slow``)."""


def tiers(total: int, few: int = FEW) -> list:
    """``@pytest.mark.parametrize("examples", tiers(N))``: a property's N examples split into
    ``few`` in the unit tier and N - few in a twin marked ``slow`` (CI runs both; another
    seed, so other draws)."""
    return [pytest.param(few, id="few"), pytest.param(total - few, id="many",
                                                      marks=pytest.mark.slow)]


def run_examples(examples: int, check, *strategies: st.SearchStrategy,
                 suppress: tuple[HealthCheck, ...] = (HealthCheck.too_slow,)) -> None:
    """``check(*drawn)`` on ``examples`` draws of ``strategies`` (hypothesis; reproducible:
    no example database, and the seed is the count, so each tier draws its own examples)."""
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(suppress),
              database=None)
    @seed(examples)
    @given(st.tuples(*strategies))
    def drawn(args: tuple) -> None:
        check(*args)

    drawn()


PRESETS = list_presets()
GPUS = ["h100-80", "a100-40", "a100-80", "rtx-4090", "mi300x", "l4", "v100-16"]

EDGE_NUMBERS = ["0", "-1", "1", "2", "8", "1e308", "nan", "inf", "-inf", "1e-6", "0.5",
                "9" * 40, "9" * 4301, "", " ", "abc", "1_000", "0x10", "١٢"]


def raw_text() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(EDGE_NUMBERS), st.text(max_size=12),
                     st.integers(-10, 10**6).map(str))


def flag_value(f) -> st.SearchStrategy[str]:
    if f.choices:
        return st.one_of(st.sampled_from(list(f.choices)), raw_text())
    if f.path == "model.preset":
        return st.one_of(st.sampled_from(PRESETS), raw_text())
    if f.path == "hardware.gpu":
        return st.one_of(st.sampled_from(GPUS), raw_text())
    return raw_text()


@st.composite
def command_lines(draw) -> list[str]:
    """A plan command line: mostly plausible, often with one or two bad values."""
    args = ["--model", draw(st.sampled_from(PRESETS)), "--gpu", draw(st.sampled_from(GPUS)),
            "--n", draw(st.sampled_from(["1", "2", "8", "16", "64"]))]
    usable = [f for f in FIELDS if not f.is_flag and f.path not in ("model.config",
                                                                     "calibration")]
    for f in draw(st.lists(st.sampled_from(usable), max_size=4, unique_by=lambda f: f.path)):
        args += [f.flag, draw(flag_value(f))]
    if draw(st.booleans()):
        args.append("--json")
    return args


JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2, 10**6),
                         st.sampled_from([10**40, 1e308, -0.0, 0.5, 2.0]),
                         st.text(max_size=10), st.sampled_from(PRESETS + GPUS))


@st.composite
def specs(draw) -> dict:
    """A gate spec: the known sections with good and bad values, sometimes unknown keys or
    wrong types."""
    spec: dict = {"model": {"preset": draw(st.sampled_from(PRESETS))},
                  "hardware": {"gpu": draw(st.sampled_from(GPUS)),
                               "n": draw(st.sampled_from([1, 8, 16]))}}
    for _ in range(draw(st.integers(0, 4))):
        section = draw(st.sampled_from(sorted(SECTIONS)))
        key = draw(st.one_of(st.sampled_from(SECTIONS[section]), st.text(max_size=6)))
        value = draw(st.one_of(JSON_SCALARS, st.lists(JSON_SCALARS, max_size=2),
                               st.dictionaries(st.text(max_size=3), JSON_SCALARS, max_size=2)))
        if section:
            target = spec.setdefault(section, {})
            if isinstance(target, dict):
                target[key] = value
        else:
            spec[key] = value
    return spec


@st.composite
def plans(draw) -> dict:
    """A valid plan request as spec values (for the metamorphic properties)."""
    return {
        "model.preset": draw(st.sampled_from(PRESETS)),
        "hardware.gpu": draw(st.sampled_from(GPUS)),
        "training.seq": draw(st.sampled_from([512, 1024, 2048, 4096, 8192])),
        "training.micro_batch": draw(st.sampled_from([1, 2, 4])),
        "training.precision": draw(st.sampled_from(["bf16-amp", "bf16", "fp16-amp", "fp32"])),
        "training.optimizer": draw(st.sampled_from(["adamw", "sgd", "adafactor", "lion",
                                                    "adamw-8bit"])),
        "training.optimizer_impl": draw(st.sampled_from(["foreach", "fused", "for-loop"])),
        "strategy": [draw(st.sampled_from(["ddp", "shard_grad_op", "full_shard", "zero1",
                                           "zero2", "zero3", "hybrid_shard", "no_shard"]))],
        "checkpointing": draw(st.sampled_from(["none", "selective", "full"])),
        "offload": "none",
    }


MIN_GPUS_MODELS = ["qwen1.5-moe-a2.7b", "mixtral-8x7b", "deepseek-v2-lite", "qwen3-30b-a3b",
                   "llama3.2-1b", "llama3-8b", "llama3-70b", "gpt2-xl"]
"""MoE models with 8 to 128 experts (FSDP2 pads them past that many ranks) and dense ones."""


@st.composite
def min_gpus_requests(draw) -> dict:
    """A `--find min-gpus` request as spec values, drawn where the fit is not monotone in the
    GPU count: padded MoE experts, ZeRO-3's persistent parameters under offload, host RAM
    that one node lacks, node sizes other than 8."""
    tp = draw(st.sampled_from(["1", "1", "auto", "2", "4"]))
    v = {
        "model.preset": draw(st.sampled_from(MIN_GPUS_MODELS)),
        "hardware.gpu": draw(st.sampled_from(["h100-80", "a100-40", "rtx-4090", "l4"])),
        "hardware.n": int(tp) if tp.isdigit() else 1,
        "hardware.gpus_per_node": draw(st.sampled_from([8, 8, 4, 6, 16])),
        "hardware.host_ram_gib": draw(st.sampled_from([None, 32, 64, 128, 512])),
        "parallel.tp": tp,
        "strategy": draw(st.sampled_from([["full_shard"], ["shard_grad_op"], ["hybrid_shard"],
                                          ["zero3"], ["zero2"], ["ddp"],
                                          ["full_shard", "zero3"]])),
        "offload": draw(st.sampled_from(["none", "none", "auto", "optimizer",
                                         "params_and_optimizer"])),
        "checkpointing": draw(st.sampled_from(["auto", "none", "full"])),
        "training.fsdp_version": draw(st.sampled_from([2, 2, 1])),
        "training.seq": draw(st.sampled_from([512, 2048, 8192])),
        "training.micro_batch": draw(st.sampled_from([1, 2, 8])),
        "training.init": draw(st.sampled_from(["meta", "full", "rank0"])),
        "deepspeed.stage3_param_persistence_threshold": draw(st.sampled_from(
            [None, None, "1e7", "1e10"])),
        "margin": draw(st.sampled_from([None, 0.0, 0.1])),
    }
    return {k: x for k, x in v.items() if x is not None}


# ------------------------------------------------------------------- issue 22: bytes, pods, sizes

SPEC_TEXTS = [
    "model:\n  preset: llama3.1-405b\nhardware:\n  gpu: l4\n  n: 1\nstrategy: ddp\n",
    '{"model": {"preset": "llama3-8b"}, "hardware": {"gpu": "h100-80", "n": 8}}\n',
    "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n"
    "  zero_stage: 3\nnum_processes: 8\n",
    "[job]\nname = \"x\"\n[training]\nlocal_batch_size = 8\nseq_len = 2048\n",
    '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}\n',
]
"""Specs and job files (a gate spec, accelerate, torchtitan TOML, DeepSpeed JSON) to mutate."""
BAD_BYTES = [b"\x00", b"\x01", b"\x1b", b"\x7f", b"\x85", b"\xff", b"\xc3\x28", b"\xed\xa0\x80",
             b"\xef\xbb\xbf", b"\r", b"\t", b"\\u0000", b"NaN", b"-Infinity", b".nan", b"9" * 4400,
             b"&a [1]", b"*a", b"!!python/object:os.system x", b"\n---\n", b"'", b'"', b"{", b"["]


@st.composite
def spec_bytes(draw) -> bytes:
    """A spec or job file's bytes with bytes people and attackers put there: control
    characters, non-UTF-8, NUL, BOMs, NaN, 4,400-digit integers, anchors, many documents."""
    data = draw(st.sampled_from(SPEC_TEXTS)).encode()
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from(BAD_BYTES)) + data[at:]
    if draw(st.integers(0, 9)) == 0:  # a stream of many documents (a 1 MB YAML of 110,000)
        data += b"---\n{}\n" * draw(st.sampled_from([2, 101, 110_000]))
    return data


GPU_VALUES = [0, 1, 8, 1 << 20, (1 << 20) + 1, -1, True, 2.0, None, "8", " 8 ", "²", "٣", "1e3",
              "0x10", "", "8Gi", "9" * 30, [8], {"a": 1}]


@st.composite
def reviewed_objects(draw) -> dict:
    """An AdmissionReview request: a Pod, Job, PyTorchJob or Deployment whose GPU counts and
    replicas are drawn from good and bad values (up to 200 roles x 2^31 replicas), with a
    spec annotation: a good one without hardware.n (the pods give the count), one drawn from
    ``specs``, or mutated bytes."""
    gpus = draw(st.sampled_from(GPU_VALUES))
    pod = {"containers": [{"resources": {draw(st.sampled_from(["limits", "requests"])):
                                         {"nvidia.com/gpu": gpus}}}]}
    kind = draw(st.sampled_from(["Pod", "Job", "PyTorchJob", "Deployment"]))
    replicas = draw(st.sampled_from([0, 1, 4, 1 << 16, 1 << 20, 1 << 31, -1, "2", None]))
    if kind == "Pod":
        spec: dict = pod
    elif kind == "PyTorchJob":
        spec = {"pytorchReplicaSpecs": {f"Worker{i}": {"replicas": replicas,
                                                       "template": {"spec": pod}}
                                        for i in range(draw(st.sampled_from([1, 2, 120, 200])))}}
    else:
        spec = {"parallelism" if kind == "Job" else "replicas": replicas,
                "template": {"spec": pod}}
    import json

    how = draw(st.sampled_from(["good", "good", "drawn", "bytes"]))
    if how == "good":  # the pods give the GPU count
        annotation = json.dumps({"model": {"preset": draw(st.sampled_from(PRESETS))},
                                 "hardware": {"gpu": draw(st.sampled_from(GPUS))}})
    elif how == "drawn":
        annotation = json.dumps(draw(specs()))
    else:
        annotation = draw(spec_bytes()).decode("utf-8", "surrogateescape")
    return {"uid": "u", "operation": "CREATE",
            "object": {"kind": kind, "metadata": {"annotations": {"fitcheck.io/spec": annotation}},
                       "spec": spec}}


SIZE_FIELDS = {"model.layers": (32, 100_000), "model.vocab": (32_000, 1 << 24),
               "training.seq": (2048, 1 << 24), "training.micro_batch": (1, 1 << 20),
               "training.grad_accum": (1, 1 << 20), "hardware.n": (8, 1 << 20),
               "hardware.gpus_per_node": (8, 4096), "model.experts": (8, 1 << 16)}
"""Numbers in a request and (a small value, the field's largest)."""


@st.composite
def sized_requests(draw) -> tuple[dict, str]:
    """A plan request and one of its numbers to take to the field's largest."""
    field = draw(st.sampled_from(sorted(SIZE_FIELDS)))
    moe = ["qwen1.5-moe-a2.7b", "mixtral-8x7b", "deepseek-v2-lite"]
    v = {"model.preset": draw(st.sampled_from(moe if field == "model.experts" else
                                              moe + ["llama3-8b", "llama3-70b", "gpt2-xl"])),
         "hardware.gpu": draw(st.sampled_from(["h100-80", "a100-40", "l4"])),
         "hardware.n": 8, "offload": draw(st.sampled_from(["auto", "none"])),
         "checkpointing": "auto",
         "strategy": draw(st.sampled_from([["zero3"], ["full_shard", "zero2"], ["ddp", "zero1"],
                                           ["hybrid_shard", "zero3"]]))}
    return v, field
