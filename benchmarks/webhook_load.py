"""Load test of `fitcheck serve` on loopback: throughput, latency, overload, slow clients, a YAML
alias bomb (docs/gating.md, "Limits").

    python benchmarks/webhook_load.py [--clients 200] [--per-client 5] [--plain] [--quick]
        [--phases keep-alive,concurrent,slowloris,held,bomb] [--pythonpath DIR]
        [--serve-arg=--workers=2 ...]
        [--connect https://127.0.0.1:PORT --cafile CERT]

Without --connect it starts `fitcheck serve --host 127.0.0.1 --port 0` in a subprocess with a
throwaway self-signed certificate in a temporary folder (the `cryptography` package, else the
`openssl` command), or with plain HTTP under --plain; --pythonpath puts another copy of the
package first (to measure an older version). Phases, each bounded in time:

1. keep-alive: one TLS connection, sequential reviews: requests/s, p50/p99 latency.
2. concurrent: --clients connections at once, --per-client reviews each on keep-alive:
   requests/s, p50/p99, HTTP status counts, connection errors, and answers that are the
   --on-error verdict (an evaluation that timed out while queued).
3. slowloris: clients trickling a request (headers, or a body) one byte per 0.5 s: how long
   the server keeps each open (capped), while /healthz and a review are timed beside them.
4. held: --held connections that connect and send nothing; reviews beside them; the server's
   thread count.
5. alias bomb: a 516-byte YAML spec whose anchors expand to 9**9 list items: the answer, its
   time, /healthz beside it, and the peak memory (RSS) of the server and its children.
6. tls floods: floods of 1,000 connections that complete the TLS handshake and send nothing:
   the server's RSS with them open and after each flood is closed.
7. big bodies: 8 connections sending reviews of just under 1 MiB (the default body cap)
   back to back, /healthz timed every 50 ms beside them: whether the event loop parses.

Prints one line per figure; nothing is written. The server is killed if its processes'
memory passes --max-server-gib.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from typing import Any
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
ANNOTATION = "fitcheck.io/spec"
SPEC_8B = {"model": {"preset": "llama3-8b"}, "hardware": {"gpu": "h100-80"}}


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """YAML whose `model.mlp` holds width**levels items through nested anchors (516 bytes)."""
    lines = ["model:", "  preset: llama3-8b", "  mlp:",
             "    a0: &a0 [" + ",".join(["lol"] * width) + "]"]
    lines += [f"    a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]"
              for i in range(1, levels)]
    lines += ["hardware:", "  gpu: h100-80", "  n: 8"]
    return "\n".join(lines) + "\n"


def review(annotation: str, uid: str) -> bytes:
    def tmpl(n: int) -> dict:
        return {"spec": {"containers": [{"name": "trainer", "image": "pytorch", "resources": {
            "limits": {"nvidia.com/gpu": str(n)}}}]}}

    obj = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
           "metadata": {"name": "train", "namespace": "ml",
                        "annotations": {ANNOTATION: annotation}},
           "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": tmpl(8)},
                                            "Worker": {"replicas": 1, "template": tmpl(8)}}}}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": uid, "operation": "CREATE", "object": obj}}).encode()


# ---------------------------------------------------------------------------------------------
# The server under test


def self_signed(folder: Path) -> tuple[str, str]:
    """(cert, key) PEM files for 127.0.0.1, valid one day."""
    cert, key = folder / "tls.crt", folder / "tls.key"
    try:
        import datetime
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        if shutil.which("openssl") is None:
            sys.exit("needs the cryptography package or the openssl command for a certificate")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj",
                        "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", str(key), "-out", str(cert)], check=True,
                       capture_output=True, timeout=60)
        return str(cert), str(key)
    k = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    c = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(k.public_key())
         .serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.SubjectAlternativeName(
             [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
         .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
         .sign(k, hashes.SHA256()))
    cert.write_bytes(c.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(k.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    return str(cert), str(key)


def descendants(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += parents.get(p, [])
    return out


def proc_status(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class Server:
    url: str
    cafile: str | None
    proc: subprocess.Popen | None = None
    pid: int | None = None
    peak_rss_kib: int = 0
    killed_for_memory: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        if self.proc is not None:
            self.pid = self.proc.pid

    def rss_kib(self) -> int:
        return sum(proc_status(p, "VmRSS") for p in descendants(self.pid)) if self.pid else 0

    def threads(self) -> int:
        return proc_status(self.pid, "Threads") if self.pid else 0

    def watch(self, limit_kib: int | None) -> None:
        while not self._stop.wait(0.05):
            rss = self.rss_kib()
            self.peak_rss_kib = max(self.peak_rss_kib, rss)
            if limit_kib and rss > limit_kib and self.proc and self.proc.poll() is None:
                self.killed_for_memory = True
                self.proc.kill()

    def reset_peak(self) -> None:
        self.peak_rss_kib = self.rss_kib()


def start_server(args: argparse.Namespace, tmp: Path) -> Server:
    if args.connect:
        srv = Server(args.connect, args.cafile, pid=args.pid)
        if args.pid:  # measured, never killed: it is not ours
            threading.Thread(target=srv.watch, args=(None,), daemon=True).start()
        return srv
    env = dict(os.environ)
    if args.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([args.pythonpath, env.get("PYTHONPATH", "")])
    base = [sys.executable, "-c", "from planner.cli import main; main()", "serve"]
    help_text = subprocess.run([*base, "--help"], capture_output=True, text=True, env=env,
                               timeout=60, check=False).stdout
    cmd = [*base, "--host", "127.0.0.1", "--port", "0", "--quiet", *args.serve_arg]
    cafile = None
    if args.plain:
        cmd += ["--insecure"] if "--insecure" in help_text else []
    else:
        cafile, key = self_signed(tmp)
        cmd += ["--tls-cert", cafile, "--tls-key", key]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env=env)
    line = proc.stderr.readline() if proc.stderr else ""
    m = re.search(r"(https?)://127\.0\.0\.1:(\d+)", line)
    if not m:
        proc.kill()
        sys.exit(f"the server did not start: {line.strip()!r}")
    threading.Thread(target=lambda: proc.stderr.read(), daemon=True).start()  # keep it drained
    srv = Server(f"{m.group(1)}://127.0.0.1:{m.group(2)}", cafile, proc)
    threading.Thread(target=srv.watch, args=(int(args.max_server_gib * 2**20),),
                     daemon=True).start()
    return srv


# ---------------------------------------------------------------------------------------------
# A small HTTP/1.1 client on asyncio streams


class Client:
    def __init__(self, url: str, cafile: str | None) -> None:
        u = urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 443
        self.ctx: ssl.SSLContext | None = None
        if u.scheme == "https":
            self.ctx = ssl.create_default_context(cafile=cafile)
            if cafile is None:
                self.ctx.check_hostname = False
                self.ctx.verify_mode = ssl.CERT_NONE

    async def connect(self, timeout: float = 30.0):
        return await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, ssl=self.ctx), timeout)

    @staticmethod
    async def send(conn, method: str, path: str, body: bytes = b"",
                   timeout: float = 30.0) -> tuple[int, bytes, bool]:
        """(status, body, server closes) of one request on an open connection."""
        reader, writer = conn
        head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        writer.write(head.encode() + body)

        async def answer() -> tuple[int, bytes, bool]:
            raw = await reader.readuntil(b"\r\n\r\n")
            lines = raw.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            hdrs = {k.strip().lower(): v.strip()
                    for k, _, v in (x.partition(":") for x in lines[1:] if x)}
            data = await reader.readexactly(int(hdrs.get("content-length", "0")))
            return status, data, hdrs.get("connection", "").lower() == "close"

        return await asyncio.wait_for(answer(), timeout)

    async def once(self, method: str, path: str, body: bytes = b"",
                   timeout: float = 30.0) -> tuple[int, bytes]:
        conn = await self.connect(timeout)
        try:
            status, data, _ = await self.send(conn, method, path, body, timeout)
            return status, data
        finally:
            conn[1].close()


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


def ms(x: float) -> str:
    return f"{x * 1e3:.1f} ms"


def on_error_answer(data: bytes) -> bool:
    try:
        msg = json.loads(data)["response"]["status"]["message"]
    except (ValueError, KeyError, TypeError):
        return False
    return "could not evaluate" in msg


# ---------------------------------------------------------------------------------------------
# Phases


async def keep_alive(c: Client, n: int) -> None:
    conn = await c.connect()
    lat, bad = [], 0
    body = review(json.dumps(SPEC_8B), "ka")
    t_all = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        status, data, closes = await c.send(conn, "POST", "/validate", body)
        lat.append(time.perf_counter() - t0)
        bad += status != 200 or on_error_answer(data)
        if closes:
            conn[1].close()
            conn = await c.connect()
    total = time.perf_counter() - t_all
    conn[1].close()
    print(f"keep-alive: {n} reviews on one connection: {n / total:.0f} requests/s, "
          f"p50 {ms(pct(lat, 50))}, p99 {ms(pct(lat, 99))}, errors {bad}")


async def concurrent(c: Client, clients: int, per_client: int) -> None:
    lat: list[float] = []
    statuses: Counter[str] = Counter()
    go = asyncio.Event()

    async def one(i: int) -> None:
        await go.wait()
        try:
            conn = await c.connect()
        except (TimeoutError, OSError, ssl.SSLError) as exc:
            statuses[f"connect {type(exc).__name__}"] += per_client
            return
        try:
            for j in range(per_client):
                t0 = time.perf_counter()
                try:
                    status, data, closes = await c.send(conn, "POST", "/validate",
                                                        review(json.dumps(SPEC_8B), f"c{i}-{j}"))
                except (TimeoutError, OSError, asyncio.IncompleteReadError, ssl.SSLError, ValueError) as exc:
                    statuses[f"failed {type(exc).__name__}"] += per_client - j
                    return
                lat.append(time.perf_counter() - t0)
                statuses["on-error verdict" if status == 200 and on_error_answer(data)
                         else str(status)] += 1
                if closes and j + 1 < per_client:
                    conn[1].close()
                    conn = await c.connect()
        finally:
            conn[1].close()

    tasks = [asyncio.create_task(one(i)) for i in range(clients)]
    await asyncio.sleep(0.05)
    t0 = time.perf_counter()
    go.set()
    await asyncio.gather(*tasks)
    total = time.perf_counter() - t0
    n = clients * per_client
    errors = n - statuses["200"]
    print(f"concurrent: {clients} clients x {per_client} reviews: {statuses['200'] / total:.0f} "
          f"requests/s, p50 {ms(pct(lat, 50))}, p99 {ms(pct(lat, 99))}, errors {errors} of {n} "
          f"{dict(sorted(statuses.items()))}")


async def probe_health(c: Client, stop: asyncio.Event, every: float = 0.2) -> tuple[list[float], int]:
    lat, failed = [], 0
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            status, _ = await c.once("GET", "/healthz", timeout=10)
            failed += status != 200
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ssl.SSLError):
            failed += 1
        lat.append(time.perf_counter() - t0)
        try:
            await asyncio.wait_for(stop.wait(), every)
        except TimeoutError:
            pass
    return lat, failed


async def slowloris(c: Client, n: int, cap: float) -> None:
    head = b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    kinds = {"headers": (b"", head + b"Content-Length: 100\r\nX-Pad: " + b"a" * 1000),
             "body": (head + b"Content-Length: 1000\r\n\r\n", b"{" + b" " * 998 + b"}")}
    holds: dict[str, list[float]] = {k: [] for k in kinds}

    async def trickle(kind: str) -> None:
        first, rest = kinds[kind]
        t0 = time.monotonic()
        try:
            reader, writer = await c.connect(cap)
        except (TimeoutError, OSError, ssl.SSLError):
            holds[kind].append(0.0)
            return
        try:
            writer.write(first)
            for b in rest:
                if time.monotonic() - t0 > cap:
                    break
                writer.write(bytes([b]))
                await writer.drain()
                try:
                    got = await asyncio.wait_for(reader.read(1), 0.5)
                    if got == b"" or got:  # closed, or answered (408): either way cut off
                        break
                except TimeoutError:
                    pass
        except (OSError, ssl.SSLError):
            pass
        finally:
            holds[kind].append(min(cap, time.monotonic() - t0))
            writer.close()

    stop = asyncio.Event()
    health = asyncio.create_task(probe_health(c, stop))
    tasks = [asyncio.create_task(trickle(k)) for k in kinds for _ in range(n)]
    await asyncio.sleep(1.0)
    t0 = time.perf_counter()
    try:
        status, _ = await c.once("POST", "/validate", review(json.dumps(SPEC_8B), "beside"),
                                    timeout=cap)
        beside = f"{status} in {ms(time.perf_counter() - t0)}"
    except (TimeoutError, OSError, asyncio.IncompleteReadError, ssl.SSLError) as exc:
        beside = f"failed ({type(exc).__name__}) after {ms(time.perf_counter() - t0)}"
    await asyncio.gather(*tasks)
    stop.set()
    hl, hf = await health
    for kind, hs in holds.items():
        held = sum(h >= cap - 0.01 for h in hs)
        print(f"slowloris ({kind}, {n} connections, 1 byte / 0.5 s, cap {cap:g} s): "
              f"closed by the server after max {max(hs):.1f} s (median "
              f"{statistics.median(hs):.1f} s); still open at the cap: {held}")
    print(f"slowloris: beside them a review got {beside}; /healthz p50 {ms(pct(hl, 50))}, max "
          f"{ms(max(hl))}, failed {hf} of {len(hl)}")


async def held(c: Client, srv: Server, n: int, wait: float) -> None:
    socks = []
    for _ in range(n):
        try:
            socks.append(await asyncio.wait_for(
                asyncio.open_connection(c.host, c.port), 5))  # TCP only: no TLS, no request
        except (TimeoutError, OSError):
            break
    await asyncio.sleep(0.5)
    threads = srv.threads()
    ok, lat, errs = 0, [], Counter()
    for i in range(10):
        t0 = time.perf_counter()
        try:
            status, _ = await c.once("POST", "/validate", review(json.dumps(SPEC_8B), f"h{i}"),
                                     timeout=wait)
            ok += status == 200
            errs[str(status)] += status != 200
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ssl.SSLError) as exc:
            errs[type(exc).__name__] += 1
        lat.append(time.perf_counter() - t0)
    await asyncio.sleep(0.2)
    closed = sum(r.at_eof() for r, _ in socks)
    print(f"held: {len(socks)} idle connections opened, {closed} since closed by the server; "
          f"server threads {threads or '?'}, RSS {srv.rss_kib() / 2**20:.2f} GiB; reviews beside "
          f"them: {ok} of 10 answered 200, max {ms(max(lat))} {dict(+errs)}")
    for _, w in socks:
        w.close()
    await asyncio.sleep(0.5)


async def bomb(c: Client, srv: Server, wait: float) -> None:
    srv.reset_peak()
    text = alias_bomb()
    stop = asyncio.Event()
    health = asyncio.create_task(probe_health(c, stop, every=0.1))
    t0 = time.perf_counter()
    try:
        status, data = await c.once("POST", "/validate", review(text, "bomb"), timeout=wait)
        msg = json.loads(data)["response"]["status"]["message"] if status == 200 else data[:100]
        what = f"{status} {str(msg)[:110]!r}"
    except (TimeoutError, OSError, asyncio.IncompleteReadError, ssl.SSLError) as exc:
        what = f"no answer ({type(exc).__name__})"
    took = time.perf_counter() - t0
    stop.set()
    hl, hf = await health
    await asyncio.sleep(0.2)
    print(f"alias bomb ({len(text.encode())} bytes of YAML): answered in {took:.2f} s: {what}")
    print(f"alias bomb: /healthz beside it max {ms(max(hl))}, failed {hf} of {len(hl)}; server "
          f"peak RSS {srv.peak_rss_kib / 2**20:.2f} GiB (all its processes)"
          + ("; KILLED for memory" if srv.killed_for_memory else ""))


async def big_bodies(c: Client, clients: int, seconds: float, size: int) -> None:
    """``clients`` connections each sending reviews of ``size`` bytes for ``seconds``, while
    /healthz is timed every 50 ms: whether parsing large bodies holds the event loop."""
    # the spec, and labels of many small keys up to the size: costly to parse, as real
    # objects are (a body of blanks parses in no time)
    base = json.loads(review(json.dumps(SPEC_8B), "UID-XXXXXXXXXXXX"))
    n = max(0, size - 4000) // 16  # '"k00000001":"v",' is 16 bytes
    base["request"]["object"]["metadata"]["labels"] = {f"k{i:08d}": "v" for i in range(n)}
    template = json.dumps(base, separators=(",", ":")).encode()  # made once: the client's
    # own CPU time must not be what is measured

    def body(uid: str) -> bytes:
        return template.replace(b"UID-XXXXXXXXXXXX", uid.encode())

    stop = asyncio.Event()
    health = asyncio.create_task(probe_health(c, stop, every=0.05))
    done: Counter[str] = Counter()

    async def one(i: int) -> None:
        conn = await c.connect()
        try:
            j = 0
            while not stop.is_set():
                status, _, closes = await c.send(conn, "POST", "/validate", body(f"b{i}-{j}"))
                done[str(status)] += 1
                j += 1
                if closes:
                    conn[1].close()
                    conn = await c.connect()
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ssl.SSLError) as exc:
            done[f"failed {type(exc).__name__}"] += 1
        finally:
            conn[1].close()

    tasks = [asyncio.create_task(one(i)) for i in range(clients)]
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(*tasks)
    hl, hf = await health
    print(f"big bodies: {clients} clients sending {size / 2**20:.2f} MiB reviews for "
          f"{seconds:.0f} s: {dict(sorted(done.items()))}; /healthz beside them p50 "
          f"{ms(pct(hl, 50))}, p99 {ms(pct(hl, 99))}, max {ms(max(hl))}, failed {hf} of {len(hl)}")


async def tls_floods(c: Client, srv: Server, n: int, rounds: int) -> None:
    """``rounds`` floods of ``n`` connections that complete the TLS handshake and send
    nothing, each closed after a second and measured 6 s later: the server process's RSS (its evaluation processes apart) after each flood and after the
    last is closed (memory must come back, not ratchet up)."""
    before = proc_status(srv.pid, "VmRSS")
    seen = []
    for _ in range(rounds):
        async def one() -> Any:
            try:
                return await c.connect(timeout=10)
            except (TimeoutError, OSError, ssl.SSLError):
                return None
        conns = [x for x in await asyncio.gather(*(one() for _ in range(n))) if x]
        await asyncio.sleep(1.0)
        peak = proc_status(srv.pid, "VmRSS")
        for _, w in conns:
            w.close()
        await asyncio.sleep(6.0)  # past the server's next malloc_trim (TRIM_EVERY_S)
        seen.append((len(conns), peak, proc_status(srv.pid, "VmRSS")))
    print(f"tls floods: server RSS before {before / 1024:.0f} MiB; "
          + "; ".join(f"{k} connected: {a / 1024:.0f} MiB held, {b / 1024:.0f} MiB after closing"
                      for k, a, b in seen))


PHASES = ("keep-alive", "concurrent", "slowloris", "held", "bomb", "big-bodies", "tls-floods")


async def run(args: argparse.Namespace, srv: Server) -> None:
    c = Client(srv.url, srv.cafile)
    print(f"server {srv.url} ({'plain HTTP' if srv.url.startswith('http:') else 'TLS'})"
          f"{'; ' + ' '.join(args.serve_arg) if args.serve_arg else ''}")
    phases = args.phases.split(",")
    if "keep-alive" in phases:
        await keep_alive(c, 50 if args.quick else 300)
    if "concurrent" in phases:
        await concurrent(c, args.clients, args.per_client)
    if "slowloris" in phases:
        await slowloris(c, 10 if args.quick else 50, 8.0 if args.quick else 15.0)
    if "held" in phases:
        await held(c, srv, 200 if args.quick else args.held, 10.0)
    if "bomb" in phases:
        await bomb(c, srv, 20.0 if args.quick else 60.0)
    if "tls-floods" in phases:
        await tls_floods(c, srv, 300 if args.quick else 1000, 3 if args.quick else 5)
    if "big-bodies" in phases:
        await big_bodies(c, 8, 5.0 if args.quick else 15.0, (1 << 20) - 4096)
    if srv.pid is not None:
        print(f"server CPU seconds by process: "
              f"{', '.join(f'{v:.1f}' for v in cpu_seconds(srv.pid))}; "
              f"RSS now {srv.rss_kib() / 2**20:.2f} GiB")


def cpu_seconds(pid: int) -> list[float]:
    """User + system CPU seconds of pid and each of its descendants."""
    out = []
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out.append((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
        except (OSError, IndexError, ValueError):
            pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--per-client", type=int, default=5)
    ap.add_argument("--held", type=int, default=1000)
    ap.add_argument("--plain", action="store_true", help="plain HTTP (serve --insecure)")
    ap.add_argument("--quick", action="store_true", help="smaller phases (about 30 s)")
    ap.add_argument("--phases", default=",".join(PHASES),
                    help=f"comma-separated, of {','.join(PHASES)}")
    ap.add_argument("--pythonpath", help="a folder with another copy of planner/ to serve")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="an extra `fitcheck serve` argument (repeat)")
    ap.add_argument("--connect", help="an already running server's URL instead")
    ap.add_argument("--cafile", help="with --connect: its CA certificate")
    ap.add_argument("--pid", type=int, help="with --connect: its process id, for its memory")
    ap.add_argument("--max-server-gib", type=float, default=6.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fitcheck-load-") as tmp:
        srv = start_server(args, Path(tmp))
        try:
            asyncio.run(run(args, srv))
        finally:
            srv._stop.set()
            if srv.proc is not None:
                srv.proc.terminate()
                try:
                    srv.proc.wait(10)
                except subprocess.TimeoutExpired:
                    srv.proc.kill()


if __name__ == "__main__":
    main()
