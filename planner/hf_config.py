"""Read a Hugging Face ``config.json`` into a ModelSpec, without transformers or network access.

Never a silent misread: a config is read only when every field that changes the model's
parameters or saved activations is modelled. Anything else (a ``model_type`` fitcheck does not
know, a vision tower, a feature such as ``mlp_bias`` alone) is a ConfigError (exit 4) naming
what is missing and the next step (shape flags, ``--from-trace``), unless the caller accepts an
approximation (``approximate=True``: ``--approximate``, ``model.approximate`` in a spec); each
accepted approximation is then one line in ``notes`` (the plan's and the gate's warnings).

Recognized ``model_type`` values (each checked against the parameter count of the
transformers class and of the published model: tests/test_hf_config_archs.py):

======================================  =====================================================
llama, mistral, mixtral, qwen2, phi3    hidden_size, num_hidden_layers, num_attention_heads,
(Llama-style; Phi-3/4 fuse qkv and      intermediate_size, vocab_size; optional
gate_up)                                num_key_value_heads, head_dim, tie_word_embeddings,
                                        hidden_act, attention_bias, mlp_bias,
                                        num_local_experts, num_experts_per_tok
qwen2_moe, qwen3, qwen3_moe             + qk-norm per head (Qwen3), num_experts,
                                        moe_intermediate_size, shared_expert_intermediate_size
                                        (Qwen2-MoE, with its sigmoid gate),
                                        decoder_sparse_step, mlp_only_layers
gemma, gemma2, gemma3_text              GeGLU, tied; Gemma-2/3 sandwich norms; Gemma-2
                                        attn_logit_softcapping / final_logit_softcapping;
                                        Gemma-3 qk-norm
olmo, olmo2                             OLMo: LayerNorm without weights; OLMo-2: norms after
                                        each branch, qk-norm over all heads
deepseek_v2, deepseek_v3                multi-head latent attention (q_lora_rank,
                                        kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim,
                                        v_head_dim), n_routed_experts + n_shared_experts,
                                        moe_intermediate_size, first_k_dense_replace (dense
                                        blocks of intermediate_size); the multi-token-
                                        prediction layers (num_nextn_predict_layers) are
                                        left out, as transformers builds none
phi (phi-2)                             parallel attention + MLP, LayerNorm with bias, biased
                                        linears, untied head with a bias, ``gelu_new``
gpt2                                    n_embd, n_layer, n_head, vocab_size; optional n_inner
                                        (null = 4 * n_embd), n_positions (or n_ctx)
bert (and roberta, xlm-roberta)         hidden_size, num_hidden_layers, num_attention_heads,
                                        intermediate_size, vocab_size; optional
                                        max_position_embeddings, type_vocab_size; the pooler
                                        only when ``architectures`` names a class that has
                                        one (BertForMaskedLM has none)
bloom                                   n_layer, n_head (or num_*), hidden_size (or n_embed),
                                        vocab_size
falcon (and RefinedWeb,                 hidden_size, num_hidden_layers (or n_layer),
RefinedWebModel)                        num_attention_heads (or n_head), vocab_size; optional
                                        num_kv_heads (or n_head_kv), multi_query,
                                        new_decoder_architecture, parallel_attn,
                                        num_ln_in_parallel_attn, ffn_hidden_size, alibi, bias
======================================  =====================================================

Defaults for absent optional keys are the ``transformers`` config-class defaults of that model
type (for example ``tie_word_embeddings`` is true for GPT-2, BERT, BLOOM, Falcon and Gemma,
false otherwise).

Every problem raises ConfigError with a one-line message that starts with the config's name.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

from planner.spec import MlpKind, ModelSpec, NormKind, PositionKind, QkNorm

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "ConfigError",
    "NotModelledError",
    "load_hf_config",
    "spec_from_hf_config",
]


class ConfigError(ValueError):
    """A config.json that cannot be read as a model shape (message is one line)."""


class NotModelledError(ConfigError):
    """A config that fitcheck could read only approximately (``approximate=False``)."""


_LLAMA_STYLE = frozenset({"llama", "mistral", "mixtral", "qwen2", "phi3", "gemma", "gemma2",
                          "gemma3-text", "qwen2-moe", "qwen3", "qwen3-moe", "olmo", "olmo2"})
_DEEPSEEK = frozenset({"deepseek-v2", "deepseek-v3"})
_BERT_STYLE = frozenset({"bert", "roberta", "xlm-roberta"})
_FALCON_STYLE = frozenset({"falcon", "refinedweb", "refinedwebmodel"})
_KNOWN = _LLAMA_STYLE | _DEEPSEEK | _BERT_STYLE | _FALCON_STYLE | {"gpt2", "bloom", "phi"}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_KNOWN | {t.replace("-", "_") for t in _KNOWN}))
"""model_type values read exactly (as transformers spells them, and with ``-`` for ``_``)."""

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

    def __init__(self, cfg: dict[str, Any], label: str, found: list[str] | None = None,
                 remarks: list[str] | None = None) -> None:
        self.cfg = cfg
        self.label = label
        self.missing: list[str] = []
        self.found = [] if found is None else found
        self.remarks = [] if remarks is None else remarks

    def approx(self, what: str) -> None:
        """Something the planner does not model: an error unless approximations are
        accepted."""
        self.found.append(what)

    def note(self, what: str) -> None:
        """A remark about an exact reading (shown with the plan)."""
        self.remarks.append(what)

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


def _next_step(label: str) -> str:
    return (f"give the shape with flags (--layers, --hidden, --heads, --kv-heads, --ffn, "
            f"--vocab, --experts), trace the real class with `fitcheck --config {label} "
            f"--from-trace`, or accept an approximate reading with --approximate "
            f"(model.approximate in a spec)")


def _act(r: _Reader, default: str = "silu") -> MlpKind:
    act = r.get_str("hidden_activation", "hidden_act", default=default).lower()
    if act.startswith("gelu"):
        return MlpKind.GEGLU
    if act not in ("silu", "swish"):
        r.approx(f"gated MLP activation {act!r} (read as SiLU; same parameters)")
    return MlpKind.SWIGLU


def _moe_dense_layers(r: _Reader, n_layers: int, n_experts: int) -> int:
    """Qwen2-MoE / Qwen3-MoE: block i has a dense MLP when i is in mlp_only_layers or
    (i + 1) is not a multiple of decoder_sparse_step (Qwen2MoeDecoderLayer.__init__)."""
    step = r.get_int("decoder_sparse_step", default=1)
    only = r.cfg.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                             for i in only):
        raise r.error(f"mlp_only_layers must be a list of layer indices, got {_show(only)}")
    return sum(1 for i in range(n_layers)
               if i in only or not (n_experts > 0 and (i + 1) % step == 0))


LLAMA_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "vocab_size")
EXPERT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")
TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token", "num_experts_per_token", "moe_top_k",
              "moe_k")
HYBRID_TYPES = frozenset({"jamba", "qwen3-next", "mamba", "mamba2", "falcon-h1", "zamba",
                          "zamba2", "bamba", "nemotron-h", "granitemoehybrid", "lfm2",
                          "minimax", "recurrent-gemma", "rwkv", "xlstm", "plamo2",
                          "qwen3-5", "qwen3-5-moe", "kimi-linear"})
"""model_type values whose blocks are not all attention + MLP (Mamba, linear attention,
recurrences): their parameters and saved tensors are outside what fitcheck counts."""
HYBRID_KEYS = ("attn_layer_period", "attn_layer_offset", "expert_layer_period",
               "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_dt_rank", "ssm_cfg",
               "linear_num_value_heads", "linear_num_key_heads", "linear_key_head_dim",
               "linear_value_head_dim", "linear_conv_kernel_dim", "full_attention_interval",
               "ssm_state_size", "hybrid_override_pattern", "block_types", "layers_block_type")
HYBRID_LAYER_TYPES = ("linear_attention", "mamba", "conv", "recurrent", "ssm", "mamba2",
                      "gated_deltanet", "linear")


def _experts(cfg: dict[str, Any]) -> int:
    """The routed experts a config names under any of the standard keys (0: none)."""
    for k in EXPERT_KEYS:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 1:
            return v
    return 0


def _hybrid(cfg: dict[str, Any], model_type: str) -> list[str]:
    """What makes a config more than attention + MLP blocks: its model_type, keys, or
    layer types."""
    found = [f"model_type {cfg.get('model_type')!r}"] if model_type in HYBRID_TYPES else []
    found += [k for k in HYBRID_KEYS if cfg.get(k) is not None]
    types = cfg.get("layer_types")
    if isinstance(types, list):
        odd = sorted({str(t) for t in types if any(h in str(t).lower()
                                                   for h in HYBRID_LAYER_TYPES)})
        if odd:
            found.append(f"layer_types {', '.join(odd)}")
    return found


def _generic_moe(r: _Reader, n_layers: int, ffn: int) -> tuple[int, int, int, dict] | None:
    """An MoE config of a model_type fitcheck does not know, from the standard keys: routed
    experts (n_routed_experts / num_local_experts / num_experts), experts per token, the
    expert width (moe_intermediate_size, else intermediate_size), shared experts
    (n_shared_experts x the expert width, or shared_expert_intermediate_size), dense blocks
    (first_k_dense_replace, mlp_only_layers / decoder_sparse_step, moe_layer_freq,
    interleave_moe_layer_step) and their width (intermediate_size_mlp, else
    intermediate_size)."""
    cfg = r.cfg
    n = _experts(cfg)
    top_k = next((cfg[k] for k in TOP_K_KEYS if isinstance(cfg.get(k), int)), None)
    if top_k is None:
        top_k = 1
        r.approx(f"no experts-per-token key ({', '.join(TOP_K_KEYS[:2])}): read as 1")
    moe_ffn = r.get_int("moe_intermediate_size", "expert_intermediate_size", default=ffn)
    dense_ffn = r.get_int("intermediate_size_mlp", "dense_intermediate_size", default=ffn)
    shared = 0
    n_shared = cfg.get("n_shared_experts", cfg.get("num_shared_experts"))
    if isinstance(n_shared, int) and not isinstance(n_shared, bool) and n_shared > 0:
        shared = n_shared * moe_ffn
    elif isinstance(cfg.get("shared_expert_intermediate_size"), int):
        shared = cfg["shared_expert_intermediate_size"]
    elif str(cfg.get("model_type", "")).lower().startswith("llama4"):
        shared = moe_ffn  # Llama4TextMoe: one shared expert of intermediate_size
    step = cfg.get("interleave_moe_layer_step", cfg.get("moe_layer_freq", 1))
    first = cfg.get("first_k_dense_replace", 0) or 0
    only = cfg.get("mlp_only_layers") or []
    sparse_step = cfg.get("decoder_sparse_step", 1) or 1
    for key, v in (("interleave_moe_layer_step", step), ("first_k_dense_replace", first),
                   ("decoder_sparse_step", sparse_step)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise r.error(f"{key} must be a non-negative integer, got {_show(v)}")
    if not isinstance(only, list):
        raise r.error(f"mlp_only_layers must be a list of layer indices, got {_show(only)}")
    step = max(step, 1)
    moe_layers = [i for i in range(n_layers) if i >= first and (i + 1) % step == 0
                  and i not in only and (i + 1) % sparse_step == 0]
    if not moe_layers:
        return None
    nd = n_layers - len(moe_layers)
    extra: dict[str, Any] = {}
    if nd:
        extra.update(n_dense_layers=nd, dense_ffn_hidden=dense_ffn)
    if shared:
        extra["shared_ffn"] = shared
    r.approx(f"{n} experts ({top_k} per token) of width {moe_ffn} read from the standard MoE "
             f"keys{f', shared width {shared}' if shared else ''}"
             f"{f', {nd} dense blocks' if nd else ''}")
    return n, top_k, moe_ffn, extra


def config_params(cfg: dict[str, Any]) -> int | None:
    """The parameter count a config's own keys imply, by the usual arithmetic (embeddings,
    attention with grouped heads, gated MLPs or experts): the cross-check printed beside an
    approximate reading. None when the keys needed are missing."""
    if isinstance(cfg.get("text_config"), dict) and "hidden_size" not in cfg:
        cfg = cfg["text_config"]

    def num(*keys: str, default: int | None = None) -> int | None:
        for k in keys:
            v = cfg.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
        return default

    h, layers, vocab = num("hidden_size"), num("num_hidden_layers"), num("vocab_size")
    heads, ffn = num("num_attention_heads"), num("intermediate_size")
    if None in (h, layers, vocab, heads, ffn):
        return None
    kv = num("num_key_value_heads", default=heads)
    hd = num("head_dim", default=h // heads)
    if cfg.get("kv_lora_rank"):  # multi-head latent attention
        q_lora, kv_lora = num("q_lora_rank", default=0), num("kv_lora_rank")
        rope, nope, v = (num("qk_rope_head_dim", default=64), num("qk_nope_head_dim", default=128),
                         num("v_head_dim", default=128))
        q = h * q_lora + q_lora * heads * (rope + nope) if q_lora else h * heads * (rope + nope)
        attn = q + h * (kv_lora + rope) + kv_lora * heads * (nope + v) + heads * v * h
    else:
        attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    n = _experts(cfg)
    moe_ffn = num("moe_intermediate_size", default=ffn)
    dense = 3 * h * num("intermediate_size_mlp", default=ffn)
    first = cfg.get("first_k_dense_replace") or 0
    step = cfg.get("interleave_moe_layer_step") or cfg.get("decoder_sparse_step") or 1
    mlp = 0
    llama4 = str(cfg.get("model_type", "")).startswith("llama4")
    for i in range(layers):
        if n and i >= first and (i + 1) % step == 0:
            shared = (cfg.get("n_shared_experts") or 0) * moe_ffn or \
                (cfg.get("shared_expert_intermediate_size") or 0) or (moe_ffn if llama4 else 0)
            mlp += 3 * h * moe_ffn * n + 3 * h * shared + h * n
        else:
            mlp += dense
    tied = cfg.get("tie_word_embeddings", False) is True
    return vocab * h * (1 if tied else 2) + layers * attn + mlp


_SLIDING_DEFAULT = {"mistral": 4096, "gemma2": 4096, "gemma3-text": 4096}
"""sliding_window defaults of the config classes that have one on by default."""


def _sliding(r: _Reader, mt: str, n_layers: int) -> dict[str, int]:
    """(sliding_window, sliding_layers): which blocks attend through a window. The config's
    ``layer_types`` when it has them (transformers 5); else each class's rule: Mistral,
    Mixtral, Phi-3 every block when sliding_window is set; Qwen2/3 the blocks from
    max_window_layers on when use_sliding_window; Gemma-2 every other block (from the
    first); Gemma-3 all but every sliding_window_pattern-th."""
    window = r.cfg.get("sliding_window", _SLIDING_DEFAULT.get(mt))
    if window is None or window is False:
        return {}
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise r.error(f"sliding_window must be a positive integer or null, got {_show(window)}")
    types = r.cfg.get("layer_types")
    if isinstance(types, list) and len(types) == n_layers:
        n = sum(1 for t in types if t == "sliding_attention")
    elif mt.startswith(("qwen2", "qwen3")):
        if not r.get_bool("use_sliding_window", False):
            return {}
        n = max(0, n_layers - r.get_int("max_window_layers", default=n_layers))
    elif mt == "gemma2":
        n = (n_layers + 1) // 2
    elif mt == "gemma3-text":
        pattern = r.get_int("sliding_window_pattern", default=6)
        n = sum(1 for i in range(n_layers) if (i + 1) % pattern)
    elif mt in ("mistral", "mixtral", "phi3"):
        n = n_layers
    else:
        return {}
    return {"sliding_window": window, "sliding_layers": n} if n else {}


def _llama_style(r: _Reader, mt: str, name: str, *, generic: bool = False) -> ModelSpec:
    hidden = r.get_int("hidden_size")
    n_layers = r.get_int("num_hidden_layers")
    n_heads = r.get_int("num_attention_heads")
    ffn = r.get_int("intermediate_size")
    vocab = r.get_int("vocab_size")
    n_kv = r.get_int("num_key_value_heads", default=0)
    gemma = mt in ("gemma", "gemma2", "gemma3-text")
    head_dim = r.get_int("head_dim", default=256 if gemma else 128 if mt.startswith("qwen3")
                         else 0)
    tied = r.get_bool("tie_word_embeddings", gemma)
    mlp = _act(r, "gelu_pytorch_tanh" if gemma else "silu")
    attention_bias = r.get_bool("attention_bias", False)
    mlp_bias = r.get_bool("mlp_bias", False)
    extra: dict[str, Any] = {}
    n_experts, top_k = 1, 1
    if mt == "mixtral":  # MixtralConfig defaults: 8 experts, 2 per token
        n_experts = r.get_int("num_local_experts", default=8)
        top_k = r.get_int("num_experts_per_tok", default=2)
    elif mt in ("qwen2-moe", "qwen3-moe"):
        # Qwen2MoeConfig: 60 experts, top 4, moe 1408, shared 5632; Qwen3MoeConfig: 128, 8, 768
        q2 = mt == "qwen2-moe"
        n_experts = r.get_int("num_experts", default=60 if q2 else 128)
        top_k = r.get_int("num_experts_per_tok", default=4 if q2 else 8)
        moe_ffn = r.get_int("moe_intermediate_size", default=1408 if q2 else 768)
        r.finish()
        if n_experts > 1:
            nd = _moe_dense_layers(r, n_layers, n_experts)
            if nd >= n_layers:
                n_experts, top_k = 1, 1
            else:
                extra.update(n_dense_layers=nd, dense_ffn_hidden=ffn if nd else 0)
                ffn = moe_ffn
                if q2:
                    extra.update(shared_ffn=r.get_int("shared_expert_intermediate_size",
                                                      default=5632), shared_expert_gate=True)
    elif generic and _experts(r.cfg):
        moe = _generic_moe(r, n_layers, ffn)
        if moe is not None:
            n_experts, top_k, ffn, more = moe
            extra.update(more)
    elif r.cfg.get("num_local_experts") not in (None, 1) or r.cfg.get("num_experts") not in (
            None, 0, 1):
        r.approx(f"experts in a {mt} config (this class has none; the keys are ignored)")
    r.finish()
    if n_experts == 1:
        top_k = 1
    if mt == "mistral" or mt.startswith(("gemma", "olmo", "phi3")):
        if "attention_bias" in r.cfg and attention_bias:
            r.approx(f"attention_bias in a {mt} config (this class has none)")
        attention_bias = False
    if mlp_bias and not attention_bias:
        r.approx("mlp_bias without attention_bias (biases on the MLP only are not modelled; "
                 "read without them)")
    if mt == "qwen2" or mt == "qwen2-moe":
        extra["qkv_bias"] = True  # Qwen2Attention: q/k/v always biased, o never
    elif attention_bias:
        extra.update(qkv_bias=True, attn_out_bias=True)
    if attention_bias and mlp_bias:
        extra["bias"] = True
    if mt in ("qwen3", "qwen3-moe", "gemma3-text"):
        extra["qk_norm"] = QkNorm.HEAD
    if mt == "olmo2":
        extra.update(qk_norm=QkNorm.FULL, post_norms=True, norm_weight_fp32=True)
    if mt == "olmo":
        extra["norm"] = NormKind.LAYERNORM_PLAIN
    if mt == "phi3":
        extra.update(fused_gate_up=True, fused_qkv=True)
    if gemma:
        extra["norm_weight_fp32"] = True
    if mt == "gemma2":
        # Gemma2Config defaults: attn_logit_softcapping 50.0, final_logit_softcapping 30.0
        extra["attn_softcap"] = r.cfg.get("attn_logit_softcapping", 50.0) is not None
        extra["final_softcap"] = r.cfg.get("final_logit_softcapping", 30.0) is not None
    if mt == "gemma3-text":
        extra["attn_softcap"] = r.cfg.get("attn_logit_softcapping") is not None
        extra["final_softcap"] = r.cfg.get("final_logit_softcapping") is not None
    extra.update(_sliding(r, mt, n_layers))
    if head_dim and head_dim * n_heads == hidden and not mt.startswith(("gemma", "qwen3")):
        head_dim = 0  # the default; keep the spec canonical
    return ModelSpec(
        name=name, n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv or n_heads,
        ffn_hidden=ffn, vocab=vocab, head_dim=head_dim, tied_embeddings=tied, mlp=mlp,
        norms_per_layer=4 if mt in ("gemma2", "gemma3-text") else 2,
        n_experts=n_experts, experts_per_token=top_k, **extra,
    )  # fmt: skip


def _deepseek(r: _Reader, mt: str, name: str) -> ModelSpec:
    """DeepseekV2Config / DeepseekV3Config (transformers) and the published configs' keys."""
    v3 = mt == "deepseek-v3"
    hidden = r.get_int("hidden_size")
    n_layers = r.get_int("num_hidden_layers")
    n_heads = r.get_int("num_attention_heads")
    ffn = r.get_int("intermediate_size")
    vocab = r.get_int("vocab_size")
    kv_lora = r.get_int("kv_lora_rank", default=512)
    q_lora = r.get_int("q_lora_rank", default=1536 if v3 else 0)  # null: a plain q_proj
    rope = r.get_int("qk_rope_head_dim", default=64)
    nope = r.get_int("qk_nope_head_dim", default=128)
    v_dim = r.get_int("v_head_dim", default=128)
    n_routed = r.get_int("n_routed_experts", default=256 if v3 else 64)
    n_shared = r.cfg.get("n_shared_experts", 1 if v3 else 2) or 0
    top_k = r.get_int("num_experts_per_tok", default=8 if v3 else 6)
    moe_ffn = r.get_int("moe_intermediate_size", default=2048 if v3 else 1407)
    freq = r.get_int("moe_layer_freq", default=1)
    first_dense = r.cfg.get("first_k_dense_replace", 3 if v3 else 0) or 0
    tied = r.get_bool("tie_word_embeddings", False)
    mlp = _act(r)
    r.finish()
    if not isinstance(n_shared, int) or isinstance(n_shared, bool) or n_shared < 0:
        raise r.error(f"n_shared_experts must be a non-negative integer, got {_show(n_shared)}")
    if not isinstance(first_dense, int) or isinstance(first_dense, bool) or first_dense < 0:
        raise r.error("first_k_dense_replace must be a non-negative integer, got "
                      f"{_show(first_dense)}")
    if r.get_bool("attention_bias", False):
        r.approx("attention_bias in multi-head latent attention (read without the biases)")
    nd = sum(1 for i in range(n_layers) if not (i >= first_dense and i % freq == 0))
    if freq != 1:
        r.approx(f"moe_layer_freq {freq} (dense blocks between MoE blocks counted, but the "
                 "reference order is dense-first)")
    mtp = r.cfg.get("num_nextn_predict_layers") or 0
    if mtp:
        r.note(f"num_nextn_predict_layers {_show(mtp)}: the multi-token-prediction layers are "
               "left out, as transformers builds none")
    moe = nd < n_layers and n_routed > 1
    return ModelSpec(
        name=name, n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_heads,
        ffn_hidden=moe_ffn if moe else ffn, vocab=vocab, head_dim=nope + rope,
        tied_embeddings=tied, mlp=mlp, q_lora_rank=q_lora, kv_lora_rank=kv_lora,
        qk_rope_dim=rope, v_head_dim=v_dim,
        n_experts=n_routed if moe else 1, experts_per_token=top_k if moe else 1,
        shared_ffn=n_shared * moe_ffn if moe else 0, router_fp32=moe,
        n_dense_layers=nd if moe else 0, dense_ffn_hidden=ffn if moe and nd else 0,
    )  # fmt: skip


def _phi(r: _Reader, name: str) -> ModelSpec:
    """PhiConfig (microsoft/phi-1, phi-1_5, phi-2): PhiDecoderLayer runs attention and the MLP
    on one LayerNorm's output and adds both; every linear has a bias, the head too."""
    hidden = r.get_int("hidden_size")
    n_layers = r.get_int("num_hidden_layers")
    n_heads = r.get_int("num_attention_heads")
    ffn = r.get_int("intermediate_size")
    vocab = r.get_int("vocab_size")
    n_kv = r.get_int("num_key_value_heads", default=0)
    tied = r.get_bool("tie_word_embeddings", False)
    act = r.get_str("hidden_act", default="gelu_new").lower()
    rotary = r.cfg.get("partial_rotary_factor", 0.5)  # PhiConfig default
    r.finish()
    if isinstance(rotary, bool) or not isinstance(rotary, (int, float)) or not 0 < rotary <= 1:
        raise r.error(f"partial_rotary_factor must be in (0, 1], got {_show(rotary)}")
    if r.get_bool("qk_layernorm", False):
        r.approx("qk_layernorm (its LayerNorms are not counted)")
    if not act.startswith("gelu"):
        r.approx(f"MLP activation {act!r} (read as GELU)")
    return ModelSpec(
        name=name, n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv or n_heads,
        ffn_hidden=ffn, vocab=vocab, tied_embeddings=tied, mlp=MlpKind.GELU,
        norm=NormKind.LAYERNORM, bias=True, norms_per_layer=1, parallel_block=True,
        head_bias=True, python_gelu=act == "gelu_new", partial_rotary=rotary < 1,
    )  # fmt: skip


def _gpt2(r: _Reader, name: str) -> ModelSpec:
    hidden = r.get_int("n_embd")
    n_layers = r.get_int("n_layer")
    n_heads = r.get_int("n_head")
    vocab = r.get_int("vocab_size")
    ffn = r.get_int("n_inner", default=None)
    positions = r.get_int("n_positions", "n_ctx", default=1024)
    tied = r.get_bool("tie_word_embeddings", True)
    act = r.get_str("activation_function", default="gelu_new").lower()
    r.finish()
    if r.get_bool("add_cross_attention", False):
        r.approx("add_cross_attention (the cross-attention layers are not counted)")
    if not act.startswith("gelu"):
        r.approx(f"activation_function {act!r} (read as GELU)")
    return ModelSpec(
        name=name, n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_heads,
        ffn_hidden=ffn or 4 * hidden, vocab=vocab, tied_embeddings=tied, mlp=MlpKind.GELU,
        norm=NormKind.LAYERNORM, position=PositionKind.LEARNED, max_positions=positions,
        bias=True, python_gelu=act == "gelu_new",
        loss_upcast_since=(4, 49),  # GPT2LMHeadModel: self.loss_function since 4.49
    )  # fmt: skip


_POOLED = ("ForPreTraining", "Model", "ForSequenceClassification", "ForNextSentencePrediction",
           "ForMultipleChoice")
"""BERT-style classes that build the pooler (BertModel(add_pooling_layer=True))."""


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
    arch = r.cfg.get("architectures")
    cls = arch[0] if isinstance(arch, list) and arch and isinstance(arch[0], str) else ""
    pooler = cls.endswith(_POOLED)
    if cls.endswith("ForPreTraining"):
        r.approx(f"{cls}'s next-sentence head (2 x hidden + 2 parameters, not counted)")
    elif cls and not cls.endswith(("ForMaskedLM", "Model")):
        r.approx(f"{cls} is read as the masked-LM class (its task head is not counted)")
    pos_type = r.get_str("position_embedding_type", default="absolute")
    if pos_type != "absolute":
        r.approx(f"position_embedding_type {pos_type!r} (its distance embedding is not counted)")
    if r.get_bool("is_decoder", False) or r.get_bool("add_cross_attention", False):
        r.approx("a BERT decoder / cross-attention (read as the encoder)")
    return ModelSpec(
        name=name, n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_heads,
        ffn_hidden=ffn, vocab=vocab, tied_embeddings=tied, mlp=MlpKind.GELU,
        norm=NormKind.LAYERNORM, position=PositionKind.LEARNED, max_positions=positions,
        bias=True, type_vocab=type_vocab, embedding_norm=True, encoder_head=True,
        pooler=pooler, loss_upcast=False,
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
        loss_upcast_since=(4, 49),  # BloomForCausalLM: self.loss_function since 4.49
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
        loss_upcast_since=(4, 49),  # FalconForCausalLM: self.loss_function since 4.49
    )  # fmt: skip


_TOWERS = ("vision_config", "audio_config", "vision_tower", "visual", "speech_config")
"""Keys of a multimodal config whose encoder a language-model reading leaves out."""


def spec_from_hf_config(cfg: dict[str, Any], name: str, *, notes: list[str] | None = None,
                        approximate: bool = False) -> ModelSpec:
    """The ModelSpec a parsed config.json describes; ``name`` labels the spec and the errors.

    A config that fitcheck models only approximately raises NotModelledError (a ConfigError)
    naming what is missing and the next step, unless ``approximate``; ``notes`` (optional)
    then collects one line per accepted approximation, and remarks such as the left-out
    multi-token-prediction layers.
    """
    if not isinstance(cfg, dict):
        raise ConfigError(f"{name}: expected a JSON object, got {type(cfg).__name__}")
    found: list[str] = []
    remarks: list[str] = []
    spec = _spec_from_hf_config(cfg, name, found, remarks, 0)
    if found and not approximate:
        raise NotModelledError(f"{name}: fitcheck does not model {'; '.join(found)}; "
                               + _next_step(name))
    if found:
        _cross_check(cfg, spec, name, found)
    if notes is not None:
        from planner.notices import Kind, Notice

        notes.extend(Notice(f"{name}: approximate reading: {f}", Kind.APPROXIMATE_READING)
                     for f in found)
        notes.extend(Notice(f"{name}: {x}", Kind.CONFIG) for x in remarks)
    p = _dropout(cfg, name)
    family, attn = _family_and_attention(cfg, name)
    return dataclasses.replace(spec, dropout=p or spec.dropout, family=family,
                               attn_implementation=attn)


def _family_and_attention(cfg: dict[str, Any], name: str) -> tuple[str, str]:
    """The model_type read (the language model's, under a wrapper's text_config) and the
    attention the config names (``attn_implementation`` or ``_attn_implementation``, which
    transformers' PretrainedConfig takes as the requested implementation), "" when none."""
    attn = ""
    for depth in range(MAX_NESTING + 1):
        for key in ("attn_implementation", "_attn_implementation"):
            raw = cfg.get(key)
            if raw is not None and not isinstance(raw, str):
                raise ConfigError(f"{name}: {key} must be a string, got {_show(raw)}")
            attn = attn or (raw or "")
        model_type = str(cfg.get("model_type") or "").lower().replace("_", "-")
        inner = cfg.get("text_config")
        if model_type in _KNOWN or not isinstance(inner, dict) or depth == MAX_NESTING:
            break
        cfg = inner
    if not model_type and "n_embd" in cfg:
        model_type = "gpt2"
    return model_type, attn


CROSS_CHECK = 0.05
"""An approximate reading whose parameter count differs from the config's own arithmetic by
more than this says so beside the plan."""


def _cross_check(cfg: dict[str, Any], spec: ModelSpec, name: str, found: list[str]) -> None:
    from planner.params import total_params

    own = config_params(cfg)
    if own is None:
        return
    got = total_params(spec)
    if abs(got - own) > CROSS_CHECK * own:
        found.append(f"planned with {got / 1e9:,.2f}B parameters; the config's own arithmetic "
                     f"(embeddings, attention, MLP or experts) gives {own / 1e9:,.2f}B")


def _spec_from_hf_config(cfg: dict[str, Any], name: str, found: list[str], remarks: list[str],
                         depth: int) -> ModelSpec:
    raw_type = cfg.get("model_type")
    if raw_type is not None and not isinstance(raw_type, str):
        raise ConfigError(f"{name}: model_type must be a string, got {_show(raw_type)}")
    model_type = (raw_type or "").lower().replace("_", "-")
    if model_type == "gpt2" or (not model_type and "n_embd" in cfg):
        model_type = "gpt2"
    towers = [k for k in _TOWERS if cfg.get(k) is not None]
    if towers:
        found.append(f"the {' and '.join(k.removesuffix('_config') for k in towers)} encoder of "
                     f"model_type {raw_type!r} (only its language model is read)")
    # Multimodal wrappers keep the language model's shape under text_config.
    if model_type not in _KNOWN and isinstance(cfg.get("text_config"), dict):
        if depth >= MAX_NESTING:
            raise ConfigError(f"{name}: text_config nested more than {MAX_NESTING} deep")
        if not towers:
            found.append(f"model_type {raw_type!r} around its text_config (only the language "
                         "model under text_config is read)")
        return _spec_from_hf_config(cfg["text_config"], name, found, remarks, depth + 1)
    r = _Reader(cfg, name, found, remarks)
    try:
        if model_type in _LLAMA_STYLE:
            return _llama_style(r, model_type, name)
        if model_type in _DEEPSEEK:
            return _deepseek(r, model_type, name)
        if model_type == "phi":
            return _phi(r, name)
        if model_type == "gpt2":
            return _gpt2(r, name)
        if model_type in _BERT_STYLE:
            return _bert(r, name)
        if model_type == "bloom":
            return _bloom(r, name)
        if model_type in _FALCON_STYLE:
            return _falcon(r, model_type, name)
        what = f"model_type {raw_type!r}" if raw_type else "a config without model_type"
        hybrid = _hybrid(cfg, model_type)
        if hybrid and all(cfg.get(k) is not None for k in LLAMA_KEYS):
            # read as a Llama-style decoder it would plan as its attention trunk alone
            raise ConfigError(
                f"{name}: {what} is not supported: it is not attention + MLP blocks only "
                f"({'; '.join(hybrid)}): "
                "fitcheck counts neither the parameters nor the saved tensors of its other "
                "layers, even approximately; describe it with the shape flags (--layers, "
                "--hidden, --heads, --ffn, --experts) or trace the real class with `fitcheck "
                f"--config {name} --from-trace`")
        if cfg.get("kv_lora_rank") and _experts(cfg):
            spec = _deepseek(r, "deepseek-v3", name)
            found.append(f"{what} (read as DeepSeek-V3: multi-head latent attention, "
                         f"{spec.n_experts} routed experts)")
            return spec
        try:
            spec = _llama_style(r, "llama", name, generic=True)
        except ConfigError as exc:
            if not r.missing:
                raise
            supported = ", ".join(sorted(_KNOWN))
            raise ConfigError(
                f"{name}: {what} is not supported and the Llama-style keys are missing"
                f" ({', '.join(r.missing)}); supported model types: {supported}; trace the real "
                f"class with `fitcheck --config {name} --from-trace`") from exc
        found.append(f"{what} (read as a Llama-style decoder: {spec.mlp.value}, rmsnorm, rope)")
        return spec
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


def load_hf_config(path: str | os.PathLike[str], *, notes: list[str] | None = None,
                   approximate: bool = False) -> ModelSpec:
    """Read ``path`` (a config.json, or a directory holding one) into a ModelSpec
    (``notes``, ``approximate``: as spec_from_hf_config)."""
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
    return spec_from_hf_config(cfg, label, notes=notes, approximate=approximate)
