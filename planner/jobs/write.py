"""Write the recommendation back into the job's own file (docs/jobs.md, "Writing the job
back").

Each format can say some of strategy x offload x checkpointing and not the rest: a DeepSpeed
JSON its stage and offload but not activation checkpointing, an accelerate FSDP config all
three but not selective checkpointing. ``recommend`` plans over what the format can say (the
flags the user gave stay fixed), ``rewrite`` changes only the lines that say it, and checks by
reading the result back that it asks for exactly the recommended candidate.
"""

from __future__ import annotations

import difflib
import os
import tempfile
from collections.abc import Iterable
from typing import Any

from planner.jobs.edit import json_set, toml_set, yaml_set
from planner.jobs.record import Job, JobError, JobFormat
from planner.lazy_dataclass import dataclass
from planner.spec import Candidate, Checkpointing, Offload, Strategy

FSDP1 = (Strategy.NO_SHARD, Strategy.SHARD_GRAD_OP, Strategy.FULL_SHARD, Strategy.HYBRID_SHARD)
FSDP2 = (Strategy.SHARD_GRAD_OP, Strategy.FULL_SHARD)
ZERO = (Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3)
NO_SELECTIVE = (Checkpointing.NONE, Checkpointing.FULL)
ALL_MODES = (Checkpointing.NONE, Checkpointing.SELECTIVE, Checkpointing.FULL)
FSDP_NAMES = {Strategy.FULL_SHARD: "FULL_SHARD", Strategy.SHARD_GRAD_OP: "SHARD_GRAD_OP",
              Strategy.NO_SHARD: "NO_SHARD", Strategy.HYBRID_SHARD: "HYBRID_SHARD"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Knobs:
    """What a job file can say: the strategies, offloads and checkpointing modes to choose
    among (empty: the file cannot say it; it stays as the job has it)."""

    strategies: tuple[Strategy, ...] = ()
    offloads: tuple[Offload, ...] = ()
    checkpointing: tuple[Checkpointing, ...] = ()
    advise: tuple[Checkpointing, ...] = ()
    """Checkpointing modes to plan over when the file cannot say it but the training code
    can (a DeepSpeed JSON beside HF's gradient_checkpointing: none or full)."""
    fsdp_version: int | None = None
    """The FSDP version the written strategies run with, when the file does not say it yet
    (HF Trainer's ``fsdp`` option is FSDP1 unless fsdp_config says version 2)."""
    reduce_dtype: str | None = None
    """The reduce dtype the written FSDP strategies run with, when the file does not say FSDP
    yet: accelerate's plugin without a ``mixed_precision_policy`` reduces in the mixed-precision
    dtype (planner/jobs/readers/accelerate.py ``fsdp``), as the read-back will plan it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Rewrite:
    path: str
    old: str
    text: str
    candidate: Candidate
    changes: list[str]
    """'zero_optimization.stage: 2 -> 3', one per changed key."""
    notes: list[str]
    """What the recommendation needs that the file cannot say."""

    @property
    def changed(self) -> bool:
        return self.text != self.old

    def diff(self) -> str:
        name = os.path.basename(self.path)
        return "".join(difflib.unified_diff(self.old.splitlines(True), self.text.splitlines(True),
                                            f"a/{name}", f"b/{name}"))


def show(v: Any) -> str:
    """A value as the file would spell it: true/false, not True/False."""
    return {True: "true", False: "false", None: "(unset)"}.get(v, str(v)) \
        if isinstance(v, (bool, type(None))) else str(v)


def _fsdp_version(job: Job) -> int:
    return int(job.values.get("training.fsdp_version", 1) or 1)


# ---------------------------------------------------------------------------------------------
# One small writer per format


class Writer:
    """knobs(job) -> what the file can say; apply(text, job, candidate) -> the new text and
    one line per change."""

    syntax = "yaml"

    def knobs(self, job: Job) -> Knobs:
        raise NotImplementedError

    def apply(self, text: str, job: Job, c: Candidate) -> tuple[str, list[str]]:
        raise NotImplementedError

    # helpers
    def set(self, text: str, keys: Iterable[str], value: Any, name: str) -> str:
        keys = tuple(keys)
        if self.syntax == "json":
            return json_set(text, keys, value, name=name)
        return yaml_set(text, keys, value, name=name)


def _doc(text: str, name: str) -> dict[str, Any]:
    from planner.specfile import parse_spec_text

    return parse_spec_text(text, name)


def _present(doc: dict, *keys: str) -> bool:
    node: Any = doc
    for k in keys:
        if not isinstance(node, dict) or k not in node:
            return False
        node = node[k]
    return True


class DeepSpeedWriter(Writer):
    syntax = "json"

    def knobs(self, job: Job) -> Knobs:
        return Knobs(strategies=ZERO, offloads=(Offload.OPTIMIZER, Offload.PARAMS_AND_OPTIMIZER),
                     advise=NO_SELECTIVE)

    def apply(self, text: str, job: Job, c: Candidate) -> tuple[str, list[str]]:
        return zero_apply(self, text, job, c, ("zero_optimization",))


def zero_apply(w: Writer, text: str, job: Job, c: Candidate, base: tuple[str, ...]
               ) -> tuple[str, list[str]]:
    """ZeRO stage and offload devices in a DeepSpeed JSON (or any mapping shaped like one)."""
    doc = _doc(text, job.path)
    changes = []
    zo = doc
    for k in base:
        zo = zo.get(k, {}) if isinstance(zo, dict) else {}
    stage = int(str(c.strategy)[-1])
    if zo.get("stage") != stage:
        text = w.set(text, base + ("stage",), stage, job.path)
        changes.append(f"{'.'.join(base + ('stage',))}: {zo.get('stage', 0)} -> {stage}")
    for part, on in (("offload_optimizer", c.offload is not Offload.NONE),
                     ("offload_param", c.offload is Offload.PARAMS_AND_OPTIMIZER)):
        sec = zo.get(part)
        device = (sec or {}).get("device", "none") if isinstance(sec, dict) else "none"
        want = "cpu" if on else "none"
        if (device in ("cpu", "nvme")) == on:
            continue
        if isinstance(sec, dict):
            text = w.set(text, base + (part, "device"), want, job.path)
        else:
            text = w.set(text, base + (part,), {"device": want, "pin_memory": True}, job.path)
        changes.append(f"{'.'.join(base + (part, 'device'))}: {device} -> {want}")
    return text, changes


class AccelerateWriter(Writer):
    def knobs(self, job: Job) -> Knobs:
        s = job.values.get("strategy")
        src = job.sources.get("strategy")
        if src is not None and src.key.startswith("parallelism_config"):  # HSDP over a mesh
            return Knobs(offloads=(Offload.PARAMS_AND_OPTIMIZER,), checkpointing=NO_SELECTIVE)
        if s in [str(x) for x in ZERO]:
            return Knobs(strategies=ZERO, offloads=(Offload.OPTIMIZER,
                                                    Offload.PARAMS_AND_OPTIMIZER),
                         advise=NO_SELECTIVE)
        if s in [str(x) for x in FSDP1]:
            fsdp = FSDP2 if _fsdp_version(job) == 2 else FSDP1
            return Knobs(strategies=fsdp, offloads=(Offload.PARAMS_AND_OPTIMIZER,),
                         checkpointing=NO_SELECTIVE)
        return Knobs()

    def apply(self, text: str, job: Job, c: Candidate) -> tuple[str, list[str]]:
        doc = _doc(text, job.path)
        dc = doc.get("deepspeed_config") or {}
        if dc.get("deepspeed_config_file"):
            raise JobError(f"{job.path}: the ZeRO settings live in {dc['deepspeed_config_file']}"
                           ": write that file (--job it --write-job ...)")
        if c.strategy.is_zero:
            changes = []
            stage = int(str(c.strategy)[-1])
            if dc.get("zero_stage") != stage:
                text = self.set(text, ("deepspeed_config", "zero_stage"), stage, job.path)
                changes.append(f"deepspeed_config.zero_stage: {show(dc.get('zero_stage'))} -> "
                               f"{stage}")
            if stage == 3 and dc.get("zero3_init_flag") is False:
                # planned as ZeRO-3 builds it (zero.Init); without the flag every rank would
                # load the whole model first
                text = self.set(text, ("deepspeed_config", "zero3_init_flag"), True, job.path)
                changes.append("deepspeed_config.zero3_init_flag: false -> true")
            for key, on in (("offload_optimizer_device", c.offload is not Offload.NONE),
                            ("offload_param_device", c.offload is Offload.PARAMS_AND_OPTIMIZER)):
                old = str(dc.get(key, "none")).lower()
                if (old != "none") != on:
                    new = "cpu" if on else "none"
                    text = self.set(text, ("deepspeed_config", key), new, job.path)
                    changes.append(f"deepspeed_config.{key}: {old} -> {new}")
            return text, changes
        return fsdp_apply(self, text, job, c, ("fsdp_config",), doc.get("fsdp_config") or {},
                          prefix="fsdp_")


def fsdp_apply(w: Writer, text: str, job: Job, c: Candidate, base: tuple[str, ...],
               fc: dict, *, prefix: str, checkpointing: bool = True,
               add_strategy: bool = True) -> tuple[str, list[str]]:
    """Sharding strategy, offload_params and activation_checkpointing of an FSDP config
    (accelerate's fsdp_* keys, or the same without the prefix); a DDP plan leaves them be."""
    changes: list[str] = []
    if c.strategy not in FSDP_NAMES:
        return text, changes

    def key(name: str) -> str:
        return next((k for k in (f"{prefix}{name}", name, f"fsdp_{name}") if k in fc),
                    f"{prefix}{name}")

    def put(name: str, old: Any, new: Any) -> None:
        nonlocal text
        if old != new:
            text = w.set(text, base + (key(name),), new, job.path)
            changes.append(f"{'.'.join(base + (key(name),))}: {show(old)} -> {show(new)}")

    v2 = _fsdp_version(job) == 2
    rk, sk = key("reshard_after_forward"), key("sharding_strategy")
    if v2 or (rk in fc and isinstance(fc[rk], bool)):
        put("reshard_after_forward", fc.get(rk), c.strategy is Strategy.FULL_SHARD)
        if sk in fc:
            put("sharding_strategy", fc.get(sk), FSDP_NAMES[c.strategy])
    elif rk in fc:
        put("reshard_after_forward", fc.get(rk), FSDP_NAMES[c.strategy])
    elif sk in fc or add_strategy:
        put("sharding_strategy", fc.get(sk), FSDP_NAMES[c.strategy])
    if key("offload_params") in fc or add_strategy:
        put("offload_params", fc.get(key("offload_params")), c.offload is not Offload.NONE)
    if checkpointing:
        put("activation_checkpointing", fc.get(key("activation_checkpointing")),
            c.checkpointing is not Checkpointing.NONE)
    return text, changes


class TorchtitanWriter(Writer):
    syntax = "toml"

    def knobs(self, job: Job) -> Knobs:
        s = job.values.get("strategy")
        par = "[parallelism]" in " ".join(str(x.key) for x in job.sources.values())
        strategies = FSDP2 if s in ("full_shard", "shard_grad_op") and par else ()
        return Knobs(strategies=strategies, offloads=(Offload.PARAMS_AND_OPTIMIZER,),
                     checkpointing=ALL_MODES)

    def apply(self, text: str, job: Job, c: Candidate) -> tuple[str, list[str]]:
        from planner.jobs.text import parse_toml

        doc = parse_toml(text, job.path)
        changes = []
        ac = doc.get("activation_checkpoint", {})
        mode = str(c.checkpointing)
        if ac.get("mode") != mode:
            text = toml_set(text, "activation_checkpoint", "mode", mode, name=job.path)
            changes.append(f"[activation_checkpoint] mode: {show(ac.get('mode'))} -> {mode}")
        if mode == "selective" and ac.get("selective_ac_option", "2") != "op":
            text = toml_set(text, "activation_checkpoint", "selective_ac_option", "op",
                            name=job.path)
            changes.append(f"[activation_checkpoint] selective_ac_option: "
                           f"{show(ac.get('selective_ac_option'))} -> op")
        section = next((s for s in ("training", "parallelism")
                        if "enable_cpu_offload" in doc.get(s, {})), "training")
        old = doc.get(section, {}).get("enable_cpu_offload", False)
        on = c.offload is not Offload.NONE
        if old != on:
            text = toml_set(text, section, "enable_cpu_offload", on, name=job.path)
            changes.append(f"[{section}] enable_cpu_offload: {str(old).lower()} -> "
                           f"{str(on).lower()}")
        if "parallelism" in doc and c.strategy in FSDP2:
            old = doc["parallelism"].get("fsdp_reshard_after_forward", "default")
            new = "never" if c.strategy is Strategy.SHARD_GRAD_OP else (
                old if old in ("default", "always") else "default")
            if old != new:
                text = toml_set(text, "parallelism", "fsdp_reshard_after_forward", new,
                                name=job.path)
                changes.append(f"[parallelism] fsdp_reshard_after_forward: {old} -> {new}")
        return text, changes


class TrainerWriter(Writer):
    """HF TrainingArguments (JSON or YAML recipes) and axolotl: gradient_checkpointing, and
    the fsdp options (TrainingArguments may gain them: ``fsdp: full_shard auto_wrap``)."""

    def __init__(self, syntax: str) -> None:
        self.syntax = syntax

    def knobs(self, job: Job) -> Knobs:
        src = job.sources.get("strategy")
        fsdp = src is not None and src.file == job.path and src.key.startswith("fsdp")
        if fsdp:
            return Knobs(strategies=FSDP2 if _fsdp_version(job) == 2 else FSDP1,
                         offloads=(Offload.PARAMS_AND_OPTIMIZER,), checkpointing=NO_SELECTIVE)
        if src is None and job.format in (JobFormat.TRAINER, JobFormat.TRL):
            # plain DDP unless fsdp is added; once it is, its fsdp_config is read as FSDP's
            from planner.jobs.readers.accelerate import _plugin_reduce_dtype
            from planner.jobs.text import read_text

            cfg = _doc(read_text(job.path), job.path).get("fsdp_config")
            policy = isinstance(cfg, dict) and any(
                k in cfg for k in ("mixed_precision_policy", "fsdp_mixed_precision_policy"))
            return Knobs(strategies=(Strategy.DDP, *FSDP1),
                         offloads=(Offload.PARAMS_AND_OPTIMIZER,), checkpointing=NO_SELECTIVE,
                         fsdp_version=1,
                         reduce_dtype=None if policy else _plugin_reduce_dtype(job.values))
        return Knobs(checkpointing=NO_SELECTIVE)

    def apply(self, text: str, job: Job, c: Candidate) -> tuple[str, list[str]]:
        doc = _doc(text, job.path)
        changes = []
        gc = c.checkpointing is not Checkpointing.NONE
        key, old = _checkpointing_key(job, doc)
        if key == "disable_gradient_checkpointing":
            if old != gc:
                text = self.set(text, (key,), not gc, job.path)
                changes.append(f"{key}: {show(not old)} -> {show(not gc)}")
        elif old != gc:
            text = self.set(text, (key,), gc, job.path)
            changes.append(f"{key}: {show(doc.get(key))} -> {show(gc)}")
        if not c.strategy.is_fsdp or not self.knobs(job).strategies:
            return text, changes
        raw = doc.get("fsdp") or ""
        tokens = raw.split() if isinstance(raw, str) else [str(t) for t in raw]
        fc = doc.get("fsdp_config") if isinstance(doc.get("fsdp_config"), dict) else {}
        prefix = "fsdp_" if any(k.startswith("fsdp_") for k in fc) else ""
        offload_key = next((k for k in (f"{prefix}offload_params", "offload_params")
                            if k in fc), None)
        keep = [t for t in tokens if t.lower() not in ("full_shard", "shard_grad_op",
                                                        "hybrid_shard", "no_shard",
                                                        "hybrid_shard_zero2", "offload")]
        new = [str(c.strategy), *(keep or ["auto_wrap"])] + (
            ["offload"] if c.offload is not Offload.NONE and offload_key is None else [])
        if [t.lower() for t in tokens] != new and (tokens or job.format in (JobFormat.TRAINER,
                                                                             JobFormat.TRL)):
            value: Any = " ".join(new) if isinstance(raw, str) else new
            text = self.set(text, ("fsdp",), value, job.path)
            changes.append(f"fsdp: {raw or '(unset)'} -> {value}")
        if fc and any(k.replace("fsdp_", "") in ("sharding_strategy", "reshard_after_forward",
                                                 "offload_params", "version") for k in fc):
            text, more = fsdp_apply(self, text, job, c, ("fsdp_config",), fc, prefix=prefix,
                                    checkpointing=False, add_strategy=False)
            changes += more
        return text, changes


def _checkpointing_key(job: Job, doc: dict) -> tuple[str, bool]:
    """The key that switches a recipe's activation checkpointing, and whether it is on now
    (the framework's default when the file leaves it out)."""
    from planner.jobs.keys import table

    if job.format is JobFormat.LLAMAFACTORY:
        from planner.jobs.readers.llamafactory import is_v1

        if is_v1(doc):
            key = "enable_activation_checkpointing"
            return key, bool(doc.get(key, table("llamafactory_v1").default(key)))
        if "gradient_checkpointing" not in doc:
            return "disable_gradient_checkpointing", not doc.get(
                "disable_gradient_checkpointing", False)
    name = {JobFormat.TRL: "trl", JobFormat.AXOLOTL: "axolotl"}.get(job.format, "transformers")
    key = "activation_checkpointing" if "activation_checkpointing" in doc else \
        "gradient_checkpointing"
    if key in doc and doc[key] is not None:
        return key, doc[key] is True or str(doc[key]).lower() == "true"
    return key, bool(table(name).default(key))


class TorchtuneWriter(Writer):
    """A torchtune recipe config: enable_activation_checkpointing, fsdp_cpu_offload and
    fsdp_reshard_after_forward (the *_distributed recipes read them)."""

    def knobs(self, job: Job) -> Knobs:
        if job.values.get("strategy") in ("full_shard", "shard_grad_op"):
            return Knobs(strategies=FSDP2, offloads=(Offload.PARAMS_AND_OPTIMIZER,),
                         checkpointing=NO_SELECTIVE)
        return Knobs(checkpointing=NO_SELECTIVE)

    def apply(self, text: str, job: Job, c: Candidate) -> tuple[str, list[str]]:
        doc = _doc(text, job.path)
        changes = []
        want = {"enable_activation_checkpointing": c.checkpointing is not Checkpointing.NONE}
        if self.knobs(job).strategies:
            want["fsdp_cpu_offload"] = c.offload is not Offload.NONE
            want["fsdp_reshard_after_forward"] = c.strategy is Strategy.FULL_SHARD
        defaults = {"enable_activation_checkpointing": False, "fsdp_cpu_offload": False,
                    "fsdp_reshard_after_forward": True}
        for key, value in want.items():
            old = doc.get(key, defaults[key])
            if old != value:
                text = self.set(text, (key,), value, job.path)
                changes.append(f"{key}: {show(doc.get(key))} -> {show(value)}")
        return text, changes


class SpecWriter(Writer):
    def knobs(self, job: Job) -> Knobs:
        return Knobs(strategies=tuple(Strategy), offloads=tuple(Offload)[1:],
                     checkpointing=ALL_MODES)

    def apply(self, text: str, job: Job, c: Candidate) -> tuple[str, list[str]]:
        doc = _doc(text, job.path)
        self.syntax = "json" if text.lstrip().startswith("{") else "yaml"
        changes = []
        for key, value in (("strategy", str(c.strategy)), ("offload", str(c.offload)),
                           ("checkpointing", str(c.checkpointing))):
            if doc.get(key) != value:
                text = self.set(text, (key,), value, job.path)
                changes.append(f"{key}: {show(doc.get(key))} -> {value}")
        return text, changes


def writer_for(job: Job, text: str) -> Writer:
    fmt = job.format
    json_text = text.lstrip().startswith("{")
    if fmt is JobFormat.DEEPSPEED:
        return DeepSpeedWriter()
    if fmt is JobFormat.ACCELERATE:
        return AccelerateWriter()
    if fmt is JobFormat.TORCHTITAN and job.layout.startswith("torchtitan 0.3"):
        raise JobError(f"{job.path}: a torchtitan config registry is Python: fitcheck does not "
                       "rewrite code (set the recommendation in the function, or override it "
                       "with torchtitan's --activation_checkpoint / --parallelism flags)")
    if fmt is JobFormat.TORCHTITAN:
        return TorchtitanWriter()
    if fmt in (JobFormat.TRAINER, JobFormat.TRL, JobFormat.LLAMAFACTORY, JobFormat.AXOLOTL):
        return TrainerWriter("json" if json_text else "yaml")
    if fmt is JobFormat.TORCHTUNE:
        return TorchtuneWriter()
    if fmt is JobFormat.SPEC:
        return SpecWriter()
    why = {JobFormat.LITGPT: "litgpt fixes them in code",
           JobFormat.KUBEFLOW: "the training settings live in the container arguments"}
    raise JobError(f"{job.path}: a {fmt} file has no strategy, offload or checkpointing keys "
                   f"to write ({why.get(fmt, 'nothing to change')})")


# ---------------------------------------------------------------------------------------------
# Planning over what the file can say, and writing it


def recommend(job: Job, request, knobs: Knobs, fixed: frozenset[str]):
    """The planner's recommendation among what the file can say (``fixed``: paths the user
    gave, which stay as asked): (candidate, answer), or (None, the last answer)."""
    from planner.plan import plan

    if knobs.fsdp_version is not None and "training.fsdp_version" not in fixed:
        # plan what the written file will run (the read-back plans the same way)
        request = request.with_training(fsdp_version=knobs.fsdp_version)
    if knobs.reduce_dtype is not None and "training.reduce_dtype" not in fixed \
            and request.training.reduce_dtype is None:
        from planner.spec import Dtype

        request = request.with_training(reduce_dtype=Dtype(knobs.reduce_dtype))
    o = request.options
    strategies = o.strategies if "strategy" in fixed or not knobs.strategies else \
        knobs.strategies
    if "checkpointing" in fixed or (not knobs.checkpointing and (
            not knobs.advise or job.values.get("checkpointing") is not None)):
        modes: tuple = (o.checkpointing,)
    elif not knobs.checkpointing:
        modes = knobs.advise
    elif knobs.checkpointing == ALL_MODES:
        modes = (Checkpointing.AUTO,)
    else:
        modes = knobs.checkpointing
    if "offload" in fixed or not knobs.offloads:
        stages: tuple = (o.offloads,)
    else:
        stages = ((Offload.NONE,), (Offload.NONE, *knobs.offloads))
    from planner.plan import TIE

    answer = None
    for offloads in stages:
        found = []  # (step time, lighter first, candidate, answer) per checkpointing mode
        for i, mode in enumerate(modes):
            # the tensor-parallel degree stays as the job has it (1 when it says none)
            answer = plan(request.with_options(strategies=strategies, offloads=offloads,
                                               checkpointing=mode, tp=o.tp or 1))
            e, st = answer.chosen()
            if e is not None:
                found.append((st.step_time_s, i, e.candidate, answer))
        if found:  # the fastest; within the planner's tie, the lighter checkpointing
            best = min(t for t, *_ in found)
            _, _, c, answer = min((f for f in found if f[0] <= best * (1 + TIE)),
                                  key=lambda f: f[1])
            return c, answer
    return None, answer


def rewrite(job: Job, request, fixed: frozenset[str] = frozenset(),
            given: dict[str, Any] | None = None) -> tuple[Rewrite | None, Any]:
    """The job's file with the recommendation written in: (Rewrite, answer), or (None, the
    answer) when nothing the file can say fits."""
    from planner.jobs import read_job, resolve
    from planner.jobs.text import read_text

    others = [f for f in job.files if f != job.path]
    text = read_text(job.path)
    w = writer_for(job, text)
    knobs = w.knobs(job)
    c, answer = recommend(job, request, knobs, fixed)
    if c is None:
        return None, answer
    if others and job.format is not JobFormat.SPEC:
        for path in ("strategy", "offload", "checkpointing"):
            src = job.sources.get(path)
            if src is not None and src.file != job.path and _differs(job, path, c):
                raise JobError(f"{src.file} says {src.key}: rewrite that file (--job "
                               f"{src.file} --write-job ...)")
    new, changes = w.apply(text, job, c)
    notes = []
    if not knobs.checkpointing and c.checkpointing is not Checkpointing.NONE \
            and job.values.get("checkpointing") in (None, "none"):
        notes.append(f"needs {c.checkpointing} activation checkpointing, which {job.path} "
                     "cannot say: turn it on in the training code (e.g. TrainingArguments "
                     "gradient_checkpointing: true)")
    asked = str(job.values.get("strategy") or "").split(",")
    if not knobs.strategies and asked != [""] and str(c.strategy) not in asked:
        notes.append(f"the recommendation is {c.strategy}, which {job.path} cannot switch to")
    unmodelled = resolve(job, given or {}).unmodelled
    if unmodelled:
        notes.append(f"the plan leaves out {len(unmodelled)} setting(s) fitcheck does not model "
                     "(NOT MODELLED in the plan): check the recommendation against them")
    back = read_job(job.path, job.format, text=new)
    got = resolve(back, given or {}).values
    unsaid = {"offload": "none", "checkpointing": "none"}
    """What a file that does not say it runs with (no offload key: no offload)."""
    for path, want in (("strategy", str(c.strategy)), ("offload", str(c.offload)),
                       ("checkpointing", str(c.checkpointing))):
        settable = {"strategy": knobs.strategies, "offload": knobs.offloads,
                    "checkpointing": knobs.checkpointing}[path]
        have = got.get(path) if got.get(path) is not None else unsaid.get(path)
        if settable and path not in fixed and str(have) != want:
            raise JobError(f"{job.path}: written with {path} {want}, the file reads back as "
                           f"{have}; not written (please report this file)")
    return Rewrite(path=job.path, old=text, text=new, candidate=c, changes=changes,
                   notes=notes), answer


def _differs(job: Job, path: str, c: Candidate) -> bool:
    want = {"strategy": c.strategy, "offload": c.offload, "checkpointing": c.checkpointing}[path]
    return str(job.values.get(path)) != str(want)


def write_atomic(path: str, text: str, *, like: str | None = None) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename:
    a reader sees the old file or the new one, never half of one."""
    from planner.tempfiles import sweep

    folder = os.path.dirname(os.path.abspath(path))
    sweep(folder, lambda n: n.startswith(".fitcheck-"))  # a killed writer's, an hour old
    fd, tmp = tempfile.mkstemp(prefix=".fitcheck-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        src = like if like and os.path.exists(like) else path
        if os.path.exists(src):
            os.chmod(tmp, os.stat(src).st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
