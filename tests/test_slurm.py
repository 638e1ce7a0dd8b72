"""fitcheck-sbatch: #SBATCH/#FITCHECK parsing, and the wrapper end to end with a fake sbatch."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import planner.slurm as fs

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
SLURM = ROOT / "integrations" / "slurm"
DATA = Path(__file__).parent / "data" / "gate"
JOBS = Path(__file__).parent / "data" / "jobs"

GATE = f"{shlex.quote(sys.executable)} -c 'from planner.cli import main; main()'"
# a fake sbatch: its arguments, then the script it was given when that is fitcheck-sbatch's copy
FAKE_SBATCH = " ".join(map(shlex.quote, [
    sys.executable, "-c", ("import os, sys; print('SUBMITTED', *sys.argv[1:], flush=True); "
                           "[sys.stdout.buffer.write(open(a, 'rb').read()) for a in sys.argv[1:] "
                           "if os.path.basename(a).startswith('fitcheck-')]")]))


def hw(*args: str) -> dict:
    opts, _ = fs.split_options(list(args), stop_at_positional=False)
    return fs.hardware_from_options(opts)[0]


@pytest.mark.parametrize("args, expected", [
    (("--nodes=2", "--gres=gpu:8"), {"n": 16, "gpus_per_node": 8}),
    (("-N", "4", "--gres=gpu:a100:8"), {"n": 32, "gpus_per_node": 8}),
    (("-N4", "--gres", "gpu:h100:4(S:0-1),shard:2"), {"n": 16, "gpus_per_node": 4}),
    (("--nodes=2-4", "--gpus-per-node=h100:8"), {"n": 16, "gpus_per_node": 8}),
    (("--gres=gres/gpu:2",), {"n": 2, "gpus_per_node": 2}),
    (("--gres=gres:gpu:h100:4",), {"n": 4, "gpus_per_node": 4}),  # Slurm 22.05's job_desc form
    (("--gres=gpu",), {"n": 1, "gpus_per_node": 1}),
    (("--gres=gpu:1,gpu:2",), {"n": 3, "gpus_per_node": 3}),
    (("-n", "8", "--gpus-per-task=1"), {"n": 8, "gpus_per_node": 8}),
    (("-N", "2", "-n", "8", "--gpus-per-task=2"), {"n": 16, "gpus_per_node": 8}),
    (("--sockets-per-node=2", "--gpus-per-socket=4"), {"n": 8, "gpus_per_node": 8}),
    (("--nodes=2", "--gpus=16"), {"n": 16, "gpus_per_node": 8}),
    (("-G", "4"), {"n": 4, "gpus_per_node": 4}),
    (("--nodes=2", "--ntasks-per-node=4", "--gpus-per-task=1"), {"n": 8, "gpus_per_node": 4}),
    (("--nodes=3", "--ntasks-per-node=8"), {"n": 24, "gpus_per_node": 8}),
    (("--nodes=2", "--gres=gpu:8", "--nodes=1"), {"n": 8, "gpus_per_node": 8}),  # later wins
    (("--time=1:00:00", "--exclusive", "--mem=0"), {}),
])
def test_hardware_from_sbatch_options(args, expected):
    assert hw(*args) == expected


def test_bad_counts_are_spec_errors():
    with pytest.raises(fs.SlurmSpecError, match="--nodes"):
        hw("--nodes=many", "--gres=gpu:8")
    with pytest.raises(fs.SlurmSpecError, match="--gpus"):
        hw("--gpus=a100:x")


def test_header_stops_at_first_command_fitcheck_anywhere():
    text = (DATA / "train-2node.sbatch").read_text()
    sbatch, fitcheck = fs.read_header(text)
    assert "--nodes=64" not in sbatch and "--nodes=2" in sbatch
    assert "--gres=gpu:h100:8" in sbatch  # the trailing comment is dropped
    assert fitcheck == ["spec=llama8b-8xh100.json", "strategy=full_shard"]


def test_build_spec_merges_file_fields_and_allocation():
    text = (DATA / "train-2node.sbatch").read_text()
    spec, notes = fs.build_spec(text, str(DATA), [])
    assert spec["model"] == {"preset": "llama3-8b"}
    assert spec["strategy"] == "full_shard"
    assert spec["training"]["seq"] == 4096
    assert spec["hardware"] == {"gpu": "h100-80", "n": 16, "gpus_per_node": 8}
    assert any("checking 16" in n for n in notes)
    # sbatch's command line wins over the script's header
    cli, _ = fs.split_options(["--nodes", "4"])
    spec, _ = fs.build_spec(text, str(DATA), cli)
    assert spec["hardware"]["n"] == 32


def directives(text: str) -> list[str]:
    return fs.read_header(text)[1]


def test_fitcheck_fields_shorthand_and_types():
    spec = fs.user_spec(directives("#FITCHECK model=llama3-8b gpu=h100-80 seq=4096 margin=0.1 "
                                   "tied_embeddings=false params=8B\n#SBATCH -N 1\n"), "/tmp")
    assert spec == {"model": {"preset": "llama3-8b", "tied_embeddings": False, "params": "8B"},
                    "hardware": {"gpu": "h100-80"}, "training": {"seq": 4096}, "margin": 0.1}
    with pytest.raises(fs.SlurmSpecError, match="unknown key 'colour'"):
        fs.build_spec("#FITCHECK colour=blue\n", "/tmp", [])
    with pytest.raises(fs.SlurmSpecError, match="no job spec"):
        fs.build_spec("#SBATCH --gpus=4\n", "/tmp", [])
    spec = fs.user_spec(directives("#FITCHECK model.config=cfg/config.json gpu=./my.toml\n"),
                        "/jobs")
    assert spec["model"]["config"] == "/jobs/cfg/config.json"
    assert spec["hardware"]["gpu"] == "/jobs/./my.toml"
    # no GPU request and no hardware.n: said before the gate runs, naming what to give
    with pytest.raises(fs.SlurmSpecError, match=r"hardware.n: the job requests no GPUs "
                       r"\(--gres=gpu:N, --gpus=N, --gpus-per-node=N\)"):
        fs.build_spec("#FITCHECK model=llama3-8b gpu=h100-80\n#SBATCH -N 1\n", "/tmp", [])


def test_argv_split_keeps_sbatch_arguments_in_order():
    w = fs.parse_argv(["--sbatch", "/bin/echo", "-N", "2", "--fitcheck-set", "seq=8",
                       "--exclusive", "-p", "gpu", "job.sh", "--fitcheck-skip", "x"])
    assert w["sbatch"] == "/bin/echo" and w["sets"] == ["seq=8"] and not w["skip"]
    assert w["passthrough"] == ["-N", "2", "--exclusive", "-p", "gpu", "job.sh",
                                "--fitcheck-skip", "x"]


def wrapper(*args: str, cwd: Path = DATA, env: dict | None = None,
            sbatch: str = "/bin/echo SUBMITTED"):
    return subprocess.run([sys.executable, str(SLURM / "fitcheck-sbatch"), "--fitcheck", GATE,
                           "--sbatch", sbatch, *args], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, **(env or {})}, timeout=60)


def test_wrapper_admits_and_execs_sbatch_with_the_original_arguments(tmp_path):
    script = tmp_path / "train.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --gres=gpu:8\n"
                      "#FITCHECK model=llama3-8b gpu=h100-80 strategy=full_shard\nsrun true\n")
    p = wrapper("-p", "gpu", "train.sbatch", "--lr", "3e-4", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "SUBMITTED -p gpu train.sbatch --lr 3e-4"
    assert "admitted: pinned full_shard fits on 8 x h100-80" in p.stderr


def test_wrapper_writes_named_files_into_the_copy_it_submits():
    """spec= names a file: the job sbatch gets carries its content (one spec-inline= line), so
    that the check in slurmctld judges the same job without reading the file."""
    p = wrapper("-p", "gpu", "train-2node.sbatch", "--lr", "3e-4", sbatch=FAKE_SBATCH)
    assert p.returncode == 0, p.stderr
    assert "admitted: pinned full_shard" in p.stderr
    head, _, copy = p.stdout.partition("\n")
    args = head.split()
    assert args[:3] == ["SUBMITTED", "-p", "gpu"] and args[4:] == ["--lr", "3e-4"]
    assert os.path.basename(args[3]).startswith("fitcheck-sbatch-")
    assert not os.path.exists(args[3])  # the copy is removed once sbatch has read it
    lines = copy.splitlines(keepends=True)
    inline = [line for line in lines if line.startswith("#FITCHECK spec-inline=")]
    assert len(inline) == 1 and copy.index(inline[0]) < copy.index("#FITCHECK-INLINED spec=")
    # the original lines stay, for people; the two directives among them no longer count
    rest = "".join(line for line in lines if line not in inline)
    assert rest.count("#FITCHECK-INLINED ") == 2
    assert rest.replace("#FITCHECK-INLINED", "#FITCHECK") == (DATA / "train-2node.sbatch"
                                                              ).read_text()
    spec = json.loads(shlex.split(inline[0].partition("=")[2])[0])
    # llama8b-8xh100.json (by hand) with the script's strategy= over it; no allocation in it
    assert spec == {"model": {"preset": "llama3-8b"},
                    "training": {"seq": 4096, "micro_batch": 2, "global_batch": 256,
                                 "precision": "bf16-amp", "optimizer": "adamw",
                                 "optimizer_impl": "fused", "attention": "sdpa"},
                    "hardware": {"gpu": "h100-80", "n": 8}, "strategy": "full_shard"}


def test_wrapper_names_the_copy_as_sbatch_would_name_the_script(tmp_path):
    (tmp_path / "s.json").write_text('{"model": {"preset": "llama3-8b"}, '
                                     '"hardware": {"gpu": "h100-80"}}')
    (tmp_path / "train.sh").write_bytes(b"#!/bin/bash\n#SBATCH --gpus=8\n#FITCHECK spec=s.json\n"
                                        b"echo caf\xe9\n")  # Latin-1: copied byte for byte
    def run(*args: str) -> bytes:
        p = subprocess.run([sys.executable, str(SLURM / "fitcheck-sbatch"), "--fitcheck", GATE,
                            "--sbatch", FAKE_SBATCH, *args], capture_output=True, cwd=tmp_path,
                           timeout=60)
        assert p.returncode == 0, p.stderr
        return p.stdout

    out = run("train.sh")
    assert out.startswith(b"SUBMITTED --job-name=train.sh /")
    assert out.endswith(b"#FITCHECK-INLINED spec=s.json\necho caf\xe9\n")
    assert run("-J", "mine", "train.sh").startswith(b"SUBMITTED -J mine /")


def test_wrapper_rejects_without_submitting():
    p = wrapper("train-70b-1node.sbatch")
    assert p.returncode == 3
    assert "SUBMITTED" not in p.stdout
    assert "rejected: pinned ddp does not fit on 8 x h100-80" in p.stderr


def test_wrapper_bad_spec_and_usage(tmp_path):
    # no #FITCHECK lines: submitted untouched, as job_submit.lua does (`alias sbatch=...`)
    p = wrapper("train-nospec.sbatch")
    assert p.returncode == 0 and p.stdout == "SUBMITTED train-nospec.sbatch\n" and not p.stderr
    p = wrapper("--wrap", "hostname")
    assert p.returncode == 0 and p.stdout == "SUBMITTED --wrap hostname\n"
    # a YAML spec with a NUL byte: one line naming the file, exit 4, no traceback
    (tmp_path / "nul.yaml").write_bytes(b"model:\n  preset: llama3-8b\x00\n")
    p = wrapper("--fitcheck-spec", "nul.yaml", "--gpus=8", "--wrap", "true", cwd=tmp_path)
    assert p.returncode == 4 and "SUBMITTED" not in p.stdout
    assert p.stderr == ("fitcheck-sbatch: error: nul.yaml: invalid YAML: unacceptable character "
                        "#x0000: special characters are not allowed\n")
    p = wrapper("--fitcheck-set", "model=nope", "--fitcheck-set", "gpu=h100-80",
                "train-nospec.sbatch")
    assert p.returncode == 4 and "model.preset" in p.stderr, p.stderr
    p = wrapper("missing.sbatch")
    assert p.returncode == 2
    p = wrapper("--fitcheck-on-error", "maybe", "train-2node.sbatch")
    assert p.returncode == 2


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e309", "0", "-1", "0.0", "3601",
                                   "abc", ""])
def test_fitcheck_timeout_is_seconds_like_the_gates(value):
    """`nan`/`inf` once raised (a traceback) and `0`/`-1` timed the gate out at once, which
    --fitcheck-on-error admit turned into an unchecked submission (issue 22, item 4): each is
    a usage error naming the flag and the value, before anything runs, whatever the policy."""
    p = wrapper("--fitcheck-timeout", value, "--fitcheck-on-error", "admit",
                "train-2node.sbatch")
    assert p.returncode == 2 and "SUBMITTED" not in p.stdout, p.stderr
    assert p.stderr == ("fitcheck-sbatch: error: --fitcheck-timeout: seconds, above 0 and at "
                        f"most 3600, got {value!r}\n")


def test_wrapper_dry_run_and_wrap(tmp_path):
    p = wrapper("--fitcheck-dry-run", "-N", "1", "--gpus-per-node=8", "--wrap", "python x.py",
                "--fitcheck-set", "model=gpt2", "--fitcheck-set", "gpu=h100-80")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["verdict"]["verdict"] == "admit"
    assert doc["spec"]["hardware"] == {"gpu": "h100-80", "n": 8, "gpus_per_node": 8}
    assert doc["submit"][-2:] == ["--wrap", "python x.py"]


@pytest.mark.parametrize("on_error, code", [("admit", 0), ("reject", 6)])
def test_wrapper_gate_failure_follows_on_error(on_error, code):
    """A gate that cannot run is no verdict (exit 6), never a rejection's exit 3."""
    p = subprocess.run([sys.executable, str(SLURM / "fitcheck-sbatch"), "--fitcheck", "/bin/false",
                        "--sbatch", "/bin/echo SUBMITTED", "--fitcheck-on-error", on_error,
                        "train-2node.sbatch"], capture_output=True, text=True, cwd=DATA,
                       timeout=60)
    assert p.returncode == code, p.stderr
    assert ("SUBMITTED" in p.stdout) is (code == 0)
    assert "gate failed" in p.stderr


def test_skip_submits_unchecked():
    p = wrapper("train-nospec.sbatch", env={"FITCHECK_SKIP": "1"})
    assert p.returncode == 0 and "SUBMITTED train-nospec.sbatch" in p.stdout


def test_fitcheck_job_line_names_a_job_config(tmp_path):
    (tmp_path / "train.toml").write_text("")
    spec, _ = fs.build_spec("#SBATCH -N 1 --gres=gpu:8\n#FITCHECK job=train.toml "
                            "format=torchtitan gpu=h100-80\n", str(tmp_path), [])
    assert spec["job"] == {"path": str(tmp_path / "train.toml"), "format": "torchtitan"}
    assert spec["hardware"] == {"gpu": "h100-80", "n": 8, "gpus_per_node": 8}
    with pytest.raises(fs.SlurmSpecError, match="no such file"):
        fs.build_spec("#FITCHECK job=missing.toml\n", str(tmp_path), [])
    with pytest.raises(fs.SlurmSpecError, match="format= goes with job="):
        fs.build_spec("#FITCHECK format=torchtitan gpu=h100-80\n", str(tmp_path), [])


def _script(tmp_path, job: str, nodes: int) -> Path:
    shutil.copy(JOBS / job, tmp_path / job)
    p = tmp_path / "train.sbatch"
    p.write_text(f"#!/bin/bash\n#SBATCH --nodes={nodes}\n#SBATCH --gres=gpu:h100:8\n"
                 f"#FITCHECK job={job} gpu=h100-80\nsrun torchrun train.py\n")
    return p


def test_wrapper_gates_a_job_config(tmp_path):
    script = _script(tmp_path, "torchtitan_llama3_8b.v0.2.0.toml", nodes=1)
    p = wrapper(str(script), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "admitted: pinned full_shard + selective checkpointing fits on 8 x h100-80" in p.stderr
    # ZBV's split backward beside selective checkpointing (torchtitan's ZBVZeroBubble with
    # the file's [activation_checkpoint]) is not modelled: rejected with the setting named,
    # never admitted
    pp = tmp_path / "pp"
    pp.mkdir()
    script = _script(pp, "torchtitan_llama3_70b.v0.2.0.toml", nodes=8)
    job = next(pp.glob("*.toml"))
    job.write_text(job.read_text().replace(
        "pipeline_parallel_degree = 1",
        'pipeline_parallel_degree = 4\npipeline_parallel_schedule = "ZBVZeroBubble"'))
    p = wrapper(str(script), cwd=pp)
    assert p.returncode == 3 and "SUBMITTED" not in p.stdout
    assert "does not model" in p.stderr and "zbv" in p.stderr.lower(), p.stderr


def test_console_script_entry_point_and_shim():
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["fitcheck-sbatch"] == "planner.slurm:main"
    p = subprocess.run([sys.executable, "-m", "planner.slurm", "--help"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and "#FITCHECK job=" in p.stdout
    p = subprocess.run([sys.executable, str(SLURM / "fitcheck_slurm.py"), "--help"],
                       capture_output=True, text=True, timeout=60, cwd="/")
    assert p.returncode == 0 and "fitcheck-sbatch" in p.stdout
