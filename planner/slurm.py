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
allocation's GPUs over both) and only on admit execs ``sbatch`` with the original arguments.
On reject it prints the reason and exits 3; a bad spec exits 4.

Wrapper options (all others go to sbatch unchanged):
  --sbatch CMD                the submit command (default $FITCHECK_SBATCH or sbatch)
  --fitcheck CMD              the gate command (default $FITCHECK or fitcheck)
  --fitcheck-job PATH         a job config (overrides #FITCHECK job=)
  --fitcheck-spec PATH        a spec file (overrides #FITCHECK spec=)
  --fitcheck-set KEY=VALUE    a spec field (repeatable; overrides #FITCHECK lines)
  --fitcheck-on-error admit|reject   when the gate cannot run or crashes (default reject)
  --fitcheck-timeout SECONDS  for the gate (default 30)
  --fitcheck-dry-run          print the spec, the verdict and the sbatch command; submit nothing
  --fitcheck-skip             submit without checking ($FITCHECK_SKIP=1 too)

Installed as the ``fitcheck-sbatch`` console script; integrations/slurm/fitcheck-sbatch is a
shim for a checkout. The gate runs in a subprocess, so a crash or a hang in it is an
--fitcheck-on-error verdict, never a stuck submission.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from typing import Any

EXIT_ADMIT, EXIT_CRASH, EXIT_USAGE, EXIT_REJECT, EXIT_BAD_SPEC = 0, 1, 2, 3, 4


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
SHORT_LONG = {"N": "nodes", "G": "gpus", "n": "ntasks"}
WANTED = {"nodes", "gres", "gpus-per-node", "gpus", "gpus-per-task", "ntasks-per-node", "ntasks",
          "wrap"}


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


def read_header(text: str) -> tuple[list[str], list[str]]:
    """(the #SBATCH arguments, the #FITCHECK arguments) of a batch script.

    #SBATCH lines count until the first command (as in sbatch); #FITCHECK lines anywhere.
    """
    sbatch: list[str] = []
    fitcheck: list[str] = []
    in_header = True
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s.startswith("#FITCHECK"):
            rest = s[len("#FITCHECK"):]
            if rest and not rest[0].isspace():
                continue  # e.g. #FITCHECKED: not ours
            try:
                fitcheck += shlex.split(rest, comments=True)
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


def _gres_gpus(text: str) -> int | None:
    """'gpu:8', 'gpu:a100:8', 'gres/gpu:4', 'gpu:8(S:0-1)', 'gpu' -> GPUs per node."""
    total = None
    for part in filter(None, text.split(",")):
        part = part.split("(", 1)[0].strip()
        fields = part.split(":")
        name = fields[0].removeprefix("gres/")
        if name != "gpu":
            continue
        count = 1
        if len(fields) > 1 and fields[-1].isdigit():
            count = int(fields[-1])
        elif len(fields) > 1 and len(fields) == 3:
            raise SlurmSpecError(f"--gres: expected gpu[:type]:count, got {text!r}")
        total = (total or 0) + count
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
    elif "gres" in last:
        gpn = _gres_gpus(last["gres"])
    elif "gpus-per-task" in last and "ntasks-per-node" in last:
        gpn = (_typed_count("gpus-per-task", last["gpus-per-task"])
               * _int("ntasks-per-node", last["ntasks-per-node"]))
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


def build_spec(script_text: str, script_dir: str, cli_opts: list[tuple[str, str | None]],
               spec_path: str | None = None, sets: list[str] | None = None,
               job_path: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """The job spec of a script: #FITCHECK job/spec/fields, then --fitcheck-*, then the GPUs
    of the #SBATCH header and the sbatch command line. Returns (spec, notes)."""
    sbatch_args, fc_args = read_header(script_text)
    fields: list[tuple[str, str, str | None]] = []
    file_from_script = None
    job: dict[str, str] = {}
    for item in fc_args:
        key, eq, value = item.partition("=")
        if not eq:
            raise SlurmSpecError(f"#FITCHECK: expected key=value, got {item!r}")
        if key.strip() == "spec":
            file_from_script = os.path.join(script_dir, value)
        elif key.strip() == "job":
            job["path"] = os.path.abspath(os.path.join(script_dir, os.path.expanduser(value)))
        elif key.strip() == "format":
            job["format"] = value.strip().lower()
        else:
            fields.append((key, value, script_dir))
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
    spec = load_spec_file(path) if path else {}
    for key, value, base in fields:
        set_field(spec, key, value, base)
    if job:
        spec["job"] = job
    if not spec:
        raise SlurmSpecError("no job spec: add '#FITCHECK job=PATH', '#FITCHECK spec=PATH' or "
                             "'#FITCHECK key=value' "
                             "lines (model, gpu, ...) to the script, or --fitcheck-spec")
    script_opts, _ = split_options(sbatch_args, stop_at_positional=False)
    hw, notes = hardware_from_options(script_opts + cli_opts)
    if hw:
        hardware = spec.setdefault("hardware", {})
        if not isinstance(hardware, dict):
            raise SlurmSpecError("hardware: must be a mapping")
        for k, v in hw.items():
            if hardware.get(k) not in (None, v):
                notes.append(f"hardware.{k}={hardware[k]!r} in the spec; the allocation "
                             f"asks for {v}: checking {v}")
            hardware[k] = v
    return spec, notes


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
    """(exit code, verdict or None, stderr) of `fitcheck gate -`; failures per on_error."""
    cmd = [*gate_cmd, "gate", "-", "--on-error", on_error, "--compact"]
    try:
        p = subprocess.run(cmd, input=json.dumps(spec), capture_output=True, text=True,
                           timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = (f"timed out after {timeout:g} s" if isinstance(exc, subprocess.TimeoutExpired)
               else f"cannot run {cmd[0]!r}: {exc}")
        return (EXIT_ADMIT if on_error == "admit" else EXIT_REJECT), None, why
    verdict = None
    if p.returncode in (EXIT_ADMIT, EXIT_REJECT):
        try:
            verdict = json.loads(p.stdout)
        except ValueError:
            return ((EXIT_ADMIT if on_error == "admit" else EXIT_REJECT), None,
                    f"unreadable verdict: {p.stdout[:200]!r}")
    elif p.returncode not in (EXIT_USAGE, EXIT_BAD_SPEC):
        return ((EXIT_ADMIT if on_error == "admit" else EXIT_REJECT), None,
                (p.stderr.strip() or f"gate exited {p.returncode}"))
    return p.returncode, verdict, p.stderr.strip()


def parse_argv(argv: list[str]) -> dict[str, Any]:
    """Wrapper options out; sbatch options, the script and its arguments kept in order."""
    wrapper = {"sbatch": os.environ.get("FITCHECK_SBATCH", "sbatch"), "fitcheck": None,
               "spec": None, "job": None, "sets": [], "on_error": "reject", "timeout": 30.0,
               "dry_run": False, "skip": os.environ.get("FITCHECK_SKIP") == "1"}
    takes = {"--sbatch": "sbatch", "--fitcheck": "fitcheck", "--fitcheck-spec": "spec",
             "--fitcheck-job": "job",
             "--fitcheck-set": "sets", "--fitcheck-on-error": "on_error",
             "--fitcheck-timeout": "timeout"}
    flags = {"--fitcheck-dry-run": "dry_run", "--fitcheck-skip": "skip"}
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
                    wrapper["timeout"] = float(value)
                except ValueError:
                    raise WrapperUsage(f"--fitcheck-timeout: a number of seconds, got "
                                       f"{value!r}") from None
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
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        w = parse_argv(argv)
    except WrapperUsage as exc:
        print(f"fitcheck-sbatch: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if w.get("help"):
        print(__doc__.strip())
        return 0
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
        print("fitcheck-sbatch: error: no batch script given (a script file, or --wrap with "
              "--fitcheck-spec/--fitcheck-set)", file=sys.stderr)
        return EXIT_USAGE
    if wrap and pos >= len(passthrough):
        text, script_dir = "", os.getcwd()
    else:
        script = passthrough[pos]
        try:
            with open(script, encoding="utf-8", errors="replace") as f:
                text = f.read(4 << 20)
        except OSError as exc:
            print(f"fitcheck-sbatch: error: script {script!r}: {exc.strerror or exc}",
                  file=sys.stderr)
            return EXIT_USAGE
        script_dir = os.path.dirname(os.path.abspath(script))
    try:
        spec, notes = build_spec(text, script_dir, cli_opts, w["spec"], w["sets"], w["job"])
    except (SlurmSpecError, WrapperUsage) as exc:
        print(f"fitcheck-sbatch: error: {exc}", file=sys.stderr)
        return exc.exit_code
    for note in notes:
        print(f"fitcheck-sbatch: note: {note}", file=sys.stderr)
    gate_cmd = shlex.split(w["fitcheck"]) if w["fitcheck"] else _default_gate()
    code, verdict, err = run_gate(spec, gate_cmd, w["on_error"], w["timeout"])
    if w["dry_run"]:
        print(json.dumps({"spec": spec, "verdict": verdict, "submit": submit}, indent=2))
    if verdict is None and code in (EXIT_ADMIT, EXIT_REJECT):  # the gate failed
        word = "submitting anyway" if code == EXIT_ADMIT else "not submitted"
        print(f"fitcheck-sbatch: gate failed ({err}); {word} per --fitcheck-on-error "
              f"{w['on_error']}", file=sys.stderr)
    elif verdict is None:
        err = err.removeprefix("fitcheck: error: ") or "bad spec"
        print(f"fitcheck-sbatch: error: {err}", file=sys.stderr)
        return code
    elif code == EXIT_REJECT:
        print(f"fitcheck-sbatch: rejected: {verdict.get('reason')}", file=sys.stderr)
    else:
        print(f"fitcheck-sbatch: admitted: {verdict.get('reason')}", file=sys.stderr)
    if code != EXIT_ADMIT:
        return code
    return _exec(submit, w["dry_run"])


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
