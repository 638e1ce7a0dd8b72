"""`fitcheck serve` under load on 127.0.0.1: many clients at once, slow clients, held
connections (benchmarks/webhook_load.py measures the same at full size)."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time
from collections import Counter

import pytest
from test_webhook import (
    SPEC_8B,
    client_context,
    make_tls_files,
    pytorchjob,
    review,
    server,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory) -> dict[str, str]:
    return make_tls_files(tmp_path_factory)


async def send(reader, writer, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                 f"\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    length = next(int(h.split(":")[1]) for h in head if h.lower().startswith("content-length"))
    return int(head[0].split()[1]), await reader.readexactly(length)


async def once(port: int, ctx: ssl.SSLContext | None, method: str, path: str,
               body: bytes = b"", timeout: float = 10.0) -> tuple[int, bytes]:
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
        try:
            return await send(reader, writer, method, path, body)
        finally:
            writer.close()


def test_200_concurrent_reviews_are_all_answered(tls_files):
    """200 clients connect, then send their reviews at the same moment: every one gets its
    verdict, none a 503 or an on-error answer (before: 119 plain / 162 TLS of 200 got 503)."""
    ctx = client_context(tls_files)
    body = review(pytorchjob(SPEC_8B))

    async def main(port: int) -> Counter:
        conns = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", port, ssl=ctx)
                                       for _ in range(200)))
        go = asyncio.Event()

        async def one(reader, writer) -> str:
            await go.wait()
            try:
                async with asyncio.timeout(15):
                    status, data = await send(reader, writer, "POST", "/validate", body)
            except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
                return type(exc).__name__
            finally:
                writer.close()
            r = json.loads(data)["response"] if status == 200 else {}
            return "ok" if r.get("allowed") is True else f"{status} {r.get('status')}"

        tasks = [asyncio.create_task(one(r, w)) for r, w in conns]
        await asyncio.sleep(0.1)
        go.set()
        return Counter(await asyncio.gather(*tasks))

    with server(tls=tls_files, workers=2, timeout_s=5.0) as port:
        t0 = time.monotonic()
        outcomes = asyncio.run(main(port))
        took = time.monotonic() - t0
    assert outcomes == Counter({"ok": 200}), outcomes
    assert took < 15, took


def test_slow_clients_are_cut_off_at_the_deadline_while_healthz_answers(tls_files):
    """Clients that trickle a request (one byte per 0.2 s, in the head or the body) or send
    nothing at all are closed at the 1 s deadline; /healthz answers meanwhile. Before, such
    a connection stayed open as long as the client kept sending."""
    ctx = client_context(tls_files)
    deadline = 1.0

    async def trickle(port: int, first: bytes, rest: bytes) -> float:
        t0 = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
        try:
            writer.write(first)
            for b in rest:
                writer.write(bytes([b]))
                await writer.drain()
                try:
                    async with asyncio.timeout(0.2):
                        if await reader.read(1) or reader.at_eof():
                            break  # answered (408) or closed: cut off either way
                except TimeoutError:
                    pass
                if time.monotonic() - t0 > 10:
                    break
        except (OSError, ssl.SSLError):
            pass
        finally:
            writer.close()
        return time.monotonic() - t0

    async def silent(port: int) -> float:  # TCP only: not even a TLS handshake
        t0 = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            async with asyncio.timeout(10):
                await reader.read(1)
        finally:
            writer.close()
        return time.monotonic() - t0

    async def main(port: int) -> tuple[list[float], list[float]]:
        head = b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        slow = [trickle(port, b"", head + b"Content-Length: 2\r\nX-Pad: " + b"a" * 200)
                for _ in range(10)]
        slow += [trickle(port, head + b"Content-Length: 200\r\n\r\n", b"{" + b" " * 198 + b"}")
                 for _ in range(10)]
        slow += [silent(port) for _ in range(5)]
        tasks = [asyncio.create_task(c) for c in slow]
        health = []
        while not all(t.done() for t in tasks):
            t0 = time.monotonic()
            status, _ = await once(port, ctx, "GET", "/healthz", timeout=5)
            assert status == 200
            health.append(time.monotonic() - t0)
            await asyncio.sleep(0.1)
        return [t.result() for t in tasks], health

    with server(tls=tls_files, timeout_s=deadline) as port:
        held, health = asyncio.run(main(port))
    assert max(held) < deadline + 1.5, held
    assert len(health) >= 3 and max(health) < 0.5, health


def test_connection_cap_makes_room_and_threads_stay_bounded(tls_files):
    """Past max_connections the oldest connection that has not sent a request is closed, so
    a real request still gets through; connections cost no threads (before: one each)."""
    ctx = client_context(tls_files)

    async def main(port: int) -> tuple[int, int, int]:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(40)]
        await asyncio.sleep(0.2)
        threads = threading.active_count()
        status, _ = await once(port, ctx, "POST", "/validate", review(pytorchjob(SPEC_8B)))
        await asyncio.sleep(0.2)
        closed = sum(r.at_eof() for r, _ in held)
        for _, w in held:
            w.close()
        return status, closed, threads

    before = threading.active_count()
    with server(tls=tls_files, max_connections=16, timeout_s=5.0) as port:
        status, closed, threads = asyncio.run(main(port))
    assert status == 200
    assert closed >= 40 - 16 + 1, closed  # all but the newest 15 made way
    assert threads - before <= 4, (before, threads)  # the server's loop and I/O threads only
