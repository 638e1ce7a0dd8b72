"""The check inside slurmctld (planner/slurm.py, integrations/slurm/job_submit.lua): Slurm's
job_desc field formats, the request and answer lines, directives that name files, and the
spec fitcheck-sbatch writes into the script. In this process, but for the `integration`
tests: the sweep over every job config of tests/data/jobs (seconds), and those that start
`--fitcheck-serve` and `--fitcheck-controller` (tests/test_slurm_live.py runs all of it inside
a real slurmctld)."""

from __future__ import annotations

import builtins
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import planner.slurm as fs
from planner.errors import EXIT_BAD_DATA, EXIT_FITS, EXIT_NO_VERDICT, EXIT_NOTHING_FITS

ROOT = Path(__file__).resolve().parent.parent
SHIM = ROOT / "integrations" / "slurm" / "fitcheck-sbatch"
JOBS = Path(__file__).parent / "data" / "jobs"


# ---------------------------------------------------------------------------------------------
# job_desc's GPU fields, in each Slurm version's format


@pytest.mark.parametrize("text, gpus", [
    # Slurm 22.05.8 (Debian 12), read from a live slurmctld's job_desc:
    ("gres:gpu:8", 8),                    # --gres=gpu:8, --gpus-per-node=8 (tres_per_node)
    ("gres:gpu:h100:4", 4),               # --gpus-per-node=h100:4
    ("gres:gpu:1,gres:gpu:2", 3),         # --gres=gpu:1,gpu:2
    ("gres:gpu", 1),                      # --gres=gpu
    # Slurm 23.11 to 25.11 (src/common/proc_args.c xfmt_tres: "%s%s:%s" with prefix
    # "gres/gpu", since commit 53ec8d6697 "it should be TRESType/TRESName"):
    ("gres/gpu:8", 8),                    # --gpus=8 (tres_per_job), --gpus-per-node=8
    ("gres/gpu:h100:8", 8),               # --gpus=h100:8
    ("gres/gpu:a100:4,gres/gpu:h100:4", 8),
    # Slurm 24.05 on, tres_per_task (slurm_option_update_tres_per_task: "%s=%d"); the example
    # is slurm_opt.c's own comment: "cpu=10,gres/gpu:gtx=1,license/iop1=1"
    ("gres/gpu=2", 2),
    ("cpu=10,gres/gpu:gtx=1,license/iop1=1", 1),
    ("cpu=4", None),
    ("gres/shard:2", None),
    ("gres:mps:100", None),
    ("", None),
    # as users type --gres
    ("gpu:8(S:0-1)", 8),
    ("gpu:h100", 1),
])
def test_gres_gpus_reads_every_slurm_format(text, gpus):
    assert fs.gres_gpus(text) == gpus


@pytest.mark.parametrize("text", ["gpu:a:b:8", "gres/gpu=x", "gres/gpu:h100:many", "gpu:a:b=2"])
def test_gres_gpus_refuses_what_is_no_count(text):
    with pytest.raises(fs.SlurmSpecError, match=r"job_desc.tres_per_node: expected gpu\[:type\]"):
        fs.gres_gpus(text, "job_desc.tres_per_node")


def hw(**fields: str) -> dict:
    return fs.hardware_from_options(fs.ControllerJob(**fields).options())[0]


NO_VAL, NO_VAL16 = "4294967294", "65534"  # slurm.h, as the plugin prints them


@pytest.mark.parametrize("fields, expected", [
    # sbatch --gres=gpu:8 on Slurm 22.05: min_nodes NO_VAL, the GPUs in tres_per_node
    ({"min_nodes": NO_VAL, "tres_per_node": "gres:gpu:8", "ntasks_per_node": NO_VAL16},
     {"n": 8, "gpus_per_node": 8}),
    # --gpus=8 (tres_per_job), 22.05 and 23.11+
    ({"min_nodes": NO_VAL, "tres_per_job": "gres:gpu:8"}, {"n": 8, "gpus_per_node": 8}),
    ({"tres_per_job": "gres/gpu:8"}, {"n": 8, "gpus_per_node": 8}),
    # -N 2 --gpus=16; -N 2 --gres=gpu:8
    ({"min_nodes": "2", "tres_per_job": "gres/gpu:16"}, {"n": 16, "gpus_per_node": 8}),
    ({"min_nodes": "2", "tres_per_node": "gres/gpu:h100:8"}, {"n": 16, "gpus_per_node": 8}),
    # -n 4 --gpus-per-task=2: 22.05's "gres:gpu:2", 24.05's "gres/gpu=2" beside "cpu=1"
    ({"num_tasks": "4", "tres_per_task": "gres:gpu:2"}, {"n": 8, "gpus_per_node": 8}),
    ({"num_tasks": "4", "tres_per_task": "cpu=1,gres/gpu=2"}, {"n": 8, "gpus_per_node": 8}),
    # --ntasks-per-node=4 --gpus-per-task=2 over 2 nodes
    ({"min_nodes": "2", "ntasks_per_node": "4", "tres_per_task": "gres/gpu:2"},
     {"n": 16, "gpus_per_node": 8}),
    # --sockets-per-node=2 --gpus-per-socket=4 (tres_per_socket)
    ({"sockets_per_node": "2", "tres_per_socket": "gres:gpu:4"}, {"n": 8, "gpus_per_node": 8}),
    # Lua 5.3+ prints a float count as "2.0"
    ({"min_nodes": "2.0", "tres_per_node": "gres/gpu:8"}, {"n": 16, "gpus_per_node": 8}),
    # no GPU request at all
    ({"min_nodes": NO_VAL, "num_tasks": NO_VAL, "ntasks_per_node": NO_VAL16}, {}),
])
def test_controller_allocation_from_job_desc(fields, expected):
    assert hw(**fields) == expected


def test_controller_allocation_bad_count_names_the_field():
    with pytest.raises(fs.SlurmSpecError, match=r"job_desc.min_nodes: expected a count, "
                       r"got 'two'"):
        hw(min_nodes="two")


# ---------------------------------------------------------------------------------------------
# The answer


def job(directives: str, **fields: str) -> fs.ControllerJob:
    return fs.ControllerJob(directives=directives, user_name="alice", name="train.sh", **fields)


# 8B, full_shard, no offload: 16 B/param = 128 GiB of states, 16 GiB a GPU on 8 (fits), all
# of it on 1 (over the H100's 80 GiB: rejected)
FITS = "#FITCHECK model=llama3-8b gpu=h100-80 strategy=full_shard offload=none\n"
DDP_70B = ("#FITCHECK model=llama3-70b gpu=h100-80 seq=8192 micro_batch=1\n"
           "#FITCHECK strategy=ddp checkpointing=none\n")


def test_controller_admits_and_rejects_from_the_job_alone():
    a = fs.controller_answer(job(FITS, tres_per_node="gres:gpu:8"))
    assert a.code == EXIT_FITS
    assert a.message.startswith("admitted: pinned full_shard fits on 8 x h100-80: needs ")
    # 70B in DDP: 16 B/param of weights, grads and Adam states alone = 1040 GiB per GPU
    a = fs.controller_answer(job(DDP_70B, tres_per_job="gres/gpu:8"))
    assert a.code == EXIT_NOTHING_FITS
    assert a.message.startswith("rejected: pinned ddp does not fit on 8 x h100-80: needs ")
    # the GPU count of either field: --gres=gpu:1 makes the same 8B job a reject
    a = fs.controller_answer(job(FITS, tres_per_node="gres:gpu:1"))
    assert a.code == EXIT_NOTHING_FITS and "on 1 x h100-80" in a.message


@pytest.mark.parametrize("directives, message", [
    ("#FITCHECK model=llama3-8b gpu=h100-80 seq=long\n",
     "bad job spec: training.seq: must be a positive integer, got 'long'"),
    ("#FITCHECK model=llama3-8b gpu=h100-80 colour=blue\n",
     "bad job spec: #FITCHECK: unknown key 'colour'"),
    ("#FITCHECK model=nope gpu=h100-80\n", "bad job spec: model.preset: unknown model 'nope'"),
    ("#FITCHECK model=llama3-8b\n", "bad job spec: hardware.gpu: required"),
    ("#FITCHECK spec-inline='{\"model\": [1}'\n",
     "bad job spec: #FITCHECK spec-inline: invalid JSON"),
    ("#FITCHECK spec-inline='model: {preset: llama3-8b}' spec-inline='{}'\n",
     "bad job spec: #FITCHECK: spec-inline= given twice"),
    ("#FITCHECK 'unclosed\n", "bad job spec: line 1: #FITCHECK: No closing quotation"),
    # a NUL byte in YAML: PyYAML refuses it as its reader is built (it used to escape the
    # wrapper as a traceback, and job_submit.lua admitted the job)
    ("#FITCHECK spec-inline='model: {preset: llama3-8b}\x00'\n",
     "bad job spec: #FITCHECK spec-inline: invalid YAML: unacceptable character #x0000"),
])
def test_controller_bad_spec_names_the_field(directives, message):
    a = fs.controller_answer(job(directives, tres_per_job="gres/gpu:8"))
    assert (a.code, a.message[:len(message)]) == (EXIT_BAD_DATA, message), a.message


def test_controller_no_gpus_says_which_options_count():
    a = fs.controller_answer(job(FITS, min_nodes=NO_VAL))
    assert a.code == EXIT_BAD_DATA
    assert a.message == ("bad job spec: hardware.n: the job requests no GPUs (--gres=gpu:N, "
                         "--gpus=N, --gpus-per-node=N) and the spec gives no n")


def test_controller_without_directives_is_not_checked():
    for text in ("", "#FITCHECKED by hand\n", "echo '#FITCHECK is a comment here'\n"):
        assert fs.controller_answer(job(text)) == fs.Answer(EXIT_FITS,
                                                             "not checked: no #FITCHECK lines")


PATHS = [
    ("spec={}", "#FITCHECK spec='{}': names a file"),
    ("job={}", "#FITCHECK job='{}': names a file"),
    ("job={} format=torchtitan", "#FITCHECK job='{}': names a file"),
    ("format=torchtitan model=llama3-8b", "#FITCHECK format='torchtitan': goes with job=PATH"),
    ("model.config={} gpu=h100-80", "model.config='{}': a file"),
    ("model=llama3-8b gpu={}", "hardware.gpu='{}': a profile file"),
    ("model=llama3-8b gpu=h100-80 calibration={}", "calibration='{}': a file"),
]


@pytest.mark.parametrize("directive, message", PATHS)
def test_controller_refuses_paths_without_touching_them(tmp_path, monkeypatch, directive,
                                                        message):
    """slurmctld would open the file with its own privileges: a path is refused with the same
    message whether or not it exists, and no file is opened or looked at."""
    secret = tmp_path / "slurmdbd.toml"
    secret.write_text('StoragePass = "SECRET-123"\n')
    fs.controller_answer(job(FITS, tres_per_job="gres/gpu:8"))  # imports and profiles loaded

    def touched(*args, **kwargs):
        raise AssertionError(f"the check looked at the file system: {args!r}")

    for name in ("open",):
        monkeypatch.setattr(builtins, name, touched)
    for name in ("stat", "lstat", "access", "listdir", "scandir"):
        monkeypatch.setattr(os, name, touched)
    for name in ("exists", "isfile", "isdir", "lexists", "getsize"):
        monkeypatch.setattr(os.path, name, touched)
    answers = [fs.controller_answer(job(f"#FITCHECK {directive.format(p)}\n",
                                        tres_per_job="gres/gpu:8"))
               for p in (str(secret), str(tmp_path / "missing.toml"))]
    monkeypatch.undo()
    for p, a in zip((secret, tmp_path / "missing.toml"), answers):
        assert a.code == EXIT_BAD_DATA
        assert a.message.startswith("bad job spec: " + message.format(p)), a.message
        assert "slurmctld does not read" in a.message and "SECRET" not in a.message
    # the only difference between the two answers is the path the user wrote
    assert answers[0].message.replace(str(secret), "P") == answers[1].message.replace(
        str(tmp_path / "missing.toml"), "P")


def test_answer_is_one_line():
    assert fs.Answer(3, "rejected:\n two\tlines ").line() == "FITCHECK 3 rejected: two lines\n"


# ---------------------------------------------------------------------------------------------
# The request


def request(directives: str, **fields: str) -> bytes:
    body = directives.encode()
    head = [fs.PROTOCOL, *(f"{k}={v}" for k, v in fields.items()),
            f"directives_bytes={len(body)}"]
    return ("\n".join(head) + "\n\n").encode() + body


def test_request_round_trip():
    r = fs.parse_request(io.BytesIO(request(FITS, user_name="alice", name="t.sh",
                                            min_nodes=NO_VAL, tres_per_node="gres:gpu:8",
                                            submit_uid="1001", future_field="x")))
    assert r == fs.ControllerJob(directives=FITS, user_name="alice", name="t.sh",
                                 min_nodes=NO_VAL, tres_per_node="gres:gpu:8")


@pytest.mark.parametrize("raw, why", [
    (b"GET / HTTP/1.1\r\n\r\n", "not a 'fitcheck-slurm 1' request"),
    (b"fitcheck-slurm 1\nuser_name=a", "request header cut short"),
    (b"fitcheck-slurm 1\n" + b"a=b\n" * 40, "request header over 32 lines"),
    (b"fitcheck-slurm 1\ndirectives_bytes=99999999\n\n", "directives_bytes: expected 0 to"),
    (b"fitcheck-slurm 1\ndirectives_bytes=10\n\n#FIT", "directives cut short: 4 of 10 bytes"),
])
def test_bad_request_is_no_verdict_never_a_rejection(raw, why):
    a = fs._answer(lambda: fs.controller_answer(fs.parse_request(io.BytesIO(raw))), 5.0)
    assert a.code == EXIT_NO_VERDICT
    assert a.message.startswith(f"no verdict: bad request from job_submit.lua: {why}")


def test_internal_error_and_timeout_are_no_verdict():
    def boom():
        raise KeyError("x")

    a = fs._answer(boom, 5.0)
    assert (a.code, a.message) == (EXIT_NO_VERDICT, "no verdict: internal error: KeyError: 'x'")
    t = time.monotonic()
    a = fs._answer(lambda: time.sleep(5), 0.2)
    assert time.monotonic() - t < 2
    assert (a.code, a.message) == (EXIT_NO_VERDICT,
                                   "no verdict: the check timed out after 0.2 s")


# ---------------------------------------------------------------------------------------------
# What fitcheck-sbatch writes into the script is the job the wrapper checked


def test_rewrite_script_keeps_the_header_and_the_commands():
    text = "#!/bin/bash\n#SBATCH -N 2\n  #FITCHECK model=x\n#FITCHECKED\nsrun a\n#FITCHECK n=1"
    out = fs.rewrite_script(text, "#FITCHECK spec-inline='{}'")
    assert out == ("#!/bin/bash\n#SBATCH -N 2\n#FITCHECK spec-inline='{}'\n"
                   "  #FITCHECK-INLINED model=x\n#FITCHECKED\nsrun a\n#FITCHECK-INLINED n=1")
    assert fs.read_header(out) == (["-N", "2"], ["spec-inline={}"])
    # no directive lines (--fitcheck-set): after the #! line
    assert fs.rewrite_script("#!/bin/sh", "#FITCHECK x=1") == "#!/bin/sh\n#FITCHECK x=1\n"
    assert fs.rewrite_script("srun a\n", "#FITCHECK x=1") == "#FITCHECK x=1\nsrun a\n"


def test_model_config_is_written_in_as_its_mapping(tmp_path):
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
           "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = fs.user_spec(["model.config=.", "gpu=h100-80"], str(tmp_path))
    portable, notes = fs.portable_spec(spec)
    assert portable == {"model": {"config": cfg}, "hardware": {"gpu": "h100-80"}} and not notes
    line = fs.inline_directive(portable)
    a = fs.controller_answer(job(line + "\n", tres_per_job="gres/gpu:8"))
    assert a.code == EXIT_FITS, a.message


def test_gpu_profile_files_cannot_be_written_in(tmp_path):
    spec = fs.user_spec(["model=llama3-8b", "gpu=my.toml"], str(tmp_path))
    _, notes = fs.portable_spec(spec)
    assert notes == [(f"hardware.gpu={str(tmp_path / 'my.toml')!r} is a profile file, which "
                      "the check in slurmctld does not read: it will refuse the job; use a "
                      "profile id (fitcheck --list-gpus)")]


def _job_configs() -> list[Path]:
    return sorted(p for p in JOBS.iterdir() if p.is_file() and p.suffix in (".toml", ".json",
                                                                             ".yaml", ".yml"))


@pytest.mark.integration  # no process, but ~120 gates: seconds, too long for the unit tier
def test_inline_spec_gets_the_wrappers_verdict_for_every_job_config(tmp_path):
    """For each job config of tests/data/jobs (with llama3-8b where it names no preset), the
    check in slurmctld, given only the script fitcheck-sbatch submits, says what the gate said
    of the file: the same verdict and the same reason, word for word."""
    from planner.gate import gate_path

    compared = 0
    for path in _job_configs():
        spec = {"job": {"path": str(path)}, "model": {"preset": "llama3-8b"},
                "hardware": {"gpu": "h100-80"}}
        spec_file = tmp_path / f"{path.stem}.json"
        # what the wrapper gates for #SBATCH --gres=gpu:8 (with_allocation)
        spec_file.write_text(json.dumps({**spec, "hardware": {"gpu": "h100-80", "n": 8,
                                                              "gpus_per_node": 8}}))
        try:
            user = gate_path(str(spec_file))
        except Exception:  # noqa: BLE001 - the wrapper stops there: nothing is submitted
            continue
        allocation = {"n": 8, "gpus_per_node": 8}
        if user.get("unmodelled"):
            with pytest.raises(fs.SlurmSpecError, match="does not model"):
                fs.portable_spec(spec, allocation)
            continue
        script = fs.rewrite_script("#!/bin/bash\n#FITCHECK job=x\nsrun true\n",
                                   fs.inline_directive(fs.portable_spec(spec, allocation)[0]))
        ctld = fs.controller_answer(job(script, tres_per_node="gres/gpu:8"))
        word = "admitted" if user["verdict"] == "admit" else "rejected"
        # word for word; a job config's own GPU count, where the allocation differs, is noted
        assert ctld.message.startswith(f"{word}: {user['reason']}"), path.name
        assert re.fullmatch(r"( \(note: hardware\.(n|gpus_per_node)=\d+ in the spec; the "
                            r"allocation asks for 8: checking 8\))*",
                            ctld.message[len(word) + 2 + len(user["reason"]):]), path.name
        compared += 1
    assert compared >= 40  # 51 of the 58 files at the time of writing


# ---------------------------------------------------------------------------------------------
# The processes job_submit.lua talks to


def _answer_over(sock_path: str, raw: bytes, timeout: float = 10) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        c.settimeout(timeout)
        c.connect(sock_path)
        c.sendall(raw)
        return c.makefile("rb").readline().decode()


def _serve(sock: Path, *args: str, code: str | None = None) -> subprocess.Popen:
    cmd = ([sys.executable, "-c", code, str(sock)] if code else
           [sys.executable, "-m", "planner.slurm", "--fitcheck-serve", str(sock), *args])
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        if "serving the slurmctld check" in line or p.poll() is not None:
            break
    assert p.poll() is None, p.stderr.read()
    return p


@pytest.mark.integration
def test_serve_answers_forks_and_cleans_up(tmp_path):
    sock = tmp_path / "fc.sock"
    p = _serve(sock)
    try:
        assert oct(sock.stat().st_mode & 0o777) == "0o600"
        line = _answer_over(str(sock), request(FITS, tres_per_node="gres:gpu:8"))
        assert line.startswith("FITCHECK 0 admitted: pinned full_shard fits on 8 x h100-80")
        line = _answer_over(str(sock), request(DDP_70B, tres_per_job="gres/gpu:8"))
        assert line.startswith("FITCHECK 3 rejected: pinned ddp does not fit on 8 x h100-80")
        line = _answer_over(str(sock), b"nonsense\n")
        assert line.startswith("FITCHECK 6 no verdict: bad request from job_submit.lua")
        # a second server on the same socket is refused (exit 2), the first keeps serving
        q = subprocess.run([sys.executable, "-m", "planner.slurm", "--fitcheck-serve", str(sock)],
                           capture_output=True, text=True, timeout=60)
        assert q.returncode == 2 and "a server already answers on" in q.stderr
        assert _answer_over(str(sock), request(FITS, tres_per_node="gres:gpu:8")).startswith(
            "FITCHECK 0 ")
    finally:
        p.terminate()
        assert p.wait(timeout=10) == 0
    assert not sock.exists()


@pytest.mark.integration
def test_serve_cuts_a_hung_check_and_keeps_serving(tmp_path):
    sock = tmp_path / "fc.sock"
    sock.touch()  # not a socket: refused, not removed
    q = subprocess.run([sys.executable, "-m", "planner.slurm", "--fitcheck-serve", str(sock)],
                       capture_output=True, text=True, timeout=60)
    assert q.returncode == 2 and "exists and is not a socket" in q.stderr
    sock.unlink()
    hang = ("import sys, time, planner.slurm as s\n"
            "def evaluate(job):\n"
            "    if 'hang' in job.directives: time.sleep(30)\n"
            "    return s.controller_answer(job)\n"
            "s.serve(sys.argv[1], 0.5, evaluate=evaluate)\n")
    p = _serve(sock, code=hang)
    try:
        t = time.monotonic()
        line = _answer_over(str(sock), request("#FITCHECK hang=1\n"))
        assert time.monotonic() - t < 5
        assert line == "FITCHECK 6 no verdict: the check timed out after 0.5 s\n"
        assert _answer_over(str(sock), request(FITS, tres_per_job="gres/gpu:8")).startswith(
            "FITCHECK 0 ")
    finally:
        p.kill()
        p.wait(timeout=10)
    # killed: the socket file stays, and the next server takes it over
    assert sock.exists()
    p = _serve(sock)
    p.terminate()
    p.wait(timeout=10)


@pytest.mark.integration
def test_controller_command_reads_stdin_answers_one_line():
    p = subprocess.run([sys.executable, "-m", "planner.slurm", "--fitcheck-controller"],
                       input=request(DDP_70B, tres_per_job="gres:gpu:8"), capture_output=True,
                       timeout=60)
    assert p.returncode == EXIT_NOTHING_FITS
    assert p.stdout.decode().startswith("FITCHECK 3 rejected: pinned ddp does not fit")
    assert p.stdout.count(b"\n") == 1 and not p.stderr


@pytest.mark.integration
def test_shim_without_fitcheck_is_no_verdict(tmp_path):
    """The checkout shim run by a Python that cannot import fitcheck: exit 6 and the answer
    line job_submit.lua reads, not a traceback (and never exit 3, a rejection)."""
    shim = tmp_path / "fitcheck-sbatch"
    shutil.copy(SHIM, shim)
    p = subprocess.run([sys.executable, "-I", "-S", str(shim), "--fitcheck-controller"],
                       input=b"", capture_output=True, timeout=60, cwd=tmp_path)
    assert p.returncode == EXIT_NO_VERDICT
    assert p.stdout.decode().startswith("FITCHECK 6 no verdict: cannot import fitcheck with ")
    assert "No module named 'planner'" in p.stdout.decode()
    assert b"Traceback" not in p.stderr
