"""`fitcheck gate SPEC`: the verdict contract, spec validation, exit codes, failure semantics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import cli
from planner.gate import SpecError, gate, parse_spec_text, request_from_spec

DATA = Path(__file__).parent / "data" / "gate"
EXAMPLE = DATA / "llama8b-8xh100.json"
VERDICT_KEYS = {"schema_version", "verdict", "reason", "recommendation", "predicted", "pinned",
                "min_gpus", "warnings", "fitcheck_version"}
PREDICTED_KEYS = {"peak_allocated_bytes", "peak_reserved_bytes", "device_used_bytes",
                  "capacity_bytes", "headroom_bytes"}


def spec(**top) -> dict:
    base = {"model": {"preset": "llama3-8b"}, "hardware": {"gpu": "h100-80", "n": 8}}
    base.update(top)
    return base


def run_gate(*args: str, input: str | None = None):
    return CliRunner().invoke(cli, ["gate", *args], input=input)


def verdict_of(result) -> dict:
    doc = json.loads(result.stdout)
    assert VERDICT_KEYS <= doc.keys(), doc.keys()
    return doc


def test_admit_matches_plan_json():
    r = run_gate(str(EXAMPLE))
    assert r.exit_code == 0, r.output
    v = verdict_of(r)
    assert v["verdict"] == "admit" and v["pinned"] is False and v["min_gpus"] is None
    assert PREDICTED_KEYS <= v["predicted"].keys()
    assert v["predicted"]["headroom_bytes"] >= 0
    # the same question through the plan command recommends the same candidate, same bytes
    p = CliRunner().invoke(cli, ["--model", "llama3-8b", "--gpu", "h100-80", "--n", "8",
                                 "--seq", "4096", "--micro-batch", "2", "--global-batch", "256",
                                 "--optimizer-impl", "fused", "--json"])
    doc = json.loads(p.stdout)
    rec = doc["recommendation"]
    assert v["recommendation"] == {k: rec[k] for k in ("strategy", "offload", "checkpointing",
                                                        "tp")}
    cand = next(c for c in doc["candidates"] if all(c[k] == rec[k] for k in v["recommendation"]))
    for k in PREDICTED_KEYS:
        assert v["predicted"][k] == cand[k]


def test_reject_nothing_fits_reports_min_gpus():
    v = gate(spec(model={"preset": "llama3-70b"}, hardware={"gpu": "rtx-4090", "n": 1}))
    assert v["verdict"] == "reject"
    assert v["min_gpus"] is not None and v["min_gpus"] > 1
    assert f"at least {v['min_gpus']} GPUs" in v["reason"]
    assert v["predicted"]["headroom_bytes"] < 0 or not v["predicted"]["fits"]
    r = run_gate("-", input=json.dumps(spec(model={"preset": "llama3-70b"},
                                            hardware={"gpu": "rtx-4090", "n": 1})))
    assert r.exit_code == 3


def test_pinned_strategy_admit_and_reject_with_alternative():
    ok = gate(spec(strategy="full_shard"))
    assert ok["verdict"] == "admit" and ok["pinned"] is True
    assert ok["recommendation"]["strategy"] == "full_shard"
    assert ok["reason"].startswith("pinned full_shard")
    bad = gate(spec(model={"preset": "llama3-70b"}, strategy="ddp",
                    hardware={"gpu": "h100-80", "n": 16, "gpus_per_node": 8}))
    assert bad["verdict"] == "reject" and bad["pinned"] is True
    assert bad["predicted"]["strategy"] == "ddp" and not bad["predicted"]["fits"]
    assert bad["recommendation"] is not None and bad["recommendation"]["strategy"] != "ddp"
    assert "fits instead" in bad["reason"]


def test_pinned_checkpointing_is_respected():
    # full_shard fits with auto checkpointing; pinned to none on a long sequence it does not
    # (without tensor parallel: TP 8 would fit it with no checkpointing)
    # (margin pinned: the default is measured, docs/accuracy.md §5, and moves with it)
    s = spec(model={"preset": "llama3-8b"}, training={"seq": 32768}, strategy="full_shard",
             parallel={"tp": 1}, margin=0.05)
    auto = gate(s)
    none = gate({**s, "checkpointing": "none"})
    assert auto["verdict"] == "admit" and auto["recommendation"]["checkpointing"] != "none"
    assert none["verdict"] == "reject"
    assert none["predicted"]["checkpointing"] == "none"


def test_pinned_fsdp_on_one_gpu_is_plain_training():
    v = gate(spec(model={"preset": "gpt2"}, hardware={"gpu": "h100-80", "n": 1},
                  strategy="full_shard"))
    assert v["verdict"] == "admit" and v["recommendation"]["strategy"] == "full_shard"
    assert v["recommendation"]["offload"] == "none"
    assert any("one GPU" in w for w in v["warnings"])


@pytest.mark.parametrize("bad, needle", [
    ({"modle": {}}, "unknown key 'modle'"),
    ({"training": {"micro-batch": 2}}, "'micro-batch' -> 'micro_batch'"),
    ({"training": {"seq": "long"}}, "training.seq: must be a positive integer, got 'long'"),
    ({"training": {"seq": 0}}, "training.seq: must be a positive integer, got 0"),
    ({"training": {"seq": True}}, "training.seq"),
    ({"training": {"precision": "fp8"}}, "training.precision: unknown value 'fp8'"),
    ({"hardware": {"gpu": "h100-80"}}, "hardware.n: required"),
    ({"hardware": {"gpu": "h100-80", "n": 12}}, "hardware.n (12) must be a multiple of "
     "hardware.gpus_per_node (8)"),
    ({"hardware": {"gpu": "nope-gpu", "n": 8}}, "hardware.gpu"),
    ({"model": {"preset": "nope-model"}}, "model.preset"),
    ({"model": {"preset": "llama3-8b", "params": 8e9}}, "give only one of model.params, "
     "model.preset"),
    ({"model": "llama3-8b"}, "model: must be a mapping, got a string 'llama3-8b'"),
    ({"strategy": "fsdp"}, "strategy: unknown value 'fsdp'"),
    ({"margin": 1.5}, "margin: must be in [0, 1), got 1.5"),
    ({"hardware": {"gpu": "h100-80", "n": 8, "host_ram_gib": -1}}, "hardware.host_ram_gib"),
])
def test_bad_spec_exit_4_one_line(bad, needle):
    doc = spec()
    doc.update(bad)
    r = run_gate("-", input=json.dumps(doc))
    assert r.exit_code == 4, (r.exit_code, r.output)
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in r.output
    assert needle in err, err
    assert r.stdout == ""


def test_spec_text_errors():
    for text, needle in [("", "empty"), ("{", "invalid JSON"), ("[1, 2]", "must be a mapping"),
                         ('{"a": 1, "a": 2}', "duplicate key 'a'"),
                         ('{"margin": NaN}', "spec: margin: nan is not a finite number")]:
        with pytest.raises(SpecError, match=needle):
            parse_spec_text(text)


def test_yaml_without_pyyaml_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml -> ImportError
    r = run_gate("-", input="model:\n  preset: llama3-8b\n")
    assert r.exit_code == 4
    assert "YAML spec needs PyYAML (pip install pyyaml) or use JSON" in r.stderr


def test_yaml_when_available(monkeypatch):
    # stand-in for PyYAML: what safe_load returns is what a real one would for this text
    fake = types.ModuleType("yaml")
    fake.YAMLError = ValueError
    fake.safe_load = lambda text: spec() if "llama3-8b" in text else None
    monkeypatch.setitem(sys.modules, "yaml", fake)
    r = run_gate("-", input="model: {preset: llama3-8b}\nhardware: {gpu: h100-80, n: 8}\n")
    assert r.exit_code == 0, r.output
    assert verdict_of(r)["verdict"] == "admit"


def test_relative_paths_resolve_against_the_spec(tmp_path):
    cfg = Path(__file__).parent / "data" / "configs"
    config = next(iter(sorted(cfg.glob("*.json"))))
    d = tmp_path / "job"
    d.mkdir()
    (d / "config.json").write_text(config.read_text())
    (d / "spec.json").write_text(json.dumps(spec(model={"config": "config.json"})))
    r = run_gate(str(d / "spec.json"))
    assert r.exit_code in (0, 3), r.output
    with pytest.raises(SpecError, match="file paths are not accepted"):
        request_from_spec(spec(model={"config": "config.json"}), allow_files=False)
    with pytest.raises(SpecError, match="file paths are not accepted"):
        request_from_spec(spec(hardware={"gpu": "/etc/passwd", "n": 1}), allow_files=False)


def test_usage_errors_exit_2():
    assert run_gate("/no/such/spec.json").exit_code == 2
    assert run_gate().exit_code == 2
    assert run_gate(str(EXAMPLE), "--on-error", "maybe").exit_code == 2


@pytest.mark.parametrize("on_error, code", [("admit", 0), ("reject", 3)])
def test_internal_error_follows_on_error(monkeypatch, on_error, code):
    import planner.plan

    def boom(*a, **k):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(planner.plan, "plan", boom)
    r = run_gate(str(EXAMPLE), "--on-error", on_error)
    assert r.exit_code == code, r.output
    v = verdict_of(r)
    assert v["verdict"] == on_error and "kaboom" in v["error"]
    assert "internal error" in r.stderr


def test_timeout_counts_as_internal_error(monkeypatch):
    import time

    import planner.plan

    real = planner.plan.plan

    def slow(*a, **k):
        time.sleep(2)
        return real(*a, **k)

    monkeypatch.setattr(planner.plan, "plan", slow)
    r = run_gate(str(EXAMPLE), "--timeout", "0.2", "--on-error", "admit")
    assert r.exit_code == 0
    assert "timed out" in verdict_of(r)["error"]


def test_cold_subprocess_no_heavy_imports_and_compact():
    code = ("import sys\nfrom planner.cli import cli\n"
            "try:\n    cli.main(['gate', sys.argv[1], '--compact'])\n"
            "except SystemExit as e:\n    rc = e.code\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'pandas', 'numpy', 'yaml', 'tabulate', 'http', 'ssl'))\n"
            "print('HEAVY', heavy, rc, file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-c", code, str(EXAMPLE)], capture_output=True,
                       text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert "HEAVY [] 0" in p.stderr, p.stderr
    assert len(p.stdout.strip().splitlines()) == 1
    assert json.loads(p.stdout)["verdict"] == "admit"


def test_headroom_is_usable_minus_required_as_documented():
    """docs/gating.md said usable - device_used (issue 22, item 11); the code, the plan JSON and
    now the docs say usable - required."""
    for n in ("1", "8"):
        r = run_gate("-", input=json.dumps({"model": {"preset": "llama3-8b"},
                                            "hardware": {"gpu": "h100-80", "n": int(n)}}))
        p = json.loads(r.stdout)["predicted"]
        assert p["headroom_bytes"] == p["usable_bytes"] - p["required_bytes"], p
    doc = open(os.path.join(os.path.dirname(__file__), "..", "docs", "gating.md")).read()
    assert "`headroom_bytes` =\n`usable_bytes` − `required_bytes`" in doc
