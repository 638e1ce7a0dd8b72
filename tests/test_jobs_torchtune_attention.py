"""The attention a torchtune job runs is torchtune's own, not transformers' default for the
model's family (the assumption line said "transformers default for llama" before).

Read off torchtune bd2a0fc7: ``MultiHeadAttention`` (modules/attention.py:140, :292) calls
``_sdpa_or_flex_attention()`` (modules/attention_utils.py:185-250): torch's
``scaled_dot_product_attention``, or ``flex_attention`` when the collate passes a packed
``BlockMask``; both keep the output and the logsumexp (fitcheck's sdpa). Gemma-2's
``Gemma2Attention`` (models/gemma2/_attention.py:299-340) computes q·kᵀ, softmax and ·v as
eager ops (fitcheck's eager) and refuses a BlockMask (:218-222)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import one_line_error, run

DATA = Path(__file__).parent / "data" / "jobs"
FULL = "torchtune_llama3_1_8B_full.yaml"
GEMMA2 = {"torchtune.models.llama3_1.llama3_1_8b": "torchtune.models.gemma2.gemma2_9b"}


def edited(tmp_path: Path, replace: dict[str, str]) -> str:
    text = (DATA / FULL).read_text()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / FULL
    path.write_text(text)
    return str(path)


def _plan(*args: str) -> dict:
    r = run("--gpu", "h100-80", "--n", "8", *args, "--json")
    assert r.exit_code in (0, 3), (r.exit_code, r.stderr)
    return json.loads(r.stdout)


def _attention_line(doc: dict) -> str:
    (line,) = [a for a in doc["assumptions"] if a.startswith("attention:")]
    return line


def test_torchtune_runs_its_own_sdpa():
    doc = _plan("--job", str(DATA / FULL))
    line = _attention_line(doc)
    assert line.startswith("attention: sdpa (torchtune's MultiHeadAttention: torch's "
                           "scaled_dot_product_attention")
    assert "transformers default" not in line and "_sdpa_or_flex_attention" in line
    # the user's --attention replaces the job's, reason included
    given = _plan("--job", str(DATA / FULL), "--attention", "eager")
    assert _attention_line(given) == "attention: eager (given)"


def test_packed_torchtune_runs_flex_attention_planned_as_sdpa(tmp_path):
    doc = _plan("--job", edited(tmp_path, {"  packed: False": "  packed: True"}))
    line = _attention_line(doc)
    assert line.startswith("attention: sdpa (torchtune's MultiHeadAttention with "
                           "dataset.packed: flex_attention")
    # the same memory and step time as the unpacked job: both keep output + logsumexp
    unpacked = _plan("--job", str(DATA / FULL))
    assert doc["candidates"] == unpacked["candidates"]


def test_torchtune_gemma2_is_eager_and_refuses_packing(tmp_path):
    doc = _plan("--job", edited(tmp_path, GEMMA2))
    assert _attention_line(doc).startswith("attention: eager (torchtune's Gemma2Attention")
    assert doc["inputs"]["training"]["attention"] == "eager"
    # the plan is the one --attention eager gives (the memory model's eager, T x T kept)
    flags = _plan("--job", edited(tmp_path, GEMMA2), "--attention", "eager")
    assert doc["candidates"] == flags["candidates"]
    sdpa = _plan("--job", edited(tmp_path, GEMMA2), "--attention", "sdpa")
    assert sdpa["candidates"] != doc["candidates"]
    r = run("--gpu", "h100-80", "--n", "8", "--job",
            edited(tmp_path, {**GEMMA2, "  packed: False": "  packed: True"}))
    one_line_error(r, 4, "dataset.packed", "Block masks are not implemeted yet")
