"""Read the job where it lives: training-job configuration files in, fitcheck's request out
(docs/jobs.md).

``read_job(path)`` detects the format by content (or takes ``fmt``) and returns a ``Job``:
its values in the field registry's paths, warnings, and what it sets that fitcheck does not
model. ``build(jobs, given, naming)`` lays the user's own values (flags, gate options) over
the job's and returns the typed Request. ``planner.jobs.write`` writes a recommendation back
into the file. Imported only when a job file is read: the planning fast path never loads it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from planner.jobs.record import (
    Job,
    JobError,
    JobFormat,
    Resolved,
    Source,
    Vocab,
    merge,
    naming_for,
    resolve,
    split_modelled,
)

__all__ = ["FORMATS", "Job", "JobError", "JobFormat", "Resolved", "Source", "Vocab", "build",
           "detect", "plan_request", "read_doc", "read_job", "read_jobs", "resolve",
           "split_modelled"]

FORMATS: tuple[str, ...] = tuple(str(f) for f in JobFormat)


def _readers() -> dict[JobFormat, Any]:
    from planner.jobs.readers import (
        accelerate,
        axolotl,
        deepspeed,
        kubeflow,
        litgpt,
        llamafactory,
        spec,
        torchtitan,
        torchtune,
        trainer,
        trl,
    )

    return {JobFormat.TORCHTITAN: torchtitan, JobFormat.DEEPSPEED: deepspeed,
            JobFormat.ACCELERATE: accelerate, JobFormat.TRAINER: trainer, JobFormat.TRL: trl,
            JobFormat.LLAMAFACTORY: llamafactory, JobFormat.AXOLOTL: axolotl,
            JobFormat.LITGPT: litgpt, JobFormat.TORCHTUNE: torchtune,
            JobFormat.KUBEFLOW: kubeflow, JobFormat.SPEC: spec}


def detect(kind: str, doc: Any, name: str) -> JobFormat:
    """The format of a parsed document (kind: json, toml, yaml or python), by the keys it
    has."""
    if kind == "python":
        return JobFormat.TORCHTITAN
    if kind == "toml":
        from planner.jobs.readers import torchtitan

        if torchtitan.detect(doc):
            return JobFormat.TORCHTITAN
        raise JobError(f"{name}: a TOML file without torchtitan's sections ([job], [model], "
                       "[training], [parallelism]); give --format")
    if not isinstance(doc, dict):
        raise JobError(f"{name}: must be a mapping of settings, got "
                       f"{type(doc).__name__}")
    scores = {fmt: mod.detect(doc) for fmt, mod in _readers().items()
              if fmt is not JobFormat.TORCHTITAN}
    best = max(scores.values())
    top = [f for f, s in scores.items() if s == best]
    if len(top) > 1 and JobFormat.TRAINER in top:
        # nothing but TrainingArguments' own keys (TRL and LLaMA-Factory subclass it): a
        # dump of TrainingArguments; a recipe's own keys would have scored it higher
        top = [JobFormat.TRAINER]
    if best <= 0:
        raise JobError(f"{name}: cannot tell which job format this is (keys "
                       f"{', '.join(sorted(map(str, doc))[:6])}...); give --format "
                       f"{'|'.join(FORMATS)}")
    if len(top) > 1:
        raise JobError(f"{name}: reads as {' or '.join(map(str, top))}; give --format")
    return top[0]


def read_doc(doc: Any, name: str, fmt: JobFormat, base_dir: str | None,
             depth: int = 0) -> Job:
    """A parsed document of a known format -> its Job."""
    from planner.jobs.readers.common import Reader

    if fmt is JobFormat.KUBEFLOW and isinstance(doc, list):
        from planner.jobs.readers.kubeflow import pick

        doc = pick(doc, name)
    if isinstance(doc, list):
        raise JobError(f"{name}: holds {len(doc)} YAML documents; a {fmt} config is one")
    if not isinstance(doc, dict):
        raise JobError(f"{name}: must be a mapping of settings, got {type(doc).__name__}")
    r = Reader(doc, name, fmt, base_dir, depth, read_job=read_job, read_doc=read_doc)
    _readers()[fmt].read(r)
    return r.job()


def read_job(path: str, fmt: str | JobFormat | None = None, *, text: str | None = None,
             depth: int = 0) -> Job:
    """The job in ``path`` ('-': stdin, or ``text`` when given). A wrong --format is an error
    saying what the file looks like."""
    from planner.jobs.pyconfig import split_name
    from planner.jobs.text import base_dir, parse, read_text

    file, function = split_name(path)
    if text is None:
        text = read_text(file)
    name = "stdin" if path == "-" else path
    kind, doc = parse(text, file if path != "-" else name)
    if kind == "python":
        doc = _registry(text, file, function, name)
        path = file
    if fmt is not None:
        try:
            fmt = JobFormat(str(fmt).lower())
        except ValueError:
            raise JobError(f"{name}: unknown format {fmt!r}; expected one of "
                           f"{', '.join(FORMATS)}") from None
        if (kind in ("toml", "python")) != (fmt is JobFormat.TORCHTITAN):
            raise JobError(f"{name}: --format {fmt} but the file is {kind.upper()}")
        probe = _first(doc, kind, name)
        if isinstance(probe, dict) and not _readers()[fmt].detect(probe):
            try:
                seen = f" (it reads as {detect(kind, probe, name)})"
            except JobError:
                seen = ""
            raise JobError(f"{name}: --format {fmt}, but the file has none of its keys{seen}")
    else:
        fmt = detect(kind, _first(doc, kind, name), name)
    return read_doc(doc, name, fmt, base_dir(path), depth)


def _registry(text: str, file: str, function: str | None, name: str) -> dict[str, Any]:
    """A torchtitan config_registry.py function, read without running it, as TOML sections."""
    from planner.jobs.pyconfig import Registry, module_name
    from planner.jobs.readers.torchtitan import from_registry

    registry = Registry(text, file)
    fname, cfg = registry.evaluate(function)
    return from_registry(cfg, fname, module_name(file), name)


def _first(doc: Any, kind: str, name: str) -> Any:
    """The document formats are told by (a manifest's training object)."""
    if kind == "yaml" and isinstance(doc, list):
        from planner.jobs.readers.kubeflow import pick

        return pick(doc, name)
    return doc


def read_jobs(paths: Sequence[str], fmt: str | None = None) -> Job:
    """Several files of one job (an accelerate config and the recipe it launches), merged;
    the same setting given two ways is an error naming both."""
    if not paths:
        raise JobError("no job file given")
    job = read_job(paths[0], fmt)
    for p in paths[1:]:
        job = merge(job, read_job(p, fmt))
    return job


def build(job: Job, given: Mapping[str, Any], given_name: Callable[[str], str],
          given_error: Callable[[str], Exception], *, allow_files: bool = True):
    """The typed Request of a job under the user's values (``given``: {path: raw}, None = not
    given), and the Resolved values it came from (warnings, unmodelled). A job's bad value is
    a JobError naming the file and key (exit 4); a given one is the front end's error."""
    from planner.fields import parse
    from planner.jobs.record import attention_why
    from planner.request import ATTENTION_WHY, build_request

    resolved = resolve(job, given)
    naming = naming_for(job, resolved, given_name, given_error)
    own = {p: v for p, v in resolved.values.items() if p not in resolved.given}
    parse(own, naming)  # the job's own values, named by file and key
    values = dict(resolved.values)
    why = attention_why(job, resolved)
    if why:
        values[ATTENTION_WHY] = why
    return build_request(values, naming, allow_files=allow_files), resolved


def plan_request(paths: Sequence[str], fmt: str | None, given: Mapping[str, Any]):
    """The plan command's request for ``--job`` files under the flags given: (Request, Job,
    Resolved). A bad flag is a usage error (exit 2), a bad job value a JobError (exit 4)."""
    from planner.errors import UsageError
    from planner.fields import FLAGS

    job = read_jobs(paths, fmt)
    request, resolved = build(job, given, FLAGS.name, UsageError)
    return request, job, resolved
