"""`fitcheck gate SPEC` and `fitcheck serve`: scheduler gating (docs/gating.md).

Loaded only when one of the two is named (planner.cli.LAZY_COMMANDS). `gate` prints one JSON
verdict and exits 0 admit, 3 reject, 4 bad spec, 2 usage; `serve` runs the Kubernetes
validating admission webhook of planner.webhook.
"""

from __future__ import annotations

import os

import click

from planner.errors import FitcheckError, UsageError

ON_ERROR = click.Choice(["admit", "reject"], case_sensitive=False)


class GateTimeout(Exception):
    pass


def _alarm(seconds: float):
    """SIGALRM after `seconds` (main thread on POSIX only; elsewhere no limit)."""
    import signal
    import threading

    if seconds <= 0 or not hasattr(signal, "setitimer") \
            or threading.current_thread() is not threading.main_thread():
        return None

    def fire(_sig, _frame):
        raise GateTimeout(f"timed out after {seconds:g} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)

    return cancel


@click.command("gate", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("spec", metavar="SPEC")
@click.option("--on-error", type=ON_ERROR, default="reject", show_default=True,
              help="What an internal error or a timeout means: the verdict printed (with an "
              "\"error\" key) and its exit code, 0 admit or 3 reject.")
@click.option("--timeout", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="Seconds before the evaluation counts as an internal error (0: none).")
@click.option("--compact", is_flag=True, help="The verdict on one line.")
def gate_cmd(spec: str, on_error: str, timeout: float, compact: bool) -> int:
    """Admit or reject the job described by SPEC (a JSON or YAML file, - for stdin).

    Prints one JSON verdict. Exit codes: 0 admit, 3 reject, 4 bad spec, 2 usage.
    """
    import json

    from planner.gate import error_verdict, exit_code, gate, read_spec

    on_error = on_error.lower()
    if spec != "-" and not os.path.isfile(spec):
        raise UsageError(f"SPEC: no such file: {spec!r}")
    cancel = _alarm(timeout)
    try:
        doc, base = read_spec(spec)
        verdict = gate(doc, base_dir=base)
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
    finally:
        if cancel is not None:
            cancel()
    click.echo(json.dumps(verdict, separators=(",", ":")) if compact
               else json.dumps(verdict, indent=2))
    return exit_code(verdict)


@click.command("serve", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8443, show_default=True,
              help="Port (0: any free port, printed on start).")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False),
              help="PEM certificate (chain); with --tls-key serves HTTPS (Kubernetes requires it).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="PEM private key.")
@click.option("--require-annotation", is_flag=True,
              help="Deny objects without the fitcheck.io/spec annotation (default: allow them "
              "with a warning).")
@click.option("--on-error", type=ON_ERROR, default="reject", show_default=True,
              help="What an internal error or an evaluation timeout means: allow (admit) or "
              "deny (reject).")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds per request: reading the body, and the evaluation.")
@click.option("--max-body-bytes", type=click.IntRange(min=1024), default=1 << 20,
              show_default=True, help="Larger requests get 413.")
@click.option("--max-concurrent", type=click.IntRange(min=1), default=32, show_default=True,
              help="Requests evaluated at once; more get 503.")
@click.option("--quiet", is_flag=True, help="No per-request log lines on stderr.")
def serve_cmd(host: str, port: int, tls_cert: str | None, tls_key: str | None,
              require_annotation: bool, on_error: str, timeout: float, max_body_bytes: int,
              max_concurrent: int, quiet: bool) -> int:
    """Kubernetes validating admission webhook: POST /validate, GET /healthz."""
    from planner.webhook import WebhookConfig, make_server

    if (tls_cert is None) != (tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    cfg = WebhookConfig(require_annotation=require_annotation, on_error=on_error.lower(),
                        timeout_s=timeout, max_body_bytes=max_body_bytes,
                        max_concurrent=max_concurrent, quiet=quiet)
    try:
        server = make_server(host, port, cfg, tls_cert=tls_cert, tls_key=tls_key)
    except OSError as exc:
        raise UsageError(f"--host/--port: cannot listen on {host}:{port}: {exc}") from None
    except ValueError as exc:
        raise UsageError(f"--tls-cert/--tls-key: {exc}") from None
    scheme = "https" if tls_cert else "http"
    bound_host, bound_port = server.server_address[:2]
    click.echo(f"fitcheck serve: listening on {scheme}://{bound_host}:{bound_port} "
               "(POST /validate, GET /healthz)", err=True)
    import signal

    def _stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt  # unwinds serve_forever in the main thread

    # SIGTERM is how Kubernetes stops a pod; SIGINT is set explicitly because a process
    # started in the background by a non-interactive shell inherits it as ignored.
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
