"""The verdict with the risk (issue 24): fits / at risk / does not fit, the probability of
running out of memory, and the at_risk policy of the gate, the plan's exit code, the webhook
and Slurm. The band is a hand-made one (monkeypatched), so the outcomes below follow from the
planner's needed bytes and that band alone, not from the shipped error_bands.json:

    n 10, mean 0, sd 0.1 -> scale 0.1 x sqrt(1.1) = 0.10488, t(9, 0.95) = 1.833:
    the need's 90 % interval is predicted x [e^-0.1923, e^+0.1923] = [0.825, 1.212].

Llama-3-8B on 8 x H100 (79.6 GiB), pinned: full_shard with full checkpointing needs far less
than 79.6 / 1.212 GiB (fits); ``at_risk_spec`` takes the first of a few heavier pinned jobs whose
need falls between 79.6 / 1.212 and 79.6 / 0.825 GiB, and the test checks that it does."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from planner import error_bands as eb
from planner.cli import cli
from planner.gate import gate

BAND = eb.RiskBand(kind="x", measured_kind="x", n=10, mean_log=0.0, sd_log=0.1)


@pytest.fixture(autouse=True)
def hand_band(monkeypatch):
    # every estimate takes its band from error_bands.plan_risk_band, which reads risk_band
    monkeypatch.setattr(eb, "risk_band", lambda *a, **k: BAND)


def test_the_hand_band():
    assert BAND.low == pytest.approx(0.8250, abs=2e-4)
    assert BAND.high == pytest.approx(1.2121, abs=2e-4)


def pinned(strategy: str, ckpt: str, **top) -> dict:
    return {"model": {"preset": "llama3-8b"}, "hardware": {"gpu": "h100-80", "n": 8},
            "strategy": strategy, "checkpointing": ckpt, "offload": "none",
            "parallel": {"tp": 1}, **top}


def at_risk_spec() -> dict:
    """A pinned job whose need is inside [usable / 1.212, usable / 0.825]: at risk."""
    for seq in (2048, 4096, 8192, 16384):
        for strategy, ckpt in (("full_shard", "none"), ("ddp", "full"), ("ddp", "none")):
            s = pinned(strategy, ckpt, training={"seq": seq})
            p = gate(s, at_risk="admit")["predicted"]
            if p["risk"]["outcome"] == "at_risk":
                return s
    raise AssertionError("no at-risk case found")


def test_outcome_follows_the_interval():
    s = at_risk_spec()
    p = gate(s, at_risk="admit")["predicted"]
    need, usable = p["required_bytes"], p["usable_bytes"]
    # at risk exactly when usable lies between need x 0.825 and need x 1.212
    assert need * BAND.low <= usable < need * BAND.high
    r = p["risk"]
    assert r["required_low_bytes"] == int(need * BAND.low)
    assert r["required_high_bytes"] >= need * BAND.high > r["required_high_bytes"] - 1
    assert 0.05 < r["oom_probability"] < 0.95
    assert r["band"]["n"] == 10 and r["band"]["coverage"] == 0.9
    # full checkpointing under full_shard: needs far less than usable / 1.212 -> fits
    ok = gate(pinned("full_shard", "full"))
    assert ok["verdict"] == "admit" and ok["outcome"] == "fits"
    assert ok["predicted"]["required_bytes"] * BAND.high < ok["predicted"]["usable_bytes"]
    assert ok["predicted"]["risk"]["oom_probability"] < 0.05


@pytest.mark.parametrize("policy, verdict", [("admit", "admit"), ("warn", "admit"),
                                             ("reject", "reject")])
def test_the_gate_policy_decides_at_risk_jobs(policy, verdict):
    s = at_risk_spec()
    v = gate(s, at_risk=policy)
    assert (v["verdict"], v["outcome"], v["at_risk_policy"]) == (verdict, "at_risk", policy)
    pct = f"{v['predicted']['risk']['oom_probability']:.0%} probability of running out of memory"
    assert pct in v["reason"] and f"(at_risk: {policy})" in v["reason"]
    warned = [w for w in v["warnings"] if w.startswith("at risk:")]
    assert len(warned) == (1 if policy == "warn" else 0)


def test_the_spec_key_sets_the_policy_and_the_flag_overrides_it():
    s = {**at_risk_spec(), "at_risk": "reject"}
    assert gate(s)["verdict"] == "reject"
    assert gate(s, at_risk="admit")["verdict"] == "admit"
    assert gate({**s, "at_risk": "warn"})["verdict"] == "admit"  # warn is admit + warning
    # the default is warn
    v = gate(at_risk_spec())
    assert v["verdict"] == "admit" and v["at_risk_policy"] == "warn"


def test_bad_policy_names_the_field():
    from planner.fields import SpecError

    with pytest.raises(SpecError, match=r"^at_risk: must be one of admit, reject, warn or a "
                                        r"probability 0 < P < 1 \(or a percentage\), got "
                                        r"'maybe'$"):
        gate({**pinned("ddp", "full"), "at_risk": "maybe"})


def test_gate_cli_exit_codes_follow_the_policy(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(at_risk_spec()))
    run = lambda *a: CliRunner().invoke(cli, ["gate", str(path), *a])  # noqa: E731
    assert run("--at-risk", "reject").exit_code == 3
    assert run("--at-risk", "admit").exit_code == 0
    r = run()
    assert r.exit_code == 0 and json.loads(r.stdout)["at_risk_policy"] == "warn"
    r = run("--at-risk", "sometimes")
    assert r.exit_code == 2 and "--at-risk" in r.output


def test_plan_shows_the_risk_and_exits_per_policy():
    s = at_risk_spec()
    args = ["--model", "llama3-8b", "--gpu", "h100-80", "--n", "8", "--strategy",
            s["strategy"], "--checkpointing", s["checkpointing"], "--offload", "none",
            "--tp", "1", "--seq", str(s["training"]["seq"])]
    run = lambda *a: CliRunner().invoke(cli, [*args, *a])  # noqa: E731
    r = run()
    assert r.exit_code == 0, r.output  # warn: nothing fits for sure, one at risk
    assert "risk " in r.output and "at risk: " in r.output
    assert "probability of running out of memory" in r.output
    assert run("--at-risk", "reject").exit_code == 3
    doc = json.loads(run("--json").stdout)
    assert doc["recommendation"] is None and doc["inputs"]["at_risk"] == "warn"
    (c,) = doc["candidates"]
    assert c["risk"]["outcome"] == "at_risk" and not c["fits"]


def test_webhook_message_and_audit_annotations_carry_the_risk():
    from planner.webhook import WebhookConfig, evaluate

    obj = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "j", "annotations": {"fitcheck.io/spec":
                                                     json.dumps(at_risk_spec())}},
           "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}}
    req = {"uid": "u", "operation": "CREATE", "object": obj}
    deny = evaluate("u", req, WebhookConfig(at_risk="reject"))["response"]
    assert deny["allowed"] is False and "is at risk" in deny["status"]["message"]
    assert deny["auditAnnotations"]["outcome"] == "at_risk"
    allow = evaluate("u", req, WebhookConfig())["response"]
    assert allow["allowed"] is True
    assert any("at risk:" in w for w in allow["warnings"])
    assert 0 < float(allow["auditAnnotations"]["oom_probability"]) < 1


def test_slurm_controller_message_carries_the_risk():
    import planner.slurm as fs

    s = at_risk_spec()
    line = (f"#FITCHECK model=llama3-8b gpu=h100-80 n=8 strategy={s['strategy']} "
            f"checkpointing={s['checkpointing']} offload=none tp=1 "
            f"seq={s['training']['seq']}")
    ok = fs.controller_answer(fs.ControllerJob(directives=line + "\n"))
    assert ok.code == fs.EXIT_ADMIT and "is at risk" in ok.message
    no = fs.controller_answer(fs.ControllerJob(directives=line + " at_risk=reject\n"))
    assert no.code == fs.EXIT_REJECT and "rejected (at_risk: reject)" in no.message


def test_a_probability_policy_rejects_at_and_above_it():
    """--at-risk P: a job at risk is rejected when its probability of running out of memory is
    at least P, else admitted with the warning 'warn' gives. The job's own probability is
    read from the verdict, and the two thresholds are put on either side of it."""
    s = at_risk_spec()
    p = gate(s, at_risk="admit")["predicted"]["risk"]["oom_probability"]
    assert 0.02 < p < 0.98
    below, above = f"{(p + 1) / 2:.4f}", f"{p / 2:.4f}"  # thresholds over and under p
    v = gate(s, at_risk=below)
    assert v["verdict"] == "admit" and v["at_risk_policy"] == below
    assert any(w.startswith("at risk: ") for w in v["warnings"])
    v = gate(s, at_risk=above)
    assert v["verdict"] == "reject" and f"rejected (at_risk: {above})" in v["reason"]
    # the spec key takes a percentage too, written back as the probability
    assert gate({**s, "at_risk": f"{p * 50:.2f}%"})["verdict"] == "reject"


@pytest.mark.parametrize("bad", ["0", "1", "1.5", "-0.2", "nan", "150%", "maybe"])
def test_a_bad_probability_policy_names_the_field(bad):
    from planner.fields import SpecError

    with pytest.raises(SpecError, match=r"^at_risk: must be one of admit, reject, warn or a "
                       r"probability"):
        gate({**at_risk_spec(), "at_risk": bad})


def test_plan_exit_code_follows_a_probability_policy():
    """Nothing fits for sure: the plan exits 0 when the least risky candidate's probability is
    under P, 3 when at or above it."""
    s = at_risk_spec()
    p = gate(s, at_risk="admit")["predicted"]["risk"]["oom_probability"]
    args = ["--model", "llama3-8b", "--gpu", "h100-80", "--n", "8", "--strategy",
            s["strategy"], "--checkpointing", s["checkpointing"], "--offload", "none",
            "--tp", "1", "--seq", str(s["training"]["seq"])]
    run = lambda *a: CliRunner().invoke(cli, [*args, *a])  # noqa: E731
    assert run("--at-risk", f"{(p + 1) / 2:.4f}").exit_code == 0
    r = run("--at-risk", f"{p / 2:.4f}")
    assert r.exit_code == 3, r.output
    r = run("--at-risk", "2")
    assert r.exit_code == 2 and "--at-risk" in r.stderr
