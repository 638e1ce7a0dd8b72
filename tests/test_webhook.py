"""`fitcheck serve`: real HTTP against the admission webhook on 127.0.0.1 (port 0)."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
from contextlib import contextmanager

import pytest

from planner.webhook import ANNOTATION, WebhookConfig, count_gpus, make_server

SPEC_8B = {"model": {"preset": "llama3-8b"}, "hardware": {"gpu": "h100-80"}}
SPEC_70B_DDP = {"model": {"preset": "llama3-70b"}, "hardware": {"gpu": "h100-80"},
                "strategy": "ddp"}


@contextmanager
def server(**cfg):
    cfg.setdefault("quiet", True)
    cfg.setdefault("timeout_s", 2.0)
    tls = cfg.pop("tls", None)
    srv = make_server("127.0.0.1", 0, WebhookConfig(**cfg),
                      **({"tls_cert": tls[0], "tls_key": tls[1]} if tls else {}))
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)


def request(port: int, method: str, path: str, body: bytes | None = None,
            headers: dict | None = None, conn=None):
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    data = r.read()
    if conn is None:
        c.close()
    return r.status, (json.loads(data) if data else None)


def container(gpus: int) -> dict:
    return {"name": "trainer", "image": "pytorch",
            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}


def pytorchjob(spec: dict | None, master: int = 8, workers: int = 1, per_pod: int = 8) -> dict:
    meta = {"name": "train", "namespace": "ml"}
    if spec is not None:
        meta["annotations"] = {ANNOTATION: json.dumps(spec)}
    tmpl = lambda n: {"spec": {"containers": [container(n)]}}  # noqa: E731
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": meta,
            "spec": {"pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": tmpl(master)},
                "Worker": {"replicas": workers, "template": tmpl(per_pod)}}}}


def batch_job(spec: dict | None, parallelism: int, gpus: int) -> dict:
    meta = {"name": "j", "annotations": {ANNOTATION: json.dumps(spec)} if spec else {}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
            "spec": {"parallelism": parallelism,
                     "template": {"spec": {"containers": [container(gpus)]}}}}


def review(obj, uid: str = "uid-1", operation: str = "CREATE") -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": uid, "operation": operation, "object": obj}}).encode()


def post(port, body: bytes, **kw):
    return request(port, "POST", "/validate", body,
                   {"Content-Type": "application/json", **kw.pop("headers", {})}, **kw)


def test_admit_deny_and_gpu_counting_over_http():
    with server() as port:
        assert request(port, "GET", "/healthz") == (200, {"status": "ok"})
        # PyTorchJob: Master 8 + 1 Worker x 8 = 16 GPUs, 8 per pod
        status, doc = post(port, review(pytorchjob(SPEC_8B), uid="a-1"))
        assert status == 200
        assert doc["apiVersion"] == "admission.k8s.io/v1" and doc["kind"] == "AdmissionReview"
        r = doc["response"]
        assert r["uid"] == "a-1" and r["allowed"] is True, r
        assert "on 16 x h100-80" in r["status"]["message"]
        assert any("use " in w for w in r["warnings"])
        # 70B pinned to DDP never fits: denied, with the reason
        status, doc = post(port, review(pytorchjob(SPEC_70B_DDP, workers=3), uid="d-1"))
        r = doc["response"]
        assert status == 200 and r["uid"] == "d-1" and r["allowed"] is False
        assert r["status"]["code"] == 403
        assert "pinned ddp" in r["status"]["message"] and "on 32 x h100-80" in r["status"]["message"]
        # batch/v1 Job: parallelism x container limits
        status, doc = post(port, review(batch_job(SPEC_8B, parallelism=2, gpus=4)))
        assert doc["response"]["allowed"] is True
        assert "on 8 x h100-80" in doc["response"]["status"]["message"]


def test_pytorchjob_gpu_counting():
    assert count_gpus(pytorchjob(None, master=8, workers=3, per_pod=8)) == (32, [8] * 4)
    job = pytorchjob(None)
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"].append(
        {"name": "sidecar", "resources": {"requests": {"cpu": "1"}}})
    assert count_gpus(job)[0] == 16
    assert count_gpus(batch_job(None, parallelism=3, gpus=2)) == (6, [2, 2, 2])
    assert count_gpus({"kind": "Pod", "spec": {"containers": [container(4)]}}) == (4, [4])


def test_spec_n_wins_over_pods_with_a_warning():
    s = {**SPEC_8B, "hardware": {"gpu": "h100-80", "n": 8}}
    with server() as port:
        _, doc = post(port, review(pytorchjob(s)))
    r = doc["response"]
    assert r["allowed"] is True and "on 8 x h100-80" in r["status"]["message"]
    assert any("request 16 GPUs" in w for w in r["warnings"])


def test_no_annotation_allowed_with_warning_or_denied_when_required():
    with server() as port:
        _, doc = post(port, review(pytorchjob(None)))
        assert doc["response"]["allowed"] is True
        assert any("no fitcheck.io/spec annotation" in w for w in doc["response"]["warnings"])
    with server(require_annotation=True) as port:
        _, doc = post(port, review(pytorchjob(None)))
        assert doc["response"]["allowed"] is False
        assert "required" in doc["response"]["status"]["message"]


def test_bad_annotation_and_no_gpus_are_denied():
    with server() as port:
        obj = pytorchjob(None)
        obj["metadata"]["annotations"] = {ANNOTATION: '{"model": {"preset": "llama3-8b"}'}
        _, doc = post(port, review(obj))
        assert doc["response"]["allowed"] is False
        assert "invalid JSON" in doc["response"]["status"]["message"]
        _, doc = post(port, review(batch_job({**SPEC_8B, "bogus": 1}, 1, 8)))
        assert "unknown key 'bogus'" in doc["response"]["status"]["message"]
        _, doc = post(port, review(batch_job(SPEC_8B, 1, 0)))
        assert doc["response"]["allowed"] is False
        assert "no GPU count" in doc["response"]["status"]["message"]
        # file paths from a request must not read server files
        s = {"model": {"config": "/etc/passwd"}, "hardware": {"gpu": "h100-80"}}
        _, doc = post(port, review(batch_job(s, 1, 8)))
        assert doc["response"]["allowed"] is False
        assert "file paths are not accepted" in doc["response"]["status"]["message"]
        # DELETE has no object: allowed
        _, doc = post(port, review(None, operation="DELETE"))
        assert doc["response"]["allowed"] is True


def test_hostile_requests_get_http_errors_not_crashes():
    with server(max_body_bytes=8192, timeout_s=1.0) as port:
        # too large: refused from Content-Length, before reading
        status, doc = post(port, b"x" * 20_000)
        assert status == 413 and "exceeds" in doc["error"]
        status, doc = post(port, b"{not json")
        assert status == 400 and "invalid JSON" in doc["error"]
        status, doc = post(port, b"\xff\xfe\x00garbage")
        assert status == 400
        status, doc = post(port, json.dumps({"kind": "Pod"}).encode())
        assert status == 400 and "AdmissionReview" in doc["error"]
        status, doc = post(port, json.dumps({"apiVersion": "admission.k8s.io/v1",
                                             "kind": "AdmissionReview", "request": {}}).encode())
        assert status == 400 and "uid" in doc["error"]
        status, doc = post(port, b"[" * 2000 + b"]" * 2000)
        assert status == 400
        assert request(port, "GET", "/validate")[0] == 405
        assert request(port, "PUT", "/validate", b"{}")[0] == 405
        assert request(port, "DELETE", "/healthz")[0] == 405
        assert request(port, "GET", "/nope")[0] == 404
        assert post_path(port, "/mutate") == 404
        # a client that sends headers and then stalls: the server times out, others proceed
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        assert request(port, "GET", "/healthz")[0] == 200
        s.settimeout(10)
        t0 = time.monotonic()
        reply = s.recv(4096)
        assert time.monotonic() - t0 < 5
        assert reply == b"" or b"408" in reply.split(b"\r\n", 1)[0]
        s.close()
        # no Content-Length
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(10)
        assert b" 411 " in s.recv(4096).split(b"\r\n", 1)[0]
        s.close()
        # still healthy after all of it
        assert request(port, "GET", "/healthz")[0] == 200


def post_path(port: int, path: str) -> int:
    return request(port, "POST", path, b"{}", {"Content-Type": "application/json"})[0]


def test_keep_alive_connection_serves_several_reviews():
    with server() as port:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for i in range(3):
            status, doc = post(port, review(pytorchjob(SPEC_8B), uid=f"k-{i}"), conn=c)
            assert status == 200 and doc["response"]["uid"] == f"k-{i}"
        c.close()


@pytest.mark.parametrize("on_error, allowed", [("admit", True), ("reject", False)])
def test_evaluation_timeout_and_crash_follow_on_error(monkeypatch, on_error, allowed):
    import planner.webhook

    def slow(*a, **k):
        time.sleep(1.5)
        raise AssertionError("not reached in time")

    monkeypatch.setattr(planner.webhook, "gate", slow)
    with server(on_error=on_error, timeout_s=0.3) as port:
        status, doc = post(port, review(pytorchjob(SPEC_8B)))
    r = doc["response"]
    assert status == 200 and r["allowed"] is allowed
    assert "timed out" in r["status"]["message"]

    def boom(*a, **k):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(planner.webhook, "gate", boom)
    with server(on_error=on_error) as port:
        _, doc = post(port, review(pytorchjob(SPEC_8B)))
    assert doc["response"]["allowed"] is allowed and "kaboom" in doc["response"]["status"]["message"]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls(tmp_path):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    p = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj",
                        "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                       capture_output=True, timeout=30)
    if p.returncode:
        pytest.skip(f"openssl failed: {p.stderr[:200]!r}")
    with server(tls=(str(cert), str(key))) as port:
        # a client that connects and never handshakes must not block the others
        idle = socket.create_connection(("127.0.0.1", port))
        ctx = ssl.create_default_context(cafile=str(cert))
        ctx.check_hostname = False
        c = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=ctx)
        status, doc = post(port, review(pytorchjob(SPEC_8B)), conn=c)
        assert status == 200 and doc["response"]["allowed"] is True
        c.close()
        idle.close()


def test_example_pytorchjob_manifest_is_admitted():
    """integrations/kubernetes/pytorchjob-example.yaml: its annotation and GPUs, through evaluate."""
    from pathlib import Path

    from planner.webhook import evaluate

    text = (Path(__file__).resolve().parent.parent / "integrations" / "kubernetes"
            / "pytorchjob-example.yaml").read_text()
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "fitcheck.io/spec: |" in line) + 1
    indent = len(lines[start]) - len(lines[start].lstrip())
    block = []
    for line in lines[start:]:
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            break
        block.append(line)
    spec = json.loads("\n".join(block))
    assert "n" not in spec["hardware"]
    assert text.count("nvidia.com/gpu: 8") == 2
    out = evaluate("u", {"object": pytorchjob(spec, master=8, workers=1, per_pod=8)},
                   WebhookConfig())
    assert out["response"]["allowed"] is True, out
    assert "on 16 x h100-80" in out["response"]["status"]["message"]


def test_serve_command_starts_answers_and_stops():
    import re
    import signal
    import sys

    p = subprocess.Popen([sys.executable, "-c", "from planner.cli import main; main()", "serve",
                          "--host", "127.0.0.1", "--port", "0", "--quiet"],
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert m, line
        port = int(m.group(1))
        assert request(port, "GET", "/healthz")[0] == 200
        _, doc = post(port, review(pytorchjob(SPEC_8B)))
        assert doc["response"]["allowed"] is True
    finally:
        p.send_signal(signal.SIGTERM)  # how Kubernetes stops the pod
        assert p.wait(10) == 0
        p.stderr.close()
