"""`fitcheck serve`: real HTTP(S) against the admission webhook on 127.0.0.1 (port 0).

A test that starts a server, an evaluation process or openssl is marked ``integration``; the
counting, the manifest's spec and the CLI's surface are unit tests."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import cli
from planner.webhook import ANNOTATION, WebhookConfig, count_gpus, make_server

SPEC_8B = {"model": {"preset": "llama3-8b"}, "hardware": {"gpu": "h100-80"}}
SPEC_70B_DDP = {"model": {"preset": "llama3-70b"}, "hardware": {"gpu": "h100-80"},
                "strategy": "ddp"}
HERE = "test_webhook"  # this module, as the evaluation processes import it (tests/ on sys.path)


# Evaluators the evaluation processes run instead of planner.webhook.evaluate
def sleepy_evaluator(uid, req, cfg):
    time.sleep(60)


def spinning_evaluator(uid, req, cfg):
    while True:
        pass


def crashing_evaluator(uid, req, cfg):
    raise RuntimeError("kaboom")


def dying_evaluator(uid, req, cfg):
    os._exit(7)


def hungry_evaluator(uid, req, cfg):
    hoard = []
    while True:
        hoard.append(bytearray(16 << 20))


def _openssl(*args: str, cwd: Path) -> None:
    p = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, timeout=60,
                       check=False)
    if p.returncode:
        pytest.skip(f"openssl failed: {p.stderr[:200]!r}")


def make_tls_files(tmp_path_factory) -> dict[str, str]:
    """A self-signed server certificate for 127.0.0.1, and a CA with a client certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    d = tmp_path_factory.mktemp("tls")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-days", "1", "-subj", "/CN=127.0.0.1", "-addext",
             "subjectAltName=IP:127.0.0.1", "-keyout", "tls.key", "-out", "tls.crt", cwd=d)
    _openssl("req", "-x509", *ec, "-days", "1", "-subj", "/CN=test-ca", "-keyout", "ca.key",
             "-out", "ca.crt", cwd=d)
    _openssl("req", *ec, "-subj", "/CN=kube-apiserver", "-keyout", "client.key", "-out",
             "client.csr", cwd=d)
    _openssl("x509", "-req", "-in", "client.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "1", "-out", "client.crt", cwd=d)
    return {k: str(d / f) for k, f in [("cert", "tls.crt"), ("key", "tls.key"),
                                       ("ca", "ca.crt"), ("client_cert", "client.crt"),
                                       ("client_key", "client.key")]}


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory) -> dict[str, str]:
    return make_tls_files(tmp_path_factory)


def client_context(tls: dict[str, str], client_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=tls["cert"])
    if client_cert:
        ctx.load_cert_chain(tls["client_cert"], tls["client_key"])
    return ctx


@contextmanager
def server(**cfg):
    """A webhook on 127.0.0.1 in a thread; yields its port. tls=tls_files serves HTTPS,
    client_ca=path requires client certificates."""
    cfg.setdefault("quiet", True)
    cfg.setdefault("timeout_s", 2.0)
    cfg.setdefault("workers", 1)
    tls = cfg.pop("tls", None)
    client_ca = cfg.pop("client_ca", None)
    kw = {"tls_cert": tls["cert"], "tls_key": tls["key"], "client_ca": client_ca} if tls else {}
    srv = make_server("127.0.0.1", 0, WebhookConfig(**cfg), **kw)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
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


@pytest.mark.integration
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


@pytest.mark.integration
def test_spec_n_wins_over_pods_with_a_warning():
    s = {**SPEC_8B, "hardware": {"gpu": "h100-80", "n": 8}}
    with server() as port:
        _, doc = post(port, review(pytorchjob(s)))
    r = doc["response"]
    assert r["allowed"] is True and "on 8 x h100-80" in r["status"]["message"]
    assert any("request 16 GPUs" in w for w in r["warnings"])


@pytest.mark.integration
def test_no_annotation_allowed_with_warning_or_denied_when_required():
    with server() as port:
        _, doc = post(port, review(pytorchjob(None)))
        assert doc["response"]["allowed"] is True
        assert any("no fitcheck.io/spec annotation" in w for w in doc["response"]["warnings"])
    with server(require_annotation=True) as port:
        _, doc = post(port, review(pytorchjob(None)))
        assert doc["response"]["allowed"] is False
        assert "required" in doc["response"]["status"]["message"]


@pytest.mark.integration
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


@pytest.mark.integration
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


@pytest.mark.integration
def test_keep_alive_connection_serves_several_reviews():
    with server() as port:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for i in range(3):
            status, doc = post(port, review(pytorchjob(SPEC_8B), uid=f"k-{i}"), conn=c)
            assert status == 200 and doc["response"]["uid"] == f"k-{i}"
        c.close()


@pytest.mark.integration
@pytest.mark.parametrize("on_error, allowed", [("admit", True), ("reject", False)])
def test_evaluation_past_the_deadline_is_killed_and_follows_on_error(on_error, allowed):
    """The evaluation runs in a process: past --timeout it is killed (not left running) and the
    answer follows --on-error; a fresh process serves the next request."""
    with server(on_error=on_error, timeout_s=0.5, evaluator=f"{HERE}:spinning_evaluator") as port:
        for i in range(2):  # the second is served by the replacement process
            t0 = time.monotonic()
            status, doc = post(port, review(pytorchjob(SPEC_8B), uid=f"t-{i}"))
            assert time.monotonic() - t0 < 2.0
            r = doc["response"]
            assert status == 200 and r["uid"] == f"t-{i}" and r["allowed"] is allowed, r
            assert "timed out after 0.5 s" in r["status"]["message"]
            assert any("evaluation failed" in w for w in r["warnings"])


@pytest.mark.integration
@pytest.mark.parametrize("evaluator, needle", [("crashing_evaluator", "RuntimeError: kaboom"),
                                               ("dying_evaluator", "evaluation process exited"),
                                               ("hungry_evaluator", "MemoryError")])
def test_evaluation_crash_follows_on_error(evaluator, needle):
    with server(on_error="admit", evaluator=f"{HERE}:{evaluator}", timeout_s=5.0,
                worker_memory_bytes=256 << 20) as port:
        for i in range(2):
            _, doc = post(port, review(pytorchjob(SPEC_8B), uid=f"c-{i}"))
            r = doc["response"]
            assert r["allowed"] is True and needle in r["status"]["message"], r


@pytest.mark.integration
def test_healthz_answers_while_evaluations_run():
    with server(timeout_s=1.5, evaluator=f"{HERE}:spinning_evaluator") as port:
        t = threading.Thread(target=post, args=(port, review(pytorchjob(SPEC_8B))))
        t.start()
        time.sleep(0.3)  # the evaluation process is spinning now
        for _ in range(5):
            t0 = time.monotonic()
            assert request(port, "GET", "/healthz")[0] == 200
            assert time.monotonic() - t0 < 0.5
        t.join(10)


@pytest.mark.integration
def test_alias_bomb_annotation_is_denied_at_once():
    """516 bytes of YAML anchors (9**9 items) used to freeze the server, /healthz included,
    for tens of seconds and gigabytes: now a bad spec, answered at once."""
    from test_specfile import alias_bomb

    obj = pytorchjob(None)
    obj["metadata"]["annotations"] = {ANNOTATION: alias_bomb()}
    with server(timeout_s=5.0) as port:
        t0 = time.monotonic()
        status, doc = post(port, review(obj, uid="bomb"))
        assert time.monotonic() - t0 < 2.0
        r = doc["response"]
        assert status == 200 and r["allowed"] is False
        assert "bad job spec" in r["status"]["message"] and "anchors" in r["status"]["message"]
        assert request(port, "GET", "/healthz")[0] == 200


@pytest.mark.integration
def test_tls(tls_files):
    with server(tls=tls_files) as port:
        # a client that connects and never handshakes must not block the others
        idle = socket.create_connection(("127.0.0.1", port))
        c = http.client.HTTPSConnection("127.0.0.1", port, timeout=10,
                                        context=client_context(tls_files))
        status, doc = post(port, review(pytorchjob(SPEC_8B)), conn=c)
        assert status == 200 and doc["response"]["allowed"] is True
        c.close()
        # and it is closed by the deadline (2 s)
        idle.settimeout(5)
        t0 = time.monotonic()
        assert idle.recv(100) == b""
        assert time.monotonic() - t0 < 3.0
        idle.close()


@pytest.mark.integration
def test_tls_keep_alive_has_no_nagle_floor(tls_files):
    """Head and body go out in one write: no 40 ms delayed-ACK wait per keep-alive request
    (it was ~44 ms each before)."""
    with server(tls=tls_files, timeout_s=5.0) as port:
        c = http.client.HTTPSConnection("127.0.0.1", port, timeout=10,
                                        context=client_context(tls_files))
        for path, body in [("/healthz", None), ("/validate", review(pytorchjob(SPEC_8B)))]:
            times = []
            for _ in range(15):
                t0 = time.perf_counter()
                status, _ = request(port, "POST" if body else "GET", path, body,
                                    {"Content-Type": "application/json"}, conn=c)
                times.append(time.perf_counter() - t0)
                assert status == 200
            assert statistics.median(times) < 0.030, (path, times)
        c.close()
        times = []  # and the first request of a new connection (TLS 1.3 session tickets)
        for _ in range(10):
            c = http.client.HTTPSConnection("127.0.0.1", port, timeout=10,
                                            context=client_context(tls_files))
            c.connect()
            t0 = time.perf_counter()
            assert request(port, "GET", "/healthz", conn=c)[0] == 200
            times.append(time.perf_counter() - t0)
            c.close()
        assert statistics.median(times) < 0.030, times


@pytest.mark.integration
def test_client_certificates_required_with_client_ca(tls_files):
    """--client-ca: /validate only for clients with a certificate signed by that CA (the API
    server's); /healthz stays open for the kubelet's probes, which present none."""
    body = review(pytorchjob(SPEC_8B))
    with server(tls=tls_files, client_ca=tls_files["ca"]) as port:
        c = http.client.HTTPSConnection("127.0.0.1", port, timeout=10,
                                        context=client_context(tls_files, client_cert=True))
        status, doc = post(port, body, conn=c)
        assert status == 200 and doc["response"]["allowed"] is True
        c.close()
        c = http.client.HTTPSConnection("127.0.0.1", port, timeout=10,
                                        context=client_context(tls_files))
        assert request(port, "GET", "/healthz", conn=c)[0] == 200
        status, doc = post(port, body, conn=c)
        assert status == 403 and "client certificate is required" in doc["error"]
        c.close()
        # a certificate from another CA fails the handshake
        other = ssl.create_default_context(cafile=tls_files["cert"])
        other.load_cert_chain(tls_files["cert"], tls_files["key"])
        c = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=other)
        with pytest.raises((ssl.SSLError, ConnectionError)):
            request(port, "GET", "/healthz", conn=c)
        c.close()


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


def serve_cli(*args: str):
    return CliRunner().invoke(cli, ["serve", *args])


@pytest.mark.integration
def test_serve_command_starts_answers_and_stops():
    import re
    import signal

    p = subprocess.Popen([sys.executable, "-c", "from planner.cli import main; main()", "serve",
                          "--insecure", "--port", "0", "--quiet"],
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)  # --insecure: loopback by default
        assert m, line
        port = int(m.group(1))
        assert request(port, "GET", "/healthz")[0] == 200
        _, doc = post(port, review(pytorchjob(SPEC_8B)))
        assert doc["response"]["allowed"] is True
    finally:
        p.send_signal(signal.SIGTERM)  # how Kubernetes stops the pod
        assert p.wait(10) == 0
        p.stderr.close()


@pytest.mark.parametrize("args, needle", [
    ([], "--tls-cert and --tls-key are required"),
    (["--host", "127.0.0.1"], "--insecure serves plain HTTP on 127.0.0.1"),
    (["--insecure", "--timeout", "nan"], "--timeout"),
    (["--insecure", "--timeout", "inf"], "--timeout"),
    (["--insecure", "--timeout", "0"], "between 0.1 and 30 seconds, got '0'"),
    (["--insecure", "--timeout", "31"], "--timeout"),
])
def test_serve_usage_errors(args, needle):
    r = serve_cli(*args)
    assert r.exit_code == 2, (r.exit_code, r.output)
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


@pytest.mark.integration
def test_serve_tls_flag_conflicts(tls_files):
    for args, needle in [(["--insecure", "--tls-cert", tls_files["cert"], "--tls-key",
                           tls_files["key"]], "--insecure serves plain HTTP"),
                         (["--insecure", "--client-ca", tls_files["ca"]], "--client-ca needs TLS"),
                         (["--tls-cert", tls_files["cert"]], "go together"),
                         (["--tls-cert", tls_files["cert"], "--tls-key", tls_files["cert"]],
                          "--tls-cert/--tls-key: cannot load")]:
        r = serve_cli(*args, "--port", "0")
        assert r.exit_code == 2 and needle in r.stderr, (args, r.output)


def test_serve_cli_surface_is_frozen():
    """Flags are a contract (the manifests script against them): none may vanish."""
    from planner.gate_cli import serve_cmd

    names = {opt for p in serve_cmd.params for opt in p.opts + p.secondary_opts}
    assert {"--host", "--port", "--tls-cert", "--tls-key", "--client-ca", "--insecure",
            "--require-annotation", "--on-error", "--timeout", "--max-body-bytes", "--workers",
            "--max-concurrent", "--max-connections", "--quiet"} <= names


@pytest.mark.integration
def test_kubernetes_manifest_serves_tls_with_accepted_flags(tls_files):
    """integrations/kubernetes/webhook.yaml's args parse, and serve HTTPS (not --insecure)."""
    import yaml

    from planner.gate_cli import serve_cmd

    text = (Path(__file__).resolve().parent.parent / "integrations" / "kubernetes"
            / "webhook.yaml").read_text()
    deploy = next(d for d in yaml.safe_load_all(text) if d and d["kind"] == "Deployment")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    args = [a.replace("/tls/tls.crt", tls_files["cert"]).replace("/tls/tls.key", tls_files["key"])
            for a in args]
    params = serve_cmd.make_context("serve", args).params
    assert params["tls_cert"] and params["tls_key"] and not params["insecure"]
    assert params["host"] is None  # 0.0.0.0 with TLS: the pod is reached through its Service


@pytest.mark.integration
def test_the_event_loop_never_parses_a_large_body(monkeypatch):
    """A review body is parsed in the evaluation process, never on the server's event loop
    (issue 22, item 7: a 1 MiB body parsed there held every connection, /healthz included).
    Every json.loads of this process is recorded while a 900 KiB review is answered: the
    largest is the evaluation process's small answer, not the body; a bad body is still a
    400 that the evaluation process wrote."""
    import planner.webhook as wh

    sizes: list[int] = []
    real = wh.json.loads

    def loads(s, *a, **kw):
        sizes.append(len(s))
        return real(s, *a, **kw)

    monkeypatch.setattr(wh.json, "loads", loads)
    obj = pytorchjob(SPEC_8B)
    obj["metadata"]["labels"] = {"padding": "x" * (900 << 10)}
    body = review(obj, uid="big-1")
    assert len(body) > 900 << 10
    with server() as port:
        status, doc = post(port, body)
        assert status == 200 and doc["response"]["uid"] == "big-1"
        assert doc["response"]["allowed"] is True, doc
        status, doc = post(port, b'{"kind": "AdmissionReview", ')
        assert status == 400 and doc["error"].startswith("invalid JSON:")
    assert sizes and max(sizes) < 64 << 10, max(sizes)


@pytest.mark.integration
@pytest.mark.parametrize("raw, needle", [
    # issue 22, item 8: each of these got no answer at all (the connection hung, or its
    # task died on int("²"), which str.isdigit() accepts)
    (b"POST /validate HTTP/1.1\nHost: x\nContent-Length: 2\n\n{}", b"bare LF"),
    (b"GET /healthz HTTP/1.1\r\nHost: x\n\r\n", b"bare LF"),
    (b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: \xb2\r\n\r\n{}",
     b"bad Content-Length"),
    (b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: \xd9\xa3\r\n\r\n{}",
     b"bad Content-Length"),
])
def test_malformed_heads_are_answered_400(raw, needle):
    with server(timeout_s=5.0) as port:
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(raw)
        s.settimeout(10)
        t0 = time.monotonic()
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
        s.close()
        assert time.monotonic() - t0 < 2.0  # answered at once, not at the deadline
        assert reply.split(b"\r\n", 1)[0] == b"HTTP/1.1 400 Bad Request", reply[:200]
        assert needle in reply, reply
        assert request(port, "GET", "/healthz")[0] == 200
