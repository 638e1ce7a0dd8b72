"""What every reader shares: typed access to the document with errors naming the file and key,
recording values with their source, model ids, optimizer names and LoRA targets."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from planner import validate
from planner.jobs.record import (
    Fallback,
    Job,
    JobError,
    JobFormat,
    Source,
    Unmodelled,
    Vocab,
    finish,
)

MISSING = object()
MAX_COUNT = 1 << 30
MAX_REFERENCE_DEPTH = 3
"""A job config may name another (a recipe its DeepSpeed JSON, a spec its job config), that one
a third; no further."""


def show(v: Any) -> str:
    return validate._show(v)


class Reader:
    """One file being read: the document, and what it says so far."""

    def __init__(self, doc: Any, name: str, fmt: JobFormat, base_dir: str | None,
                 depth: int = 0, *, read_job: Callable[..., Job] | None = None,
                 read_doc: Callable[..., Job] | None = None) -> None:
        self.doc = doc
        self.read_job = read_job
        """planner.jobs.read_job, for the files this one names (given by the caller, so that
        no reader imports the package that imports the readers)."""
        self.read_doc = read_doc
        """planner.jobs.read_doc, for a document this one carries (a manifest's spec)."""
        self.name = name
        self.fmt = fmt
        self.base_dir = base_dir
        self.depth = depth
        self.raw: dict[str, Any] = {}
        self.sources: dict[str, Source] = {}
        self.fallbacks: dict[str, Fallback] = {}
        self.warnings: list[str] = []
        self.layout = ""
        self.unresolved: Source | None = None
        self.peers: list[Job] = []
        """Files this one names whose settings combine with its own (a DeepSpeed JSON)."""
        self.bases: list[Job] = []
        """Files this one names and overrides (the job config a spec names)."""
        self.tops: list[Job] = []
        """Specs this one carries that override it (a manifest's fitcheck.io/spec)."""
        self.defaulted: dict[str, list[str]] = {}
        """Framework defaults applied for keys the file leaves out, per framework label."""

    # ---- errors and access --------------------------------------------------------------

    def fail(self, key: str, message: str) -> JobError:
        return JobError(f"{self.name}: {key}: {message}")

    def get(self, *keys: str, doc: Any = MISSING) -> Any:
        """doc[k1][k2]... or MISSING (a non-mapping on the way is an error naming it)."""
        node = self.doc if doc is MISSING else doc
        for i, k in enumerate(keys):
            if not isinstance(node, Mapping):
                raise self.fail(".".join(keys[:i]) or "file",
                                f"must be a mapping, got {validate._type(node)}")
            if k not in node:
                return MISSING
            node = node[k]
        return node

    def mapping(self, value: Any, key: str) -> Mapping[str, Any]:
        if value is MISSING or value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(key, f"must be a mapping, got {validate._type(value)} {show(value)}")
        return value

    def count(self, value: Any, key: str, *, auto: bool = False, zero: bool = False) -> int | None:
        """A positive whole number; None for null (and for "auto" when allowed)."""
        if value is None or value is MISSING:
            return None
        if auto and isinstance(value, str) and value.strip().lower() == "auto":
            return None
        if zero and value in (0, "0"):
            return 0
        try:
            return validate.count(value, limit=MAX_COUNT)
        except ValueError as exc:
            extra = ' or "auto"' if auto else ""
            raise self.fail(key, f"{exc}{extra}") from None

    def degree(self, value: Any, key: str) -> int | None:
        """A parallel degree: a positive integer, -1 for 'the rest' (None), missing = None."""
        if value is MISSING or value is None or value in (-1, "-1"):
            return None
        return self.count(value, key)

    def boolean(self, value: Any, key: str, *, auto: bool = False) -> bool | None:
        if value is None or value is MISSING:
            return None
        if auto and isinstance(value, str) and value.strip().lower() == "auto":
            return None
        try:
            return validate.boolean(value)
        except ValueError as exc:
            raise self.fail(key, f"{exc}{' or auto' if auto else ''}") from None

    def text(self, value: Any, key: str) -> str | None:
        if value is None or value is MISSING:
            return None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            raise self.fail(key, f"must be a string, got {validate._type(value)} {show(value)}")
        return value.strip() or None

    def choose(self, value: Any, key: str, table: Mapping[str, Any]) -> Any:
        """table[value] (case-insensitive); an unknown value is an error listing the known."""
        text = self.text(value, key)
        if text is None:
            return None
        for k, v in table.items():
            if k.lower() == text.lower():
                return v
        raise self.fail(key, f"unknown value {show(value)}; expected one of "
                        f"{', '.join(table)}")

    # ---- recording ----------------------------------------------------------------------

    def set(self, path: str, value: Any, key: str) -> None:
        """The file says ``path`` = value (at ``key``). The same field from two keys of one
        file must agree."""
        if value is None:
            return
        if path in self.raw:
            old = self.raw[path]
            a = old.value if isinstance(old, Vocab) else old
            b = value.value if isinstance(value, Vocab) else value
            if a != b:
                raise JobError(f"{self.name}: {self.sources[path].key} says {show(a)} but {key} "
                               f"says {show(b)} ({path}); make them agree")
            return
        self.raw[path] = value
        self.sources[path] = Source(self.name, key)

    def replace(self, path: str, value: Any, key: str) -> None:
        """A later key of the file decides ``path`` (FSDP2's reshard_after_forward over the
        FSDP1 sharding strategy)."""
        self.raw.pop(path, None)
        self.set(path, value, key)

    def fallback(self, path: str, value: Any, note: str) -> None:
        self.fallbacks.setdefault(path, Fallback(value, note))

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    # ---- the framework's key table (planner/jobs/keys.py) -------------------------------

    def audit(self, table: str, doc: Any = MISSING, *, prefix: str = "",
              skip: tuple[str, ...] = ()) -> None:
        """Every key of ``doc`` (default: the file) that its framework's table says is not
        modelled, and every key the table does not know: one line each, never dropped."""
        from planner.jobs.keys import table as load

        tab = load(table)
        node = self.doc if doc is MISSING else doc
        if not isinstance(node, Mapping):
            return
        from planner.jobs.keys import walk

        for f in walk(tab, node, prefix, frozenset(skip)):
            line = f.line(self.name, tab)
            if f.warning:
                self.warn(line)
                continue
            path = f"{tab.name}:{f.key}"
            self.raw[path] = Unmodelled(f.value, line)
            self.sources[path] = Source(self.name, f.key)

    def label(self, table: str) -> str:
        """'TRL 1.16.0': the framework and version a table describes."""
        from planner.jobs.keys import table as load

        return load(table).label

    def probability(self, value: Any, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise self.fail(key, f"must be a probability in [0, 1), got {show(value)}")
        return float(value)

    def default(self, table: str, key: str, value: Any = MISSING) -> Any:
        """``value`` when the file gives it; else the framework's default for ``key`` (from its
        table, at the table's version), noted for the assumptions block."""
        if value is not MISSING and value is not None:
            return value
        from planner.jobs.keys import NO_DEFAULT
        from planner.jobs.keys import table as load

        tab = load(table)
        d = tab.default(key)
        if d is NO_DEFAULT:
            return None if value is MISSING else value
        from planner.jobs.keys import shown

        self.defaulted.setdefault(tab.label, []).append(f"{key} {shown(d)}")
        return d

    def job(self) -> Job:
        from planner.jobs.record import merge, overlay

        for label, keys in self.defaulted.items():
            self.warn(f"{self.name}: {label} defaults for what the file leaves out: "
                      f"{', '.join(dict.fromkeys(keys))}")
        self.defaulted = {}
        own = finish(Job(format=self.fmt, path=self.name, values={}, warnings=[],
                         said=self.warnings,
                         unmodelled=[], layout=self.layout, raw=self.raw, sources=self.sources,
                         fallbacks=self.fallbacks, files=(self.name,),
                         unresolved_model=self.unresolved))
        for peer in self.peers:
            own = merge(own, peer)
        for base in self.bases:
            own = overlay(base, own)
        for top in self.tops:
            own = overlay(own, top, primary=own)
        return own

    # ---- references to other files ------------------------------------------------------

    def find(self, ref: str) -> str | None:
        """A path named in the file: relative to the file's folder, else to the working
        directory (where the launcher runs); None when neither exists."""
        ref = os.path.expanduser(ref)
        tries = [ref] if os.path.isabs(ref) else [
            *([os.path.join(self.base_dir, ref)] if self.base_dir else []), ref]
        for p in tries:
            if os.path.isfile(p):
                return os.path.abspath(p)
        return None

    def reference(self, ref: Any, key: str, fmt: JobFormat | None) -> Job | None:
        """Read the job file the document names at ``key`` (a missing file is a warning)."""
        from planner.jobs.pyconfig import split_name

        text = self.text(ref, key)
        if text is None:
            return None
        if self.depth >= MAX_REFERENCE_DEPTH:
            raise self.fail(key, f"references nested more than {MAX_REFERENCE_DEPTH} deep")
        file, function = split_name(text)
        path = self.find(file)
        if path is None:
            self.warn(f"{self.name}: {key} names {text!r}, which is not found next to the file "
                      "or in the working directory: its settings are not read")
            return None
        if function is not None:
            path = f"{path}:{function}"
        return self.read_job(path, fmt, depth=self.depth + 1)

    # ---- shared vocabularies ------------------------------------------------------------

    def model(self, ident: Any, key: str) -> None:
        """A model named by hub id, local checkpoint folder or config.json -> model.preset or
        model.config; anything else is recorded as unresolved (the user must give one)."""
        from planner.presets import resolve_name

        text = self.text(ident, key)
        if text is None:
            return
        local = self.find(os.path.join(text, "config.json")) if not text.endswith(".json") \
            else self.find(text)
        if local is not None:
            self.set("model.config", local, key)
            return
        parts = [p for p in text.replace("\\", "/").split("/") if p and p != "."]
        candidates = [text] + (["/".join(parts[-2:]), parts[-1]] if len(parts) > 2 else [])
        for c in candidates:
            preset = resolve_name(c)
            if preset is not None:
                self.set("model.preset", preset, key)
                if preset.lower() != text.lower():
                    self.warn(f"{self.name}: {key} {text!r} read as fitcheck's {preset} preset")
                return
        self.unresolved = Source(self.name, f"{key} {text!r}")

    def optimizer(self, name: Any, key: str) -> None:
        """An HF / axolotl optimizer name -> training.optimizer (+ optimizer_impl)."""
        text = self.text(name, key)
        if text is None:
            return
        low = text.lower()
        kind, impl = OPTIMIZERS.get(low, (Vocab(low.replace("_", "-")), None))
        self.set("training.optimizer", kind, key)
        self.set("training.optimizer_impl", impl, key)
        if low.startswith("paged_"):
            self.warn(f"{self.name}: {key} {text!r} is paged: its state may spill to host RAM "
                      "under pressure; sized as if it stays on the GPU")

    def sgd_momentum(self, momentum: Any, key: str) -> None:
        """torch.optim.SGD with a momentum keeps ``momentum_buffer`` per parameter
        (torch/optim/sgd.py ``_init_group``; momentum 0, the default, keeps none): a job's SGD
        with momentum != 0 is sgd-momentum."""
        if momentum is None or self.raw.get("training.optimizer") != "sgd":
            return
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)):
            raise self.fail(key, f"must be a number, got {momentum!r}")
        if momentum != 0:
            self.replace("training.optimizer", "sgd-momentum", key)

    def lora_targets(self, value: Any, key: str) -> None:
        """peft-style target module names -> finetune.lora_targets (fitcheck's names)."""
        if value is None or value is MISSING:
            return
        if isinstance(value, str) and value.strip().lower() in ("all-linear", "all"):
            self.set("finetune.lora_targets", ALL_LINEAR, key)
            return
        if isinstance(value, str) and any(c in value for c in "[]()|*+?\\^$"):
            targets, some = regex_targets(value, key, self.name)
            self.set("finetune.lora_targets", targets, key)
            if some:
                self.warn(f"{self.name}: {key} matches {','.join(some)} on some layers only: "
                          "planned on every layer (an upper bound)")
            return
        names = value if isinstance(value, list) else [value]
        out: list[str] = []
        fused: list[str] = []
        for n in names:
            t = self.text(n, key) or ""
            last = t.split(".")[-1].lower()
            if last in FUSED:  # one module holding several projections
                fused.append(t)
                out.extend(FUSED[last])
                continue
            short = LORA_NAMES.get(last)
            out.append(short or t)
        self.set("finetune.lora_targets", tuple(dict.fromkeys(out)), key)
        if fused:
            self.warn(f"{self.name}: {key} {', '.join(fused)}: fused projections read as "
                      f"their parts ({','.join(dict.fromkeys(out))}): the adapters are planned "
                      "a little larger than they are")


# A text model's linear modules as Hugging Face names them, under the prefixes its decoder has
# in a causal LM and in a vision-language model
PREFIXES = ("model.layers", "model.language_model.layers", "model.text_model.layers",
            "language_model.model.layers", "model.model.layers")
MODULES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
           "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
           "down": "mlp.down_proj"}
LAYERS = range(128)


def regex_targets(pattern: str, key: str,
                  name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A single target_modules string is a regular expression PEFT full-matches against each
    module's name (peft tuners_utils.check_target_module_exists): (the decoder's linear
    modules it matches in any layer, those it matches in some layers only), under the first
    naming that matches any."""
    import re

    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise JobError(f"{name}: {key}: {show(pattern)} is not a regular expression ({exc})") \
            from None
    for prefix in PREFIXES:
        hits = {t: sum(1 for i in LAYERS if rx.fullmatch(f"{prefix}.{i}.{m}"))
                for t, m in MODULES.items()}
        if any(hits.values()):
            return (tuple(t for t, n in hits.items() if n),
                    tuple(t for t, n in hits.items() if 0 < n < len(LAYERS)))
    raise JobError(f"{name}: {key}: the regular expression {show(pattern)} matches none of a "
                   "decoder's linear modules (model.layers.N.self_attn.q_proj, ...): give "
                   "--lora-targets")


# HF TrainingArguments.optim / axolotl optimizer -> (fitcheck optimizer, implementation)
OPTIMIZERS: dict[str, tuple[Any, Any]] = {
    "adamw_torch": ("adamw", "foreach"),
    "adamw_torch_fused": ("adamw", "fused"),
    "adamw_apex_fused": ("adamw", "fused"),
    "adamw_hf": ("adamw", "for-loop"),
    "adamw": ("adamw", None),
    "adam": ("adam", None),
    "adamw_bnb_8bit": ("adamw-8bit", None),
    "adamw_8bit": ("adamw-8bit", None),
    "paged_adamw_8bit": ("adamw-8bit", None),
    "adamw_torch_8bit": ("adamw-8bit", None),
    "ao_adamw_8bit": ("adamw-8bit", None),
    "paged_adamw_32bit": ("adamw", None),
    "adafactor": ("adafactor", None),
    "sgd": ("sgd", None),
    "lion_32bit": ("lion", None),
    "paged_lion_32bit": ("lion", None),
}
LORA_NAMES = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate",
              "up_proj": "up", "down_proj": "down", "query": "q", "key": "k", "value": "v",
              "dense": "o", "q": "q", "k": "k", "v": "v", "o": "o", "gate": "gate", "up": "up",
              "down": "down"}
# Fused projections under the names model families give them (PEFT matches the module name):
# GPT-2 c_attn / c_fc / c_proj (attention's and the MLP's output), GPT-NeoX/Falcon/BLOOM
# query_key_value and dense_h_to_4h / dense_4h_to_h, MPT/Replit Wqkv and mlp_up / mlp_down,
# Phi-3 qkv_proj and gate_up_proj
FUSED = {"wqkv": ("q", "k", "v"), "qkv_proj": ("q", "k", "v"), "qkv": ("q", "k", "v"),
         "query_key_value": ("q", "k", "v"), "c_attn": ("q", "k", "v"),
         "gate_up_proj": ("gate", "up"), "c_proj": ("o", "down")}
LORA_NAMES.update({"mlp_up": "up", "mlp_down": "down", "c_fc": "up", "fc1": "up",
                   "fc2": "down", "dense_h_to_4h": "up", "dense_4h_to_h": "down",
                   "out_proj": "o", "wo": "o", "wq": "q", "wk": "k", "wv": "v"})
ALL_LINEAR = ("q", "k", "v", "o", "gate", "up", "down")
PRECISIONS = {"no": "fp32", "fp32": "fp32", "fp16": "fp16-amp", "bf16": "bf16-amp"}
"""accelerate's mixed_precision."""


def unread_cp(r: Reader, degree: int, key: str, how: str) -> Unmodelled:
    """A context-parallel degree the planner does not take: fitcheck --cp models torch's
    ``context_parallel`` as torchtitan wires it (planner/context_parallel.py), and ``how``
    says why this framework's is not that."""
    return Unmodelled(degree, f"context parallel degree {degree} ({r.name} {key}) is not "
                      f"modelled: fitcheck --cp models torch's context_parallel as torchtitan "
                      f"wires it; {how}")


def unread_ep(r: Reader, degree: int, key: str, how: str) -> Unmodelled:
    """An expert-parallel degree the planner does not take: fitcheck --ep models torchtitan's
    EP (planner/expert_parallel.py), and ``how`` says why this framework's is not that."""
    return Unmodelled(degree, f"expert parallel degree {degree} ({r.name} {key}) is not "
                      f"modelled: fitcheck --ep models torchtitan's expert parallel; {how}")
