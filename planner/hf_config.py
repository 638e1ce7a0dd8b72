"""Read a Hugging Face ``config.json`` into a ModelSpec, without transformers or network access.

Recognized ``model_type`` values and the keys each one reads:

=====================================  ========================================================
llama, mistral, mixtral, qwen2, phi3,  hidden_size, num_hidden_layers, num_attention_heads,
gemma, gemma2 (Llama-style)            intermediate_size, vocab_size; optional
                                       num_key_value_heads, head_dim, tie_word_embeddings,
                                       hidden_act / hidden_activation, attention_bias, mlp_bias,
                                       num_local_experts, num_experts_per_tok
gpt2                                   n_embd, n_layer, n_head, vocab_size; optional n_inner
                                       (null = 4 * n_embd), n_positions (or n_ctx)
bert (and roberta, xlm-roberta)        hidden_size, num_hidden_layers, num_attention_heads,
                                       intermediate_size, vocab_size; optional
                                       max_position_embeddings, type_vocab_size
bloom                                  n_layer, n_head (or num_*), hidden_size (or n_embed),
                                       vocab_size
falcon (and RefinedWeb,                hidden_size, num_hidden_layers (or n_layer),
RefinedWebModel)                       num_attention_heads (or n_head), vocab_size; optional
                                       num_kv_heads (or n_head_kv), multi_query,
                                       new_decoder_architecture, parallel_attn,
                                       num_ln_in_parallel_attn, ffn_hidden_size, alibi, bias
=====================================  ========================================================

Any other ``model_type`` (or none) is read as a Llama-style decoder when it has the Llama keys;
a note saying so is appended to ``notes`` when the caller passes a list. Defaults for absent
optional keys are the ``transformers`` config-class defaults of that model type (for example
``tie_word_embeddings`` is true for GPT-2, BERT, BLOOM, Falcon and Gemma, false otherwise).

Every problem raises ConfigError with a one-line message that starts with the config's name.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

from planner.spec import MlpKind, ModelSpec, NormKind, PositionKind

__all__ = ["ConfigError", "load_hf_config", "spec_from_hf_config", "SUPPORTED_MODEL_TYPES"]


class ConfigError(ValueError):
    """A config.json that cannot be read as a model shape (message is one line)."""


_LLAMA_STYLE = frozenset({"llama", "mistral", "mixtral", "qwen2", "phi3", "gemma", "gemma2"})
_BERT_STYLE = frozenset({"bert", "roberta", "xlm-roberta"})
_FALCON_STYLE = frozenset({"falcon", "refinedweb", "refinedwebmodel"})
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(
    sorted(_LLAMA_STYLE | _BERT_STYLE | _FALCON_STYLE | {"gpt2", "bloom"})
)

_REQUIRED = object()
MAX_DIMENSION = 1 << 24
"""No dimension of a real model (layers, width, heads, vocabulary) comes near this."""
MAX_CONFIG_BYTES = 1 << 22
MAX_NESTING = 4
"""text_config wrappers followed at most this deep."""


def _show(value: Any) -> str:
    """A value as it appears in JSON (null, true, "text"), for error messages."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Reader:
    """Typed access to a config dict that gathers every missing required key before failing."""

    def __init__(self, cfg: dict[str, Any], label: str) -> None:
        self.cfg = cfg
        self.label = label
        self.missing: list[str] = []

    def error(self, message: str) -> ConfigError:
        return ConfigError(f"{self.label}: {message}")

    def _find(self, keys: tuple[str, ...]) -> tuple[str, Any] | None:
        for key in keys:
            if key in self.cfg and self.cfg[key] is not None:
                return key, self.cfg[key]
        for key in keys:  # present but null
            if key in self.cfg:
                return key, None
        return None

    def get_int(self, *keys: str, default: Any = _REQUIRED) -> Any:
        """A positive integer under the first present key; null means absent for optional keys."""
        found = self._find(keys)
        if found is None or (found[1] is None and default is not _REQUIRED):
            if default is _REQUIRED:
                self.missing.append(keys[0] if len(keys) == 1 else f"{keys[0]} (or {keys[1]})")
                return None
            return default
        key, value = found
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise self.error(f"{key} must be a positive integer, got {_show(value)}")
        if value > MAX_DIMENSION:
            raise self.error(f"{key} must be at most {MAX_DIMENSION:,}, got {_show(value)}")
        return value

    def get_bool(self, key: str, default: bool) -> bool:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(f"{key} must be true or false, got {_show(value)}")
        return value

    def get_str(self, *keys: str, default: str = "") -> str:
        found = self._find(keys)
        if found is None or found[1] is None:
            return default
        key, value = found
        if not isinstance(value, str):
            raise self.error(f"{key} must be a string, got {_show(value)}")
        return value

    def finish(self) -> None:
        if self.missing:
            raise ConfigError(
                f"{self.label} is missing required keys: {', '.join(self.missing)}"
            )


def _llama_style(r: _Reader, model_type: str, name: str, notes: list[str] | None) -> ModelSpec:
    hidden = r.get_int("hidden_size")
    n_layers = r.get_int("num_hidden_layers")
    n_heads = r.get_int("num_attention_heads")
    ffn = r.get_int("intermediate_size")
    vocab = r.get_int("vocab_size")
    n_kv = r.get_int("num_key_value_heads", default=0)
    head_dim = r.get_int("head_dim", default=0)
    tied = r.get_bool("tie_word_embeddings", model_type in ("gemma", "gemma2"))
    act = r.get_str("hidden_activation", "hidden_act", default="silu").lower()
    attention_bias = r.get_bool("attention_bias", False)
    mlp_bias = r.get_bool("mlp_bias", False)
    # MixtralConfig defaults: 8 experts, 2 per token.
    n_experts = r.get_int("num_local_experts", default=8 if model_type == "mixtral" else 1)
    top_k = r.get_int("num_experts_per_tok", default=2)
    r.finish()
    if n_experts == 1:
        top_k = 1
    if head_dim and head_dim * n_heads == hidden:
        head_dim = 0  # the default; keep the spec canonical
    mlp = MlpKind.GEGLU if act.startswith("gelu") else MlpKind.SWIGLU
    if notes is not None and model_type not in _LLAMA_STYLE:
        notes.append(
            f"{r.label}: model_type {model_type or '(none)'!r} is not recognized; read as a"
            f" Llama-style decoder ({mlp.value}, rmsnorm, rope)"
        )
    return ModelSpec(
        name=name,
        n_layers=n_layers,
        hidden=hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv or n_heads,
        ffn_hidden=ffn,
        vocab=vocab,
        head_dim=head_dim,
        tied_embeddings=tied,
        mlp=mlp,
        # Qwen2Attention always has q/k/v biases; Llama's attention_bias also biases o_proj,
        # which the reference layout cannot express (hidden elements per layer) unless
        # mlp_bias is set too, making every linear biased.
        bias=attention_bias and mlp_bias,
        qkv_bias=model_type == "qwen2" or attention_bias,
        norms_per_layer=4 if model_type == "gemma2" else 2,
        n_experts=n_experts,
        experts_per_token=top_k,
    )


def _gpt2(r: _Reader, name: str) -> ModelSpec:
    hidden = r.get_int("n_embd")
    n_layers = r.get_int("n_layer")
    n_heads = r.get_int("n_head")
    vocab = r.get_int("vocab_size")
    ffn = r.get_int("n_inner", default=None)
    positions = r.get_int("n_positions", "n_ctx", default=1024)
    tied = r.get_bool("tie_word_embeddings", True)
    r.finish()
    return ModelSpec(
        name=name, n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_heads,
        ffn_hidden=ffn or 4 * hidden, vocab=vocab, tied_embeddings=tied, mlp=MlpKind.GELU,
        norm=NormKind.LAYERNORM, position=PositionKind.LEARNED, max_positions=positions,
        bias=True,
    )  # fmt: skip


def _bert(r: _Reader, name: str) -> ModelSpec:
    hidden = r.get_int("hidden_size")
    n_layers = r.get_int("num_hidden_layers")
    n_heads = r.get_int("num_attention_heads")
    ffn = r.get_int("intermediate_size")
    vocab = r.get_int("vocab_size")
    positions = r.get_int("max_position_embeddings", default=512)
    type_vocab = r.get_int("type_vocab_size", default=2)
    tied = r.get_bool("tie_word_embeddings", True)
    r.finish()
    return ModelSpec(
        name=name, n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_heads,
        ffn_hidden=ffn, vocab=vocab, tied_embeddings=tied, mlp=MlpKind.GELU,
        norm=NormKind.LAYERNORM, position=PositionKind.LEARNED, max_positions=positions,
        bias=True, type_vocab=type_vocab, embedding_norm=True, encoder_head=True,
    )  # fmt: skip


def _bloom(r: _Reader, name: str) -> ModelSpec:
    n_layers = r.get_int("n_layer", "num_hidden_layers")
    n_heads = r.get_int("n_head", "num_attention_heads")
    hidden = r.get_int("hidden_size", "n_embed")
    vocab = r.get_int("vocab_size")
    tied = r.get_bool("tie_word_embeddings", True)
    r.finish()
    return ModelSpec(
        name=name, n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_heads,
        ffn_hidden=4 * hidden, vocab=vocab, tied_embeddings=tied, mlp=MlpKind.GELU,
        norm=NormKind.LAYERNORM, position=PositionKind.ALIBI, bias=True, embedding_norm=True,
    )  # fmt: skip


def _falcon(r: _Reader, model_type: str, name: str) -> ModelSpec:
    hidden = r.get_int("hidden_size")
    n_layers = r.get_int("num_hidden_layers", "n_layer")
    n_heads = r.get_int("num_attention_heads", "n_head")
    vocab = r.get_int("vocab_size")
    # transformers' FalconConfig: RefinedWeb (40B-style) checkpoints use the new architecture.
    new_arch = r.get_bool("new_decoder_architecture", model_type == "refinedweb")
    multi_query = r.get_bool("multi_query", True)
    parallel = r.get_bool("parallel_attn", True)
    kv_groups = r.get_int("num_kv_heads", "n_head_kv", default=None)
    n_ln = r.get_int("num_ln_in_parallel_attn", default=2)
    ffn = r.get_int("ffn_hidden_size", default=None)
    alibi = r.get_bool("alibi", False)
    bias = r.get_bool("bias", False)
    tied = r.get_bool("tie_word_embeddings", True)
    r.finish()
    if new_arch:
        n_kv = kv_groups or n_heads
        norms, parallel = min(n_ln, 2), True  # the new architecture is always parallel
    else:
        n_kv = 1 if multi_query else n_heads  # num_kv_heads is ignored here (falcon-7b: 71)
        norms = 1 if parallel else 2
    return ModelSpec(
        name=name, n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv,
        ffn_hidden=ffn or 4 * hidden, vocab=vocab, tied_embeddings=tied, mlp=MlpKind.GELU,
        norm=NormKind.LAYERNORM, position=PositionKind.ALIBI if alibi else PositionKind.ROPE,
        bias=bias, norms_per_layer=norms, parallel_block=parallel,
    )  # fmt: skip


def spec_from_hf_config(
    cfg: dict[str, Any], name: str, *, notes: list[str] | None = None
) -> ModelSpec:
    """The ModelSpec a parsed config.json describes; ``name`` labels the spec and the errors.

    ``notes`` (optional) collects one-line remarks about assumptions, e.g. an unrecognized
    model_type read as Llama-style.
    """
    if not isinstance(cfg, dict):
        raise ConfigError(f"{name}: expected a JSON object, got {type(cfg).__name__}")
    spec = _spec_from_hf_config(cfg, name, notes)
    p = _dropout(cfg, name)
    return dataclasses.replace(spec, dropout=p) if p else spec


def _spec_from_hf_config(cfg: dict[str, Any], name: str, notes: list[str] | None) -> ModelSpec:
    raw_type = cfg.get("model_type")
    if raw_type is not None and not isinstance(raw_type, str):
        raise ConfigError(f"{name}: model_type must be a string, got {_show(raw_type)}")
    model_type = (raw_type or "").lower().replace("_", "-")
    if model_type == "gpt2" or (not model_type and "n_embd" in cfg):
        model_type = "gpt2"
    # Multimodal wrappers keep the language model's shape under text_config.
    if (
        model_type not in SUPPORTED_MODEL_TYPES
        and "hidden_size" not in cfg
        and isinstance(cfg.get("text_config"), dict)
    ):
        inner = cfg["text_config"]
        depth = cfg.get("_fitcheck_depth", 0) if isinstance(cfg.get("_fitcheck_depth"), int) else 0
        if depth >= MAX_NESTING:
            raise ConfigError(f"{name}: text_config nested more than {MAX_NESTING} deep")
        if notes is not None:
            notes.append(f"{name}: using the language model under text_config")
        return spec_from_hf_config({**inner, "_fitcheck_depth": depth + 1}, name, notes=notes)
    r = _Reader(cfg, name)
    try:
        if model_type in _LLAMA_STYLE:
            return _llama_style(r, model_type, name, notes)
        if model_type == "gpt2":
            return _gpt2(r, name)
        if model_type in _BERT_STYLE:
            return _bert(r, name)
        if model_type == "bloom":
            return _bloom(r, name)
        if model_type in _FALCON_STYLE:
            return _falcon(r, model_type, name)
        try:
            return _llama_style(r, model_type, name, notes)
        except ConfigError as exc:
            if not r.missing:
                raise
            what = f"model_type {raw_type!r} is not supported" if raw_type else "no model_type"
            supported = ", ".join(SUPPORTED_MODEL_TYPES)
            raise ConfigError(
                f"{name}: {what} and the Llama-style keys are missing"
                f" ({', '.join(r.missing)}); supported model types: {supported}"
            ) from exc
    except ConfigError:
        raise
    except ValueError as exc:  # ModelSpec's own checks (head counts that do not divide, ...)
        raise ConfigError(f"{name}: {exc}") from exc


_DROPOUT_KEYS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "resid_pdrop",
                 "embd_pdrop", "attn_pdrop", "hidden_dropout", "attention_dropout",
                 "dropout")


def _dropout(cfg: dict[str, Any], name: str) -> float:
    """The largest dropout probability the config trains with (0 when none is set)."""
    values = []
    for key in _DROPOUT_KEYS:
        v = cfg.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
            raise ConfigError(f"{name}: {key} must be a probability in [0, 1), got {_show(v)}")
        values.append(float(v))
    return max(values, default=0.0)


def load_hf_config(path: str | os.PathLike[str]) -> ModelSpec:
    """Read ``path`` (a config.json, or a directory holding one) into a ModelSpec."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    label = str(p)
    try:
        if p.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{label}: larger than {MAX_CONFIG_BYTES} bytes; not a config.json")
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{label}: no such file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{label}: not valid JSON: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise ConfigError(f"{label}: cannot read: {exc.strerror or exc}") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{label}: not valid JSON: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{label}: JSON nested too deeply") from None
    except ValueError:  # an integer of more than 4,300 digits
        raise ConfigError(f"{label}: a number is out of range for a model config") from None
    return spec_from_hf_config(cfg, label)
