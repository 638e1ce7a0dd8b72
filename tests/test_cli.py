"""The `fitcheck` command's contract: flags, JSON keys, exit codes, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from click.testing import CliRunner

from conftest import one_line_error, run
from planner.cli import cli

BASE = ["--gpu", "h100-80"]


def test_main_command_table_and_exit_code():
    r = run("--params", "13e9", "--gpu", "h100-80", "--n", "8")
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "shape ASSUMED" in out
    for s in ("ddp", "no_shard", "shard_grad_op", "full_shard", "hybrid_shard", "zero1", "zero2", "zero3"):
        assert s in out
    assert "recommendation:" in out


def test_json_contract():
    r = run("--model", "llama2-13b", "--gpu", "h100-80", "--n", "8", "--json")
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    assert doc["schema_version"] == 1
    assert doc["inputs"]["model"]["params"] == 13_015_864_320
    assert doc["inputs"]["model"]["layers"] == 40
    assert doc["inputs"]["hardware"]["n_gpus"] == 8
    assert {c["strategy"] for c in doc["candidates"]} == {
        "ddp", "no_shard", "shard_grad_op", "full_shard", "hybrid_shard", "zero1", "zero2", "zero3"}
    required = {"strategy", "offload", "checkpointing", "fits", "peak_allocated_bytes",
                "peak_reserved_bytes", "device_used_bytes", "capacity_bytes", "breakdown_bytes"}
    for c in doc["candidates"]:
        assert required <= c.keys()
        # the breakdown's allocator terms sum to peak allocated; reserved and context on top
        b = c["breakdown_bytes"]
        runtime = {"allocator_overhead", "cuda_context", "nccl_buffers"}
        at_peak = sum(v for k, v in b.items() if k not in runtime)  # allocated at the peak
        # reserved: at every moment allocated + the unreleasable overhead + the releasable
        # cache (other streams' pools, the loss gap), so at the peak moment at least the first
        # two; the most of them is the peak
        assert c["phase_reserved_bytes"][c["peak_phase"]] >= at_peak + b["allocator_overhead"]
        assert c["peak_reserved_bytes"] == max(c["phase_reserved_bytes"].values())
        for phase, alloc in c["phase_allocated_bytes"].items():
            assert c["phase_reserved_bytes"][phase] >= alloc
        assert c["peak_allocated_bytes"] >= at_peak
        assert c["peak_allocated_bytes"] == max(c["phase_allocated_bytes"].values())
        assert c["device_used_bytes"] == (c["peak_reserved_bytes"] + b["cuda_context"]
                                          + b["nccl_buffers"])
        assert all(isinstance(v, int) for v in b.values())
    ddp = next(c for c in doc["candidates"] if c["strategy"] == "ddp")
    assert not ddp["fits"]  # 16 B/param x 13.0e9 = 208 GB of model states alone
    rec = doc["recommendation"]
    assert rec is not None and {"strategy", "offload", "checkpointing", "reasons"} <= rec.keys()


def test_nothing_fits_exits_3_and_says_how_many_gpus():
    r = run("--model", "llama3.1-405b", "--gpu", "h100-80", "--n", "8", "--json")
    assert r.exit_code == 3
    doc = json.loads(r.stdout)
    assert doc["recommendation"] is None
    # 405.85e9 params x 16 B = 6.49 TB of states alone; 8 x 80 GB cannot hold it
    assert doc["min_gpus"] is not None and doc["min_gpus"] > 8
    r = run("--model", "llama3.1-405b", "--gpu", "h100-80", "--n", "8")
    assert r.exit_code == 3 and f"needs {doc['min_gpus']} GPUs" in r.stdout


def test_min_gpus_answers_with_the_requests_own_options():
    """--find min-gpus and 'needs N GPUs' search with the given strategies, offload and
    checkpointing, so the plan at the answer fits (it used to force auto checkpointing and
    allow every offload: 'fewest GPUs = 1' and then 'does not fit')."""
    base = ("--model", "llama3-8b", "--gpu", "a10g", "--seq", "4096")
    for extra in (("--offload", "none"), ("--offload", "none", "--checkpointing", "full"),
                  ("--strategy", "full_shard", "--checkpointing", "selective")):
        r = run(*base, *extra, "--find", "min-gpus", "--json")
        doc = json.loads(r.stdout)
        n = doc["found"]["value"]
        assert r.exit_code == 0 and n is not None, (extra, r.output)
        at = json.loads(run(*base, *extra, "--n", str(n), "--json").stdout)
        assert at["recommendation"] is not None, extra
        # and one GPU fewer (a whole node fewer past one node) does not fit
        below = n - 1 if n <= 8 else n - 8
        if below >= 1:  # (nothing fits for sure; one at risk would exit 0 without reject)
            assert run(*base, *extra, "--n", str(below), "--at-risk",
                       "reject").exit_code == 3, (extra, below)
    # nothing fits on 8: the count offered is above 8, and the plan there fits
    r = run("--model", "llama3-70b", "--gpu", "h100-80", "--n", "8", "--strategy", "full_shard",
            "--offload", "none", "--json")
    need = json.loads(r.stdout)["min_gpus"]
    assert r.exit_code == 3 and need > 8
    assert run("--model", "llama3-70b", "--gpu", "h100-80", "--n", str(need), "--strategy",
               "full_shard", "--offload", "none").exit_code == 0


def test_one_gpu_is_plain_training():
    r = run("--model", "gpt2", "--gpu", "h100-80", "--n", "1", "--json")
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    ddp = next(c for c in doc["candidates"] if c["strategy"] == "ddp")
    assert ddp["breakdown_bytes"]["comm_buffers"] == 0
    assert ddp["breakdown_bytes"]["nccl_buffers"] == 0


def test_strategy_offload_checkpointing_flags():
    r = run("--model", "llama2-70b", "--gpu", "h100-80", "--n", "8", "--strategy", "zero3,full_shard",
            "--offload", "params_and_optimizer", "--checkpointing", "full", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [(c["strategy"], c["offload"], c["checkpointing"]) for c in doc["candidates"]] == [
        ("zero3", "params_and_optimizer", "full"), ("full_shard", "params_and_optimizer", "full")]


@pytest.mark.parametrize("value", ["-5", "0", "nan", "inf", "-inf", "abc"])
def test_bad_params(value):
    one_line_error(run("--params", value, *BASE), 2, "--params", value)


@pytest.mark.parametrize("flag", ["--n", "--micro-batch", "--seq", "--grad-accum"])
def test_zero_counts_are_usage_errors(flag):
    one_line_error(run("--params", "7e9", *BASE, flag, "0"), 2, flag, "0")


def test_unknown_gpu_lists_close_matches():
    one_line_error(run("--params", "7e9", "--gpu", "h100-8"), 2, "h100-8", "h100-80")


def test_unknown_model():
    one_line_error(run("--model", "llama2-8b", *BASE), 2, "llama2-8b")


def test_two_model_sources():
    one_line_error(run("--model", "gpt2", "--params", "7e9", *BASE), 2, "--params", "--model")


def test_no_model():
    one_line_error(run(*BASE), 2, "--params")


def test_bad_margin():
    one_line_error(run("--params", "7e9", *BASE, "--margin", "nan"), 2, "--margin", "nan")


def test_malformed_config_is_bad_data(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{ not json")
    one_line_error(run("--config", str(p), *BASE), 4, "JSON")


def test_config_missing_keys_are_named(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    one_line_error(run("--config", str(p), *BASE), 4, "num_hidden_layers")


def test_profile_missing_a_field_is_bad_data(tmp_path):
    from importlib.resources import files

    text = (files("hardware_profiles") / "h100-80.toml").read_text()
    lines = [ln for ln in text.splitlines() if not ln.startswith("memory_bytes")]
    p = tmp_path / "mygpu.toml"
    p.write_text("\n".join(lines))
    one_line_error(run("--params", "7e9", "--gpu", str(p)), 4, "memory_bytes")


def test_user_profile_file_works(tmp_path):
    from importlib.resources import files

    text = (files("hardware_profiles") / "h100-80.toml").read_text()
    p = tmp_path / "mygpu.toml"
    p.write_text(text.replace("id = \"h100-80\"", "id = \"mygpu\""))
    r = run("--params", "1e9", "--gpu", str(p), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["inputs"]["hardware"]["gpu"] == "mygpu"


def test_unknown_flag_is_one_line():
    one_line_error(run("--params", "7e9", *BASE, "--bogus"), 2, "--bogus")


def test_explicit_shape_and_overrides():
    r = run("--layers", "2", "--hidden", "256", "--heads", "4", "--vocab", "1000", *BASE, "--json")
    assert r.exit_code == 0, r.output
    m = json.loads(r.stdout)["inputs"]["model"]
    assert (m["layers"], m["hidden"], m["heads"], m["kv_heads"], m["vocab"], m["source"]) == (
        2, 256, 4, 4, 1000, "explicit")
    # Llama's ffn rule for 256: 2/3 * 4 * 256 = 682.7 -> next multiple of 256 = 768
    assert m["ffn"] == 768
    r = run("--model", "llama2-7b", "--layers", "16", *BASE, "--json")
    m = json.loads(r.stdout)["inputs"]["model"]
    assert m["layers"] == 16 and m["hidden"] == 4096


def cli_surface() -> dict[str, dict[str, str]]:
    """Every command's every option: its spellings and what it takes (flag, value, choices)."""
    import click

    ctx = click.Context(cli)
    out = {}
    for name in sorted(cli.list_commands(ctx)):
        cmd = cli.get_command(ctx, name)
        opts = {}
        for p in cmd.params:
            if not isinstance(p, click.Option):
                opts[f"<{p.name}>"] = "argument"
                continue
            key = "/".join(sorted(p.opts, key=len, reverse=True) + p.secondary_opts)
            kind = ("flag" if p.is_flag else "choice: " + "|".join(p.type.choices)
                    if isinstance(p.type, click.Choice) else "value")
            opts[key] = kind + (" (repeatable)" if p.multiple else "")
        out[name] = dict(sorted(opts.items()))
    return out


def test_cli_surface_is_frozen():
    """Flags are a contract other tools script against: every option of every command, its
    spellings, whether it takes a value and its choices, as tests/data/cli_surface.json holds
    them. A change here is deliberate: update the file in the same commit (and docs/cli.md)."""
    frozen = json.loads((Path(__file__).parent / "data" / "cli_surface.json").read_text())
    now = cli_surface()
    assert set(now) == set(frozen)
    for command in frozen:
        gone = {k: v for k, v in frozen[command].items() if now[command].get(k) != v}
        new = {k: v for k, v in now[command].items() if frozen[command].get(k) != v}
        assert (command, gone, new) == (command, {}, {})
    assert sum(len(v) for v in now.values()) >= 200  # every command is in the freeze


def test_help_and_lists():
    r = run("--help")
    assert r.exit_code == 0 and "--params" in r.stdout and "Exit codes" in r.stdout
    r = run("--list-gpus")
    assert r.exit_code == 0 and "h100-80" in r.stdout
    r = run("--list-models")
    assert r.exit_code == 0 and "llama3.1-405b" in r.stdout


def test_planner_path_imports_no_torch_or_pandas():
    import subprocess
    import sys

    code = ("import sys; from planner.cli import cli\n"
            "try:\n    cli.main(['--params','13e9','--gpu','h100-80','--n','8','--json'])\n"
            "except SystemExit: pass\n"
            "bad = [m for m in ('torch', 'pandas', 'numpy') if m in sys.modules]\n"
            "print('IMPORTED', bad, file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "IMPORTED []" in r.stderr


def _calibration(tmp_path, torch_version: str, **values) -> str:
    doc = {"schema_version": 1, "id": "h100-test", "gpu": {"profile": "h100-80", "name": "H100",
                                                           "memory_bytes": 85520809984},
           "versions": {"torch": torch_version, "cuda": "12.4", "driver": "550.54.15",
                        "nccl": "2.21.5"},
           "date": "2026-11-01", "values": {k: {"value": v} for k, v in values.items()}}
    p = tmp_path / "cal.json"
    p.write_text(json.dumps(doc))
    return str(p)


def test_calibration_file_replaces_the_runtime_terms(tmp_path):
    args = ("--model", "llama2-7b", "--gpu", "h100-80", "--n", "8", "--strategy", "full_shard",
            "--checkpointing", "full", "--json")
    raw = json.loads(run(*args, "--calibration", "none").stdout)
    assert raw["calibration"] is None
    # a context of exactly 1 GiB and reserved = 1.25 x allocated (no other allocator term here:
    # full checkpointing peaks at the optimizer step, where no step leftover applies)
    path = _calibration(tmp_path, "2.13.0", cuda_context_bytes=2**30, allocator_fragmentation=0.25)
    cal = json.loads(run(*args, "--calibration", path).stdout)
    assert cal["calibration"]["id"] == "h100-test"
    c = cal["candidates"][0]
    assert c["breakdown_bytes"]["cuda_context"] == 2**30
    assert c["breakdown_bytes"]["allocator_overhead"] == int(c["peak_allocated_bytes"] * 0.25)
    assert c["peak_allocated_bytes"] == raw["candidates"][0]["peak_allocated_bytes"]


def test_stale_calibration_warns_on_stderr(tmp_path):
    path = _calibration(tmp_path, "2.0.0", allocator_fragmentation=0.1)
    r = run("--model", "gpt2", "--gpu", "h100-80", "--calibration", path, "--json")
    assert r.exit_code == 0
    assert "stale" in r.stderr and "torch 2.0.0 (calibrated)" in r.stderr
    assert "stale" in json.loads(r.stdout)["calibration"]["stale"]


def test_bad_calibration_is_bad_data(tmp_path):
    p = tmp_path / "cal.json"
    p.write_text('{"schema_version": 1}')
    one_line_error(run("--model", "gpt2", "--gpu", "h100-80", "--calibration", str(p)), 4)
    one_line_error(run("--model", "gpt2", "--gpu", "h100-80", "--calibration", "nope.json"), 2,
                   "--calibration")


@pytest.mark.parametrize("args, code, needle", [
    (("--model", "llama3-8b", "--gpu", "h100-80", "--host-ram-gib", "1e308"), 2,
     "--host-ram-gib: must be in"),
    (("--model", "llama3-8b", "--gpu", "h100-80", "--seq", "9" * 4301), 2, "--seq: must be"),
    (("--model", "llama3-8b", "--gpu", "h100-80", "--hidden", "9" * 40), 2, "--hidden: must be"),
    (("--model", "llama3-8b", "--gpu", "h100-80", "--margin", "nan"), 2, "--margin: must be"),
    (("--params", "1e400", "--gpu", "h100-80"), 2, "--params: must be"),
    (("--model", "llama3-8b", "--gpu", "h100-80", "--strategy", ""), 2,
     "--strategy: give at least one strategy"),
])
def test_extreme_values_are_usage_errors(args, code, needle):
    one_line_error(run(*args), code, needle)


def test_bad_config_files_are_exit_4(tmp_path):
    import json as _json

    deep = {"model_type": "llava"}
    cur = deep
    for _ in range(900):
        cur["text_config"] = {"model_type": "llava"}
        cur = cur["text_config"]
    cases = {
        "huge.json": '{"model_type": "llama", "hidden_size": 1e308, "num_hidden_layers": 2, '
                     '"num_attention_heads": 2, "vocab_size": 10, "intermediate_size": 4}',
        "digits.json": '{"model_type": "llama", "hidden_size": ' + "9" * 4301 + "}",
        "nested.json": "[" * 100_000 + "]" * 100_000,
        "chain.json": _json.dumps(deep),
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        one_line_error(run("--config", str(tmp_path / name), "--gpu", "h100-80"), 4, name)


def test_mlp_override_on_a_preset():
    r = run("--model", "llama3-8b", "--gpu", "h100-80", "--mlp", "gelu", "--n", "8", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["inputs"]["model"]["mlp"] == "gelu"
    # two MLP matrices of the preset's width instead of three
    h, f, L = 4096, 14336, 32
    assert doc["inputs"]["model"]["params"] == 8_030_261_248 - L * h * f


def test_version_and_module_entry_point():
    import subprocess
    import sys

    from planner import __version__

    out = run("--version").stdout.strip()
    assert out == f"fitcheck (distribution fitcheck-planner) {__version__}"
    p = subprocess.run([sys.executable, "-m", "planner", "--version"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and __version__ in p.stdout


@pytest.mark.parametrize("width", [80, 100, 120])
def test_plan_fits_the_terminal(width, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(width))
    # calibration none: the shipped h100-80 calibration's assumption line names its file's
    # absolute path, which no wrapping can break (its length is the checkout's)
    out = run("--model", "llama2-13b", "--gpu", "h100-80", "--n", "8", "--calibration",
              "none").stdout
    assert max(len(line) for line in out.splitlines()) <= width
    for s in ("ddp", "full_shard", "zero3", "needs GiB", "fits", "step s", "recommendation:"):
        assert s in out


def test_wide_mode_has_every_term_one_format_per_column():
    out = run("--model", "llama2-13b", "--gpu", "h100-80", "--n", "8", "--wide").stdout
    for h in ("params", "grads", "optim", "gathered", "activ", "transient", "buffers", "runtime",
              "needs GiB", "reserved", "usable", "headroom", "step s", "tokens/s/GPU", "MFU",
              "exposed comm ms", "offload s", "vs DDP"):
        assert h in out, h
    speed = out[out.index("exposed comm ms"):].splitlines()[2:10]
    exposed = [row.split()[6] for row in speed]  # strategy offload ckpt step tok MFU exposed
    assert all(x.count(".") == 1 and len(x.split(".")[1]) == 1 for x in exposed), exposed


@pytest.mark.parametrize("words, cword, expect", [
    ("fitcheck --gp", 1, {"--gpu", "--gpus-per-node"}),
    ("fitcheck --gpu h100", 2, {"h100-80", "h100-nvl", "h100-pcie"}),
    ("fitcheck --model mixtral", 2, {"mixtral-8x7b"}),
    ("fitcheck --precision bf", 2, {"bf16", "bf16-amp"}),
    ("fitcheck rep", 1, {"report"}),
])
def test_shell_completion(words, cword, expect, monkeypatch):
    monkeypatch.setenv("COMP_WORDS", words)
    monkeypatch.setenv("COMP_CWORD", str(cword))
    r = CliRunner().invoke(cli, [], env={"_FITCHECK_COMPLETE": "bash_complete",
                                         "COMP_WORDS": words, "COMP_CWORD": str(cword)},
                           prog_name="fitcheck")
    got = {line.split(",", 1)[1] for line in r.stdout.splitlines() if "," in line}
    assert expect <= got, (words, got)


ECHO = {  # registry path -> where --json's "inputs" says what was planned with it
    "model.params": "model.params", "model.preset": "model.name", "model.config": "model.source",
    "model.approximate": "model.source", "model.layers": "model.layers",
    "model.hidden": "model.hidden", "model.heads": "model.heads",
    "model.kv_heads": "model.kv_heads", "model.ffn": "model.ffn", "model.vocab": "model.vocab",
    "model.tied_embeddings": "model.tied_embeddings", "model.mlp": "model.mlp",
    "model.experts": "model.experts", "model.experts_per_token": "model.experts_per_token",
    "training.global_batch": "global_batch", "training.loss": "training.loss",
    "training.fsdp_version": "training.fsdp_version", "finetune.freeze": "finetune.freeze_layers",
    "parallel.tp": "tp", "parallel.cp": "cp", "parallel.cp_rotate": "cp_rotate",
    "parallel.cp_kv": "cp_kv",
    "parallel.ep": "ep", "parallel.ep_imbalance": "ep_imbalance",
    "parallel.mesh": "mesh",
    "parallel.pp": "pp.degree", "parallel.pp_schedule": "pp.schedule",
    "parallel.pp_microbatches": "pp.microbatches",
    "parallel.pp_virtual_stages": "pp.virtual_stages",
    "parallel.pp_kept_outputs": "pp.kept_outputs", "hardware.gpu": "hardware.gpu",
    "hardware.n": "hardware.n_gpus",
    "hardware.gpus_per_node": "hardware.gpus_per_node",
    "hardware.host_ram_gib": "hardware.host_ram_bytes_per_node", "strategy": "strategies",
    "offload": "offload", "checkpointing": "checkpointing", "margin": "margin",
    "calibration": "calibration",
}
"""The fields whose echo is not at their own path (the rest: training.X, finetune.X,
deepspeed.X under the same key)."""


def test_json_inputs_echo_every_registry_field():
    from planner.fields import FIELDS

    r = run("--model", "llama3-8b", "--gpu", "h100-80", "--n", "8", "--json",
            "--ds-reduce-bucket-size", "auto", "--calibration", "none")
    doc = json.loads(r.stdout)
    missing = []
    for f in FIELDS:
        where = ECHO.get(f.path, f.path)
        if where == "calibration":
            node = doc  # the calibration applied (null: none) sits beside the inputs
        else:
            node = doc["inputs"]
        for key in where.split("."):
            if not isinstance(node, dict) or key not in node:
                missing.append(f.path)
                break
            node = node[key]
    assert missing == []
    # "auto" is resolved from the model as the HF integration does: hidden x hidden
    assert doc["inputs"]["deepspeed"]["reduce_bucket_size"] == 4096 * 4096
    assert doc["inputs"]["deepspeed"]["offload_device"] == "cpu"


def _keys(node, out: set[str]) -> set[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            out.add(k)
            _keys(v, out)
    elif isinstance(node, list):
        for v in node:
            _keys(v, out)
    return out


def test_json_schema_is_the_documented_one():
    """Every key --json writes is in docs/cli.md's schema block, and the top level is exactly
    the documented one (a job, a --find answer, a calibration and nothing-fits each add
    theirs; the example covers the keys a plain plan writes)."""
    import re

    doc_text = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    block = doc_text.split("## JSON schema", 1)[1].split("```", 2)[1]
    documented = set(re.findall(r"[a-z_][a-z0-9_]*", block))
    for args in (("--model", "llama3-8b", "--gpu", "h100-80", "--n", "8"),
                 ("--model", "llama3-70b", "--gpu", "h100-80", "--n", "1", "--find",
                  "min-gpus", "--lora-rank", "16")):
        doc = json.loads(run(*args, "--json").stdout)
        assert set(doc) == {"schema_version", "inputs", "candidates", "recommendation",
                            "calibration", "min_gpus", "found", "skipped", "assumptions",
                            "warnings"}
        undocumented = sorted(_keys(doc, set()) - documented)
        assert undocumented == []


@pytest.mark.parametrize("path, raw, given", [
    ("parallel.pp", "1", False), ("parallel.pp", "2", True), ("parallel.cp", "1", False),
    ("parallel.ep_imbalance", "1.0", False), ("parallel.ep_imbalance", "1", False),
    ("parallel.ep_imbalance", "1.5", True),
    ("parallel.tp", "1", False), ("parallel.tp", "auto", False), ("parallel.tp", "2", True),
    ("parallel.mesh", "given", False), ("parallel.mesh", "auto", True),
])
def test_from_trace_counts_only_options_that_change_the_plan(path, raw, given):
    """--from-trace refuses the parallel and fine-tuning options it does not trace, but not
    their defaults however spelled (the field's own check reads both), nor --tp 1 (no TP)."""
    from planner.cli import _changes
    from planner.fields import BY_PATH

    assert _changes(BY_PATH[path], raw) is given
