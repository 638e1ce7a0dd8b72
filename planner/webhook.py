"""Kubernetes validating admission webhook: AdmissionReview v1 in, the gate's verdict out.

``POST /validate`` takes an AdmissionReview whose object carries the job spec in the
annotation ``fitcheck.io/spec``; the GPU count comes from the pod templates when the spec has
no ``hardware.n``. ``GET /healthz`` answers 200. Standard library only: an asyncio HTTP/1.1
server (TLS with ``ssl``) in front of a few evaluation processes.

Every request is bounded: one deadline (``timeout_s``) covers the TLS handshake, reading the
request, waiting for an evaluation process and the evaluation; a client still sending at the
deadline is cut off (408), an evaluation still running is killed with its process and answered
by the ``on_error`` rule. Open connections are capped (the oldest idle or unfinished one makes
way), bodies are capped one by one and in total, and the event loop that answers /healthz
never runs a spec. docs/gating.md, "Kubernetes".
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import socket
import ssl
import sys
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from enum import Enum
from http import HTTPStatus
from typing import Any

from planner.lazy_dataclass import dataclass
from planner.gate import ADMIT, REJECT, SpecError, error_verdict, gate
from planner.specfile import parse_spec_text

ANNOTATION = "fitcheck.io/spec"
GPU_RESOURCE = "nvidia.com/gpu"
MAX_PODS = 1 << 16
"""Pods a reviewed object may describe (replicas summed over its roles)."""
API_VERSION = "admission.k8s.io/v1"
MAX_WARNING_CHARS = 256  # the API server may truncate longer ones
MAX_HEAD_BYTES = 16 * 1024
"""Request line and headers together; longer heads get 431."""
MAX_HEADERS = 100
WRITE_GRACE_S = 1.0
"""Past the deadline, how long writing the answer (an on-error verdict, a 408) may take."""
LISTEN_BACKLOG = 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookConfig:
    require_annotation: bool = False
    """Deny objects without the annotation (default: allow them with a warning)."""
    on_error: str = REJECT
    """admit or reject: the answer when evaluation fails or times out."""
    at_risk: str | None = None
    """admit, reject, warn or a probability (planner.error_bands.parse_at_risk): a job at
    risk (serve --at-risk); None: the spec's at_risk."""
    timeout_s: float = 5.0
    """Whole-request deadline: TLS handshake, reading, waiting for a worker, evaluating."""
    idle_timeout_s: float = 120.0
    """How long a keep-alive connection may wait for its next request."""
    max_body_bytes: int = 1 << 20
    """One request's body; larger ones get 413."""
    max_buffered_bytes: int = 16 << 20
    """Bodies held at once, all connections together (at least one of max_body_bytes); past
    it 503."""
    workers: int = 2
    """Evaluation processes: reviews evaluated at once (more wait, within their deadline)."""
    max_connections: int = 256
    """Open connections; past it the oldest idle or unfinished one is closed to make room.
    Each costs about 0.3 MiB with TLS (asyncio's 256 KiB read buffer): size memory to it."""
    worker_memory_bytes: int = 512 << 20
    """Address-space limit (RLIMIT_AS) of each evaluation process; 0: none."""
    evaluator: str = "planner.webhook:evaluate"
    """module:function the evaluation processes call: fn(uid, request, config) -> review."""
    quiet: bool = False
    """No per-request log lines on stderr."""


class BadRequest(Exception):
    """Not an AdmissionReview we can answer (no uid to answer to): HTTP 400."""


class Denied(Exception):
    """An answerable request that must be denied with this message (bad spec, no GPUs)."""


# ---------------------------------------------------------------------------------------------
# GPU counting from pod templates


def _gpu_value(v: Any, where: str) -> int:
    if isinstance(v, bool):
        raise Denied(f"{where}: {GPU_RESOURCE} must be a whole number, got {v!r}")
    if isinstance(v, int):
        n = v
    elif isinstance(v, str) and re.fullmatch(r"[0-9]{1,8}", v.strip()):
        # ASCII digits only: str.isdigit() also takes "²" and other digits int() refuses
        n = int(v.strip())
    else:
        raise Denied(f"{where}: {GPU_RESOURCE} must be a whole number, got {v!r}")
    if n < 0 or n > 1 << 20:
        raise Denied(f"{where}: {GPU_RESOURCE} out of range: {n}")
    return n


def _container_gpus(c: Any, where: str) -> int:
    if not isinstance(c, dict):
        return 0
    res = c.get("resources")
    if not isinstance(res, dict):
        return 0
    for kind in ("limits", "requests"):  # extended resources: requests == limits when both
        m = res.get(kind)
        if isinstance(m, dict) and GPU_RESOURCE in m:
            return _gpu_value(m[GPU_RESOURCE], f"{where}.resources.{kind}")
    return 0


def pod_gpus(pod_spec: Any, where: str = "spec") -> int:
    """GPUs one pod holds: the containers' sum, or the largest init container if larger."""
    if not isinstance(pod_spec, dict):
        return 0
    main = pod_spec.get("containers")
    init = pod_spec.get("initContainers")
    total = sum(_container_gpus(c, f"{where}.containers[{i}]")
                for i, c in enumerate(main if isinstance(main, list) else []))
    init_max = max((_container_gpus(c, f"{where}.initContainers[{i}]")
                    for i, c in enumerate(init if isinstance(init, list) else [])), default=0)
    return max(total, init_max)


def _count(v: Any, where: str, default: int = 1) -> int:
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v > 1 << 20:
        raise Denied(f"{where}: must be a non-negative integer, got {v!r}")
    return v


def count_gpus(obj: dict[str, Any]) -> tuple[int, list[int]]:
    """(total GPUs, GPUs of each pod that has any) of a PyTorchJob, Job, Pod or templated object."""
    kind = obj.get("kind")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return 0, []
    pods: list[int] = []

    def add(per: int, copies: int, where: str) -> None:
        # counted before any list is built: 120 roles x 2^20 replicas is 1.3e8 pods
        if per and len(pods) + copies > MAX_PODS:
            raise Denied(f"{where}: too many pods: more than {MAX_PODS}")
        pods.extend([per] * copies if per else [])

    if kind == "PyTorchJob":
        replica_specs = spec.get("pytorchReplicaSpecs")
        if not isinstance(replica_specs, dict):
            raise Denied("spec.pytorchReplicaSpecs: missing or not a mapping")
        for role, rs in replica_specs.items():
            if not isinstance(rs, dict):
                continue
            where = f"spec.pytorchReplicaSpecs.{role}"
            replicas = _count(rs.get("replicas"), f"{where}.replicas")
            tmpl = rs.get("template")
            per = pod_gpus(tmpl.get("spec") if isinstance(tmpl, dict) else None,
                           f"{where}.template.spec")
            add(per, replicas, f"{where}.replicas")
    elif kind == "Pod":
        per = pod_gpus(spec)
        pods = [per] if per else []
    else:  # batch/v1 Job (parallelism), or anything with replicas and a pod template
        tmpl = spec.get("template")
        per = pod_gpus(tmpl.get("spec") if isinstance(tmpl, dict) else None, "spec.template.spec")
        if kind == "Job":
            copies = _count(spec.get("parallelism"), "spec.parallelism")
        else:
            copies = _count(spec.get("replicas"), "spec.replicas")
        add(per, copies, "spec.parallelism" if kind == "Job" else "spec.replicas")
    return sum(pods), pods


# ---------------------------------------------------------------------------------------------
# One AdmissionReview


def _short(text: str) -> str:
    return text if len(text) <= MAX_WARNING_CHARS else text[:MAX_WARNING_CHARS - 3] + "..."


def _response(uid: str, allowed: bool, message: str, warnings: list[str],
              verdict: dict[str, Any] | None = None) -> dict[str, Any]:
    resp: dict[str, Any] = {
        "uid": uid,
        "allowed": allowed,
        "status": {"code": 200 if allowed else 403, "message": message},
    }
    if warnings:
        resp["warnings"] = [_short(w) for w in warnings]
    if verdict is not None and verdict.get("recommendation"):
        r = verdict["recommendation"]
        resp["auditAnnotations"] = {
            "verdict": verdict["verdict"],
            "recommendation": f"{r['strategy']}/{r['offload']}/{r['checkpointing']}",
        }
    risk = ((verdict or {}).get("predicted") or {}).get("risk") or {}
    if risk.get("outcome"):  # fits / at_risk / does_not_fit, and the probability of an OOM
        notes = resp.setdefault("auditAnnotations", {"verdict": verdict["verdict"]})
        notes["outcome"] = risk["outcome"]
        if risk.get("oom_probability") is not None:
            notes["oom_probability"] = f"{risk['oom_probability']:.4f}"
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": resp}


def parse_review(body: Any) -> tuple[str, dict[str, Any]]:
    """(uid, request) of an AdmissionReview v1, or BadRequest."""
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object (an AdmissionReview)")
    if body.get("kind") != "AdmissionReview":
        raise BadRequest(f"kind must be AdmissionReview, got {body.get('kind')!r}")
    if body.get("apiVersion") != API_VERSION:
        raise BadRequest(f"apiVersion must be {API_VERSION}, got {body.get('apiVersion')!r}")
    req = body.get("request")
    if not isinstance(req, dict):
        raise BadRequest("request: missing or not an object")
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid or len(uid) > 256:
        raise BadRequest("request.uid: missing or not a string")
    return uid, req


def evaluate(uid: str, req: dict[str, Any], cfg: WebhookConfig) -> dict[str, Any]:
    """The AdmissionReview response for one request (Denied -> deny; other errors raise)."""
    obj = req.get("object")
    if obj is None:
        if req.get("operation") == "DELETE":
            return _response(uid, True, "fitcheck: DELETE is not checked", [])
        return _response(uid, False, "fitcheck: request.object missing", [])
    if not isinstance(obj, dict):
        return _response(uid, False, "fitcheck: request.object is not an object", [])
    meta = obj.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    raw = annotations.get(ANNOTATION) if isinstance(annotations, dict) else None
    if raw is None:
        if cfg.require_annotation:
            return _response(uid, False, f"fitcheck: the {ANNOTATION} annotation is required "
                             "(a JSON job spec, docs/gating.md)", [])
        return _response(uid, True, f"fitcheck: no {ANNOTATION} annotation, not checked",
                         [f"fitcheck: no {ANNOTATION} annotation; memory fit not checked"])
    try:
        if not isinstance(raw, str):
            raise Denied(f"annotation {ANNOTATION} must be a string")
        try:
            spec = parse_spec_text(raw, f"annotation {ANNOTATION}")
        except SpecError as exc:
            raise Denied(str(exc)) from None
        warnings: list[str] = []
        spec = copy.deepcopy(spec)
        hw = spec.get("hardware")
        total, pods = count_gpus(obj)
        if isinstance(hw, dict) and hw.get("n") is None:
            if total <= 0:
                raise Denied(f"no GPU count: set hardware.n in {ANNOTATION} or "
                             f"{GPU_RESOURCE} limits on the pod template")
            hw["n"] = total
            if hw.get("gpus_per_node") is None and pods and len(set(pods)) == 1:
                hw["gpus_per_node"] = pods[0]
            elif len(set(pods)) > 1:
                warnings.append(f"fitcheck: pods hold different GPU counts {sorted(set(pods))};"
                                " set hardware.gpus_per_node")
        elif isinstance(hw, dict) and total and hw.get("n") != total:
            warnings.append(f"fitcheck: spec says hardware.n={hw.get('n')!r} but the pods "
                            f"request {total} GPUs; checked with the spec's")
        try:
            verdict = gate(spec, allow_files=False, at_risk=cfg.at_risk)
        except SpecError as exc:
            raise Denied(str(exc)) from None
    except Denied as exc:
        return _response(uid, False, f"fitcheck: bad job spec: {exc}", [])
    allowed = verdict["verdict"] == ADMIT
    warnings += [f"fitcheck: {w}" for w in verdict.get("warnings", [])]
    rec = verdict.get("recommendation")
    if allowed and rec and not verdict.get("pinned"):
        warnings.append(f"fitcheck: use {rec['strategy']}, offload {rec['offload']}, "
                        f"checkpointing {rec['checkpointing']}")
    return _response(uid, allowed, f"fitcheck: {verdict['verdict']}: {verdict['reason']}",
                     warnings, verdict)


def error_response(uid: str, err: str, cfg: WebhookConfig) -> dict[str, Any]:
    """The answer when evaluation failed or ran past the deadline: allowed per on_error."""
    v = error_verdict(err, cfg.on_error)
    return _response(uid, v["verdict"] == ADMIT, f"fitcheck: {v['reason']}",
                     [f"fitcheck: evaluation failed: {_short(err)}"])


# ---------------------------------------------------------------------------------------------
# Evaluation processes
#
# Each is `python -c "from planner.webhook import _worker_main; _worker_main()"`, talking in
# frames (a 4-byte big-endian length, then the bytes) on its stdin and stdout: first the
# configuration in, "ready" out; then a raw AdmissionReview body in and, out (JSON): ["bad",
# message] for a body that is not an AdmissionReview (HTTP 400), or ["uid", uid] as soon as
# the body parsed, then ["ok", review] or ["err", message]; until its stdin closes. The
# bytes are parsed here, never on the server's event loop (a large body would stall every
# connection while it parses). A plain subprocess rather than multiprocessing: no pickling,
# and no re-import of the parent's __main__ in the child.

WORKER_START_S = 60.0
"""How long an evaluation process may take to start (imports and a warm-up evaluation)."""


TRIM_EVERY_S = 5.0
TRIM_AFTER_CLOSED = 64
"""How often the server gives freed memory back to the system, and after how many closed
connections (``_trim_loop``)."""

MAX_LOOP_PARSE_BYTES = 256 << 10
"""The largest body the event loop parses itself, and only to answer a review no evaluation
process read in time (~1 ms of the loop's time; a larger one is answered 503)."""


def _write_frame(f: Any, data: bytes) -> None:
    f.write(len(data).to_bytes(4, "big") + data)
    f.flush()


def _read_frame(f: Any) -> bytes | None:
    """The next frame, or None at the end of the stream."""
    head = f.read(4)
    if len(head) < 4:
        return None
    n = int.from_bytes(head, "big")
    data = f.read(n)
    return data if len(data) == n else None


def _die_with_parent() -> None:
    """An evaluation process never outlives its server: a server killed while a review is
    being evaluated (its stdin is never closed then) would otherwise leave the process
    computing as an orphan. Linux: the kernel sends SIGKILL when the parent dies
    (prctl PR_SET_PDEATHSIG); everywhere: a thread that exits once the parent is gone."""
    import threading
    import time

    parent = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the request above took effect
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="fitcheck-orphan-watch", daemon=True).start()


def _worker_main() -> None:
    """The evaluation process (see above)."""
    import dataclasses
    import importlib
    import signal

    _die_with_parent()
    inp = sys.stdin.buffer
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print goes to stderr, never into the frames
    sys.stdout = sys.stderr
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server stops it; Ctrl-C is for the server
    init = _read_frame(inp)
    if init is None:
        return
    doc = json.loads(init)
    sys.path[:] = doc["sys_path"]
    names = {f.name for f in dataclasses.fields(WebhookConfig)}
    cfg = WebhookConfig(**{k: v for k, v in doc["config"].items() if k in names})
    if cfg.worker_memory_bytes:
        import resource

        try:
            resource.setrlimit(resource.RLIMIT_AS, (cfg.worker_memory_bytes,
                                                    resource.getrlimit(resource.RLIMIT_AS)[1]))
        except (ValueError, OSError):
            pass
    module, _, name = cfg.evaluator.partition(":")
    fn = getattr(importlib.import_module(module), name)
    try:  # load the profiles and presets now rather than in the first request's time
        gate({"model": {"preset": "llama3-8b"}, "hardware": {"gpu": "h100-80", "n": 8}},
             allow_files=False)
    except Exception as exc:  # noqa: BLE001 - a warm-up only
        sys.stderr.write(f"fitcheck serve: evaluation process warm-up: {exc}\n")
    _write_frame(out, b'"ready"')
    while (body := _read_frame(inp)) is not None:
        try:
            try:
                uid, req = parse_review(json.loads(body))
            except (ValueError, RecursionError) as exc:  # bytes not UTF-8 are ValueError too
                answer = json.dumps(["bad", f"invalid JSON: {str(exc)[:200]}"]).encode()
            except BadRequest as exc:
                answer = json.dumps(["bad", str(exc)]).encode()
            else:
                del body
                _write_frame(out, json.dumps(["uid", uid]).encode())
                try:
                    answer = json.dumps(["ok", fn(uid, req, cfg)]).encode()
                except BaseException as exc:  # noqa: BLE001 - reported as the on-error verdict
                    answer = json.dumps(["err", f"{type(exc).__name__}: {exc}"[:1000]]).encode()
            _write_frame(out, answer)
        except (OSError, ValueError):
            return


class _WorkerDied(Exception):
    pass


class _Worker:
    """One evaluation process. start() and call() block: run them off the event loop."""

    def __init__(self, cfg: WebhookConfig) -> None:
        import dataclasses
        import subprocess

        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from planner.webhook import _worker_main; _worker_main()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        init = {"config": dataclasses.asdict(cfg), "sys_path": sys.path}
        try:
            _write_frame(self.proc.stdin, json.dumps(init).encode())
        except OSError:
            pass  # it died already: wait_ready says so

    def wait_ready(self, timeout: float = WORKER_START_S) -> None:
        import select

        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready or _read_frame(self.proc.stdout) != b'"ready"':
            self.kill()
            raise _WorkerDied(f"an evaluation process did not start (exit code "
                              f"{self.proc.poll()}; its error is on stderr above)")

    def call(self, body: bytes, seen: dict[str, str]) -> bytes:
        """The final answer frame; the review's uid goes into ``seen`` as soon as the process
        has parsed the body (a review that then runs past its deadline is answered with it)."""
        try:
            _write_frame(self.proc.stdin, body)
            out = _read_frame(self.proc.stdout)
            if out is not None and out.startswith(b'["uid"'):
                seen["uid"] = json.loads(out)[1]
                out = _read_frame(self.proc.stdout)
        except (OSError, ValueError) as exc:
            raise _WorkerDied(str(exc)) from None
        if out is None:
            raise _WorkerDied(f"exit code {self.proc.poll()}")
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        self.proc.wait()


class EvaluatorPool:
    """cfg.workers evaluation processes, each evaluating one review at a time. A review waits
    for a free one; one past its deadline is killed with its process, which is replaced."""

    def __init__(self, cfg: WebhookConfig) -> None:
        self.cfg = cfg
        self._idle: deque[_Worker] = deque()
        self._waiting: deque[asyncio.Future[_Worker]] = deque()  # first come, first served
        self._all: set[_Worker] = set()
        self._closed = False
        # the threads that talk to the processes: one per busy process, plus replacements
        self._threads = ThreadPoolExecutor(2 * cfg.workers + 2,
                                           thread_name_prefix="fitcheck-evaluate")
        started = [_Worker(cfg) for _ in range(cfg.workers)]
        try:
            for w in started:
                w.wait_ready()
        except _WorkerDied:
            for w in started:
                w.kill()
            self._threads.shutdown()
            raise
        for w in started:
            self._add(w)

    def _add(self, w: _Worker) -> None:
        if self._closed:
            w.kill()
            return
        self._all.add(w)
        self._give(w)

    def _give(self, w: _Worker) -> None:
        """A free process to the longest-waiting review, else to the idle ones."""
        while self._waiting:
            fut = self._waiting.popleft()
            if not fut.done():
                fut.set_result(w)
                return
        self._idle.append(w)

    async def _take(self, deadline: float) -> _Worker:
        while self._waiting and self._waiting[0].done():  # gave up waiting
            self._waiting.popleft()
        if self._idle and not self._waiting:
            return self._idle.popleft()
        fut: asyncio.Future[_Worker] = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        try:
            async with asyncio.timeout_at(deadline):
                return await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self._give(fut.result())  # handed over just as we gave up: pass it on
            fut.cancel()
            raise

    def _replace(self, w: _Worker) -> None:
        """Kill w and start another, off the event loop. The kill signal goes now: the
        thread that reaps w and starts the replacement may be cancelled by close()."""
        self._all.discard(w)
        if w.proc.poll() is None:
            w.proc.kill()  # a signal: does not block
        loop = asyncio.get_running_loop()

        def work() -> None:
            w.kill()
            if self._closed:
                return
            try:
                new = _Worker(self.cfg)
                new.wait_ready()
            except (OSError, _WorkerDied) as exc:
                sys.stderr.write(f"fitcheck serve: cannot start an evaluation process: {exc}\n")
                return
            loop.call_soon_threadsafe(self._add, new)

        self._threads.submit(work)

    async def review(self, body: bytes, deadline: float,
                     seen: dict[str, str]) -> tuple[str, Any]:
        """("ok", AdmissionReview), ("bad", why it is not one) or ("err", message);
        TimeoutError past the deadline (event-loop time). ``seen["uid"]``: the review's uid,
        once the evaluation process has parsed the body."""
        loop = asyncio.get_running_loop()
        w = await self._take(deadline)
        try:
            async with asyncio.timeout_at(deadline):
                raw = await loop.run_in_executor(self._threads, w.call, body, seen)
        except _WorkerDied as exc:
            self._replace(w)
            return "err", f"the evaluation process exited ({exc})"
        except BaseException:  # the deadline, or the server is stopping
            self._replace(w)
            raise
        self._give(w)
        status, payload = json.loads(raw)
        return status, payload

    def close(self) -> None:
        self._closed = True
        for w in list(self._all):
            w.kill()
        self._all.clear()
        self._threads.shutdown(wait=False, cancel_futures=True)


# ---------------------------------------------------------------------------------------------
# HTTP/1.1


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.headers = status, headers or {}


class _State(Enum):
    NEW = "new"          # handshake or first request not yet read
    READING = "reading"  # a request under way
    IDLE = "idle"        # keep-alive, between requests
    BUSY = "busy"        # evaluating or answering


class _Conn:
    __slots__ = ("peer", "since", "state", "task", "writer")

    def __init__(self, writer: asyncio.StreamWriter, task: asyncio.Task | None,
                 since: float) -> None:
        self.writer, self.task, self.since = writer, task, since
        self.state = _State.NEW
        peer = writer.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) else "-"


@dataclass(frozen=True, slots=True)
class _Request:
    method: str
    path: str
    version: str
    headers: dict[str, str]

    @property
    def keep_alive(self) -> bool:
        conn = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in conn
        return "close" not in conn


async def _read_head(reader: asyncio.StreamReader, first: bytes) -> bytes | None:
    """One request head, up to and with its blank line (None: the client went away), or
    _HTTPError. Read line by line, so that a line ended by a bare LF is answered 400 at once
    (RFC 9112 section 2.2 lets a server refuse it) instead of waiting for a CRLF CRLF that
    never comes; ``first`` is the request's first byte, already read."""
    head = bytearray(first)
    while True:
        try:
            head += await reader.readuntil(b"\n")
        except asyncio.LimitOverrunError:
            raise _HTTPError(431, f"request head over {MAX_HEAD_BYTES} bytes") from None
        except asyncio.IncompleteReadError:
            return None
        if len(head) > MAX_HEAD_BYTES:
            raise _HTTPError(431, f"request head over {MAX_HEAD_BYTES} bytes")
        if not head.endswith(b"\r\n"):
            raise _HTTPError(400, "a line of the request head ends in a bare LF; end lines "
                             "with CRLF")
        if head.endswith(b"\r\n\r\n") or head == b"\r\n":
            return bytes(head)


def _parse_head(head: bytes) -> _Request:
    """The request line and headers (lower-case names) of one request head, or _HTTPError."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1].startswith("/"):
        raise _HTTPError(400, f"bad request line: {lines[0][:100]!r}")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise _HTTPError(505, f"HTTP version not supported: {version[:20]!r}")
    fields = [line for line in lines[1:] if line]
    if len(fields) > MAX_HEADERS:
        raise _HTTPError(431, f"more than {MAX_HEADERS} header lines")
    headers: dict[str, str] = {}
    for line in fields:
        name, sep, value = line.partition(":")
        if not sep or not name or any(c in name for c in " \t"):  # no folding, no spaces
            raise _HTTPError(400, f"bad header line: {line[:100]!r}")
        key, value = name.lower(), value.strip(" \t")
        if key not in headers:
            headers[key] = value
        elif key == "content-length":
            if headers[key] != value:
                raise _HTTPError(400, "conflicting Content-Length headers")
        else:
            headers[key] = f"{headers[key]}, {value}"
    return _Request(method, target.split("?", 1)[0], version, headers)


def _http_response(status: int, doc: dict[str, Any] | None, *, close: bool,
                   headers: dict[str, str] | None = None) -> bytes:
    """A whole response, head and body in one buffer: one write, no Nagle wait between."""
    body = b"" if doc is None else json.dumps(doc).encode()
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", "Server: fitcheck-webhook",
             "Content-Type: application/json", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class WebhookServer:
    """The webhook bound to a socket. serve_forever() runs it in the calling thread until
    shutdown() (from another thread) or, with handle_signals, SIGTERM/SIGINT."""

    def __init__(self, sock: socket.socket, cfg: WebhookConfig,
                 ssl_context: ssl.SSLContext | None) -> None:
        self.socket = sock
        self.server_address = sock.getsockname()
        self.cfg = cfg
        self.ssl_context = ssl_context
        self.client_certs = ssl_context is not None and ssl_context.verify_mode != ssl.CERT_NONE
        """/validate needs a client certificate (verified in the handshake); /healthz does not,
        so that the kubelet's probes, which present none, still reach it."""
        self.pool = EvaluatorPool(cfg)
        self._conns: dict[_Conn, None] = {}  # in order of arrival
        self._buffered = 0
        self._closed = 0  # connections closed since the last malloc_trim (_trim_loop)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._done = threading.Event()
        self._serving = False

    # -- life cycle --------------------------------------------------------------------------

    def serve_forever(self, *, handle_signals: bool = False) -> None:
        self._serving = True
        try:
            asyncio.run(self._serve(handle_signals))
        finally:
            self._done.set()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop serve_forever (from another thread) and wait for it."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the loop has closed already
                pass
        if self._serving:
            self._done.wait(timeout)

    def server_close(self) -> None:
        self.socket.close()
        if not self._serving:
            self.pool.close()

    async def _serve(self, handle_signals: bool) -> None:
        libc = _glibc()
        _return_freed_buffers(libc)
        loop = asyncio.get_running_loop()
        self._loop, self._stop = loop, asyncio.Event()
        loop.set_exception_handler(self._loop_error)
        if handle_signals:
            import signal

            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop.set)
        server = await asyncio.start_server(self._on_connect, sock=self.socket,
                                            limit=MAX_HEAD_BYTES, backlog=LISTEN_BACKLOG)
        trim = asyncio.create_task(self._trim_loop(libc)) if libc is not None else None
        try:
            await self._stop.wait()
        finally:
            if trim is not None:
                trim.cancel()
            server.close()
            busy = [c.task for c in self._conns if c.task is not None
                    and c.state in (_State.READING, _State.BUSY)]
            if busy:  # let requests under way finish, within their deadline
                await asyncio.wait(busy, timeout=self.cfg.timeout_s + WRITE_GRACE_S)
            rest = [c.task for c in self._conns if c.task is not None]
            for t in rest:
                t.cancel()
            if rest:
                await asyncio.wait(rest, timeout=2 * WRITE_GRACE_S)
            self.pool.close()

    async def _trim_loop(self, libc: Any) -> None:
        """Every TRIM_EVERY_S, once TRIM_AFTER_CLOSED connections have closed since the last
        time: glibc's malloc_trim(0), which gives the free pages inside the heap back to the
        system (a few milliseconds). Without it the server's RSS grew by ~30 MiB with each
        flood of 1,000 TLS connections and never came down."""
        while True:
            await asyncio.sleep(TRIM_EVERY_S)
            if self._closed >= TRIM_AFTER_CLOSED:
                self._closed = 0
                libc.malloc_trim(0)

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, (ConnectionError, ssl.SSLError, TimeoutError)):
            return  # a client's broken connection: nothing to do
        if not self.cfg.quiet:
            what = f"{type(exc).__name__}: {exc}" if exc else context.get("message", "")
            sys.stderr.write(f"fitcheck serve: {what}\n")

    # -- connections -------------------------------------------------------------------------

    def _log(self, conn: _Conn, text: str) -> None:
        if not self.cfg.quiet:
            sys.stderr.write(f"fitcheck serve: {conn.peer} {text}\n")

    def _make_room(self) -> bool:
        """Close the oldest idle keep-alive connection, else the oldest one still sending its
        request (a real request takes milliseconds): True if one was closed."""
        for states in ((_State.IDLE,), (_State.NEW, _State.READING)):
            for c in self._conns:  # oldest first
                if c.state in states and c.task is not None:
                    del self._conns[c]
                    c.task.cancel()
                    return True
        return False

    async def _on_connect(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        conn = _Conn(writer, asyncio.current_task(), asyncio.get_running_loop().time())
        try:
            if len(self._conns) >= self.cfg.max_connections and not self._make_room():
                self._log(conn, f"refused: {len(self._conns)} connections open, all busy")
                return
            self._conns[conn] = None
            await self._serve_connection(conn, reader, writer)
        except asyncio.CancelledError:
            pass  # closed to make room for another, or the server is stopping
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, TimeoutError):
            pass  # the client went away, or did not finish in time
        except Exception as exc:  # noqa: BLE001 - one connection's bug is not the server's
            self._log(conn, f"connection error: {type(exc).__name__}: {exc}")
        finally:
            try:  # flush what was written; a TLS peer gets WRITE_GRACE_S to close cleanly
                writer.close()
                await asyncio.wait_for(writer.wait_closed(), WRITE_GRACE_S)
            except BaseException:  # noqa: BLE001, S110 - closing anyway
                pass
            writer.transport.abort()
            self._conns.pop(conn, None)
            self._closed += 1

    async def _serve_connection(self, conn: _Conn, reader: asyncio.StreamReader,
                                writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        deadline = conn.since + self.cfg.timeout_s
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # asyncio's default too
        if self.ssl_context is not None:
            async with asyncio.timeout_at(deadline):
                await writer.start_tls(self.ssl_context)
        first = b""
        while True:
            conn.state = _State.READING
            if not await self._one_request(conn, reader, writer, deadline, first):
                return
            conn.state = _State.IDLE
            async with asyncio.timeout(self.cfg.idle_timeout_s):
                first = await reader.read(1)
            if not first:
                return
            deadline = loop.time() + self.cfg.timeout_s  # from the next request's first byte

    async def _one_request(self, conn: _Conn, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter, deadline: float, first: bytes) -> bool:
        """Read, answer and log one request; whether the connection stays open."""
        head_read = False
        try:
            async with asyncio.timeout_at(deadline):
                head = await _read_head(reader, first)
                if head is None:
                    return False  # the client went away
                head_read = True
                req = _parse_head(head)
                body = await self._read_body(req, reader, writer)
        except _HTTPError as exc:
            await self._answer(conn, writer, deadline, "-", exc.status, {"error": str(exc)},
                               close=True, headers=exc.headers)
            return False
        except TimeoutError:
            if head_read:  # a body that does not arrive in time
                await self._answer(conn, writer, deadline, "POST /validate", 408, {
                    "error": f"the request did not arrive within {self.cfg.timeout_s:g} s"},
                    close=True)
            return False
        conn.state = _State.BUSY
        what = f"{req.method} {req.path[:100]}"
        if body is None:
            status, doc, headers, keep = self._other(req)
        else:
            try:
                status, doc = await self._validate(body, deadline)
            finally:
                self._buffered -= len(body)
            headers, keep = {}, req.keep_alive
        await self._answer(conn, writer, deadline, what, status, doc, close=not keep,
                           headers=headers)
        return keep

    async def _answer(self, conn: _Conn, writer: asyncio.StreamWriter, deadline: float,
                      what: str, status: int, doc: dict[str, Any], *, close: bool,
                      headers: dict[str, str] | None = None) -> None:
        if status != 200:
            self._log(conn, f"{what} {status} {doc.get('error', '')}"[:300])
        writer.write(_http_response(status, doc, close=close, headers=headers))
        loop = asyncio.get_running_loop()
        async with asyncio.timeout_at(max(deadline, loop.time()) + WRITE_GRACE_S):
            await writer.drain()

    @staticmethod
    def _other(req: _Request) -> tuple[int, dict[str, Any], dict[str, str], bool]:
        """(status, document, headers, keep open) for everything but POST /validate."""
        bodyless = req.headers.get("content-length", "0") == "0" \
            and "transfer-encoding" not in req.headers
        keep = req.keep_alive and bodyless and req.method == "GET"  # never leave a body unread
        if req.method == "GET" and req.path == "/healthz":
            return 200, {"status": "ok"}, {}, keep
        if req.path in ("/validate", "/healthz"):
            allow = "POST" if req.path == "/validate" else "GET"
            return 405, {"error": f"method {req.method} not allowed"}, {"Allow": allow}, keep
        return 404, {"error": f"no such path: {req.path[:100]}"}, {}, keep

    async def _read_body(self, req: _Request, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> bytes | None:
        """POST /validate's body (counted in self._buffered until answered), None for other
        requests; _HTTPError when it cannot be taken."""
        if req.method != "POST" or req.path != "/validate":
            return None
        if self.client_certs and not writer.get_extra_info("peercert"):
            raise _HTTPError(403, "a client certificate is required (serve --client-ca)")
        if "transfer-encoding" in req.headers:
            raise _HTTPError(411, "chunked bodies are not accepted; send Content-Length")
        length_text = req.headers.get("content-length")
        if length_text is None:
            raise _HTTPError(411, "Content-Length required")
        if not (length_text.isascii() and length_text.isdigit()) or len(length_text) > 18:
            raise _HTTPError(400, f"bad Content-Length: {length_text[:40]!r}")
        length = int(length_text)
        if length > self.cfg.max_body_bytes:
            await self._drain(reader, length)
            raise _HTTPError(413, f"body of {length} bytes exceeds the limit of "
                             f"{self.cfg.max_body_bytes}")
        if self._buffered + length > max(self.cfg.max_buffered_bytes, self.cfg.max_body_bytes):
            raise _HTTPError(503, "too many request bodies held at once", {"Retry-After": "1"})
        if req.headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._buffered += length
        try:
            return await reader.readexactly(length)
        except BaseException:
            self._buffered -= length
            raise

    async def _drain(self, reader: asyncio.StreamReader, length: int) -> None:
        """Read and drop a refused body (up to a bound, within the deadline), so closing does
        not reset the connection under a client still sending it and it sees the 413."""
        left = min(length, 8 * self.cfg.max_body_bytes)
        while left > 0:
            chunk = await reader.read(min(left, 65536))
            if not chunk:
                return
            left -= len(chunk)

    async def _validate(self, body: bytes, deadline: float) -> tuple[int, dict[str, Any]]:
        """(HTTP status, document) for a POST /validate body. The body is parsed in the
        evaluation process, never here: the event loop only moves bytes."""
        seen: dict[str, str] = {}
        try:
            status, payload = await self.pool.review(body, deadline, seen)
        except TimeoutError:
            status, payload = "err", f"timed out after {self.cfg.timeout_s:g} s"
        if status == "bad":
            return 400, {"error": payload}
        uid = seen.get("uid")
        if uid is None:  # no process read it in time (all busy), or it died reading it
            if len(body) > MAX_LOOP_PARSE_BYTES:  # no uid to answer to, short of stalling
                # every connection here while it parses
                return 503, {"error": f"the review was not read: {_short(str(payload))}"}
            try:
                uid = parse_review(json.loads(body))[0]
            except (ValueError, RecursionError) as exc:
                return 400, {"error": f"invalid JSON: {str(exc)[:200]}"}
            except BadRequest as exc:
                return 400, {"error": str(exc)}
        out = payload if status == "ok" else error_response(uid, payload, self.cfg)
        if not self.cfg.quiet:
            r = out["response"]
            sys.stderr.write(f"fitcheck serve: validate uid={uid[:64]} allowed={r['allowed']} "
                             f"{r['status']['message'][:200]}\n")
        return 200, out


def _glibc() -> Any:
    """The C library when it is glibc (it has mallopt and malloc_trim), else None."""
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except (OSError, AttributeError):
        return None


def _return_freed_buffers(libc: Any) -> None:
    """Make glibc map allocations of 64 KiB and more on their own, so that they go back to the
    system when freed. Every TLS connection holds asyncio's 256 KiB read buffer
    (asyncio/sslproto.py, ``SSLProtocol.max_size``); under glibc's default the mmap threshold
    rises once the first such buffer is freed, later ones come from the heap, and after
    floods of connections the server kept 265 MiB for good (benchmarks/webhook_load.py
    --phases tls-floods). The smaller pieces of each connection (OpenSSL's) stay on the heap:
    ``_trim_loop`` gives those back."""
    if libc is not None:
        libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD (malloc.h): fixed, so no longer
        # raised by glibc's dynamic adjustment


def _ssl_context(tls_cert: str, tls_key: str | None,
                 client_ca: str | None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    # No TLS 1.3 session tickets: sent after the handshake, they held the first request of
    # each new connection ~40 ms (a delayed ACK; measured), and nothing here resumes sessions.
    ctx.num_tickets = 0
    try:
        ctx.load_cert_chain(tls_cert, tls_key)
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"--tls-cert/--tls-key: cannot load the certificate/key: {exc}") \
            from None
    if client_ca:
        try:
            ctx.load_verify_locations(cafile=client_ca)
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"--client-ca: cannot load {client_ca!r}: {exc}") from None
        ctx.verify_mode = ssl.CERT_OPTIONAL  # a certificate given must verify; /validate needs one
    return ctx


def _fit_connections(cfg: WebhookConfig) -> WebhookConfig:
    """cfg with max_connections within the open-file limit (raised toward its hard limit)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return cfg
    spare = 64 + 4 * cfg.workers  # listening socket, pipes, files
    need = cfg.max_connections + spare
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < need:
        return replace(cfg, max_connections=max(1, soft - spare))
    return cfg


def make_server(host: str, port: int, cfg: WebhookConfig, *, tls_cert: str | None = None,
                tls_key: str | None = None, client_ca: str | None = None) -> WebhookServer:
    """A bound server with its evaluation processes started; call serve_forever. Port 0: any
    free one (see server.server_address). server.cfg.max_connections is cfg's, lowered if the
    open-file limit is smaller. ValueError for a bad certificate, OSError if it cannot listen."""
    if client_ca and not tls_cert:
        raise ValueError("--client-ca needs --tls-cert and --tls-key")
    ctx = _ssl_context(tls_cert, tls_key, client_ca) if tls_cert else None
    cfg = _fit_connections(cfg)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)
    try:
        return WebhookServer(sock, cfg, ctx)
    except BaseException:
        sock.close()
        raise
