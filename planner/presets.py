"""Built-in model presets: the shapes of well-known models, by short id.

Every shape is copied from the model's official Hugging Face ``config.json`` (URL in the
comment above each entry). ``tests/test_presets.py`` checks each preset's ``total_params``
against the published parameter count, so a wrong number here fails a test.

The reference layout (``planner/params.py``) uses separate q/k/v and gate/up projections where
some checkpoints fuse them (GPT-2 ``c_attn``, Falcon/BLOOM ``query_key_value``, Phi-3
``qkv_proj``/``gate_up_proj``); the element counts are the same.
"""

from __future__ import annotations

import dataclasses
import re

from planner.spec import MlpKind, ModelSpec, NormKind, PositionKind, QkNorm

__all__ = ["PRESETS", "UnknownModelError", "base_name", "get_preset", "list_presets",
           "resolve_name"]


class UnknownModelError(ValueError, KeyError):
    """No preset has this name: a ValueError (bad input) that ``except KeyError`` catches too."""

    def __init__(self, name: str, suggestions: list[str]) -> None:
        self.name = name
        self.suggestions = suggestions
        if "/" in name:  # a hub id: its config is what says the shape, not its name
            hint = ("fitcheck does not download configs: give --config path/to/config.json (the "
                    "repository's config.json)")
            if suggestions:
                hint += f", or --model {' / '.join(suggestions)} (the same config)"
        elif suggestions:
            hint = "did you mean " + ", ".join(suggestions) + "?"
        else:
            hint = "known models: " + ", ".join(list_presets())
        super().__init__(f"unknown model {name!r}; {hint}")

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


def _gpt2(name: str, n_layers: int, hidden: int, n_heads: int) -> ModelSpec:
    # GPT-2: Conv1D layers all with bias, LayerNorm, learned 1024-row position table,
    # lm_head tied to wte, MLP 4h (n_inner null).
    return ModelSpec(
        name=name, n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_heads,
        ffn_hidden=4 * hidden, vocab=50257, tied_embeddings=True, mlp=MlpKind.GELU,
        norm=NormKind.LAYERNORM, position=PositionKind.LEARNED, max_positions=1024, bias=True,
        dropout=0.1,  # resid_pdrop = embd_pdrop = attn_pdrop = 0.1
        python_gelu=True,  # activation_function "gelu_new": NewGELUActivation, op by op
        loss_upcast_since=(4, 49),  # GPT2LMHeadModel: self.loss_function since 4.49
    )  # fmt: skip


def _bert(name: str, n_layers: int, hidden: int, n_heads: int) -> ModelSpec:
    # BERT (uncased vocab 30522): post-norm encoder, embeddings LayerNorm, 512 learned positions,
    # 2 token types, MLM head (dense + LayerNorm + decoder bias, decoder tied) and pooler.
    return ModelSpec(
        name=name, n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_heads,
        ffn_hidden=4 * hidden, vocab=30522, tied_embeddings=True, mlp=MlpKind.GELU,
        norm=NormKind.LAYERNORM, position=PositionKind.LEARNED, max_positions=512, bias=True,
        type_vocab=2, embedding_norm=True, encoder_head=True,
        dropout=0.1,  # hidden_dropout_prob = attention_probs_dropout_prob = 0.1
        loss_upcast=False,  # BertForPreTraining/ForMaskedLM: CrossEntropyLoss on the logits
    )  # fmt: skip


def _llama(
    name: str, n_layers: int, hidden: int, n_heads: int, n_kv_heads: int, ffn: int, vocab: int,
    *, tied: bool = False, head_dim: int = 0, qkv_bias: bool = False,
    n_experts: int = 1, experts_per_token: int = 1,
) -> ModelSpec:
    # Llama-style decoder: SwiGLU, RMSNorm, RoPE, no biases, pre-norm (2 norms per block).
    return ModelSpec(
        name=name, n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv_heads,
        ffn_hidden=ffn, vocab=vocab, head_dim=head_dim, tied_embeddings=tied,
        qkv_bias=qkv_bias, n_experts=n_experts, experts_per_token=experts_per_token,
    )  # fmt: skip


def _gemma2(
    name: str, n_layers: int, hidden: int, n_heads: int, n_kv_heads: int, head_dim: int, ffn: int
) -> ModelSpec:
    # Gemma-2: GeGLU (gelu_pytorch_tanh), RMSNorm, RoPE, sandwich norms (4 per block),
    # explicit head_dim, vocab 256000, tied embeddings.
    return ModelSpec(
        name=name, n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv_heads,
        head_dim=head_dim, ffn_hidden=ffn, vocab=256000, tied_embeddings=True,
        mlp=MlpKind.GEGLU, norms_per_layer=4,
        attn_softcap=True, final_softcap=True,  # attn_logit_softcapping 50, final 30
        sliding_window=4096, sliding_layers=(n_layers + 1) // 2,  # every other block
        norm_weight_fp32=True,  # Gemma2RMSNorm: x_normed * (1 + weight) in fp32
    )  # fmt: skip


def _bloom(name: str, n_layers: int, hidden: int, n_heads: int) -> ModelSpec:
    # BLOOM: ALiBi, LayerNorm after the embeddings, biases everywhere, MLP 4h, tied lm_head.
    return ModelSpec(
        name=name, n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_heads,
        ffn_hidden=4 * hidden, vocab=250880, tied_embeddings=True, mlp=MlpKind.GELU,
        norm=NormKind.LAYERNORM, position=PositionKind.ALIBI, bias=True, embedding_norm=True,
        loss_upcast_since=(4, 49),  # BloomForCausalLM: self.loss_function since 4.49
    )  # fmt: skip


_ALL: list[ModelSpec] = [
    # https://huggingface.co/openai-community/gpt2/blob/main/config.json  (12 x 768, 12 heads)
    _gpt2("gpt2", 12, 768, 12),
    # https://huggingface.co/openai-community/gpt2-medium/blob/main/config.json  (24 x 1024, 16)
    _gpt2("gpt2-medium", 24, 1024, 16),
    # https://huggingface.co/openai-community/gpt2-large/blob/main/config.json  (36 x 1280, 20)
    _gpt2("gpt2-large", 36, 1280, 20),
    # https://huggingface.co/openai-community/gpt2-xl/blob/main/config.json  (48 x 1600, 25)
    _gpt2("gpt2-xl", 48, 1600, 25),
    # https://huggingface.co/google-bert/bert-base-uncased/blob/main/config.json
    _bert("bert-base", 12, 768, 12),
    # https://huggingface.co/google-bert/bert-large-uncased/blob/main/config.json
    _bert("bert-large", 24, 1024, 16),
    # https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json
    _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000),
    # https://huggingface.co/meta-llama/Llama-2-13b-hf/blob/main/config.json
    _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000),
    # https://huggingface.co/meta-llama/Llama-2-70b-hf/blob/main/config.json
    _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000),
    # https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json
    _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256),
    # https://huggingface.co/meta-llama/Meta-Llama-3-70B/blob/main/config.json
    _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256),
    # https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json
    _llama("llama3.1-8b", 32, 4096, 32, 8, 14336, 128256),
    # https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json
    _llama("llama3.1-70b", 80, 8192, 64, 8, 28672, 128256),
    # https://huggingface.co/meta-llama/Llama-3.1-405B/blob/main/config.json
    _llama("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256),
    # https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json  (head_dim 64, tied)
    _llama("llama3.2-1b", 16, 2048, 32, 8, 8192, 128256, tied=True),
    # https://huggingface.co/meta-llama/Llama-3.2-3B/blob/main/config.json  (head_dim 128, tied)
    _llama("llama3.2-3b", 28, 3072, 24, 8, 8192, 128256, tied=True),
    # https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json
    dataclasses.replace(_llama("mistral-7b", 32, 4096, 32, 8, 14336, 32000),
                        sliding_window=4096, sliding_layers=32),
    # https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json
    # (num_local_experts 8, num_experts_per_tok 2)
    _llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, n_experts=8, experts_per_token=2),
    # https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json  (q/k/v bias in Qwen2Attention)
    _llama("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, qkv_bias=True),
    # https://huggingface.co/Qwen/Qwen2.5-72B/blob/main/config.json
    _llama("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064, qkv_bias=True),
    # https://huggingface.co/google/gemma-2-9b/blob/main/config.json
    _gemma2("gemma2-9b", 42, 3584, 16, 8, 256, 14336),
    # https://huggingface.co/google/gemma-2-27b/blob/main/config.json
    _gemma2("gemma2-27b", 46, 4608, 32, 16, 128, 36864),
    # https://huggingface.co/tiiuae/falcon-7b/blob/main/config.json
    # multi_query (1 KV head), parallel_attn with one input LayerNorm, bias false, MLP 4h,
    # RoPE. lm_head is tied to word_embeddings (FalconForCausalLM ties them; the checkpoint
    # stores a copy, so the Hub's file-based count of 7.22B counts the table twice).
    ModelSpec(
        name="falcon-7b", n_layers=32, hidden=4544, n_heads=71, n_kv_heads=1,
        ffn_hidden=4 * 4544, vocab=65024, tied_embeddings=True, mlp=MlpKind.GELU,
        norm=NormKind.LAYERNORM, norms_per_layer=1, parallel_block=True,
        loss_upcast_since=(4, 49),  # FalconForCausalLM: self.loss_function since 4.49
    ),  # fmt: skip
    # https://huggingface.co/tiiuae/falcon-40b/blob/main/config.json
    # new_decoder_architecture: 8 KV groups, parallel block with two LayerNorms (ln_attn, ln_mlp).
    ModelSpec(
        name="falcon-40b", n_layers=60, hidden=8192, n_heads=128, n_kv_heads=8,
        ffn_hidden=4 * 8192, vocab=65024, tied_embeddings=True, mlp=MlpKind.GELU,
        norm=NormKind.LAYERNORM, norms_per_layer=2, parallel_block=True,
        loss_upcast_since=(4, 49),
    ),  # fmt: skip
    # https://huggingface.co/bigscience/bloom-560m/blob/main/config.json
    _bloom("bloom-560m", 24, 1024, 16),
    # https://huggingface.co/bigscience/bloom-7b1/blob/main/config.json
    _bloom("bloom-7b1", 30, 4096, 32),
    # https://huggingface.co/microsoft/Phi-3-mini-4k-instruct/blob/main/config.json
    # (fused qkv_proj / gate_up_proj, MHA, vocab 32064, untied)
    dataclasses.replace(_llama("phi3-mini", 32, 3072, 32, 32, 8192, 32064), fused_gate_up=True,
                        fused_qkv=True, sliding_window=2047, sliding_layers=32),
]

# Variants whose config differs from their base's only in the sliding window (which sets the
# SDPA masks kept past the window, planner.activations):
# https://huggingface.co/microsoft/Phi-3-mini-128k-instruct/blob/main/config.json and
# Phi-3.5-mini-instruct: sliding_window 262144; Mistral-7B-Instruct-v0.2: sliding_window null
_BY_NAME = {spec.name: spec for spec in _ALL}
_ALL += [
    dataclasses.replace(_BY_NAME["phi3-mini"], name="phi3-mini-128k", sliding_window=262144),
    dataclasses.replace(_BY_NAME["mistral-7b"], name="mistral-7b-v0.2", sliding_window=0,
                        sliding_layers=0),
]

# ---- issue 13: the families read from config.json (tests/data/configs/archs has each file) --
_ALL += [
    # https://huggingface.co/Qwen/Qwen1.5-MoE-A2.7B/blob/main/config.json: 60 experts of 1408,
    # top 4, a shared expert of 5632 with its sigmoid gate, q/k/v biases
    dataclasses.replace(
        _llama("qwen1.5-moe-a2.7b", 24, 2048, 16, 16, 1408, 151936, qkv_bias=True,
               n_experts=60, experts_per_token=4),
        shared_ffn=5632, shared_expert_gate=True),
    # https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json (head_dim 128, qk-norm)
    dataclasses.replace(_llama("qwen3-8b", 36, 4096, 32, 8, 12288, 151936, head_dim=128),
                        qk_norm=QkNorm.HEAD),
    # https://huggingface.co/Qwen/Qwen3-14B/blob/main/config.json (head_dim 128, qk-norm, untied)
    dataclasses.replace(_llama("qwen3-14b", 40, 5120, 40, 8, 17408, 151936, head_dim=128),
                        qk_norm=QkNorm.HEAD),
    # https://huggingface.co/Qwen/Qwen3-32B/blob/main/config.json: 64 heads of 128 (q width 8192
    # over a 5120 residual), qk-norm, untied; torchtitan's qwen3 "32B" flavor is the same shape
    dataclasses.replace(_llama("qwen3-32b", 64, 5120, 64, 8, 25600, 151936, head_dim=128),
                        qk_norm=QkNorm.HEAD),
    # https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json: 128 experts of 768, top 8
    dataclasses.replace(_llama("qwen3-30b-a3b", 48, 2048, 32, 4, 768, 151936, head_dim=128,
                               n_experts=128, experts_per_token=8), qk_norm=QkNorm.HEAD),
    # https://huggingface.co/google/gemma-3-1b-pt/blob/main/config.json (gemma3_text)
    dataclasses.replace(_gemma2("gemma3-1b", 26, 1152, 4, 1, 256, 6912), vocab=262144,
                        attn_softcap=False, final_softcap=False, qk_norm=QkNorm.HEAD,
                        sliding_window=512, sliding_layers=22),  # 5 of every 6 blocks
    # https://huggingface.co/allenai/OLMo-1B-hf/blob/main/config.json: weightless LayerNorm
    dataclasses.replace(_llama("olmo-1b", 16, 2048, 16, 16, 8192, 50304, tied=True),
                        norm=NormKind.LAYERNORM_PLAIN),
    # https://huggingface.co/allenai/OLMo-2-1124-7B/blob/main/config.json: norms after the
    # branches (fp32 weight multiply), qk-norm over all heads
    dataclasses.replace(_llama("olmo2-7b", 32, 4096, 32, 32, 11008, 100352),
                        qk_norm=QkNorm.FULL, post_norms=True, norm_weight_fp32=True),
    # https://huggingface.co/microsoft/phi-2/blob/main/config.json: parallel block, biases,
    # gelu_new, partial_rotary_factor 0.4, resid_pdrop 0.1
    ModelSpec(
        name="phi-2", n_layers=32, hidden=2560, n_heads=32, n_kv_heads=32, ffn_hidden=10240,
        vocab=51200, mlp=MlpKind.GELU, norm=NormKind.LAYERNORM, bias=True, norms_per_layer=1,
        parallel_block=True, head_bias=True, python_gelu=True, partial_rotary=True,
        dropout=0.1,
    ),
    # https://huggingface.co/microsoft/phi-4/blob/main/config.json (phi3 layout)
    dataclasses.replace(_llama("phi-4", 40, 5120, 40, 10, 17920, 100352), fused_gate_up=True,
                        fused_qkv=True),
    # https://huggingface.co/deepseek-ai/DeepSeek-V2-Lite/blob/main/config.json: MLA without q
    # compression, 64 experts of 1408 (top 6) + 2 shared, the first block dense (10944)
    ModelSpec(
        name="deepseek-v2-lite", n_layers=27, hidden=2048, n_heads=16, n_kv_heads=16,
        ffn_hidden=1408, vocab=102400, head_dim=192, kv_lora_rank=512, qk_rope_dim=64,
        v_head_dim=128, n_experts=64, experts_per_token=6, shared_ffn=2816,
        n_dense_layers=1, dense_ffn_hidden=10944, router_fp32=True,
    ),
    # https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json: MLA (q rank 1536),
    # 256 experts of 2048 (top 8) + 1 shared, 3 dense blocks (18432); MTP layers left out
    ModelSpec(
        name="deepseek-v3", n_layers=61, hidden=7168, n_heads=128, n_kv_heads=128,
        ffn_hidden=2048, vocab=129280, head_dim=192, q_lora_rank=1536, kv_lora_rank=512,
        qk_rope_dim=64, v_head_dim=128, n_experts=256, experts_per_token=8, shared_ffn=2048,
        n_dense_layers=3, dense_ffn_hidden=18432, router_fp32=True,
    ),
]

_FAMILY_PREFIXES = (
    ("gpt2", "gpt2"), ("bert", "bert"), ("llama", "llama"), ("mixtral", "mixtral"),
    ("mistral", "mistral"), ("qwen2.5", "qwen2"), ("qwen1.5-moe", "qwen2-moe"),
    ("qwen3-30b-a3b", "qwen3-moe"), ("qwen3", "qwen3"), ("gemma2", "gemma2"),
    ("gemma3", "gemma3-text"), ("falcon", "falcon"), ("bloom", "bloom"), ("phi3", "phi3"),
    ("phi-4", "phi3"), ("phi-2", "phi"), ("olmo2", "olmo2"), ("olmo", "olmo"),
    ("deepseek-v2", "deepseek-v2"), ("deepseek-v3", "deepseek-v3"),
)
"""Preset id prefix -> the ``model_type`` of the config.json each preset cites (first match;
the default attention follows it: planner/attention.py)."""


def _with_family(spec: ModelSpec) -> ModelSpec:
    family = next(f for prefix, f in _FAMILY_PREFIXES if spec.name.startswith(prefix))
    return dataclasses.replace(spec, family=family)


PRESETS: dict[str, ModelSpec] = {spec.name: _with_family(spec) for spec in _ALL}
"""Preset id -> shape. ModelSpec is frozen, so sharing the instances is safe."""

# Hugging Face repository ids (and a few common spellings) that name a preset.
_ALIASES: dict[str, str] = {
    "openai-community/gpt2": "gpt2",
    "openai-community/gpt2-medium": "gpt2-medium",
    "openai-community/gpt2-large": "gpt2-large",
    "openai-community/gpt2-xl": "gpt2-xl",
    "gpt2-small": "gpt2",
    "bert-base-uncased": "bert-base",
    "google-bert/bert-base-uncased": "bert-base",
    "bert-large-uncased": "bert-large",
    "google-bert/bert-large-uncased": "bert-large",
    "meta-llama/llama-2-7b-hf": "llama2-7b",
    "meta-llama/llama-2-13b-hf": "llama2-13b",
    "meta-llama/llama-2-70b-hf": "llama2-70b",
    "meta-llama/meta-llama-3-8b": "llama3-8b",
    "meta-llama/meta-llama-3-70b": "llama3-70b",
    "meta-llama/llama-3.1-8b": "llama3.1-8b",
    "meta-llama/llama-3.1-70b": "llama3.1-70b",
    "meta-llama/llama-3.1-405b": "llama3.1-405b",
    "meta-llama/meta-llama-3.1-8b": "llama3.1-8b",
    "meta-llama/meta-llama-3.1-70b": "llama3.1-70b",
    "meta-llama/meta-llama-3.1-405b": "llama3.1-405b",
    "meta-llama/llama-3.2-1b": "llama3.2-1b",
    "meta-llama/llama-3.2-3b": "llama3.2-3b",
    "mistralai/mistral-7b-v0.1": "mistral-7b",
    "mistralai/mixtral-8x7b-v0.1": "mixtral-8x7b",
    "qwen/qwen2.5-7b": "qwen2.5-7b",
    "qwen/qwen2.5-72b": "qwen2.5-72b",
    "google/gemma-2-9b": "gemma2-9b",
    "google/gemma-2-27b": "gemma2-27b",
    "tiiuae/falcon-7b": "falcon-7b",
    "tiiuae/falcon-40b": "falcon-40b",
    "bigscience/bloom-560m": "bloom-560m",
    "bigscience/bloom-7b1": "bloom-7b1",
    "microsoft/phi-3-mini-4k-instruct": "phi3-mini",
    "phi-3-mini": "phi3-mini",
    # Repositories with the same architecture fields as a preset's base config
    # (/work/notes/issue13/hub_ids.md; -Instruct/-Chat/-it/-hf variants need no entry:
    # resolve_name strips those suffixes).
    "nousresearch/meta-llama-3-8b": "llama3-8b",  # ungated mirrors of the Meta repositories
    "nousresearch/meta-llama-3-70b": "llama3-70b",
    "nousresearch/meta-llama-3.1-8b": "llama3.1-8b",
    "nousresearch/meta-llama-3.1-70b": "llama3.1-70b",
    "casperhansen/llama-3-70b-fp16": "llama3-70b",
    "meta-llama/llama-3.3-70b-instruct": "llama3.1-70b",  # same shape as 3.1-70B
    "qwen/qwen2-7b": "qwen2.5-7b",  # 3584 x 28, GQA 28/4, ffn 18944, vocab 152064, q/k/v bias
    # rope_theta 1e6 and no sliding window (the v0.2 preset: no window masks past 4096)
    "mistralai/mistral-7b-instruct-v0.2": "mistral-7b-v0.2",
    "microsoft/phi-3-mini-128k-instruct": "phi3-mini-128k",  # longrope, window 262144
    "microsoft/phi-3.5-mini-instruct": "phi3-mini-128k",
    "qwen/qwen1.5-moe-a2.7b": "qwen1.5-moe-a2.7b",
    "qwen/qwen3-8b": "qwen3-8b",
    "qwen/qwen3-8b-base": "qwen3-8b",
    "qwen/qwen3-14b": "qwen3-14b",
    "qwen/qwen3-14b-base": "qwen3-14b",
    "qwen/qwen3-32b": "qwen3-32b",
    "qwen/qwen3-30b-a3b": "qwen3-30b-a3b",
    "qwen/qwen3-30b-a3b-base": "qwen3-30b-a3b",
    "google/gemma-3-1b-pt": "gemma3-1b",
    "google/gemma-3-1b": "gemma3-1b",  # -it stripped
    "allenai/olmo-1b-hf": "olmo-1b",
    "allenai/olmo-2-1124-7b": "olmo2-7b",
    "microsoft/phi-2": "phi-2",
    "microsoft/phi-4": "phi-4",
    "deepseek-ai/deepseek-v2-lite": "deepseek-v2-lite",
    "deepseek-ai/deepseek-v3": "deepseek-v3",
    "deepseek-ai/deepseek-v3-base": "deepseek-v3",
}

# Post-trained variants whose config is NOT the base's, so the suffix must not be stripped
# (hub_ids.md): Mistral v0.3 and Mixtral-8x22B-Instruct use the 32768-token v3 tokenizer.
_DIFFERENT_VARIANTS: frozenset[str] = frozenset({
    "mistralai/mistral-7b-instruct-v0.3",
    "mistralai/mixtral-8x22b-instruct-v0.1",
})
_VARIANT_TOKENS = ("instruct", "chat", "it", "hf")
"""Trailing name tokens of post-trained or converted repositories that keep the base config
(Llama-2-7b-chat-hf, Llama-3.1-8B-Instruct, gemma-2-9b-it, Mistral-7B-Instruct-v0.1)."""


def _key(name: str) -> str:
    """Loose form of a name: lower case, no separators ('Llama-2-7B' == 'llama2_7b')."""
    return re.sub(r"[\s_.\-]+", "", name.lower())


def base_name(name: str) -> str:
    """The name without variant tokens: 'meta-llama/Llama-2-7b-chat-hf' ->
    'meta-llama/llama-2-7b', 'mistralai/Mistral-7B-Instruct-v0.1' -> 'mistralai/mistral-7b-v0.1'.
    A version tail (-v0.1) stays; only tokens right before it or at the end go."""
    tokens = name.strip().lower().split("-")
    out: list[str] = []
    for i, tok in enumerate(tokens):
        later = tokens[i + 1:]
        tail = all(t in _VARIANT_TOKENS or re.fullmatch(r"v\d+(\.\d+)*", t) for t in later)
        if tok in _VARIANT_TOKENS and i > 0 and tail:
            continue
        out.append(tok)
    return "-".join(out)


_LOOKUP: dict[str, str] = {}
for _name in PRESETS:
    _LOOKUP[_key(_name)] = _name
for _alias, _target in _ALIASES.items():
    _LOOKUP.setdefault(_key(_alias), _target)
_BASE_LOOKUP: dict[str, str] = {}
for _alias, _target in [*((p, p) for p in PRESETS), *_ALIASES.items()]:
    _BASE_LOOKUP.setdefault(_key(base_name(_alias)), _target)


def list_presets() -> list[str]:
    """Preset ids, in catalogue order (families together, small to large)."""
    return list(PRESETS)


def resolve_name(name: str) -> str | None:
    """The preset id ``name`` refers to (exact id, HF repo id or loose spelling, with or without
    an -Instruct/-Chat/-it/-hf suffix that keeps the base config), or None."""
    name = name.strip()
    if name in PRESETS:
        return name
    found = _LOOKUP.get(_key(name))
    if found is not None or name.lower() in _DIFFERENT_VARIANTS:
        return found
    return _BASE_LOOKUP.get(_key(base_name(name)))


def get_preset(name: str) -> ModelSpec:
    """The preset called ``name``; raises UnknownModelError (with close matches) otherwise."""
    resolved = resolve_name(name)
    if resolved is not None:
        return PRESETS[resolved]
    import difflib  # only on the error path: keeps the planner's import light

    if "/" in name:
        # a hub id no alias names: a preset of a similar name may differ in shape (Mistral-7B
        # v0.3's 32768-token vocabulary is not v0.2's 32000), so none is offered
        raise UnknownModelError(name, [])
    lowered = name.strip().lower()
    suggestions = difflib.get_close_matches(lowered, list(PRESETS), n=3, cutoff=0.6)
    if not suggestions:  # try the loose spelling against the loose ids
        by_key = {_key(p): p for p in PRESETS}
        suggestions = [
            by_key[k] for k in difflib.get_close_matches(_key(name), list(by_key), n=3, cutoff=0.6)
        ]
    raise UnknownModelError(name, suggestions)
