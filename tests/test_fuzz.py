"""Generated inputs (hypothesis): bad input is always exit 2 or 4 with one line, never a crash;
a bad spec is never admitted; the planner's answers keep the properties any correct answer has.

benchmarks/fuzz.py runs the same properties with many more examples and prints the counts.
"""

from __future__ import annotations

import json

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import strategies as st  # noqa: E402

from conftest import run  # noqa: E402
from fuzz_cases import command_lines, plans, run_examples, specs, tiers  # noqa: E402
from planner.fields import SPEC  # noqa: E402
from planner.memory import estimate  # noqa: E402
from planner.plan import find, plan  # noqa: E402
from planner.request import build_request  # noqa: E402
from planner.spec import Candidate, Checkpointing, Offload, Strategy  # noqa: E402

EXAMPLES = 120
"""Examples per property: FEW in the unit tier, the rest in CI (fuzz_cases.tiers)."""


def check_cli_result(r) -> None:
    """The exit-code contract: 0/3 answer, 2/4 one line on stderr, never 1."""
    assert r.exit_code in (0, 2, 3, 4), (r.exit_code, r.stderr[-500:])
    assert "Traceback" not in r.output and "internal error" not in r.stderr
    if r.exit_code in (2, 4):
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert r.stdout == ""


@pytest.mark.parametrize("examples", tiers(EXAMPLES))
def test_cli_bad_values_never_crash(examples):
    run_examples(examples, lambda args: check_cli_result(run(*args)), command_lines())


@pytest.mark.parametrize("examples", tiers(EXAMPLES))
def test_gate_never_crashes_and_never_admits_a_bad_spec(examples):
    run_examples(examples, _gate_never_crashes, specs(), st.sampled_from(["admit", "reject"]))


def _gate_never_crashes(spec, on_error):
    r = run("gate", "-", "--on-error", on_error, input=json.dumps(spec))
    check_cli_result(r)
    if r.exit_code == 0:
        doc = json.loads(r.stdout)
        assert doc["verdict"] == "admit" and "error" not in doc


def _request(values: dict, **override):
    return build_request({**values, **override}, SPEC)


def _used(values: dict, **override) -> int:
    r = _request(values, **override)
    c = Candidate(strategy=Strategy(values["strategy"][0]), offload=Offload.NONE,
                  checkpointing=Checkpointing(values["checkpointing"]))
    return estimate(r.model, r.training, r.cluster, c).required_bytes


@pytest.mark.parametrize("examples", tiers(EXAMPLES))
def test_more_gpus_in_a_node_never_need_more_memory(examples):
    run_examples(examples, _more_gpus_in_a_node_never_need_more_memory, plans())


def _more_gpus_in_a_node_never_need_more_memory(values):
    used = [_used(values, **{"hardware.n": n, "hardware.gpus_per_node": 8}) for n in (2, 4, 8)]
    assert used[0] >= used[1] >= used[2], used


@pytest.mark.parametrize("examples", tiers(EXAMPLES))
def test_more_tokens_never_need_less_memory(examples):
    run_examples(examples, _more_tokens_never_need_less_memory, plans())


def _more_tokens_never_need_less_memory(values):
    mb, seq = values["training.micro_batch"], values["training.seq"]
    base = _used(values, **{"hardware.n": 8})
    assert _used(values, **{"hardware.n": 8, "training.micro_batch": mb * 2}) >= base
    assert _used(values, **{"hardware.n": 8, "training.seq": seq * 2}) >= base


@pytest.mark.parametrize("examples", tiers(EXAMPLES))
def test_found_values_fit(examples):
    run_examples(examples, _found_values_fit, plans())


def _found_values_fit(values):
    r = _request(values, **{"hardware.n": 8, "checkpointing": "auto", "offload": None})
    for question in ("min-gpus", "max-micro-batch"):
        f = find(r, question)
        assert (f.value is not None) == f.answer.any_fits, question
    a = plan(r)
    if a.min_gpus is not None:  # nothing fits at 8: the count offered fits
        assert a.min_gpus > 8 and plan(r.with_gpus(a.min_gpus)).any_fits
