"""The embedded GPU profiles and the validating loader in ``hardware_profiles``."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

import hardware_profiles as hp
from hardware_profiles import ProfileError, list_profiles
from planner.hardware import all_gpus as load_all
from planner.hardware import load_gpu as load_profile
from planner.spec import GpuProfile

MiB = 2**20
GiB = 2**30

REQUIRED_IDS = {
    "v100-16", "v100-32", "a10g", "l4", "l40s", "a100-40", "a100-80", "a100-80-pcie",
    "h100-80", "h100-pcie", "h100-nvl", "h200", "gh200", "b200", "rtx-3090", "rtx-4090",
    "rtx-a6000", "mi250x", "mi300x",
}  # fmt: skip


def _one_line(exc: pytest.ExceptionInfo[ProfileError]) -> str:
    message = str(exc.value)
    assert "\n" not in message and "\r" not in message, message
    return message


# --- the embedded data ------------------------------------------------------------------------


def test_required_ids_are_embedded() -> None:
    ids = list_profiles()
    assert ids == sorted(ids)
    assert REQUIRED_IDS <= set(ids)


def test_every_embedded_profile_loads_and_is_sourced() -> None:
    profiles = load_all()
    assert list(profiles) == list_profiles()
    for gpu_id, profile in profiles.items():
        assert isinstance(profile, GpuProfile)
        assert profile.id == gpu_id
        for name in hp.NUMERIC_FIELDS:
            if name in hp._OPTIONAL_FIELDS and getattr(profile, name) is None:
                continue  # optional: no float8 tensor cores (A100 and older, MI250X), or
                # float8 matmuls not measured on it (the datasheet ratio is assumed)
            source = profile.sources.get(name, "")
            assert source.strip(), f"{gpu_id}: no source for {name}"


@pytest.mark.parametrize("gpu_id", sorted(REQUIRED_IDS))
def test_embedded_values_are_plausible(gpu_id: str) -> None:
    p = load_profile(gpu_id)
    assert p.vendor in {"nvidia", "amd"}
    assert 8 * GiB < p.memory_bytes < 256 * GiB
    # Driver-reported totals are whole MiB.
    assert p.memory_bytes % MiB == 0
    # Dense peaks are ordered: half precision >= TF32 >= FP32, all below 5 PFLOP/s.
    assert 5000 > p.bf16_tflops >= p.tf32_tflops >= p.fp32_tflops > 0
    assert p.fp16_tflops >= p.tf32_tflops
    assert 100e9 < p.hbm_bandwidth_bytes_per_s < 20e12
    assert 10e9 <= p.intra_node_bandwidth_bytes_per_s <= 2e12
    assert 0.1e9 <= p.inter_node_bandwidth_bytes_per_s <= 200e9
    assert 8e9 <= p.pcie_bandwidth_bytes_per_s <= 1e12
    assert 1 <= p.gpus_per_node <= 16
    assert p.host_ram_bytes_per_node >= 64 * GiB
    assert 128 * MiB <= p.cuda_context_bytes <= 2 * GiB
    assert p.memory_bytes > p.cuda_context_bytes


def test_hand_checked_values() -> None:
    h100 = load_profile("h100-80")
    assert h100.memory_bytes == 81559 * MiB == 85520809984
    assert h100.bf16_tflops == 989.0  # dense, not the 1,979 sparsity figure
    assert h100.intra_node_link == "nvlink4"
    assert h100.intra_node_bandwidth_bytes_per_s == 450e9
    assert h100.inter_node_bandwidth_bytes_per_s == 50e9
    assert h100.gpus_per_node == 8
    assert h100.host_ram_bytes_per_node == 2 * 2**40

    a100 = load_profile("a100-80")
    assert a100.memory_bytes == 81920 * MiB
    assert a100.bf16_tflops == 312.0
    assert a100.tf32_tflops == 156.0
    assert a100.intra_node_bandwidth_bytes_per_s == 300e9

    assert load_profile("a100-40").memory_bytes == 40960 * MiB
    assert load_profile("h200").memory_bytes == 143771 * MiB
    assert load_profile("h100-nvl").memory_bytes == 95830 * MiB
    assert load_profile("gh200").pcie_bandwidth_bytes_per_s == 450e9
    assert load_profile("mi300x").memory_bytes == 206141652992
    # MI250X is modelled per GCD: 64 GiB (less a 16 MiB reserve), 8 "GPUs" per 4-module node.
    mi250x = load_profile("mi250x")
    assert mi250x.memory_bytes == 64 * GiB - 16 * MiB
    assert mi250x.gpus_per_node == 8
    assert "GCD" in mi250x.name


def test_loader_covers_every_spec_field() -> None:
    spec_fields = {f.name for f in dataclasses.fields(GpuProfile)}
    assert spec_fields == set(hp.FIELDS) | {"sources"}


def test_lookup_is_case_insensitive() -> None:
    assert load_profile("H100-80") == load_profile("h100-80")
    assert load_profile("  A10G ").id == "a10g"


def test_import_is_light() -> None:
    code = (
        "import sys, hardware_profiles as hp; hp.read_all(); "
        "heavy = ('torch', 'numpy', 'pandas', 'importlib.metadata'); "
        "print(','.join(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# --- unknown ids --------------------------------------------------------------------------------


def test_unknown_id_lists_close_matches_and_known_ids() -> None:
    with pytest.raises(ProfileError) as exc:
        load_profile("h10-80")
    message = _one_line(exc)
    assert message.startswith("unknown GPU 'h10-80'; close matches: ")
    close = message.split("close matches: ", 1)[1].split(";", 1)[0].split(", ")
    assert "h100-80" in close
    assert "known ids: " in message
    for gpu_id in REQUIRED_IDS:
        assert gpu_id in message
    assert message.endswith("give a path to a TOML profile")


def test_unknown_id_without_close_matches() -> None:
    with pytest.raises(ProfileError) as exc:
        load_profile("zzzzzzzz")
    message = _one_line(exc)
    assert "no close matches" in message
    assert "known ids: " in message


def test_missing_user_file() -> None:
    with pytest.raises(ProfileError) as exc:
        load_profile("/nonexistent/dir/my-gpu.toml")
    assert "not found" in _one_line(exc)


# --- user files ---------------------------------------------------------------------------------


def _user_toml(**overrides: object) -> str:
    """A valid user profile (based on h100-80, no sources), with fields replaced or dropped."""
    values: dict[str, object] = {
        "id": "my-gpu",
        "name": "My GPU",
        "vendor": "nvidia",
        "memory_bytes": 81559 * MiB,
        "bf16_tflops": 989,
        "fp16_tflops": 989.0,
        "tf32_tflops": 494.5,
        "fp32_tflops": 67.0,
        "hbm_bandwidth_bytes_per_s": 3.35e12,
        "intra_node_link": "nvlink4",
        "intra_node_bandwidth_bytes_per_s": 450e9,
        "inter_node_bandwidth_bytes_per_s": 50e9,
        "gpus_per_node": 8,
        "host_ram_bytes_per_node": 2 * 2**40,
        "pcie_bandwidth_bytes_per_s": 64e9,
        "cuda_context_bytes": 512 * MiB,
    }
    for key, value in overrides.items():
        if value is None:
            values.pop(key, None)
        else:
            values[key] = value
    lines = []
    for key, value in values.items():
        if isinstance(value, str) and not value.startswith("RAW:"):
            lines.append(f'{key} = "{value}"')
        elif isinstance(value, str):
            lines.append(f"{key} = {value[4:]}")
        else:
            lines.append(f"{key} = {value!r}")
    return "\n".join(lines) + "\n"


def _write(tmp_path: Path, text: str, name: str = "my-gpu.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_user_file_loads(tmp_path: Path) -> None:
    path = _write(tmp_path, _user_toml())
    profile = load_profile(str(path))
    assert profile.id == "my-gpu"
    assert profile.memory_bytes == 81559 * MiB
    assert profile.bf16_tflops == 989.0 and isinstance(profile.bf16_tflops, float)
    assert profile.sources == {}


def test_user_file_with_sources_and_any_name(tmp_path: Path) -> None:
    text = _user_toml() + '\n[sources]\nmemory_bytes = "nvidia-smi on my box"\n'
    path = _write(tmp_path, text, name="cluster.toml")
    profile = load_profile(path)  # a Path works too
    assert profile.id == "my-gpu"
    assert profile.sources == {"memory_bytes": "nvidia-smi on my box"}


def test_existing_file_without_toml_suffix_is_a_path(tmp_path: Path) -> None:
    path = _write(tmp_path, _user_toml(), name="gpu.conf")
    assert load_profile(str(path)).id == "my-gpu"


def test_missing_field(tmp_path: Path) -> None:
    path = _write(tmp_path, _user_toml(memory_bytes=None))
    with pytest.raises(ProfileError) as exc:
        load_profile(str(path))
    assert _one_line(exc) == f"{path}: missing field 'memory_bytes'"


def test_several_missing_fields_are_all_named(tmp_path: Path) -> None:
    path = _write(tmp_path, _user_toml(memory_bytes=None, gpus_per_node=None))
    with pytest.raises(ProfileError) as exc:
        load_profile(str(path))
    message = _one_line(exc)
    assert "'gpus_per_node'" in message and "'memory_bytes'" in message


def test_negative_value(tmp_path: Path) -> None:
    path = _write(tmp_path, _user_toml(memory_bytes=-5))
    with pytest.raises(ProfileError) as exc:
        load_profile(str(path))
    message = _one_line(exc)
    assert message.endswith("field 'memory_bytes' must be an integer in [1073741824, 70368744177664]")
    assert "my-gpu.toml" in message and "got -5" not in message  # contents never echo


def test_negative_rate(tmp_path: Path) -> None:
    path = _write(tmp_path, _user_toml(bf16_tflops=-1.5))
    with pytest.raises(ProfileError) as exc:
        load_profile(str(path))
    message = _one_line(exc)
    assert message.endswith("field 'bf16_tflops' must be a number in [0.1, 100000]")
    assert "got -1.5" not in message


@pytest.mark.parametrize(
    ("field", "raw", "shown"),
    [
        ("memory_bytes", "8.0e10", "80000000000.0"),  # byte counts must be integers
        ("gpus_per_node", '"8"', "'8'"),
        ("gpus_per_node", "true", "True"),
        ("bf16_tflops", '"989"', "'989'"),
        ("bf16_tflops", "nan", "nan"),
        ("hbm_bandwidth_bytes_per_s", "0", "0"),
        ("name", "42", "42"),
        ("intra_node_link", '""', "''"),
    ],
)
def test_wrong_type(tmp_path: Path, field: str, raw: str, shown: str) -> None:
    path = _write(tmp_path, _user_toml(**{field: f"RAW:{raw}"}))
    with pytest.raises(ProfileError) as exc:
        load_profile(str(path))
    message = _one_line(exc)
    assert f"field '{field}' must be" in message
    assert f"got {shown}" not in message  # the value read from the file is not echoed


def test_zero_cuda_context_is_allowed(tmp_path: Path) -> None:
    path = _write(tmp_path, _user_toml(cuda_context_bytes=0))
    assert load_profile(str(path)).cuda_context_bytes == 0


def test_extra_key(tmp_path: Path) -> None:
    path = _write(tmp_path, _user_toml(memory_gb=80, tdp_watts=700))
    with pytest.raises(ProfileError) as exc:
        load_profile(str(path))
    message = _one_line(exc)
    assert "2 key(s) not in the profile schema" in message
    assert "memory_gb" not in message and "tdp_watts" not in message  # names from the file
    assert "my-gpu.toml" in message


def test_malformed_toml(tmp_path: Path) -> None:
    path = _write(tmp_path, _user_toml() + "this is = = not toml\n[[[\n")
    with pytest.raises(ProfileError) as exc:
        load_profile(str(path))
    message = _one_line(exc)
    assert message.startswith(f"{path}: malformed TOML (at line ")  # the position survives
    assert "not toml" not in message


def test_sources_must_be_a_table_of_strings(tmp_path: Path) -> None:
    path = _write(tmp_path, _user_toml(sources="RAW:42"))
    with pytest.raises(ProfileError) as exc:
        load_profile(str(path))
    assert "field 'sources' must be a table of strings" in _one_line(exc)

    path = _write(tmp_path, _user_toml() + "\n[sources]\nmemory_bytes = 5\n")
    with pytest.raises(ProfileError) as exc:
        load_profile(str(path))
    assert "field 'sources.memory_bytes' must be a non-empty string" in _one_line(exc)

    path = _write(tmp_path, _user_toml() + '\n[sources]\nmemory = "x"\n')
    with pytest.raises(ProfileError) as exc:
        load_profile(str(path))
    assert "'sources' has an entry for a field not in the profile schema" in _one_line(exc)


# --- the stricter rules for embedded files ------------------------------------------------------


def test_embedded_rules_id_and_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Embedded files must match their stem and source every numeric field."""
    text = (Path(hp.PROFILE_DIR) / "h100-80.toml").read_text()
    monkeypatch.setattr(hp, "PROFILE_DIR", str(tmp_path))

    (tmp_path / "h100-80.toml").write_text(text)
    assert load_profile("h100-80").id == "h100-80"

    (tmp_path / "h100-80.toml").write_text(text.replace('id = "h100-80"', 'id = "h100"'))
    with pytest.raises(ProfileError) as exc:
        load_profile("h100-80")
    assert "field 'id' must equal the file name stem 'h100-80'" in _one_line(exc)

    unsourced = "\n".join(
        line for line in text.splitlines() if not line.startswith("pcie_bandwidth_bytes_per_s = \"")
    )
    (tmp_path / "h100-80.toml").write_text(unsourced)
    with pytest.raises(ProfileError) as exc:
        load_all()
    message = _one_line(exc)
    assert message.startswith("h100-80.toml: ")
    assert "pcie_bandwidth_bytes_per_s" in message


def test_partial_id_suggests_the_ids_it_starts() -> None:
    with pytest.raises(ProfileError) as exc:
        load_profile("H100")
    close = _one_line(exc).split("close matches: ", 1)[1].split(";", 1)[0].split(", ")
    assert close[:3] == ["h100-80", "h100-nvl", "h100-pcie"]


def test_physical_ranges_and_context_below_capacity(tmp_path: Path) -> None:
    """Extreme values (issue: 1e308 TFLOP/s, a 5e-324 efficiency) are refused by name."""
    for field, raw in [("bf16_tflops", "1e308"), ("compute_efficiency", "5e-324"),
                       ("gpus_per_node", "100000")]:
        path = _write(tmp_path, _user_toml(**{field: f"RAW:{raw}"}))
        with pytest.raises(ProfileError) as exc:
            load_profile(str(path))
        assert f"field '{field}' must be" in _one_line(exc)
    path = _write(tmp_path, _user_toml(memory_bytes="RAW:" + "9" * 4301))
    with pytest.raises(ProfileError, match="a value is out of range"):  # tomllib's ValueError
        load_profile(str(path))
    path = _write(tmp_path, _user_toml(memory_bytes=2 * GiB, cuda_context_bytes=2 * GiB))
    with pytest.raises(ProfileError, match="'cuda_context_bytes' must be below 'memory_bytes'"):
        load_profile(str(path))


def test_non_utf8_and_oversized_files(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(b'name = "\xff\xfe"\n' + bytes([0xff, 0xfe, 0x80]))
    with pytest.raises(ProfileError, match="not UTF-8 text"):
        load_profile(str(path))
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (hp.MAX_FILE_BYTES + 10))
    with pytest.raises(ProfileError, match="larger than"):
        load_profile(str(big))


def test_a_bare_id_is_never_read_from_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file named like a profile id in the working directory is not a profile."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "h100-80").write_text(_user_toml(memory_bytes=10**12))
    (tmp_path / "secrets").write_text('api_key = "hunter2"\n')
    assert load_profile("h100-80").memory_bytes == 81559 * MiB
    with pytest.raises(ProfileError) as exc:
        load_profile("secrets")
    assert "hunter2" not in _one_line(exc) and "api_key" not in _one_line(exc)
