"""Gate a Slurm batch script with `fitcheck gate` before `sbatch` sees it (docs/gating.md).

    fitcheck-sbatch [WRAPPER OPTIONS] [SBATCH OPTIONS] SCRIPT [SCRIPT ARGS]

Reads the script's ``#SBATCH`` header (--nodes/-N, --gres=gpu:N, --gpus-per-node,
--gpus/-G, --gpus-per-task, --ntasks-per-node; sbatch options on the command line win, as
in sbatch) for the GPU count, and ``#FITCHECK`` lines for the job:

    #FITCHECK job=train.toml                (a job config: torchtitan, DeepSpeed, accelerate,
                                             HF / axolotl / litgpt YAML; docs/jobs.md)
    #FITCHECK spec=fitcheck.json            (a fitcheck spec; both relative to the script)
    #FITCHECK model=llama3-8b gpu=h100-80 seq=4096 strategy=full_shard

runs ``fitcheck gate -`` on the combined spec (its fields over the job config's, the
allocation's GPUs over both) and only on admit submits with ``sbatch``. On reject it prints
the reason and exits 3; a bad spec exits 4; a gate that gives no verdict exits 6 (or submits,
with --fitcheck-on-error admit). A script without #FITCHECK lines is submitted unchecked.

When the script names files (spec=, job=, a model.config path) or --fitcheck-spec/-job/-set
are given, the script sbatch receives has them written in as one ``#FITCHECK spec-inline=``
line (the originals become ``#FITCHECK-INLINED``), so that the check in slurmctld
(integrations/slurm/job_submit.lua) judges the same job without reading any file.

Wrapper options (all others go to sbatch unchanged):
  --sbatch CMD                the submit command (default $FITCHECK_SBATCH or sbatch)
  --fitcheck CMD              the gate command (default $FITCHECK or fitcheck)
  --fitcheck-job PATH         a job config (overrides #FITCHECK job=)
  --fitcheck-spec PATH        a spec file (overrides #FITCHECK spec=)
  --fitcheck-set KEY=VALUE    a spec field (repeatable; overrides #FITCHECK lines)
  --fitcheck-on-error admit|reject   when the gate cannot run or crashes (default reject)
  --fitcheck-timeout SECONDS  for the gate (default 30; 2 with --fitcheck-controller/-serve)
  --fitcheck-dry-run          print the spec, the verdict and the sbatch command; submit nothing
  --fitcheck-skip             submit without checking ($FITCHECK_SKIP=1 too)

The check inside slurmctld (job_submit.lua calls one of these; docs/gating.md):
  --fitcheck-serve SOCKET     serve checks on a Unix socket: one warm process, a fork per job
  --fitcheck-controller       check one job read from stdin, print the answer line, exit

Installed as the ``fitcheck-sbatch`` console script; integrations/slurm/fitcheck-sbatch is a
shim for a checkout. The gate runs in a subprocess, so a crash or a hang in it is an
--fitcheck-on-error verdict, never a stuck submission.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import subprocess
import sys
from typing import Any, BinaryIO

from planner.lazy_dataclass import dataclass
from planner.errors import (
    EXIT_BAD_DATA,
    EXIT_CRASH,
    EXIT_FITS,
    EXIT_NO_VERDICT,
    EXIT_NOTHING_FITS,
    EXIT_USAGE,
    FitcheckError,
)

EXIT_ADMIT, EXIT_REJECT, EXIT_BAD_SPEC = EXIT_FITS, EXIT_NOTHING_FITS, EXIT_BAD_DATA


class SlurmSpecError(Exception):
    """The script's directives or the spec are unusable (exit 4)."""

    exit_code = EXIT_BAD_SPEC


class WrapperUsage(Exception):
    exit_code = EXIT_USAGE


# ---------------------------------------------------------------------------------------------
# sbatch option syntax

# Long options that never take a value, or take one only as --opt=value (getopt optional args).
LONG_NOARG = {
    "contiguous", "exclusive", "get-user-env", "hold", "help", "ignore-pbs", "no-kill",
    "no-requeue", "nice", "overcommit", "oversubscribe", "parsable", "propagate", "quiet",
    "reboot", "requeue", "spread-job", "test-only", "usage", "use-min-nodes", "verbose",
    "version", "wait",
}
SHORT_NOARG = set("hHkOQsuvVW")
SHORT_LONG = {"N": "nodes", "G": "gpus", "n": "ntasks", "J": "job-name"}
WANTED = {"nodes", "gres", "gpus-per-node", "gpus", "gpus-per-task", "ntasks-per-node", "ntasks",
          "gpus-per-socket", "sockets-per-node", "wrap"}


def split_options(args: list[str], stop_at_positional: bool = True
                  ) -> tuple[list[tuple[str, str | None]], int]:
    """sbatch options as (name, value) and the index of the first positional (the script).

    Long names without the dashes; short ones mapped to long where we care (-N, -G, -n).
    """
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return out, i + 1
        if a.startswith("--") and len(a) > 2:
            name, eq, value = a[2:].partition("=")
            if eq:
                out.append((name, value))
            elif name in LONG_NOARG:
                out.append((name, None))
            else:
                out.append((name, args[i + 1] if i + 1 < len(args) else None))
                i += 1
        elif a.startswith("-") and len(a) > 1:
            flag = a[1]
            if flag in SHORT_NOARG:
                out.append((flag, None))
            elif len(a) > 2:
                out.append((SHORT_LONG.get(flag, flag), a[2:].lstrip("=")))
            else:
                out.append((SHORT_LONG.get(flag, flag), args[i + 1] if i + 1 < len(args) else None))
                i += 1
        elif stop_at_positional:
            return out, i
        i += 1
    return out, len(args)


DIRECTIVE = "#FITCHECK"


def is_directive(line: str) -> bool:
    """A #FITCHECK line (not #FITCHECKED, #FITCHECK-INLINED): the one rule for the wrapper, the
    check in slurmctld, and the rewriting of scripts."""
    s = line.strip()
    return s.startswith(DIRECTIVE) and (len(s) == len(DIRECTIVE) or s[len(DIRECTIVE)].isspace())


def read_header(text: str) -> tuple[list[str], list[str]]:
    """(the #SBATCH arguments, the #FITCHECK arguments) of a batch script.

    #SBATCH lines count until the first command (as in sbatch); #FITCHECK lines anywhere.
    """
    sbatch: list[str] = []
    fitcheck: list[str] = []
    in_header = True
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s.startswith(DIRECTIVE):
            if not is_directive(s):
                continue  # e.g. #FITCHECKED: not ours
            try:
                fitcheck += shlex.split(s[len(DIRECTIVE):], comments=True)
            except ValueError as exc:
                raise SlurmSpecError(f"line {n}: #FITCHECK: {exc}") from None
        elif in_header and s.startswith("#SBATCH"):
            rest = s[len("#SBATCH"):]
            if rest and not rest[0].isspace():
                continue
            try:
                sbatch += shlex.split(rest, comments=True)
            except ValueError as exc:
                raise SlurmSpecError(f"line {n}: #SBATCH: {exc}") from None
        elif s and not s.startswith("#"):
            in_header = False
    return sbatch, fitcheck


def _int(opt: str, text: str) -> int:
    t = text.strip()
    if not t.isdigit() or int(t) <= 0:
        raise SlurmSpecError(f"--{opt}: expected a positive count, got {text!r}")
    return int(t)


def _typed_count(opt: str, text: str) -> int:
    """'8', 'a100:8', 'a100:4,h100:4' -> GPUs (summed over types)."""
    total = 0
    for part in filter(None, text.split(",")):
        total += _int(opt, part.rsplit(":", 1)[-1])
    if total <= 0:
        raise SlurmSpecError(f"--{opt}: expected a GPU count, got {text!r}")
    return total


def gres_gpus(text: str, opt: str = "--gres") -> int | None:
    """GPUs in a GRES or TRES list (summed over its entries); None when it names no GPU.

    Entries are comma-separated; other resources (``cpu=4``, ``gres/shard:2``,
    ``license/x=1``) are skipped. Each GPU entry is one of (Slurm's source, src/common/
    slurm_opt.c and src/interfaces/gres.c, at the tags named):

    ``gpu``, ``gpu:8``, ``gpu:h100:8``, ``gpu:8(S:0-1)``
        ``--gres`` / ``--gpus*`` as users type them; no count is one GPU.
    ``gres:gpu:8``, ``gres:gpu:h100:8``
        job_desc.tres_per_{job,node,socket,task} in Slurm 22.05 and 23.02 (``xfmt_tres(...,
        "gres:gpu", ...)`` and ``gres_prepend_tres_type``: "gres:"; seen from a live 22.05.8).
    ``gres/gpu:8``, ``gres/gpu:h100:8``
        the same fields from 23.11 on (commit 53ec8d6697 "it should be TRESType/TRESName":
        ``xfmt_tres(..., "gres/gpu", ...)``).
    ``gres/gpu=2``, ``gres/gpu:h100=2``
        tres_per_task from 24.05 on (``--gpus-per-task`` through
        ``slurm_option_update_tres_per_task``, "%s=%d"; beside it ``cpu=4`` from ``-c``).
    """
    total = None
    for entry in filter(None, (e.strip() for e in text.split(","))):
        entry = entry.split("(", 1)[0].strip()
        for prefix in ("gres/", "gres:"):
            entry = entry.removeprefix(prefix)
        body, eq, count_text = entry.partition("=")
        fields = body.split(":")
        if fields[0] != "gpu":
            continue
        if eq:  # gpu=N, gpu:type=N
            count_text, typed = count_text.strip(), len(fields) == 2
            if len(fields) > 2 or (typed and not fields[1]):
                raise SlurmSpecError(f"{opt}: expected gpu[:type]=count, got {text!r}")
        elif len(fields) == 1:  # gpu
            count_text = "1"
        elif len(fields) == 2:  # gpu:N, or gpu:type (one GPU of that type)
            count_text = fields[1] if fields[1].isdigit() else "1"
        elif len(fields) == 3:  # gpu:type:N
            count_text = fields[2]
        else:
            raise SlurmSpecError(f"{opt}: expected gpu[:type]:count, got {text!r}")
        if not count_text.isdigit():
            raise SlurmSpecError(f"{opt}: expected gpu[:type]:count, got {text!r}")
        total = (total or 0) + int(count_text)
    return total


def _nodes(text: str) -> int:
    """'2', '2-4' (the minimum: the tightest case), '2,4' -> nodes."""
    first = text.replace(",", "-").split("-", 1)[0].split(":", 1)[0]
    return _int("nodes", first)


def hardware_from_options(opts: list[tuple[str, str | None]]) -> tuple[dict[str, int], list[str]]:
    """{n, gpus_per_node} (either may be missing) from sbatch options; later ones win."""
    last: dict[str, str] = {}
    for name, value in opts:
        if name in WANTED and value is not None:
            last[name] = value
    notes: list[str] = []
    nodes = _nodes(last["nodes"]) if "nodes" in last else 1
    gpn = None
    if "gpus-per-node" in last:
        gpn = _typed_count("gpus-per-node", last["gpus-per-node"])
    if gpn is None and "gres" in last:
        gpn = gres_gpus(last["gres"])
    if gpn is None and "gpus-per-task" in last and "ntasks-per-node" in last:
        gpn = (_typed_count("gpus-per-task", last["gpus-per-task"])
               * _int("ntasks-per-node", last["ntasks-per-node"]))
    if gpn is None and "gpus-per-socket" in last and "sockets-per-node" in last:
        gpn = (_typed_count("gpus-per-socket", last["gpus-per-socket"])
               * _int("sockets-per-node", last["sockets-per-node"]))
    hw: dict[str, int] = {}
    if "gpus" in last:
        total = _typed_count("gpus", last["gpus"])
        hw["n"] = total
        if gpn is None and nodes > 1 and total % nodes == 0:
            gpn = total // nodes
        elif gpn is None and nodes == 1:
            gpn = total
    elif gpn is not None:
        hw["n"] = nodes * gpn
    elif "gpus-per-task" in last and "ntasks" in last:  # sbatch -n 8 --gpus-per-task=1
        hw["n"] = (_typed_count("gpus-per-task", last["gpus-per-task"])
                   * _int("ntasks", last["ntasks"]))
        if nodes == 1:
            gpn = hw["n"]
        elif hw["n"] % nodes == 0:
            gpn = hw["n"] // nodes
    elif "ntasks-per-node" in last:
        per = _int("ntasks-per-node", last["ntasks-per-node"])
        hw["n"], gpn = nodes * per, per
        notes.append(f"no GPU request (--gres/--gpus*): assuming one GPU per task, "
                     f"{per} per node")
    if gpn is not None:
        hw["gpus_per_node"] = gpn
    return hw, notes


# ---------------------------------------------------------------------------------------------
# The spec

def _shorthand() -> tuple[dict[str, str], tuple[str, ...]]:
    """#FITCHECK keys: every spec field by its key alone (seq, gpu, preset), model and n."""
    from planner.fields import SECTIONS

    top = tuple(k for k in SECTIONS[""])
    short = {"model": "model.preset", "n": "hardware.n"}
    for section, keys in SECTIONS.items():
        for k in keys:
            if section:
                short.setdefault(k, f"{section}.{k}")
    return short, top


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none", "~"):
        return None if low != "none" else text
    try:
        v = json.loads(text)
    except ValueError:
        return text
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else text


def set_field(spec: dict[str, Any], key: str, raw: str, base_dir: str | None) -> None:
    """Set a dotted (model.preset) or short (preset, gpu, seq) spec field from text."""
    key = key.strip().replace("-", "_")
    short, top = _shorthand()
    path = key if "." in key or key in top else short.get(key)
    if path is None:
        raise SlurmSpecError(f"#FITCHECK: unknown key {key!r}; use job=PATH, spec=PATH, a "
                             "dotted key (model.preset, training.seq, hardware.gpu) or one of "
                             f"{', '.join(sorted(short))}, {', '.join(top)}")
    value = _value(raw)
    parts = path.split(".")
    node = spec
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise SlurmSpecError(f"#FITCHECK: {p} is not a mapping in the spec")
        node = child
    node[parts[-1]] = _absolute(path, value, base_dir)


def _absolute(path: str, value: Any, base_dir: str | None) -> Any:
    """model.config and a TOML hardware.gpu relative to the file that named them."""
    if base_dir is None or not isinstance(value, str) or os.path.isabs(value):
        return value
    if path == "model.config" or (path == "hardware.gpu" and (
            "/" in value or value.endswith(".toml") or value.startswith("."))):
        return os.path.join(base_dir, value)
    return value


def load_spec_file(path: str) -> dict[str, Any]:
    """A fitcheck spec file (planner.specfile: bounded, no YAML aliases), its relative paths
    made absolute against its folder."""
    from planner.fields import SpecError
    from planner.specfile import read_spec

    try:
        doc, base = read_spec(path)
    except OSError as exc:
        raise SlurmSpecError(f"spec {path!r}: {exc.strerror or exc}") from None
    except SpecError as exc:
        raise SlurmSpecError(str(exc)) from None
    for section in ("model", "hardware"):
        sec = doc.get(section)
        if isinstance(sec, dict):
            for k in ("config", "gpu"):
                if k in sec:
                    sec[k] = _absolute(f"{section}.{k}", sec[k], base)
    job = doc.get("job")
    if isinstance(job, str):
        doc["job"] = os.path.join(base, os.path.expanduser(job))
    elif isinstance(job, dict) and isinstance(job.get("path"), str):
        job["path"] = os.path.join(base, os.path.expanduser(job["path"]))
    return doc


INLINE = "spec-inline"
"""The #FITCHECK key of a whole spec written into the script as JSON, as fitcheck-sbatch writes
it for the check in slurmctld; fields given beside it override it, as they do a spec=PATH."""


def _key_value(item: str, where: str) -> tuple[str, str]:
    key, eq, value = item.partition("=")
    if not eq:
        raise SlurmSpecError(f"{where}: expected key=value, got {item!r}")
    return key.strip(), value


def _inline(value: str) -> dict[str, Any]:
    """The spec of a spec-inline= directive: content only, never a path."""
    from planner.fields import SpecError
    from planner.specfile import parse_spec_text

    try:
        doc = parse_spec_text(value, f"#FITCHECK {INLINE}")
    except SpecError as exc:
        raise SlurmSpecError(str(exc)) from None
    if "job" in doc:
        raise SlurmSpecError(f"#FITCHECK {INLINE}: job: a job config is not named inside an "
                             "inline spec; fitcheck-sbatch writes its settings in instead")
    return doc


def user_spec(fc_args: list[str], script_dir: str, spec_path: str | None = None,
              sets: list[str] | None = None, job_path: str | None = None) -> dict[str, Any]:
    """The job that a script's #FITCHECK arguments and the wrapper's --fitcheck-* options
    describe, before the allocation's GPUs: spec=/job= files relative to the script, the
    options' relative to the working directory; fields over the spec file (or inline spec)."""
    fields: list[tuple[str, str, str | None]] = []
    file_from_script = None
    inline: dict[str, Any] | None = None
    job: dict[str, str] = {}
    for item in fc_args:
        key, value = _key_value(item, "#FITCHECK")
        if key == "spec":
            file_from_script = os.path.join(script_dir, value)
        elif key == "job":
            job["path"] = os.path.abspath(os.path.join(script_dir, os.path.expanduser(value)))
        elif key == "format":
            job["format"] = value.strip().lower()
        elif key.replace("_", "-") == INLINE:
            if inline is not None:
                raise SlurmSpecError(f"#FITCHECK: {INLINE}= given twice")
            inline = _inline(value)
        else:
            fields.append((key, value, script_dir))
    if file_from_script and inline is not None:
        raise SlurmSpecError(f"#FITCHECK: give spec=PATH or {INLINE}=, not both")
    if job_path:
        job["path"] = os.path.abspath(job_path)
    if job and "path" not in job:
        raise SlurmSpecError("#FITCHECK: format= goes with job=PATH")
    if job and not os.path.isfile(job["path"]):
        raise SlurmSpecError(f"#FITCHECK: job={job['path']}: no such file")
    for item in sets or []:
        key, eq, value = item.partition("=")
        if not eq:
            raise WrapperUsage(f"--fitcheck-set: expected KEY=VALUE, got {item!r}")
        fields.append((key, value, os.getcwd()))
    path = spec_path or file_from_script
    spec = load_spec_file(path) if path else (inline or {})
    for key, value, base in fields:
        set_field(spec, key, value, base)
    if job:
        spec["job"] = job
    if not spec:
        raise SlurmSpecError("no job spec: add '#FITCHECK job=PATH', '#FITCHECK spec=PATH' or "
                             "'#FITCHECK key=value' "
                             "lines (model, gpu, ...) to the script, or --fitcheck-spec")
    return spec


def with_allocation(spec: dict[str, Any], opts: list[tuple[str, str | None]]) -> list[str]:
    """Set the spec's hardware.n and gpus_per_node to the allocation's (sbatch options, later
    ones winning), in place; the notes say where the spec said otherwise."""
    hw, notes = hardware_from_options(opts)
    if hw:
        hardware = spec.setdefault("hardware", {})
        if not isinstance(hardware, dict):
            raise SlurmSpecError("hardware: must be a mapping")
        for k, v in hw.items():
            if hardware.get(k) not in (None, v):
                notes.append(f"hardware.{k}={hardware[k]!r} in the spec; the allocation "
                             f"asks for {v}: checking {v}")
            hardware[k] = v
    hardware = spec.get("hardware")
    if not (isinstance(hardware, dict) and hardware.get("n") is not None):
        raise SlurmSpecError("hardware.n: the job requests no GPUs (--gres=gpu:N, --gpus=N, "
                             "--gpus-per-node=N) and the spec gives no n")
    return notes


def build_spec(script_text: str, script_dir: str, cli_opts: list[tuple[str, str | None]],
               spec_path: str | None = None, sets: list[str] | None = None,
               job_path: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """The job spec of a script: #FITCHECK job/spec/fields, then --fitcheck-*, then the GPUs
    of the #SBATCH header and the sbatch command line. Returns (spec, notes)."""
    sbatch_args, fc_args = read_header(script_text)
    spec = user_spec(fc_args, script_dir, spec_path, sets, job_path)
    script_opts, _ = split_options(sbatch_args, stop_at_positional=False)
    return spec, with_allocation(spec, script_opts + cli_opts)


# ---------------------------------------------------------------------------------------------
# The job written into the script, for the check in slurmctld (which reads no files)


def _nest(values: dict[str, Any]) -> dict[str, Any]:
    """{field path: value} (planner.fields: 'model.preset', 'strategy') -> a nested spec."""
    out: dict[str, Any] = {}
    for path, v in values.items():
        section, dot, key = path.partition(".")
        v = list(v) if isinstance(v, tuple) else v
        if dot:
            out.setdefault(section, {})[key] = v
        else:
            out[path] = v
    return out


def _read_config(path: str) -> dict[str, Any]:
    """A model.config file's config.json mapping, for an inline spec."""
    from planner.specfile import MAX_SPEC_BYTES

    p = os.path.expanduser(path)
    if os.path.isdir(p):
        p = os.path.join(p, "config.json")
    try:
        with open(p, encoding="utf-8") as f:
            text = f.read(MAX_SPEC_BYTES + 1)
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or "not UTF-8 text"
        raise SlurmSpecError(f"model.config: cannot read {path!r}: {why}") from None
    if len(text) > MAX_SPEC_BYTES:
        raise SlurmSpecError(f"model.config: {path!r} is larger than {MAX_SPEC_BYTES} bytes")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise SlurmSpecError(f"model.config: {path!r}: invalid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise SlurmSpecError(f"model.config: {path!r}: must be a JSON object")
    return doc


def portable_spec(spec: dict[str, Any], hardware: dict[str, Any] | None = None
                  ) -> tuple[dict[str, Any], list[str]]:
    """The spec with what its files say in place of their paths: a job config's settings as
    the gate reads them (planner.jobs) under the allocation's ``hardware`` (n, gpus_per_node:
    a job may derive a setting from the GPU count, e.g. DeepSpeed's gradient accumulation
    from train_batch_size), a model.config's config.json mapping. A GPU profile or
    calibration file cannot be written in: a note says the check in slurmctld refuses it."""
    from planner.validate import looks_like_path

    spec = copy.deepcopy(spec)
    notes: list[str] = []
    if "job" in spec:
        from planner.jobs import read_job, resolve

        given = {f"hardware.{k}": v for k, v in (hardware or {}).items()
                 if k in ("n", "gpus_per_node") and v is not None}
        try:
            resolved = resolve(read_job("-", "spec", text=json.dumps(spec)), given)
        except FitcheckError as exc:
            raise SlurmSpecError(str(exc)) from None
        if resolved.unmodelled:  # the gate rejects these; an inline spec cannot say them
            raise SlurmSpecError("the job sets what fitcheck does not model, so the check in "
                                 "slurmctld cannot be told it: " + "; ".join(resolved.unmodelled))
        spec = _nest(resolved.values)
    model = spec.get("model")
    if isinstance(model, dict) and isinstance(model.get("config"), str):
        model["config"] = _read_config(model["config"])
    hardware = spec.get("hardware")
    gpu = hardware.get("gpu") if isinstance(hardware, dict) else None
    if isinstance(gpu, str) and looks_like_path(gpu):
        notes.append(f"hardware.gpu={gpu!r} is a profile file, which the check in slurmctld "
                     "does not read: it will refuse the job; use a profile id "
                     "(fitcheck --list-gpus)")
    cal = spec.get("calibration")
    if isinstance(cal, str) and cal not in ("auto", "none"):
        notes.append(f"calibration={cal!r} is a file, which the check in slurmctld does not "
                     "read: it will refuse the job; use auto or none")
    return spec, notes


def inline_directive(spec: dict[str, Any]) -> str:
    """The one #FITCHECK line that carries a whole (portable) spec."""
    from planner.specfile import MAX_SPEC_BYTES

    try:
        text = json.dumps(spec, separators=(",", ":"), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise SlurmSpecError(f"the spec cannot be written into the script: {exc}") from None
    if len(text) > MAX_SPEC_BYTES:
        raise SlurmSpecError(f"the spec is larger than {MAX_SPEC_BYTES} bytes as JSON")
    return f"#FITCHECK {INLINE}={shlex.quote(text)}"


INLINED = "#FITCHECK-INLINED"
"""What an original #FITCHECK line becomes once its content is in the spec-inline= line."""


def rewrite_script(text: str, directive: str) -> str:
    """The script with ``directive`` in place of its #FITCHECK lines: it goes before the first
    of them (else after the #! line), and each becomes #FITCHECK-INLINED, kept for people.
    Comment lines only: the #SBATCH header and the commands are untouched."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    placed = False
    for line in lines:
        if is_directive(line):
            if not placed:
                out.append(directive + "\n")
                placed = True
            at = line.index(DIRECTIVE)
            line = line[:at] + INLINED + line[at + len(DIRECTIVE):]
        out.append(line)
    if not placed:
        at = 1 if lines and lines[0].startswith("#!") else 0
        if at == 1 and not out[0].endswith("\n"):
            out[0] += "\n"
        out.insert(at, directive + "\n")
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# The check inside slurmctld: job_submit.lua sends the job, one answer line comes back


PROTOCOL = "fitcheck-slurm 1"
"""The first line of a request; then key=value lines, an empty line, and the directives."""
MAX_HEADER_LINES = 32
MAX_HEADER_LINE_BYTES = 4096
MAX_DIRECTIVE_BYTES = 4 << 20
"""The #FITCHECK lines of one job, at most (Slurm's default max_script_size is 4 MB)."""
SERVE_MEMORY_BYTES = 512 << 20
"""Address space of one check forked by --fitcheck-serve (the webhook's evaluation limit)."""

_UNSET = frozenset({0xFFFFFFFE, 0xFFFFFFFF, 0xFFFE, 0xFFFF})
"""slurm.h's NO_VAL, INFINITE, NO_VAL16 and INFINITE16: a count the job does not give."""


class RequestError(Exception):
    """A request that job_submit.lua should not have sent: no verdict, never the user's fault."""


@dataclass(frozen=True, slots=True)
class ControllerJob:
    """One job as job_submit.lua passes it: what the job itself carries and nothing else. The
    names are job_desc's in Slurm's job_submit/lua plugin (the same from 22.05 to 25.11: src/
    plugins/job_submit/lua/job_submit_lua.c); values as the plugin's tostring() gives them."""

    directives: str = ""
    """The script's lines that hold "#FITCHECK" (the plugin sends only those)."""
    user_name: str = ""
    name: str = ""
    min_nodes: str = ""
    num_tasks: str = ""
    ntasks_per_node: str = ""
    sockets_per_node: str = ""
    tres_per_job: str = ""
    """--gpus: "gres:gpu:16" (22.05, 23.02), "gres/gpu:16" (23.11 on); see gres_gpus."""
    tres_per_node: str = ""
    """--gres and --gpus-per-node: "gres:gpu:8", "gres/gpu:h100:8", comma-separated."""
    tres_per_socket: str = ""
    tres_per_task: str = ""
    """--gpus-per-task: "gres:gpu:1" (22.05), "gres/gpu:1" (23.11), "gres/gpu=1" (24.05 on)."""

    def _count(self, field: str) -> int | None:
        text = getattr(self, field).strip()
        if not text:
            return None
        try:
            v = float(text)  # Lua 5.3+ prints a float count as "8.0"
        except ValueError:
            raise SlurmSpecError(f"job_desc.{field}: expected a count, got {text!r}") from None
        if not v.is_integer() or v <= 0 or int(v) in _UNSET:
            return None
        return int(v)

    def options(self) -> list[tuple[str, str | None]]:
        """The allocation as sbatch options, for hardware_from_options: the same rule as the
        wrapper's, over the controller's view (#SBATCH lines and command line merged)."""
        opts: list[tuple[str, str | None]] = []
        for field, opt in (("min_nodes", "nodes"), ("num_tasks", "ntasks"),
                           ("ntasks_per_node", "ntasks-per-node"),
                           ("sockets_per_node", "sockets-per-node")):
            n = self._count(field)
            if n is not None:
                opts.append((opt, str(n)))
        for field, opt in (("tres_per_node", "gpus-per-node"), ("tres_per_job", "gpus"),
                           ("tres_per_task", "gpus-per-task"),
                           ("tres_per_socket", "gpus-per-socket")):
            gpus = gres_gpus(getattr(self, field), f"job_desc.{field}")
            if gpus:
                opts.append((opt, str(gpus)))
        return opts


def parse_request(stream: BinaryIO) -> ControllerJob:
    """A job from job_submit.lua: the PROTOCOL line, key=value lines (ControllerJob's fields
    and directives_bytes), an empty line, then directives_bytes bytes of #FITCHECK lines."""
    first = stream.readline(MAX_HEADER_LINE_BYTES + 1)
    if first.rstrip(b"\r\n") != PROTOCOL.encode():
        raise RequestError(f"not a {PROTOCOL!r} request: {first[:60]!r}")
    fields: dict[str, str] = {}
    for _ in range(MAX_HEADER_LINES):
        line = stream.readline(MAX_HEADER_LINE_BYTES + 1)
        if not line.endswith(b"\n"):
            raise RequestError("request header cut short or a line over "
                               f"{MAX_HEADER_LINE_BYTES} bytes")
        line = line.rstrip(b"\r\n")
        if not line:
            break
        key, _, value = line.decode("utf-8", "replace").partition("=")
        fields[key.strip()] = value
    else:
        raise RequestError(f"request header over {MAX_HEADER_LINES} lines")
    size = fields.pop("directives_bytes", "0").strip()
    if not size.isdigit() or int(size) > MAX_DIRECTIVE_BYTES:
        raise RequestError(f"directives_bytes: expected 0 to {MAX_DIRECTIVE_BYTES}, got {size!r}")
    body = stream.read(int(size))
    if len(body) != int(size):
        raise RequestError(f"directives cut short: {len(body)} of {size} bytes")
    known = set(ControllerJob.__slots__) - {"directives"}  # type: ignore[attr-defined]
    return ControllerJob(directives=body.decode("utf-8", "replace"),
                         **{k: v for k, v in fields.items() if k in known})


@dataclass(frozen=True, slots=True)
class Answer:
    """The check's answer to job_submit.lua, written as one line: ``FITCHECK <code> <text>``."""

    code: int
    """EXIT_ADMIT (admitted, or not checked), EXIT_REJECT, EXIT_BAD_SPEC or EXIT_NO_VERDICT."""
    message: str
    """For people: "admitted: ...", "not checked: ...", "rejected: ...", "bad job spec: ...",
    "no verdict: ..."."""

    def line(self) -> str:
        return f"FITCHECK {self.code} {' '.join(self.message.split())}\n"


_FILE_KEYS = ("spec", "job", "format")


def _refuse_files(spec: dict[str, Any]) -> None:
    """SlurmSpecError for a field that names a file: the check in slurmctld neither reads
    such a file nor looks whether it exists (planner.gate with allow_files=False refuses them
    too; this says what to do instead)."""
    from planner.validate import looks_like_path

    model, hardware = spec.get("model"), spec.get("hardware")
    config = model.get("config") if isinstance(model, dict) else None
    gpu = hardware.get("gpu") if isinstance(hardware, dict) else None
    cal = spec.get("calibration")
    if isinstance(config, str):
        raise SlurmSpecError(f"model.config={config!r:.200}: a file, which the check in "
                             "slurmctld does not read; submit with fitcheck-sbatch (it writes "
                             "config.json into the script), or give model.preset or the shape "
                             "fields")
    if isinstance(gpu, str) and looks_like_path(gpu):
        raise SlurmSpecError(f"hardware.gpu={gpu!r:.200}: a profile file, which the check in "
                             "slurmctld does not read; give a profile id (fitcheck --list-gpus)")
    if isinstance(cal, str) and cal not in ("auto", "none"):
        raise SlurmSpecError(f"calibration={cal!r:.200}: a file, which the check in slurmctld "
                             "does not read; give auto or none")


def controller_spec(directives: list[str]) -> dict[str, Any]:
    """The spec of a job inside slurmctld: its #FITCHECK key=value fields over its inline spec
    (spec-inline=). A directive naming a file (spec=, job=, a model.config or GPU profile path)
    is a bad spec, refused without the file being read or looked for."""
    spec: dict[str, Any] = {}
    fields: list[tuple[str, str]] = []
    inline_seen = False
    for item in directives:
        key, value = _key_value(item, "#FITCHECK")
        canonical = key.replace("_", "-")
        if canonical in _FILE_KEYS:
            what = "goes with job=PATH, a file" if canonical == "format" else "names a file"
            raise SlurmSpecError(f"#FITCHECK {key}={value!r:.200}: {what}, which the check in "
                                 "slurmctld does not read; submit with fitcheck-sbatch (it "
                                 f"writes the file's settings into the script as {INLINE}=), "
                                 "or give the fields as #FITCHECK key=value")
        if canonical == INLINE:
            if inline_seen:
                raise SlurmSpecError(f"#FITCHECK: {INLINE}= given twice")
            spec, inline_seen = _inline(value), True
        else:
            fields.append((key, value))
    for key, value in fields:
        set_field(spec, key, value, None)
    if not spec:
        raise SlurmSpecError("no job spec in the #FITCHECK lines")
    _refuse_files(spec)
    return spec


def controller_answer(job: ControllerJob) -> Answer:
    """The verdict on one job inside slurmctld, from what the job carries: its directives and
    its allocation. Reads no file (planner.gate with allow_files=False)."""
    try:
        _, directives = read_header(job.directives)
        if not directives:
            return Answer(EXIT_ADMIT, "not checked: no #FITCHECK lines")
        spec = controller_spec(directives)
        notes = with_allocation(spec, job.options())
        from planner.gate import gate

        doc = gate(spec, allow_files=False)
    except (SlurmSpecError, FitcheckError) as exc:
        return Answer(EXIT_BAD_SPEC, f"bad job spec: {exc}")
    tail = "".join(f" (note: {n})" for n in notes)
    if doc["verdict"] == "admit":
        return Answer(EXIT_ADMIT, f"admitted: {doc['reason']}{tail}")
    return Answer(EXIT_REJECT, f"rejected: {doc['reason']}{tail}")


class _TimedOut(BaseException):
    """The check's time passed (a BaseException: no `except Exception` on the way takes it)."""


def _answer(check: Any, timeout_s: float) -> Answer:
    """check() -> Answer, within timeout_s (SIGALRM: the main thread of a process of its own);
    past it, or on an internal error, an Answer with no verdict. Never raises."""
    import signal

    armed = True

    def fire(_sig: int, _frame: object) -> None:
        if armed:
            raise _TimedOut

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        try:
            return check()
        finally:
            armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    except _TimedOut:
        return Answer(EXIT_NO_VERDICT, f"no verdict: the check timed out after {timeout_s:g} s")
    except RequestError as exc:
        return Answer(EXIT_NO_VERDICT, f"no verdict: bad request from job_submit.lua: {exc}")
    except OSError as exc:
        return Answer(EXIT_NO_VERDICT, f"no verdict: reading the request: {exc}")
    except Exception as exc:  # noqa: BLE001 - a bug: no verdict, the plugin's policy decides
        if os.environ.get("FITCHECK_DEBUG"):
            import traceback

            traceback.print_exc()
        return Answer(EXIT_NO_VERDICT, f"no verdict: internal error: {type(exc).__name__}: "
                      f"{str(exc)[:300]}")


def _claim_socket(path: str) -> None:
    """Remove a stale socket file at path; WrapperUsage if a server answers there or the path
    is something else."""
    import socket
    import stat

    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise WrapperUsage(f"--fitcheck-serve: {path!r} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # nobody listens: left by a server that was killed
        return
    finally:
        probe.close()
    raise WrapperUsage(f"--fitcheck-serve: a server already answers on {path!r}")


WARM_UP = ControllerJob(directives="#FITCHECK model=llama3-8b gpu=h100-80\n",
                        tres_per_job="gres/gpu:8")
"""A job checked once at start, so that every fork finds the planner imported and loaded."""


def serve(path: str, timeout_s: float = 2.0, *, evaluate: Any = controller_answer) -> int:
    """Answer job_submit.lua on the Unix socket at path until SIGTERM or SIGINT: one warm
    process, a fork per job (cut at timeout_s and SERVE_MEMORY_BYTES: a hang or a blow-up
    never reaches the server). The socket is owner-only (mode 0600): run this as the user
    slurmctld runs as (SlurmUser)."""
    import resource
    import signal
    import socketserver

    class Check(socketserver.StreamRequestHandler):
        def handle(self) -> None:  # in the fork
            try:
                resource.setrlimit(resource.RLIMIT_AS, (SERVE_MEMORY_BYTES,
                                                        resource.getrlimit(resource.RLIMIT_AS)[1]))
            except (ValueError, OSError):
                pass
            self.connection.settimeout(timeout_s)
            answer = _answer(lambda: evaluate(parse_request(self.rfile)), timeout_s)
            try:
                self.wfile.write(answer.line().encode())
            except OSError:
                pass  # the plugin gave up waiting

    class Server(socketserver.ForkingMixIn, socketserver.UnixStreamServer):
        block_on_close = False

    _claim_socket(path)
    old_umask = os.umask(0o177)
    try:
        server = Server(path, Check)
    except OSError as exc:
        raise WrapperUsage(f"--fitcheck-serve: cannot listen on {path!r}: "
                           f"{exc.strerror or exc}") from None
    finally:
        os.umask(old_umask)
    inode = os.stat(path).st_ino
    warm = _answer(lambda: evaluate(WARM_UP), max(timeout_s, 30.0))
    if warm.code == EXIT_NO_VERDICT:
        print(f"fitcheck-sbatch: warm-up check: {warm.message}", file=sys.stderr)

    def stop(_sig: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    print(f"fitcheck-sbatch: serving the slurmctld check on {path} (timeout {timeout_s:g} s)",
          file=sys.stderr, flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        try:
            if os.stat(path).st_ino == inode:
                os.unlink(path)
        except OSError:
            pass
    return 0


# ---------------------------------------------------------------------------------------------
# The command


def _default_gate() -> list[str]:
    cmd = os.environ.get("FITCHECK")
    if cmd:
        return shlex.split(cmd)
    import shutil

    if shutil.which("fitcheck"):
        return ["fitcheck"]
    return [sys.executable, "-c", "from planner.cli import main; main()"]


def run_gate(spec: dict[str, Any], gate_cmd: list[str], on_error: str, timeout: float
             ) -> tuple[int, dict[str, Any] | None, str]:
    """(exit code, verdict or None, stderr) of `fitcheck gate -`. No verdict (the gate could
    not run, crashed, timed out, or reported an internal error) is EXIT_ADMIT with
    on_error admit, else EXIT_NO_VERDICT: never a rejection's code."""
    failed = EXIT_ADMIT if on_error == "admit" else EXIT_NO_VERDICT
    cmd = [*gate_cmd, "gate", "-", "--on-error", on_error, "--compact"]
    try:
        p = subprocess.run(cmd, input=json.dumps(spec), capture_output=True, text=True,
                           timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = (f"timed out after {timeout:g} s" if isinstance(exc, subprocess.TimeoutExpired)
               else f"cannot run {cmd[0]!r}: {exc}")
        return failed, None, why
    verdict = None
    if p.returncode in (EXIT_ADMIT, EXIT_REJECT):
        try:
            verdict = json.loads(p.stdout)
        except ValueError:
            return failed, None, f"unreadable verdict: {p.stdout[:200]!r}"
        if not isinstance(verdict, dict):
            return failed, None, f"unreadable verdict: {p.stdout[:200]!r}"
        if verdict.get("error"):  # the gate's own internal error or timeout
            return failed, None, str(verdict["error"])
    elif p.returncode not in (EXIT_USAGE, EXIT_BAD_SPEC):
        return failed, None, (p.stderr.strip().splitlines() or [f"gate exited {p.returncode}"])[-1]
    return p.returncode, verdict, p.stderr.strip()


WRAPPER_TIMEOUT_S = 30.0
CONTROLLER_TIMEOUT_S = 2.0
"""--fitcheck-timeout's default for --fitcheck-controller and --fitcheck-serve: the check
runs while slurmctld waits (job_submit.lua's own TIMEOUT_S is 2 s too)."""


def parse_argv(argv: list[str]) -> dict[str, Any]:
    """Wrapper options out; sbatch options, the script and its arguments kept in order."""
    wrapper = {"sbatch": os.environ.get("FITCHECK_SBATCH", "sbatch"), "fitcheck": None,
               "spec": None, "job": None, "sets": [], "on_error": "reject", "timeout": None,
               "dry_run": False, "skip": os.environ.get("FITCHECK_SKIP") == "1",
               "serve": None, "controller": False}
    takes = {"--sbatch": "sbatch", "--fitcheck": "fitcheck", "--fitcheck-spec": "spec",
             "--fitcheck-job": "job",
             "--fitcheck-set": "sets", "--fitcheck-on-error": "on_error",
             "--fitcheck-timeout": "timeout", "--fitcheck-serve": "serve"}
    flags = {"--fitcheck-dry-run": "dry_run", "--fitcheck-skip": "skip",
             "--fitcheck-controller": "controller"}
    passthrough: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        name, eq, value = a.partition("=")
        if name in takes:
            if not eq:
                if i + 1 >= len(argv):
                    raise WrapperUsage(f"{name}: needs a value")
                value = argv[i + 1]
                i += 1
            key = takes[name]
            if key == "sets":
                wrapper["sets"].append(value)
            elif key == "timeout":
                try:
                    t = float(value)
                except ValueError:
                    t = float("nan")
                if not 0 < t <= 3600:  # also refuses nan and inf
                    raise WrapperUsage(f"--fitcheck-timeout: seconds, above 0 and at most "
                                       f"3600, got {value!r}") from None
                wrapper["timeout"] = t
            elif key == "on_error":
                if value not in ("admit", "reject"):
                    raise WrapperUsage(f"--fitcheck-on-error: admit or reject, got {value!r}")
                wrapper["on_error"] = value
            else:
                wrapper[key] = value
        elif a in flags:
            wrapper[flags[a]] = True
        elif a in ("-h", "--help") and not passthrough:
            wrapper["help"] = True
        elif a == "--":
            passthrough += argv[i:]
            break
        elif a.startswith("-") and len(a) > 1:  # an sbatch option, with its value if separate
            passthrough.append(a)
            if _takes_next(a) and i + 1 < len(argv):
                passthrough.append(argv[i + 1])
                i += 1
        else:  # the script: everything after it is the script's
            passthrough += argv[i:]
            break
        i += 1
    wrapper["passthrough"] = passthrough
    return wrapper


def _takes_next(a: str) -> bool:
    if a.startswith("--"):
        return "=" not in a and a[2:] not in LONG_NOARG
    return len(a) == 2 and a[1] not in SHORT_NOARG


def main(argv: list[str] | None = None) -> int:
    from planner.tempfiles import exit_on_terminate

    argv = list(sys.argv[1:] if argv is None else argv)
    exit_on_terminate()  # SIGTERM removes the script copy it submits (planner/tempfiles.py)
    try:
        return _main(argv)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug: one line (FITCHECK_DEBUG=1: traceback)
        if os.environ.get("FITCHECK_DEBUG"):
            import traceback

            traceback.print_exc()
        print(f"fitcheck-sbatch: error: internal error: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return EXIT_CRASH


def _error(exc: Exception | str, code: int) -> int:
    print(f"fitcheck-sbatch: error: {exc}", file=sys.stderr)
    return code


def _main(argv: list[str]) -> int:
    try:
        w = parse_argv(argv)
    except WrapperUsage as exc:
        return _error(exc, EXIT_USAGE)
    if w.get("help"):
        print(__doc__.strip())
        return 0
    if w["serve"] is not None:
        try:
            return serve(w["serve"], w["timeout"] or CONTROLLER_TIMEOUT_S)
        except WrapperUsage as exc:
            return _error(exc, EXIT_USAGE)
    if w["controller"]:
        timeout = w["timeout"] or CONTROLLER_TIMEOUT_S
        answer = _answer(lambda: controller_answer(parse_request(sys.stdin.buffer)), timeout)
        sys.stdout.write(answer.line())
        return answer.code
    sbatch = shlex.split(w["sbatch"])
    passthrough = w["passthrough"]
    cli_opts, pos = split_options(passthrough)
    submit = [*sbatch, *passthrough]
    if w["skip"]:
        print("fitcheck-sbatch: check skipped (--fitcheck-skip / FITCHECK_SKIP=1)",
              file=sys.stderr)
        return _exec(submit, w["dry_run"])
    wrap = any(name == "wrap" for name, _ in cli_opts)
    if pos >= len(passthrough) and not wrap:
        return _error("no batch script given (a script file, or --wrap with "
                      "--fitcheck-spec/--fitcheck-set)", EXIT_USAGE)
    script = None if pos >= len(passthrough) else passthrough[pos]
    if script is None:  # --wrap
        text, script_dir = "", os.getcwd()
    else:
        try:  # surrogateescape: a copy written back is byte for byte the script
            with open(script, encoding="utf-8", errors="surrogateescape") as f:
                text = f.read(4 << 20)
        except OSError as exc:
            return _error(f"script {script!r}: {exc.strerror or exc}", EXIT_USAGE)
        script_dir = os.path.dirname(os.path.abspath(script))
    try:
        sbatch_args, fc_args = read_header(text)
        if not (fc_args or w["spec"] or w["sets"] or w["job"]):
            # nothing to check, as job_submit.lua: submitted untouched (--wrap jobs too)
            if w["dry_run"]:
                print(json.dumps({"spec": None, "verdict": None, "submit": submit,
                                  "directive": None}, indent=2))
            return _exec(submit, w["dry_run"])
        spec = user_spec(fc_args, script_dir, w["spec"], w["sets"], w["job"])
        gated = copy.deepcopy(spec)
        script_opts, _ = split_options(sbatch_args, stop_at_positional=False)
        notes = with_allocation(gated, script_opts + cli_opts)
    except (SlurmSpecError, WrapperUsage) as exc:
        return _error(exc, exc.exit_code)
    for note in notes:
        print(f"fitcheck-sbatch: note: {note}", file=sys.stderr)
    gate_cmd = shlex.split(w["fitcheck"]) if w["fitcheck"] else _default_gate()
    code, verdict, err = run_gate(gated, gate_cmd, w["on_error"], w["timeout"]
                                  or WRAPPER_TIMEOUT_S)
    if verdict is None and code in (EXIT_ADMIT, EXIT_NO_VERDICT):  # the gate failed
        word = "submitting anyway" if code == EXIT_ADMIT else "not submitted"
        print(f"fitcheck-sbatch: gate failed ({err}); {word} per --fitcheck-on-error "
              f"{w['on_error']}", file=sys.stderr)
    elif verdict is None:
        err = err.removeprefix("fitcheck: error: ") or "bad spec"
        print(f"fitcheck-sbatch: error: {err}", file=sys.stderr)
    elif code == EXIT_REJECT:
        print(f"fitcheck-sbatch: rejected: {verdict.get('reason')}", file=sys.stderr)
    else:
        print(f"fitcheck-sbatch: admitted: {verdict.get('reason')}", file=sys.stderr)
    directive = None
    if code == EXIT_ADMIT and script is not None and _needs_inline(fc_args, spec, w):
        try:
            portable, more = portable_spec(spec, gated.get("hardware"))
            directive = inline_directive(portable)
        except SlurmSpecError as exc:
            return _error(exc, exc.exit_code)
        for note in more:
            print(f"fitcheck-sbatch: note: {note}", file=sys.stderr)
    elif code == EXIT_ADMIT and script is None and (w["spec"] or w["sets"] or w["job"]):
        print("fitcheck-sbatch: note: a --wrap job carries no #FITCHECK lines: the check in "
              "slurmctld, if any, lets it through unchecked", file=sys.stderr)
    if w["dry_run"]:
        print(json.dumps({"spec": gated, "verdict": verdict, "submit": submit,
                          "directive": directive}, indent=2))
    if code != EXIT_ADMIT:
        return code
    if directive is None:
        return _exec(submit, w["dry_run"])
    if w["dry_run"]:
        return 0
    assert script is not None
    return _submit_copy(sbatch, passthrough, pos, rewrite_script(text, directive),
                        script_opts + cli_opts)


def _needs_inline(fc_args: list[str], spec: dict[str, Any], w: dict[str, Any]) -> bool:
    """Whether the check in slurmctld would not see the job as the wrapper did: files named
    (spec=, job=, a model.config path), or --fitcheck-spec/-job/-set given."""
    if w["spec"] or w["sets"] or w["job"]:
        return True
    if any(_key_value(a, "#FITCHECK")[0] in _FILE_KEYS for a in fc_args):
        return True
    try:
        _refuse_files(spec)
    except SlurmSpecError:
        return True
    return False


def _submit_copy(sbatch: list[str], passthrough: list[str], pos: int, text: str,
                 opts: list[tuple[str, str | None]]) -> int:
    """sbatch on a copy of the script (a private temporary file, removed once sbatch has read
    it), named as sbatch would name the original job (--job-name, unless one is given)."""
    import tempfile

    script = passthrough[pos]
    named = any(n == "job-name" for n, _ in opts) or os.environ.get("SBATCH_JOB_NAME")
    name = [] if named else [f"--job-name={os.path.basename(script)}"]
    from planner.tempfiles import sweep

    # a killed wrapper's copies, an hour old (sbatch has read them long since)
    sweep(tempfile.gettempdir(), lambda n: n.startswith("fitcheck-sbatch-") and n.endswith(".sh"))
    fd, tmp = tempfile.mkstemp(prefix="fitcheck-sbatch-", suffix=".sh")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(text)
        cmd = [*sbatch, *passthrough[:pos], *name, tmp, *passthrough[pos + 1:]]
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            return subprocess.call(cmd)
        except OSError as exc:
            return _error(f"cannot run {cmd[0]!r}: {exc.strerror or exc}", EXIT_CRASH)
    finally:
        os.unlink(tmp)


def _exec(cmd: list[str], dry_run: bool) -> int:
    if dry_run:
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        print(f"fitcheck-sbatch: error: cannot run {cmd[0]!r}: {exc.strerror or exc}",
              file=sys.stderr)
        return EXIT_CRASH
    return EXIT_CRASH  # not reached


if __name__ == "__main__":
    sys.exit(main())
