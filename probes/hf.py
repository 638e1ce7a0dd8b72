"""The real Hugging Face model class, built from a config.json alone, for the trace.

No weights, no download, no GPU: ``transformers`` builds the class named by the config on the
meta device; ``probes.trace`` shards it, materialises it on fake CPU tensors and runs the step.

- ``resolve_config(value)``: a config.json path, its directory, or a hub id whose config is in
  the local Hugging Face cache (``huggingface_hub.try_to_load_from_cache``; nothing is
  fetched) -> the file. ``read_config(path)`` -> the dict. Both raise ``HfConfigError``
  (one line, exit 4 at the CLI).
- ``hf_factory(config, layers=N)``: a ``probes.trace.ModelFactory`` for the class, optionally
  cut to its first N decoder layers (``num_hidden_layers`` and every per-layer list of the
  config cut alike), for the scaled trace (probes/trace_plan.py).
- ``inspect(job)``: the full-depth module's structure and parameter counts (what the step-time
  model needs, and whether its layers repeat, so that a shallow trace can be scaled).

How the class is chosen: the config's ``architectures[0]`` when ``transformers`` has it and it
is a language-model head (``...ForCausalLM``, ``...LMHeadModel``, ``...ForMaskedLM``,
``...ForPreTraining``), else ``AutoModelForCausalLM``, else ``AutoModelForMaskedLM``. The loss
is the class's own (``labels=`` a second token tensor; ``next_sentence_label`` too for
pre-training heads). ``use_cache=False`` (no KV cache in training); the attention kernel is
``attn_implementation`` = the training's ``--attention`` (sdpa or eager); parameters fp32 (the
loop casts for pure bf16).

Decoder layers: the ``nn.ModuleList`` with the most parameters whose children are all of one
class listed in the model's ``_no_split_modules`` (else of any one class). Checkpointing wraps
each of them with ``torch.distributed.algorithms._checkpoint.checkpoint_wrapper``
(non-reentrant, as torchtitan and accelerate do); selective = torchtitan's op-level SAC
policy (probes/models.py). Each (wrapped) layer is one FSDP unit, the root another.

What a GPU run does that fake CPU tensors would not (``hf_kernel_context``, around forward and
backward): dropout runs as ``aten.native_dropout`` (CUDA's kernel saves a 1-byte mask; CPU's
``F.dropout`` an input-dtype noise tensor); SDPA's ``dropout_p`` is set to 0 (CUDA's flash /
efficient kernels keep only the RNG seed and offset; the CPU kernel would fall back to the
math path and keep the T x T probabilities); SDPA whose value head differs from the query's
(DeepSeek's multi-head latent attention) runs as CUDA's memory-efficient kernel (the CPU
dispatch would take the math path); and transformers' packed-batch check, which reads
the position ids' values, answers "not packed" as it does on a real batch of sequences (on
fake tensors it cannot read them and would build a T x T mask, turning off SDPA's is_causal
and GQA). The recompute of checkpointed layers re-enters the dropout emulation through the
checkpoint's ``context_fn``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MAX_CONFIG_BYTES = 1 << 22
LM_HEAD_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForMaskedLM", "ForPreTraining")
TOP_K_KEYS = ("num_experts_per_tok", "num_selected_experts", "moe_top_k", "top_k",
              "num_experts_per_token")


class HfConfigError(ValueError):
    """A config that cannot be found or read (one line)."""


# --------------------------------------------------------------------------- finding the config
# (no torch or transformers import: the CLI's parent process runs these)


def resolve_config(value: str) -> Path:
    """A config.json, a directory holding one, or a hub id ("org/name") whose config.json is
    already in the local Hugging Face cache. Nothing is downloaded."""
    path = Path(os.path.expanduser(value))
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise HfConfigError(f"{value}: directory has no config.json")
        return path
    if path.is_file():
        return path
    if value.count("/") == 1 and not value.startswith((".", "/", "~")):
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError:  # pragma: no cover - transformers depends on it
            try_to_load_from_cache = None
        if try_to_load_from_cache is not None:
            hit = try_to_load_from_cache(value, "config.json")
            if isinstance(hit, str) and os.path.isfile(hit):
                return Path(hit)
        raise HfConfigError(f"{value}: no such file or directory, and no config.json for hub "
                            "id " + repr(value) + " in the local Hugging Face cache (nothing "
                            "is downloaded: fetch it first, or pass the file)")
    raise HfConfigError(f"{value}: no such file or directory")


def read_config(path: str | Path) -> dict[str, Any]:
    """The config.json as a dict (``HfConfigError`` for anything else)."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_CONFIG_BYTES:
            raise HfConfigError(f"{p}: larger than {MAX_CONFIG_BYTES} bytes; not a config.json")
        data = json.loads(p.read_text())
    except OSError as exc:
        raise HfConfigError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HfConfigError(f"{p}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise HfConfigError(f"{p}: expected a JSON object, got {type(data).__name__}")
    if not isinstance(data.get("model_type"), str):
        raise HfConfigError(f"{p}: no model_type (transformers needs it to pick the class)")
    return data


def config_digest(config: dict[str, Any]) -> str:
    """sha256 of the config's canonical JSON (its path and provenance keys left out)."""
    kept = {k: v for k, v in config.items() if k not in ("_name_or_path", "_commit_hash")}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def num_layers(config: dict[str, Any]) -> int | None:
    """The decoder depth under the keys configs use (None when absent)."""
    for key in ("num_hidden_layers", "n_layer", "num_layers", "n_layers"):
        v = config.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


# --------------------------------------------------------------------------- building (child)


def transformers_config(config: dict[str, Any], layers: int | None = None):
    """The transformers config object, cut to ``layers`` decoder layers when given."""
    from transformers import CONFIG_MAPPING

    model_type = config.get("model_type")
    if model_type not in CONFIG_MAPPING:
        import transformers

        raise HfConfigError(f"model_type {model_type!r} is not known to transformers "
                            f"{transformers.__version__}")
    cfg = CONFIG_MAPPING[model_type].from_dict(dict(config))
    if not hasattr(cfg, "num_hidden_layers") and hasattr(cfg, "get_text_config"):
        # a multimodal wrapper (Llama-4): its language model is traced, as hf_config reads it
        # (the vision encoder is left out: planner/hf_config.py says so)
        text = cfg.get_text_config()
        if text is cfg or not hasattr(text, "num_hidden_layers"):
            raise HfConfigError(f"model_type {model_type!r} has no decoder depth "
                                "(num_hidden_layers) to trace")
        cfg = text
        if not getattr(cfg, "architectures", None):
            cfg.architectures = None
    if layers is not None:
        n = cfg.num_hidden_layers
        if layers > n:
            raise ValueError(f"cannot cut {n} layers to {layers}")
        for key, value in cfg.to_dict().items():
            if isinstance(value, list) and len(value) == n and key != "architectures":
                setattr(cfg, key, value[:layers])
        cfg.num_hidden_layers = layers
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    return cfg


def model_class(cfg: Any) -> type:
    """The language-model class of the config (module doc)."""
    import transformers

    for arch in getattr(cfg, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if isinstance(cls, type) and arch.endswith(LM_HEAD_SUFFIXES):
            return cls
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    for auto in (AutoModelForCausalLM, AutoModelForMaskedLM):
        mapping = auto._model_mapping
        if type(cfg) in mapping:
            return mapping[type(cfg)]
    raise HfConfigError(f"transformers has no causal or masked language-model class for "
                        f"model_type {cfg.model_type!r}")


def build_module(cfg: Any, attention: str = "sdpa"):
    """The model on the meta device, fp32, in training mode."""
    import torch

    cls = model_class(cfg)
    with torch.device("meta"):
        try:
            model = cls._from_config(cfg, attn_implementation=attention, dtype=torch.float32)
        except (ValueError, ImportError) as exc:
            if "attn_implementation" not in str(exc) and "attention" not in str(exc).lower():
                raise
            from probes.trace_types import UnsupportedConfig

            first = str(exc).splitlines()[0].split(". ")[0]
            raise UnsupportedConfig(f"attention {attention}: {first} (transformers "
                                    f"{__import__('transformers').__version__}; try another "
                                    "--attention)") from None
    model.to(torch.float32)
    return model.train()


UNTRACEABLE = (
    # (module class name contains, the op that stops a fake-tensor trace)
    ("GatedDeltaNet", "the chunked gated delta rule (torch_chunk_gated_delta_rule loops over "
     "the sequence in Python; its kernel is flash-linear-attention's, CUDA only)"),
    ("MambaMixer", "the selective scan (slow_forward loops over the sequence in Python; "
     "mamba-ssm's kernels are CUDA only)"),
    ("Mamba2Mixer", "the selective scan (torch_forward loops over the sequence's chunks; "
     "mamba-ssm's kernels are CUDA only)"),
    ("Mamba2Layer", "the selective scan (mamba-ssm's kernels are CUDA only)"),
    ("LinearAttention", "linear attention (a recurrence over the sequence)"),
)
"""Layers a fake-tensor trace cannot run in bounded time: refused at once, naming the module
and the op (exit 5), rather than running for a quarter of an hour."""


def refuse_untraceable(model: Any) -> None:
    from probes.trace_types import UnsupportedConfig

    for name, mod in model.named_modules():
        cls = type(mod).__name__
        for marker, op in UNTRACEABLE:
            if marker in cls:
                raise UnsupportedConfig(f"{cls} ({name}): {op}: not traceable on fake tensors; "
                                        "describe the model with the shape flags instead")


def find_blocks(model: Any) -> tuple[str, Any]:
    """(path, ModuleList) of the decoder layers (module doc)."""
    from torch import nn

    wanted = set(getattr(model, "_no_split_modules", None) or [])
    best: tuple[int, int, str, Any] | None = None
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.ModuleList) or len(mod) == 0:
            continue
        classes = {type(m).__name__ for m in mod}
        if len(classes) != 1:
            continue
        size = sum(p.numel() for p in mod.parameters())
        rank = (1 if classes & wanted else 0, size)
        if best is None or rank > best[:2]:
            best = (*rank, name, mod)
    if best is None or best[1] == 0:
        raise HfConfigError(f"{type(model).__name__}: no list of repeated layers found")
    return best[2], best[3]


def has_dropout(cfg: Any) -> bool:
    keys = [k for k in cfg.to_dict() if "dropout" in k or k.endswith("_pdrop")]
    return any(isinstance(getattr(cfg, k, 0), float) and getattr(cfg, k) > 0 for k in keys)


def _loss_fn(model: Any):
    import inspect as _inspect

    params = _inspect.signature(model.forward).parameters
    nsp = "next_sentence_label" in params

    def loss(module: Any, batch: tuple) -> Any:
        import torch

        ids, labels = batch
        kw = {"input_ids": ids, "labels": labels}
        if nsp:
            kw["next_sentence_label"] = torch.zeros(ids.shape[0], dtype=torch.int64)
        out = module(**kw)
        value = out.loss if hasattr(out, "loss") else out[0]
        if value is None:
            raise RuntimeError(f"{type(module).__name__} returned no loss for labels=")
        return value

    return loss


def _recompute_contexts(extra: Any, selective: bool, sac_list: str = "current",
                        force_shapes: frozenset = frozenset()) -> Any:
    """A checkpoint ``context_fn``: the dropout emulation during recomputation (the loop's
    function mode is not in effect inside checkpoint's recomputation: the recomputed masks
    would differ from the saved ones), ``extra``'s contexts (the autocast emulation), and for
    selective checkpointing torchtitan's op-level SAC policy with the save list ``sac_list``
    and the block's forced shapes (``probes.models.torchtitan_force_shapes``)."""
    from contextlib import nullcontext

    from probes.models import _BothContexts, _op_sac_context_fn

    def context_fn() -> tuple:
        fwd, rec = extra() if extra is not None else (nullcontext(), nullcontext())
        return fwd, _BothContexts(rec, CudaDropoutEmulation())

    return _op_sac_context_fn(context_fn, sac_list, force_shapes) if selective else context_fn


def hf_factory(config: dict[str, Any], *, layers: int | None = None):
    """A ``probes.trace.ModelFactory`` building the class of ``config`` (module doc)."""

    def build(opts: Any) -> Any:
        import torch
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl,
            checkpoint_wrapper,
        )

        from planner.spec import Checkpointing, TrainingSpec
        from probes.trace_types import TraceModel, UnsupportedConfig

        cfg = transformers_config(config, layers)
        model = build_module(cfg, opts.attention.value)
        refuse_untraceable(model)
        path, layer_list = find_blocks(model)
        vocab = int(cfg.vocab_size)
        dropout = has_dropout(cfg)
        ck = opts.checkpointing
        if ck is not Checkpointing.NONE:
            selective = ck is Checkpointing.SELECTIVE
            if selective and opts.selective_policy != "op":
                raise UnsupportedConfig("selective_policy 'regions' exists only for the "
                                        "reference model; Hugging Face layers use 'op'")
            from probes.models import torchtitan_force_shapes

            tr = opts.training or TrainingSpec()
            for i, layer in enumerate(list(layer_list)):
                shapes = torchtitan_force_shapes(layer, i, tr.sac_force_recompute)
                context_fn = _recompute_contexts(opts.recompute_context, selective,
                                                 tr.sac_list.value, shapes)
                layer_list[i] = checkpoint_wrapper(
                    layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT, context_fn=context_fn,
                    preserve_rng_state=dropout)

        def make_batch(b: int, t: int) -> tuple:
            return (torch.randint(0, vocab, (b, t), dtype=torch.int64),
                    torch.randint(0, vocab, (b, t), dtype=torch.int64))

        info = {"source": "hf", "class": type(model).__name__,
                "model_type": cfg.model_type, "block_path": path,
                "block_class": type(layer_list[0]).__name__ if ck is Checkpointing.NONE
                else type(layer_list[0]._checkpoint_wrapped_module).__name__,
                "attn_implementation": getattr(cfg, "_attn_implementation", None),
                "experts_implementation": getattr(cfg, "_experts_implementation", None),
                "dropout": dropout}
        return TraceModel(module=model, blocks=list(layer_list), block_path=path,
                          make_batch=make_batch, loss=_loss_fn(model),
                          kernel_context=hf_kernel_context, info=info)

    return build


# --------------------------------------------------------------------------- CUDA kernels


def _dropout_emulation_class() -> type:
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    class _CudaDropoutEmulation(TorchFunctionMode):
        """Dropout as CUDA runs it (module doc)."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.dropout:
                x = args[0] if args else kwargs["input"]
                p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
                training = args[2] if len(args) > 2 else kwargs.get("training", True)
                if training and p > 0:
                    return torch.native_dropout(x, p, True)[0]
                return x
            if func is F.scaled_dot_product_attention:
                if len(args) > 4:
                    args = (*args[:4], 0.0, *args[5:])
                elif kwargs.get("dropout_p"):
                    kwargs = {**kwargs, "dropout_p": 0.0}
                q, k, v = (list(args[:3]) + [kwargs.get(n) for n in ("query", "key",
                                                                     "value")][len(args):])[:3]
                if q is not None and v is not None and q.shape[-1] != v.shape[-1] \
                        and q.shape[-1] == k.shape[-1]:
                    return _efficient_sdpa(args, kwargs)
            return func(*args, **kwargs)

    return _CudaDropoutEmulation


def _efficient_sdpa(args: tuple, kwargs: dict) -> Any:
    """SDPA whose value head differs from the query/key head (multi-head latent attention:
    DeepSeek-V2/V3) as CUDA runs it: the flash kernel needs equal head dims, the memory-
    efficient one does not (``aten/src/ATen/native/transformers/sdp_utils_cpp.h``,
    ``check_head_dim_size_mem_efficient``) and keeps q, k, v, out and the logsumexp. The CPU
    dispatch would fall back to the math path, which keeps the T x T probabilities. Called
    on fake tensors only (the op has no CPU kernel; its meta kernel gives the shapes)."""
    import torch

    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
             "enable_gqa")
    a = dict(zip(names, args)) | kwargs
    q, k, v = a["query"], a["key"], a["value"]
    if a.get("enable_gqa") and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(rep, -3), v.repeat_interleave(rep, -3)
    mask = a.get("attn_mask")
    out = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, mask, True, 0.0, bool(a.get("is_causal")) and mask is None,
        scale=a.get("scale"))
    return out[0]


_EMULATION: type | None = None


def CudaDropoutEmulation():  # noqa: N802 - a context-manager factory
    """A fresh dropout/SDPA emulation mode (see the module doc)."""
    global _EMULATION
    if _EMULATION is None:
        _EMULATION = _dropout_emulation_class()
    return _EMULATION()


@contextmanager
def unpacked_batch() -> Iterator[None]:
    """transformers decides from the position ids' values whether a batch packs several
    sequences (``masking_utils.find_packed_sequence_indices``); on fake tensors it cannot read
    them, assumes packing, and builds a (T x T) mask, which turns SDPA's ``is_causal`` off
    (and GQA's ``enable_gqa``: keys and values are repeated to every head). The trace's batch
    is plain sequences: answered as the check answers on such a batch (not packed)."""
    import transformers.masking_utils as mu

    saved = mu.find_packed_sequence_indices
    mu.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        mu.find_packed_sequence_indices = saved


@contextmanager
def hf_kernel_context() -> Iterator[None]:
    """Around each forward and backward of a Hugging Face model: the CUDA dropout
    emulation and the unpacked-batch answer."""
    with unpacked_batch(), CudaDropoutEmulation():
        yield


# --------------------------------------------------------------------------- inspection


def _signature(module: Any) -> str:
    items = [(n, tuple(p.shape), str(p.dtype)) for n, p in module.named_parameters()]
    return hashlib.sha1(repr(items).encode()).hexdigest()[:12]


def period_of(seqs: list[list[Any]]) -> int | None:
    """The smallest p such that every sequence repeats with period p and repeats at least
    twice (None: no repetition, a shallow trace cannot stand for the model)."""
    n = len(seqs[0]) if seqs else 0
    for p in range(1, n // 2 + 1):
        if all(all(s[i] == s[i % p] for i in range(n)) for s in seqs):
            return p
    return None


def matmul_counts(model: Any, cfg: Any, path: str, blocks: Any) -> dict[str, Any]:
    """Parameter counts the step-time model reads (planner.throughput.StepInputs): the matmul
    weights a token multiplies per block (every 2-D+ weight; MoE experts weighted by top-k /
    experts), the head's (every 2-D weight outside the blocks but the input embeddings, the
    output projection counted even when tied), all parameters, the active ones."""
    from torch import nn

    notes: list[str] = []
    top_k = next((int(getattr(cfg, k)) for k in TOP_K_KEYS
                  if isinstance(getattr(cfg, k, None), int)), None)

    def block_counts(blk: Any) -> tuple[int, int, int, int]:
        total = mm = active_mm = inactive = 0
        expert_lists = {n for n, m in blk.named_modules()
                        if isinstance(m, nn.ModuleList) and n.split(".")[-1] == "experts"}
        for n, p in blk.named_parameters():
            k = p.numel()
            total += k
            in_list = next((e for e in expert_lists if n.startswith(e + ".")), None)
            is_expert = in_list is not None or (p.dim() == 3 and "expert" in n)
            if p.dim() < 2:
                continue
            mm += k
            if is_expert:
                n_exp = len(blk.get_submodule(in_list)) if in_list else p.shape[0]
                frac = min(top_k, n_exp) / n_exp if top_k else 1.0
                active_mm += int(k * frac)
                inactive += k - int(k * frac)
            else:
                active_mm += k
        return total, mm, active_mm, inactive

    per = [block_counts(b) for b in blocks]
    if any(c[3] for c in per) and top_k is None:
        notes.append("experts found but no top-k key in the config: every expert counted "
                     "as active")
    block_ids = {id(p) for b in blocks for p in b.parameters()}
    emb_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    out_w = getattr(out, "weight", None)
    head = 0
    seen: set[int] = set()
    total = 0
    for p in model.parameters():  # model.parameters() yields a tied weight once
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        if id(p) in block_ids or p.dim() < 2:
            continue
        if id(p) in emb_ids and p is not out_w:
            continue
        head += p.numel()
    blocks_total = sum(c[0] for c in per)
    hidden = int(getattr(cfg, "hidden_size", 0) or 0)
    heads = int(getattr(cfg, "num_attention_heads", 0) or 0)
    head_dim = getattr(cfg, "head_dim", None) or (hidden // heads if heads else 0)
    q_dim = heads * int(head_dim or 0)
    if not q_dim:
        notes.append("no num_attention_heads/hidden_size in the config: attention FLOPs "
                     "left out of the step time")
    return {
        "params": total,
        "active_params": total - sum(c[3] for c in per),
        "per_block_params": [c[0] for c in per],
        "root_params": total - blocks_total,
        "matmul_per_block": [c[2] for c in per],
        "matmul_head": head,
        "q_dim": q_dim,
        "top_k": top_k,
        "notes": notes,
    }


def describe(cfg: Any) -> dict[str, Any]:
    """Shape facts from the config, for the table (None where the config has none)."""

    def get(name: str) -> Any:
        v = getattr(cfg, name, None)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    return {"hidden": get("hidden_size"), "heads": get("num_attention_heads"),
            "kv_heads": get("num_key_value_heads") or get("num_attention_heads"),
            "ffn": get("intermediate_size") or get("n_inner") or get("ffn_dim"),
            "vocab": get("vocab_size"),
            "experts": get("num_local_experts") or get("num_experts") or get("n_routed_experts"),
            "tied_embeddings": bool(getattr(cfg, "tie_word_embeddings", False))}


def inspect(job: dict[str, Any]) -> dict[str, Any]:
    """The full-depth module's structure (``{"config": {...}}``): class, decoder layers and
    whether they repeat (``period``), parameter counts, shape facts."""
    import torch

    cfg = transformers_config(job["config"])
    model = build_module(cfg, "eager")  # every class has it; it changes no parameter
    refuse_untraceable(model)
    path, blocks = find_blocks(model)
    sigs = [_signature(b) for b in blocks]
    n = len(blocks)
    lists = [v for k, v in cfg.to_dict().items()
             if isinstance(v, list) and len(v) == n and k != "architectures"]
    counts = matmul_counts(model, cfg, path, blocks)
    period = period_of([sigs, *lists]) if n > 1 else None
    return {
        "class": type(model).__name__,
        "model_type": cfg.model_type,
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "block_path": path,
        "block_class": type(blocks[0]).__name__,
        "n_layers": n,
        "period": period,
        "config_layers": getattr(cfg, "num_hidden_layers", None),
        **counts,
        **describe(cfg),
    }


def scaled_depths(n_layers: int, period: int | None) -> tuple[int, int] | None:
    """The two shallow depths a scaled trace runs (None: trace the full depth): the first
    multiple of the period with at least four layers (so that the first two and the last two
    blocks are distinct: probes.trace_plan.scale_result), and one period more."""
    if period is None:
        return None
    d1 = period * math.ceil(4 / period)
    d2 = d1 + period
    return None if d2 >= n_layers else (d1, d2)
