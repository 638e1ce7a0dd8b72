"""Never a silent key: every key of every framework's schema is classified in its table
(planner/data/job_keys_*.json), the tables are well formed, and the audit turns a file's keys
into NOT MODELLED lines, warnings or nothing as the table says.

The key lists are the frameworks' own: tests/data/jobs/schemas/*.txt were written from each
framework's source at the version the file names (tests/data/jobs/schemas/extract.py); where
the framework is installed (transformers) its schema is also read live."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from planner.fields import BY_PATH
from planner.jobs.keys import NO_DEFAULT, TABLES, Kind, at_default, table, walk

SCHEMAS = Path(__file__).parent / "data" / "jobs" / "schemas"
SNAPSHOTS = {  # snapshot file -> the tables whose keys it must be in
    "deepspeed-0.19.8.txt": "deepspeed",
    "accelerate-1.15.0.txt": "accelerate",
    "transformers-4.57.1.txt": "transformers",
    "trl-1.16.0.txt": "trl",
    "llamafactory-0.9.5.txt": "llamafactory",
    "llamafactory_v1-ff6d4d12.txt": "llamafactory_v1",
    "axolotl-0.19.0.txt": "axolotl",
    "litgpt-0.5.13.txt": "litgpt",
    "torchtune-bd2a0fc7.txt": "torchtune",
    "torchtitan-0.3.0-b5bcd76c.txt": "torchtitan",
}


def snapshot_keys(name: str) -> list[str]:
    keys = []
    for line in (SCHEMAS / name).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key = line.split("\t")[0]
            assert key and " " not in key, (name, line)
            keys.append(key)
    return sorted(set(keys))


def classified(tab, key: str) -> bool:
    """The key, or an open entry above it, is in the table."""
    parts = key.split(".")
    for i in range(len(parts), 0, -1):
        k = tab.get(".".join(parts[:i]))
        if k is not None and (i == len(parts) or k.open):
            return True
    return False


@pytest.mark.parametrize("snapshot", sorted(SNAPSHOTS))
def test_every_key_of_the_framework_schema_is_classified(snapshot):
    tab = table(SNAPSHOTS[snapshot])
    missing = [k for k in snapshot_keys(snapshot) if not classified(tab, k)]
    assert not missing, f"{SNAPSHOTS[snapshot]}: not classified: {missing}"


def test_the_installed_transformers_training_arguments_are_classified():
    transformers = pytest.importorskip("transformers")
    fields = [f.name for f in dataclasses.fields(transformers.TrainingArguments)]
    for name in ("transformers", "trl", "llamafactory"):
        tab = table(name)
        missing = [f for f in fields if tab.get(f) is None]
        assert not missing, (name, transformers.__version__, missing)


@pytest.mark.parametrize("name", TABLES)
def test_tables_are_well_formed(name):
    doc = json.loads((Path(__file__).resolve().parent.parent / "planner" / "data" /
                      f"job_keys_{name}.json").read_text())
    assert {"framework", "version", "source", "keys"} <= set(doc)
    tab = table(name)
    assert tab.keys
    for key in tab.keys.values():
        if key.kind is Kind.FIELD:
            # a fitcheck field, a path the registry will have (parallel.cp: NOT MODELLED until
            # then), or '-' for a key that decides how others are read
            assert key.field, key.name
        if key.kind is Kind.MEMORY:
            assert key.what, key.name
        if key.kind is Kind.IRRELEVANT:
            assert not key.what
    # a section's own keys are listed under it
    for key in tab.keys.values():
        if key.kind is Kind.SECTION:
            assert tab.has_children(key.name), key.name


@pytest.mark.parametrize("name", TABLES)
def test_every_key_read_as_a_field_is_read_by_the_reader(name):
    """A key the table says is read: its name appears in the reader that reads it (a key
    classified as read and then forgotten would be a silent key)."""
    readers = {"deepspeed": ["deepspeed"], "accelerate": ["accelerate"],
               "transformers": ["trainer", "accelerate"], "trl": ["trl", "trainer", "accelerate"],
               "llamafactory": ["llamafactory", "trainer", "accelerate"],
               "llamafactory_v1": ["llamafactory"], "axolotl": ["axolotl", "trainer", "accelerate"],
               "litgpt": ["litgpt"], "torchtune": ["torchtune"], "torchtitan": ["torchtitan"]}
    root = Path(__file__).resolve().parent.parent / "planner" / "jobs" / "readers"
    src = "".join((root / f"{r}.py").read_text() for r in readers[name]) + (
        root / "common.py").read_text()
    missing = []
    for key in tab_fields(name):
        last = key.split(".")[-1]
        base = last.removeprefix("fsdp_").removeprefix("parallelism_config_")
        names = {last, base, base.removesuffix("_size")}
        if table(name).get(key).field.startswith("deepspeed.") and name == "deepspeed":
            continue  # zero(): every zero_optimization knob the table maps to deepspeed.*
        if not any(f'"{n}' in src or f"'{n}" in src or f" {n}" in src for n in names):
            missing.append(key)
    assert not missing, (name, missing)


def tab_fields(name: str) -> list[str]:
    return [k.name for k in table(name).keys.values() if k.kind is Kind.FIELD]


def test_field_paths_are_the_registry_or_named_not_modelled():
    from planner.jobs.record import WORDS

    for name in TABLES:
        for key in table(name).keys.values():
            if key.kind is Kind.FIELD and key.field not in ("-",):
                assert key.field in BY_PATH or key.field in WORDS or \
                    key.field.startswith("deepspeed."), (name, key.name, key.field)


# ---------------------------------------------------------------------------------------------
# The audit


def test_defaults_and_neutral_values_say_nothing():
    tab = table("axolotl")
    k = tab.get("tensor_parallel_size")
    assert k.kind is Kind.FIELD
    cp = table("torchtitan").get("parallelism.expert_tensor_parallel_degree")
    assert at_default(cp, 1) and not at_default(cp, 2)
    ds = table("deepspeed")
    assert at_default(ds.get("zero_optimization.zero_hpz_partition_size"), 1)
    assert not at_default(ds.get("zero_optimization.zero_hpz_partition_size"), 8)
    assert at_default(ds.get("bf16.bf16_master_weights_and_grads"), "false")
    assert at_default(ds.get("pipeline"), {"enabled": False})
    assert ds.get("wandb").default is NO_DEFAULT


def test_walk_names_the_not_modelled_the_unknown_and_nothing_else():
    tab = table("deepspeed")
    doc = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10, "_comment": "x",
           "bf16": {"enabled": True, "immediate_grad_update": True,
                    "check_grad_overflow": False},
           "zero_optimization": {"stage": 3, "zero_quantized_nontrainable_weights": True,
                                 "nonsense": 1},
           "wandb": {"enabled": True, "project": "p"}, "comms_config": {"x": 1}}
    found = {f.key: f for f in walk(tab, doc)}
    assert set(found) == {"bf16.immediate_grad_update",
                          "zero_optimization.zero_quantized_nontrainable_weights",
                          "zero_optimization.nonsense", "comms_config"}
    assert found["bf16.immediate_grad_update"].known
    assert not found["zero_optimization.nonsense"].known
    assert not found["zero_optimization.nonsense"].ignored  # DeepSpeed's pydantic forbids it
    assert found["comms_config"].ignored  # DeepSpeed ignores unknown top-level keys
    line = found["zero_optimization.zero_quantized_nontrainable_weights"].line("ds.json", tab)
    assert line == ("ZeRO++ quantized frozen weights (ds.json "
                    "zero_optimization.zero_quantized_nontrainable_weights: true) is not "
                    "modelled yet")


def test_markdown_lists_every_table():
    from planner.jobs.keydoc import markdown

    text = markdown()
    for name in TABLES:
        assert f"### {table(name).label}" in text
