"""Crashes that were exit 1 (issue 22, items 9 and 11): each is now one line naming the file
or the flag, with its documented exit code, and nothing half-written."""

from __future__ import annotations

import json
import os

import pytest

from conftest import one_line_error, run

ACCELERATE_FSDP = "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_processes: {n}\n"


@pytest.mark.parametrize("text", [
    "[training]\nseq = " + "9" * 4400 + "\n",
    "[job]\nname = \"x\"\n[training]\nlocal_batch_size = " + "9" * 4301 + "\n"])
def test_a_toml_integer_past_4300_digits_is_bad_data(tmp_path, text):
    path = tmp_path / "job.toml"
    path.write_text(text)
    r = run("--model", "llama3-8b", "--gpu", "h100-80", "--job", str(path))
    one_line_error(r, 4, f"{path}: invalid TOML: Exceeds the limit (4300 digits)")


def test_write_job_into_a_missing_folder_is_a_usage_error(tmp_path):
    job = tmp_path / "acc.yaml"
    job.write_text(ACCELERATE_FSDP.format(n=8))
    out = tmp_path / "no" / "such" / "out.yaml"
    r = run("--model", "llama3-8b", "--gpu", "h100-80", "--job", str(job), "--write-job", str(out))
    one_line_error(r, 2, f"--write-job: cannot write {str(out)!r}: No such file or directory")


def test_a_failed_rename_leaves_nothing_behind(tmp_path, monkeypatch):
    """The rename into place fails (another file system, a read-only mount): exit 2, the old
    file untouched, no temporary file left."""
    import planner.jobs.write as w

    job = tmp_path / "acc.yaml"
    job.write_text(ACCELERATE_FSDP.format(n=8))
    out = tmp_path / "out.yaml"
    out.write_text("old\n")

    def refuse(src, dst):
        raise OSError(18, "Invalid cross-device link")
    monkeypatch.setattr(w.os, "replace", refuse)
    r = run("--model", "llama3-8b", "--gpu", "h100-80", "--job", str(job), "--write-job", str(out))
    one_line_error(r, 2, f"--write-job: cannot write {str(out)!r}: Invalid cross-device link")
    assert out.read_text() == "old\n"
    assert sorted(os.listdir(tmp_path)) == ["acc.yaml", "out.yaml"]


def test_write_job_json_when_nothing_fits_prints_the_answer(tmp_path):
    """It printed no JSON at all (a consumer of --json read nothing); now the answer with
    job.rewrite null, exit 3, and no file written."""
    job = tmp_path / "acc.yaml"
    job.write_text(ACCELERATE_FSDP.format(n=1))
    out = tmp_path / "out.yaml"
    r = run("--model", "llama3-70b", "--gpu", "l4", "--job", str(job), "--write-job", str(out),
            "--json")
    assert r.exit_code == 3, r.stderr
    doc = json.loads(r.stdout)
    assert doc["job"]["rewrite"] is None and not any(c["fits"] for c in doc["candidates"])
    assert "nothing it can say fits on this hardware; not written" in r.stderr
    assert not out.exists()


SPEC_405B_ON_L4 = b"model:\n  preset: llama3.1-405b\nhardware:\n  gpu: l4\n  n: 1\nstrategy: ddp\xff\n"


@pytest.mark.parametrize("encoding", ["utf-8:strict", "utf-8:surrogateescape"])
def test_a_non_utf8_byte_on_stdin_is_bad_data_in_any_locale(encoding):
    """Under a UTF-8 locale Python decodes stdin strictly: the byte was an internal error and
    `gate - --on-error admit` admitted a 405B DDP job onto one L4 (issue 22, item 2); under C
    it was a YAML error. Now stdin is read as bytes: exit 4, 'stdin: not UTF-8 text'."""
    import subprocess
    import sys

    env = dict(os.environ, PYTHONIOENCODING=encoding)
    for args in (["gate", "-", "--on-error", "admit"],
                 ["--job", "-", "--model", "llama3-8b", "--gpu", "h100-80"]):
        p = subprocess.run([sys.executable, "-m", "planner", *args], input=SPEC_405B_ON_L4,
                           capture_output=True, env=env, timeout=120)
        assert (p.returncode, p.stdout, p.stderr) == (
            4, b"", b"fitcheck: error: stdin: not UTF-8 text\n"), args


def test_sigterm_removes_the_script_copy_fitcheck_sbatch_submits(tmp_path):
    """SIGTERM's default action ended Python without its finally blocks: the copy of the
    script stayed in the temp folder. Now SIGTERM is SystemExit(143) and the copy goes."""
    import signal
    import subprocess
    import sys
    import time

    slurm = os.path.join(os.path.dirname(__file__), "..", "integrations", "slurm",
                         "fitcheck-sbatch")
    data = os.path.join(os.path.dirname(__file__), "data", "gate")
    # it names a spec file (spec=): the wrapper submits a copy with the spec inlined
    script = os.path.join(data, "train-2node.sbatch")
    started = tmp_path / "started"
    fake = tmp_path / "fake_sbatch.py"  # says which script it was given, then waits
    fake.write_text(f"import sys, time\nopen({str(started)!r}, 'w').write(sys.argv[-1])\n"
                    "time.sleep(60)\n")
    sbatch = f"{sys.executable} {fake}"
    env = dict(os.environ, TMPDIR=str(tmp_path))
    gate = f"{sys.executable} -c 'from planner.cli import main; main()'"
    p = subprocess.Popen([sys.executable, slurm, "--fitcheck", gate, "--sbatch", sbatch,
                          script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True, cwd=data)
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    assert started.exists(), p.communicate()
    copy = started.read_text()
    assert os.path.basename(copy).startswith("fitcheck-sbatch-") and os.path.exists(copy)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 143
    try:  # subprocess.call kills its child as it unwinds: nothing should be left
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    assert not os.path.exists(copy)


def test_a_killed_writers_temporary_files_are_swept_an_hour_later(tmp_path):
    """SIGKILL runs nothing: the next report written into the folder removes what a killed
    one left (its own names, an hour old), and nothing else."""
    import time

    old = time.time() - 2 * 3600
    for name in (".report.csv.k1ll3d_.tmp", ".report.md.abc.tmp", "notes.tmp",
                 ".other.csv.abc.tmp"):
        (tmp_path / name).write_text("x")
        os.utime(tmp_path / name, (old, old))
    (tmp_path / ".report.csv.fresh.tmp").write_text("a write in progress")
    r = run("report", "--models", "llama3-8b", "--gpus", "h100-80", "--n", "8",
            "--out", str(tmp_path), "--format", "csv")
    assert r.exit_code == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == [".other.csv.abc.tmp", ".report.csv.fresh.tmp",
                                            ".report.md.abc.tmp", "notes.tmp", "report.csv"]
