"""`fitcheck serve`'s evaluation processes die with the server, even mid-evaluation."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.integration

SPIN = "tests.test_webhook_orphans:spin"


def spin(uid, req, cfg):  # an evaluator that never returns (the evaluation process runs it)
    while True:
        pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_server_leaves_no_evaluation_process_behind():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    server = textwrap.dedent(f"""
        import sys, threading
        sys.path.insert(0, {root!r})
        from planner.webhook import WebhookConfig, _Worker
        w = _Worker(WebhookConfig(workers=1, evaluator={SPIN!r}))
        w.wait_ready()
        print(w.proc.pid, flush=True)
        from planner.webhook import API_VERSION
        import json
        review = json.dumps({{"kind": "AdmissionReview", "apiVersion": API_VERSION,
                             "request": {{"uid": "u1"}}}}).encode()
        threading.Thread(target=w.call, args=(review,), daemon=True).start()
        threading.Event().wait()  # evaluating forever, until this process is killed
    """)
    parent = subprocess.Popen([sys.executable, "-c", server], stdout=subprocess.PIPE,
                              text=True, cwd=root)
    try:
        worker = int(parent.stdout.readline())
        time.sleep(1.0)  # the worker is now inside spin()
        assert _alive(worker)
    finally:
        parent.kill()  # SIGKILL: no cleanup runs in the server
        parent.wait()
    deadline = time.monotonic() + 5
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = _alive(worker)
    if alive:
        os.kill(worker, 9)
    assert not alive, "the evaluation process outlived its server"
