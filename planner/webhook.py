"""Kubernetes validating admission webhook: AdmissionReview v1 in, the gate's verdict out.

Stdlib only (http.server, ssl, threading). ``POST /validate`` takes an AdmissionReview whose
object carries the job spec in the annotation ``fitcheck.io/spec`` (a JSON string); the GPU
count comes from the pod templates when the spec has no ``hardware.n``. ``GET /healthz``
answers 200. Hostile input gets an HTTP error, never a crash or a hang: bodies over the limit
413, bad JSON 400, other methods 405, other paths 404, slow clients a socket timeout, a slow
evaluation the --on-error verdict after the per-request timeout. docs/gating.md.
"""

from __future__ import annotations

import copy
import json
import socket
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from planner.gate import ADMIT, REJECT, SpecError, error_verdict, gate, parse_spec_text

ANNOTATION = "fitcheck.io/spec"
GPU_RESOURCE = "nvidia.com/gpu"
API_VERSION = "admission.k8s.io/v1"
MAX_WARNING_CHARS = 256  # the API server may truncate longer ones


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookConfig:
    require_annotation: bool = False
    on_error: str = REJECT
    """admit or reject: the answer when evaluation fails or times out."""
    timeout_s: float = 5.0
    max_body_bytes: int = 1 << 20
    max_concurrent: int = 32
    quiet: bool = False


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
    elif isinstance(v, str) and v.strip().isdigit():
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
            pods += [per] * replicas if per else []
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
        pods = [per] * copies if per else []
    if len(pods) > 1 << 16:
        raise Denied(f"too many pods: {len(pods)}")
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
            verdict = gate(spec, allow_files=False)
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


def review_with_deadline(uid: str, req: dict[str, Any], cfg: WebhookConfig) -> dict[str, Any]:
    """evaluate() in a worker thread; past the deadline or on a crash: the --on-error answer."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["out"] = evaluate(uid, req, cfg)
        except BaseException as exc:  # noqa: BLE001 - reported as the on-error verdict
            box["err"] = f"{type(exc).__name__}: {exc}"

    t = threading.Thread(target=work, name=f"fitcheck-review-{uid[:16]}", daemon=True)
    t.start()
    t.join(cfg.timeout_s)
    if "out" in box:
        return box["out"]
    err = box.get("err", f"timed out after {cfg.timeout_s:g} s")
    v = error_verdict(err, cfg.on_error)
    return _response(uid, v["verdict"] == ADMIT, f"fitcheck: {v['reason']}",
                     [f"fitcheck: evaluation failed: {_short(err)}"])


# ---------------------------------------------------------------------------------------------
# HTTP


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fitcheck-webhook"
    sys_version = ""
    cfg: WebhookConfig = WebhookConfig()
    slots: threading.BoundedSemaphore

    def setup(self) -> None:
        self.timeout = self.cfg.timeout_s  # socket timeout: slow clients cannot hold a thread
        super().setup()
        do_handshake = getattr(self.request, "do_handshake", None)
        if do_handshake is not None:  # TLS: handshake here, off the accept loop
            do_handshake()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        if not self.cfg.quiet:
            sys.stderr.write(f"fitcheck serve: {self.address_string()} {format % args}\n")

    def _send(self, code: int, doc: dict[str, Any] | None = None, *, close: bool = False,
              headers: dict[str, str] | None = None) -> None:
        body = b"" if doc is None else json.dumps(doc).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except OSError:
            self.close_connection = True

    def _path(self) -> str:
        return self.path.split("?", 1)[0]

    def do_GET(self) -> None:  # noqa: N802
        if self._path() == "/healthz":
            self._send(200, {"status": "ok"})
        elif self._path() == "/validate":
            self._send(405, {"error": "use POST"}, headers={"Allow": "POST"})
        else:
            self._send(404, {"error": f"no such path: {self._path()[:100]}"})

    def _not_allowed(self) -> None:
        if self._path() in ("/validate", "/healthz"):
            allow = "POST" if self._path() == "/validate" else "GET"
            self._send(405, {"error": f"method {self.command} not allowed"},
                       headers={"Allow": allow}, close=True)
        else:
            self._send(404, {"error": f"no such path: {self._path()[:100]}"}, close=True)

    do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _not_allowed  # noqa: N815

    def _drain(self, length: int) -> None:
        """Read and drop a refused body (up to a bound), so closing does not reset the
        connection under a client still sending it and it sees the 413."""
        left = min(length, 8 * self.cfg.max_body_bytes)
        try:
            while left > 0:
                chunk = self.rfile.read(min(left, 65536))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass

    def do_POST(self) -> None:  # noqa: N802
        if self._path() != "/validate":
            self._send(404, {"error": f"no such path: {self._path()[:100]}"}, close=True)
            return
        if self.headers.get("Transfer-Encoding"):
            self._send(411, {"error": "chunked bodies are not accepted; send Content-Length"},
                       close=True)
            return
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            self._send(411, {"error": "Content-Length required"}, close=True)
            return
        try:
            length = int(length_text)
            if length < 0:
                raise ValueError
        except ValueError:
            self._send(400, {"error": f"bad Content-Length: {length_text[:40]!r}"}, close=True)
            return
        if length > self.cfg.max_body_bytes:
            self._drain(length)
            self._send(413, {"error": f"body of {length} bytes exceeds the limit of "
                             f"{self.cfg.max_body_bytes}"}, close=True)
            return
        try:
            raw = self.rfile.read(length)
        except (TimeoutError, socket.timeout, OSError):
            self._send(408, {"error": "timed out reading the body"}, close=True)
            return
        if len(raw) < length:
            self._send(400, {"error": "body shorter than Content-Length"}, close=True)
            return
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            self._send(400, {"error": f"invalid JSON: {str(exc)[:200]}"})
            return
        try:
            uid, req = parse_review(body)
        except BadRequest as exc:
            self._send(400, {"error": str(exc)})
            return
        if not self.slots.acquire(blocking=False):
            self._send(503, {"error": "too many requests in flight"}, headers={"Retry-After": "1"})
            return
        try:
            out = review_with_deadline(uid, req, self.cfg)
        finally:
            self.slots.release()
        r = out["response"]
        self.log_message("validate uid=%s allowed=%s %s", uid[:64], r["allowed"],
                         r["status"]["message"][:200])
        self._send(200, out)


class WebhookServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        cfg = getattr(self.RequestHandlerClass, "cfg", None)
        if cfg is None or not cfg.quiet:
            sys.stderr.write(f"fitcheck serve: {client_address[0]}: connection error: "
                             f"{type(exc).__name__}: {exc}\n")


def make_server(host: str, port: int, cfg: WebhookConfig, *, tls_cert: str | None = None,
                tls_key: str | None = None) -> WebhookServer:
    """A bound server (port 0: any free one; see server.server_address); call serve_forever."""
    handler = type("FitcheckHandler", (_Handler,),
                   {"cfg": cfg, "slots": threading.BoundedSemaphore(cfg.max_concurrent)})
    server = WebhookServer((host, port), handler)
    if tls_cert:
        import ssl

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(tls_cert, tls_key)
        except (ssl.SSLError, OSError) as exc:
            server.server_close()
            raise ValueError(f"cannot load the certificate/key: {exc}") from None
        server.socket = ctx.wrap_socket(server.socket, server_side=True,
                                        do_handshake_on_connect=False)
    return server
