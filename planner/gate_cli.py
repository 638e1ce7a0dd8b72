"""`fitcheck gate SPEC` and `fitcheck serve`: scheduler gating (docs/gating.md).

Loaded only when one of the two is named (planner.cli.LAZY_COMMANDS). `gate` prints one JSON
verdict and exits 0 admit (a job at risk: per --at-risk), 3 reject, 4 bad spec, 2 usage;
`serve` runs the Kubernetes validating admission webhook of planner.webhook.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import click

from planner.cli_options import JOB_FORMATS
from planner.errors import FitcheckError, UsageError

ON_ERROR = click.Choice(["admit", "reject"], case_sensitive=False)
class _AtRisk(click.ParamType):
    """admit, reject, warn or a probability (planner.error_bands.parse_at_risk, imported only
    when the option is given: the gate's --help stays light)."""

    name = "admit|reject|warn|P"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        from planner.error_bands import parse_at_risk

        try:
            return parse_at_risk(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


AT_RISK = _AtRisk()
AT_RISK_HELP = ("A job at risk (the interval of its need straddles the usable memory): admit, "
                "reject, warn (admit with a warning giving the probability of running out "
                "of memory), or a probability P (0.5, 50%): reject at and above it, else warn. "
                "Overrides the spec's at_risk [default: the spec's, else warn].")


GATE_TIMEOUT_S = (0.1, 3600.0)
"""gate --timeout: 0 (no limit) or within these seconds."""
SERVE_TIMEOUT_S = (0.1, 30.0)
"""serve --timeout: within these seconds (the API server waits 30 s at most)."""


class Seconds(click.ParamType):
    """A finite number of seconds in [lo, hi], or 0 when zero_ok ("no limit")."""

    name = "seconds"

    def __init__(self, lo: float, hi: float, *, zero_ok: bool = False) -> None:
        self.lo, self.hi, self.zero_ok = lo, hi, zero_ok

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        try:
            x = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            self.fail(f"a number of seconds, got {value!r}", param, ctx)
        if self.zero_ok and x == 0:
            return 0.0
        if not self.lo <= x <= self.hi:  # also refuses nan and inf
            zero = "0 (no limit) or " if self.zero_ok else ""
            self.fail(f"must be {zero}between {self.lo:g} and {self.hi:g} seconds, got {value!r}",
                      param, ctx)
        return x


class GateTimeout(BaseException):
    """The gate's --timeout passed. A BaseException, so that no `except Exception` on the way
    takes it for an error of its own."""


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """GateTimeout in the main thread after `seconds` (POSIX; 0 or elsewhere: no limit). The
    timer fires once and never after the block: a late signal raises nothing."""
    import signal
    import threading

    if seconds <= 0 or not hasattr(signal, "setitimer") \
            or threading.current_thread() is not threading.main_thread():
        yield
        return
    armed = True

    def fire(_sig: int, _frame: object) -> None:
        nonlocal armed
        if armed:
            armed = False
            raise GateTimeout(f"timed out after {seconds:g} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@click.command("gate", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("spec", metavar="SPEC")
@click.option("--on-error", type=ON_ERROR, default="reject", show_default=True,
              help="What an internal error or a timeout means: the verdict printed (with an "
              "\"error\" key) and its exit code, 0 admit or 3 reject.")
@click.option("--timeout", type=Seconds(*GATE_TIMEOUT_S, zero_ok=True), default=10.0,
              show_default=True, help="Seconds before reading and evaluating the spec counts "
              f"as an internal error: 0 (none) or {GATE_TIMEOUT_S[0]:g} to {GATE_TIMEOUT_S[1]:g}.")
@click.option("--at-risk", "at_risk", type=AT_RISK, default=None, help=AT_RISK_HELP)
@click.option("--compact", is_flag=True, help="The verdict on one line.")
@click.option("--format", "job_format", type=click.Choice(JOB_FORMATS, case_sensitive=False),
              help="The format of SPEC when it is a job config (default: told by its content; "
              "docs/jobs.md).")
@click.option("--gpu", metavar="NAME|PATH", help="GPU profile, when SPEC does not say.")
@click.option("--n", metavar="N", help="Total GPUs (overrides SPEC's).")
@click.option("--gpus-per-node", metavar="N", help="GPUs per node (overrides SPEC's).")
@click.option("--model", metavar="PRESET", help="The model, when SPEC does not name one "
              "fitcheck knows (a preset or hub-style id).")
def gate_cmd(spec: str, on_error: str, timeout: float, at_risk: str | None, compact: bool,
             job_format: str | None, gpu: str | None, n: str | None,
             gpus_per_node: str | None, model: str | None) -> int:
    """Admit or reject the job described by SPEC (- for stdin): a fitcheck spec (JSON or
    YAML) or a job config (torchtitan TOML or config registry entry FILE.py:NAME, DeepSpeed
    JSON, accelerate / HF / TRL / LLaMA-Factory / axolotl / litgpt / torchtune YAML, Kubeflow
    manifest; docs/jobs.md).

    Prints one JSON verdict. Exit codes: 0 admit (a job that fits, or one at risk under
    --at-risk admit or warn), 3 reject, 4 bad spec, 2 usage.
    """
    import json

    from planner.gate import error_verdict, exit_code, gate_path

    from planner.cli_options import JobFile

    on_error = on_error.lower()
    try:  # '-', a regular file, or a torchtitan registry entry FILE.py:NAME
        JobFile().convert(spec, None, None)
    except click.BadParameter as exc:
        raise UsageError(f"SPEC: {exc.message}") from None
    try:
        with _time_limit(timeout):
            verdict = gate_path(spec, fmt=job_format and job_format.lower(), overrides={
                "hardware.gpu": gpu, "hardware.n": n, "hardware.gpus_per_node": gpus_per_node,
                "model.preset": model}, at_risk=at_risk)
    except (FitcheckError, click.ClickException, KeyboardInterrupt):
        raise  # a bad spec (exit 4) or usage (2) is not an internal error
    except (GateTimeout, Exception) as exc:  # internal error: fail open or closed, as asked
        if os.environ.get("FITCHECK_DEBUG"):
            import traceback

            traceback.print_exc()
        err = str(exc) if isinstance(exc, GateTimeout) else f"{type(exc).__name__}: {exc}"
        verdict = error_verdict(err, on_error)
        click.echo(f"fitcheck: internal error: {err}; verdict {verdict['verdict']} per "
                   f"--on-error", err=True)
    click.echo(json.dumps(verdict, separators=(",", ":")) if compact
               else json.dumps(verdict, indent=2))
    return exit_code(verdict)


LOOPBACK = "127.0.0.1"


@click.command("serve", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", default=None, help="Address to listen on [default: 0.0.0.0 with TLS, "
              f"{LOOPBACK} with --insecure].")
@click.option("--port", type=click.IntRange(0, 65535), default=8443, show_default=True,
              help="Port (0: any free port, printed on start).")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False),
              help="PEM certificate (chain) for HTTPS; required, with --tls-key, unless "
              "--insecure.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="PEM private key.")
@click.option("--client-ca", type=click.Path(exists=True, dir_okay=False),
              help="PEM CA bundle: require a client certificate signed by it (the API "
              "server's, docs/gating.md).")
@click.option("--insecure", is_flag=True,
              help=f"Plain HTTP without TLS, for local tests; listens on {LOOPBACK} unless "
              "--host says otherwise.")
@click.option("--require-annotation", is_flag=True,
              help="Deny objects without the fitcheck.io/spec annotation (default: allow them "
              "with a warning).")
@click.option("--on-error", type=ON_ERROR, default="reject", show_default=True,
              help="What an internal error or an evaluation timeout means: allow (admit) or "
              "deny (reject).")
@click.option("--timeout", type=Seconds(*SERVE_TIMEOUT_S), default=5.0, show_default=True,
              help="Seconds for a whole request: TLS handshake, reading it, waiting for a worker "
              f"and evaluating ({SERVE_TIMEOUT_S[0]:g} to {SERVE_TIMEOUT_S[1]:g}).")
@click.option("--max-body-bytes", type=click.IntRange(1024, 64 << 20), default=1 << 20,
              show_default=True, help="Larger requests get 413.")
@click.option("--workers", "--max-concurrent", "workers", type=click.IntRange(1, 64), default=2,
              show_default=True, help="Evaluation processes: reviews evaluated at once; more "
              "wait for one within --timeout.")
@click.option("--max-connections", type=click.IntRange(1, 1 << 20), default=256,
              show_default=True, help="Open connections at most (about 0.3 MiB each with TLS); "
              "past it the oldest idle or unfinished one is closed.")
@click.option("--at-risk", "at_risk", type=AT_RISK, default=None, help=AT_RISK_HELP)
@click.option("--quiet", is_flag=True, help="No per-request log lines on stderr.")
def serve_cmd(host: str | None, port: int, tls_cert: str | None, tls_key: str | None,
              client_ca: str | None, insecure: bool, require_annotation: bool, on_error: str,
              timeout: float, max_body_bytes: int, workers: int, max_connections: int,
              at_risk: str | None, quiet: bool) -> int:
    """Kubernetes validating admission webhook: POST /validate, GET /healthz (HTTPS)."""
    from planner.webhook import WebhookConfig, make_server

    if (tls_cert is None) != (tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    if insecure and tls_cert:
        raise UsageError("--insecure serves plain HTTP: drop it, or drop --tls-cert/--tls-key")
    if insecure and client_ca:
        raise UsageError("--client-ca needs TLS: drop --insecure and give --tls-cert/--tls-key")
    if not insecure and not tls_cert:
        raise UsageError("--tls-cert and --tls-key are required (Kubernetes calls webhooks over "
                         f"HTTPS); --insecure serves plain HTTP on {LOOPBACK} for local tests")
    host = host or (LOOPBACK if insecure else "0.0.0.0")
    cfg = WebhookConfig(require_annotation=require_annotation, on_error=on_error.lower(),
                        timeout_s=timeout, max_body_bytes=max_body_bytes, workers=workers,
                        max_connections=max_connections, quiet=quiet,
                        at_risk=at_risk)
    try:
        server = make_server(host, port, cfg, tls_cert=tls_cert, tls_key=tls_key,
                             client_ca=client_ca)
    except OSError as exc:
        raise UsageError(f"--host/--port: cannot listen on {host}:{port}: {exc}") from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    bound_host, bound_port = server.server_address[:2]
    click.echo(f"fitcheck serve: listening on {'http' if insecure else 'https'}://{bound_host}:"
               f"{bound_port} (POST /validate, GET /healthz; {workers} evaluation processes"
               f"{', client certificates required' if client_ca else ''})", err=True)
    if insecure:
        click.echo(f"fitcheck serve: plain HTTP (--insecure): not for Kubernetes"
                   f"{'' if bound_host in (LOOPBACK, '::1') else ', and reachable from other hosts'}",
                   err=True)
    if server.cfg.max_connections < max_connections:
        click.echo(f"fitcheck serve: --max-connections lowered to {server.cfg.max_connections} "
                   "by the open-file limit (ulimit -n)", err=True)
    try:
        server.serve_forever(handle_signals=True)  # until SIGTERM (how Kubernetes stops a pod)
    finally:                                       # or SIGINT
        server.server_close()
    return 0
