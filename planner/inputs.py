"""Turn what the user typed into planner value types, or one clear error.

No click here: the CLI passes plain values, so the gate and the report reuse this.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from planner.errors import InputDataError, UsageError
from planner.spec import Cluster, GpuProfile, MlpKind, ModelSpec

_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_params(text: str) -> float:
    """'13e9', '13B', '1.5t', '7_000_000_000' -> a positive finite float."""
    raw = text.strip().replace("_", "")
    scale = 1.0
    if raw and raw[-1].lower() in _SUFFIX:
        scale = _SUFFIX[raw[-1].lower()]
        raw = raw[:-1]
    try:
        value = float(raw) * scale
    except ValueError:
        raise UsageError(f"--params: expected a number of parameters like 13e9 or 13B, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"--params: must be a positive finite number, got {text!r}")
    return value


# Explicit shape flags -> ModelSpec fields.
OVERRIDE_FIELDS = {
    "layers": "n_layers",
    "hidden": "hidden",
    "heads": "n_heads",
    "kv_heads": "n_kv_heads",
    "ffn": "ffn_hidden",
    "vocab": "vocab",
    "tied_embeddings": "tied_embeddings",
    "mlp": "mlp",
    "experts": "n_experts",
    "experts_per_token": "experts_per_token",
}


def _llama_ffn(hidden: int) -> int:
    """Llama's rule: 2/3 of 4h for SwiGLU, rounded up to a multiple of 256 (Touvron et al.
    2023, and the reference implementation's ``multiple_of``)."""
    f = int(2 * 4 * hidden / 3)
    return 256 * -(-f // 256)


def resolve_model(*, params: str | None = None, preset: str | None = None,
                  config: str | None = None, overrides: dict[str, Any] | None = None) -> tuple[ModelSpec, str]:
    """The model and a word for where its shape came from: params, preset, config, explicit."""
    given = [flag for flag, v in (("--params", params), ("--model", preset), ("--config", config)) if v is not None]
    if len(given) > 1:
        raise UsageError(f"give only one of --params, --model, --config (got {' and '.join(given)})")
    ov = {OVERRIDE_FIELDS[k]: v for k, v in (overrides or {}).items() if v is not None}
    for key, value in ov.items():
        if isinstance(value, int) and not isinstance(value, bool) and value <= 0:
            flag = next(f for f, field in OVERRIDE_FIELDS.items() if field == key)
            raise UsageError(f"--{flag.replace('_', '-')}: must be a positive integer, got {value}")
    if params is not None:
        from planner.scaling import shape_from_params

        n = parse_params(params)
        try:
            spec, source = shape_from_params(n), "params"
        except ValueError as exc:
            raise UsageError(f"--params: {exc}") from None
    elif preset is not None:
        from planner.presets import UnknownModelError, get_preset

        try:
            spec, source = get_preset(preset), "preset"
        except UnknownModelError as exc:
            raise UsageError(f"--model: {exc.args[0] if exc.args else exc}") from None
    elif config is not None:
        from planner.hf_config import ConfigError, load_hf_config

        if not os.path.isfile(config):
            raise UsageError(f"--config: no such file: {config!r}")
        try:
            spec, source = load_hf_config(config), "config"
        except ConfigError as exc:
            raise InputDataError(str(exc)) from None
    else:
        missing = [f"--{f}" for f in ("layers", "hidden", "heads", "vocab") if OVERRIDE_FIELDS[f] not in ov]
        if missing:
            raise UsageError(
                "describe the model with one of --params, --model, --config, or explicit shape "
                f"flags (missing: {', '.join(missing)})")
        hidden = ov["hidden"]
        mlp = MlpKind(ov.get("mlp", MlpKind.SWIGLU))
        base = dict(name="custom", n_layers=ov["n_layers"], hidden=hidden, n_heads=ov["n_heads"],
                    n_kv_heads=ov.get("n_kv_heads", ov["n_heads"]),
                    ffn_hidden=ov.get("ffn_hidden", _llama_ffn(hidden) if mlp.gated else 4 * hidden),
                    vocab=ov["vocab"], mlp=mlp)
        try:
            spec = ModelSpec(**base, **{k: v for k, v in ov.items() if k not in base})
        except ValueError as exc:
            raise UsageError(f"model shape: {exc}") from None
        return spec, "explicit"
    if ov:
        if "n_heads" in ov and "n_kv_heads" not in ov and spec.n_kv_heads == spec.n_heads:
            ov["n_kv_heads"] = ov["n_heads"]  # multi-head attention stays multi-head
        try:
            spec = dataclasses.replace(spec, **ov, name=f"{spec.name}+overrides")
        except ValueError as exc:
            raise UsageError(f"model shape: {exc}") from None
    return spec, source


def resolve_gpu(name: str) -> GpuProfile:
    """A profile id, or a path to a user's TOML profile."""
    from hardware_profiles import ProfileError, load_profile

    is_file = os.path.isfile(name)
    try:
        return load_profile(name)
    except ProfileError as exc:
        if is_file:
            raise InputDataError(str(exc)) from None
        raise UsageError(f"--gpu: {exc}") from None


def resolve_cluster(gpu: GpuProfile, n: int, gpus_per_node: int | None,
                    host_ram_gib: float | None) -> Cluster:
    if n <= 0:
        raise UsageError(f"--n: must be a positive number of GPUs, got {n}")
    gpn = gpus_per_node if gpus_per_node is not None else gpu.gpus_per_node
    if gpn <= 0:
        raise UsageError(f"--gpus-per-node: must be positive, got {gpn}")
    if n > gpn and n % gpn:
        raise UsageError(f"--n ({n}) must be a multiple of --gpus-per-node ({gpn}) past one node")
    if host_ram_gib is not None:
        if not math.isfinite(host_ram_gib) or host_ram_gib <= 0:
            raise UsageError(f"--host-ram-gib: must be a positive number, got {host_ram_gib}")
        host = int(host_ram_gib * 2**30)
    else:
        host = gpu.host_ram_bytes_per_node
    return Cluster(gpu=gpu, n_gpus=n, gpus_per_node=gpn, host_ram_bytes_per_node=host)


def resolve_calibration(choice: str, gpu: GpuProfile, model: ModelSpec):
    """--calibration FILE|auto: (overheads, gpu, throughput assumptions, description) or
    Nones when auto finds nothing. A bad file is InputDataError (exit 4)."""
    import os as _os

    from planner.calibration_paths import any_calibration_files

    if choice == "auto" and not any_calibration_files():
        return None, gpu, None, None
    from planner import calibration as cal_mod
    from planner.memory import Overheads
    from planner.throughput import DEFAULT_ASSUMPTIONS

    torch_version = cal_mod.installed_torch_version()
    if choice == "auto":
        cal = cal_mod.find_calibration(gpu.id, torch_version)
        if cal is None:
            return None, gpu, None, None
    else:
        if not _os.path.isfile(choice):
            raise UsageError(f"--calibration: no such file: {choice!r} (or use auto / none)")
        cal = cal_mod.load_calibration(choice)
    overheads, gpu = cal_mod.apply(cal, Overheads(), gpu, model=model)
    assumptions = cal_mod.apply_throughput(cal, DEFAULT_ASSUMPTIONS)
    info = {"id": cal.id, "source": cal.path or choice,
            "stale": cal_mod.is_stale(cal, torch_version)}
    return overheads, gpu, assumptions, info
