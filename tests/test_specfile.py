"""planner.specfile: a spec's text is parsed bounded in time and memory, whatever it holds."""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest
from click.testing import CliRunner

from planner.cli import cli
from planner.fields import SpecError
from planner.specfile import MAX_SPEC_DEPTH, MAX_SPEC_NODES, parse_spec_text

OK_YAML = "model: {preset: llama3-8b}\nhardware: {gpu: h100-80, n: 8}\n"


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """516 bytes of YAML whose anchors make 9**9 (387 million) list items under model.mlp."""
    lines = ["model:", "  preset: llama3-8b", "  mlp:",
             "    a0: &a0 [" + ",".join(["lol"] * width) + "]"]
    lines += [f"    a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]"
              for i in range(1, levels)]
    return "\n".join([*lines, "hardware:", "  gpu: h100-80", "  n: 8"]) + "\n"


def nested_yaml(levels: int) -> str:
    """A mapping `a` holding `levels - 1` nested flow lists: `levels` containers in all."""
    return "a: " + "[" * (levels - 1) + "]" * (levels - 1) + "\n"


def nested_json(levels: int) -> str:
    return '{"a": ' + "[" * (levels - 1) + "]" * (levels - 1) + "}"


def test_yaml_alias_bomb_is_refused_at_once_in_little_memory():
    text = alias_bomb()
    assert len(text) < 600
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(SpecError) as info:
            parse_spec_text(text, "annotation")
        took = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "anchors and aliases (& and *) are not accepted (line 4)" in str(info.value)
    assert took < 1.0, took
    assert peak < 5 * 2**20, peak  # before: gigabytes (the expansion, or its repr)


@pytest.mark.parametrize("text", ["model: &m {preset: x}\n", "a: 1\nb: *a\n",
                                  "a: &x 1\nb: *x\n", "base: &b {n: 1}\nhw:\n  <<: *b\n"])
def test_any_anchor_or_alias_is_refused(text):
    with pytest.raises(SpecError, match="anchors and aliases"):
        parse_spec_text(text)


@pytest.mark.parametrize("nest", [nested_yaml, nested_json])
def test_nesting_is_bounded(nest):
    assert parse_spec_text(nest(MAX_SPEC_DEPTH))["a"] is not None
    for levels in (MAX_SPEC_DEPTH + 1, 900, 200_000):  # under and over the recursion limit
        t0 = time.perf_counter()
        with pytest.raises(SpecError, match=f"nested deeper than {MAX_SPEC_DEPTH} levels"):
            parse_spec_text(nest(levels))
        assert time.perf_counter() - t0 < 2.0


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_node_count_is_bounded(fmt):
    def text(n: int) -> str:  # the mapping, its key, the list, n items: n + 3 nodes
        items = ",".join(["1"] * n)
        return f"a: [{items}]\n" if fmt == "yaml" else f'{{"a": [{items}]}}'

    assert len(parse_spec_text(text(MAX_SPEC_NODES - 3))["a"]) == MAX_SPEC_NODES - 3
    with pytest.raises(SpecError, match=f"more than {MAX_SPEC_NODES} keys and values"):
        parse_spec_text(text(MAX_SPEC_NODES - 2))
    t0 = time.perf_counter()
    with pytest.raises(SpecError, match="more than"):
        parse_spec_text(text(150_000))
    assert time.perf_counter() - t0 < 2.0


@pytest.mark.parametrize("text, needle", [
    ("a: 1\na: 2\n", "duplicate key 'a' (line 2)"),
    ('{"a": 1, "a": 2}', "duplicate key 'a'"),
    ("a: " + "9" * 5000 + "\n", "invalid YAML: Exceeds the limit"),
    ('{"a": ' + "9" * 5000 + "}", "invalid JSON: Exceeds the limit"),
    ('{"margin": 1e400}', "margin: inf is not a finite number"),
    ("margin: .nan\n", "margin: nan is not a finite number"),
    ('{"margin": NaN}', "spec: margin: nan is not a finite number"),
    ('{"a": {"b": [1, -Infinity]}}', "spec: a.b[1]: -inf is not a finite number"),
    ("when: 2024-01-01\n", "when: a value of type date is not accepted"),
    ("1: one\n", "keys must be strings, got an integer 1"),
    ("a: !!python/object:os.system x\n", "invalid YAML: could not determine a constructor"),
    ("x" * (2**20 + 1), "spec larger than 1048576 bytes"),
])
def test_outside_json_data_model_is_refused(text, needle):
    with pytest.raises(SpecError) as info:
        parse_spec_text(text)
    assert needle in str(info.value), str(info.value)


def test_plain_yaml_and_json_still_parse():
    assert parse_spec_text(OK_YAML) == {"model": {"preset": "llama3-8b"},
                                        "hardware": {"gpu": "h100-80", "n": 8}}
    assert parse_spec_text(json.dumps({"a": [1, 2.5, None, True, "x"]})) == {
        "a": [1, 2.5, None, True, "x"]}


def test_gate_names_stay_importable_from_planner_gate():
    from planner import gate, specfile

    assert gate.parse_spec_text is specfile.parse_spec_text
    assert gate.read_spec is specfile.read_spec
    assert gate.MAX_SPEC_BYTES == specfile.MAX_SPEC_BYTES


@pytest.mark.parametrize("text", [alias_bomb(), nested_json(5000), nested_yaml(200_000)])
def test_gate_exits_4_at_once_on_hostile_specs(tmp_path, text):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    t0 = time.perf_counter()
    r = CliRunner().invoke(cli, ["gate", str(path), "--timeout", "0"])
    assert time.perf_counter() - t0 < 5.0
    assert r.exit_code == 4, (r.exit_code, r.output)
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.output


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e308", "1e-6", "-1", "3601", "soon"])
def test_gate_timeout_out_of_bounds_is_a_usage_error(value):
    r = CliRunner().invoke(cli, ["gate", "-", "--timeout", value], input=OK_YAML)
    assert r.exit_code == 2, (r.exit_code, r.output)
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "--timeout" in err and repr(value) in err, err


@pytest.mark.parametrize("value", ["0", "0.1", "3600"])
def test_gate_timeout_in_bounds_runs(value):
    r = CliRunner().invoke(cli, ["gate", "-", "--timeout", value, "--compact"], input=OK_YAML)
    assert r.exit_code in (0, 3), (r.exit_code, r.output)  # 0.1 s may pass: on-error reject
    assert json.loads(r.stdout)["verdict"] in ("admit", "reject")
