"""An emulation of CUDA autocast's cast policy for CPU (fake) tensors.

Why: the trace probes run on fake CPU tensors, but ``torch.autocast("cpu")`` follows the CPU
op lists, which differ from CUDA's (on CPU ``layer_norm``, ``softmax``, ``log_softmax``, ``sum``
stay in bf16; on CUDA they run/produce fp32), so activation sizes under a CPU autocast would
not be those of a GPU run. ``CudaAutocastEmulation`` is a ``TorchFunctionMode`` that applies
CUDA's policy instead. It is an emulation, not the real dispatcher kernel:

Source: PyTorch's ``aten/src/ATen/autocast_mode.cpp`` (``TORCH_LIBRARY_IMPL(aten, Autocast, m)``:
the CUDA registrations) and the op lists ``AT_FORALL_LOWER_PRECISION_FP``, ``AT_FORALL_FP32``,
``AT_FORALL_FP32_SET_OPT_DTYPE``, ``AT_FORALL_PROMOTE`` in ``aten/src/ATen/autocast_mode.h``
(checked against the header shipped with torch 2.13), and ``cached_cast`` there:

* lower_precision_fp (linear, matmul, mm, bmm, addmm, baddbmm, addbmm, addmv, addr, mv, einsum,
  conv*, prelu, scaled_dot_product_attention, rnn cells, ...): every floating, non-double
  tensor argument is cast to the autocast dtype.
* fp32 (layer_norm, group_norm, rms_norm, pow, rsqrt, exp, log, reciprocal, softplus, the
  losses incl. nll_loss, logsumexp, ...): floating tensor arguments are cast to fp32.
* fp32_set_opt_dtype (softmax, log_softmax, sum, prod, cumsum, cumprod, vector/matrix norms):
  if the first argument is floating and no ``dtype`` was passed, ``dtype=torch.float32`` is
  added (the output is fp32); otherwise unchanged.
* promote (addcdiv, addcmul, atan2, bilinear, cross, dot, vdot, grid_sampler, index_put,
  tensordot, scatter_add): floating arguments are cast to the widest floating dtype among them.
* Everything else runs unchanged (normal type promotion).
* Weight cache (``cached_cast``): a cast to the autocast dtype of an fp32 tensor that is a
  leaf, requires grad and is not a view (i.e. a parameter) is cached for the lifetime of the
  autocast region, so each weight is cast once per region and the copy stays alive until the
  region exits (``torch.autocast.__exit__`` clears the cache at nesting level 0).

Differences from the real thing: it intercepts at the Python ``__torch_function__`` level, so
it sees the *outermost* call of a composite (e.g. ``F.cross_entropy`` rather than the
``log_softmax`` + ``nll_loss`` it decomposes into; both are fp32 ops on CUDA, so cross_entropy
is treated as fp32, which is what the decomposition does). Ops reached only from inside another
intercepted or composite function are not seen. In-place ops are not autocast on CUDA either.
``torch.utils.checkpoint`` recomputation does not re-enter this mode by itself: pass
``recompute_context_fn(dtype)`` as ``context_fn`` (real autocast state is restored by
checkpoint; this does the same for the emulation).
"""

from __future__ import annotations

import weakref
from contextlib import nullcontext
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map_only

__all__ = ["CudaAutocastEmulation", "recompute_context_fn", "POLICY"]

_LOWER = {
    "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "convolution", "prelu", "addmm", "addmv", "addr",
    "matmul", "__matmul__", "__rmatmul__", "einsum", "mm", "mv", "linalg_vecdot", "linear",
    "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
    "cudnn_convolution", "cudnn_convolution_transpose",
}  # fmt: skip
_FP32 = {
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow", "__pow__", "__rpow__", "float_power",
    "softplus", "layer_norm", "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm",
    "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss",
    "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss",
    "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
    "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "upsample_linear1d",
    "upsample_bilinear2d", "upsample_trilinear3d", "upsample_bicubic2d",
    # composite of log_softmax (fp32_set_opt_dtype) + nll_loss (fp32): both fp32 on CUDA
    "cross_entropy",
}  # fmt: skip
_FP32_SET_OPT_DTYPE = {
    "prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm",
    "linalg_matrix_norm", "sum",
}  # fmt: skip
_PROMOTE = {
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
    "index_put", "tensordot", "scatter_add",
}  # fmt: skip

POLICY: dict[str, str] = {
    **dict.fromkeys(_LOWER, "lower_precision_fp"),
    **dict.fromkeys(_FP32, "fp32"),
    **dict.fromkeys(_FP32_SET_OPT_DTYPE, "fp32_set_opt_dtype"),
    **dict.fromkeys(_PROMOTE, "promote"),
}


def _eligible(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


class CudaAutocastEmulation(TorchFunctionMode):
    """``with CudaAutocastEmulation(torch.bfloat16):`` behaves like
    ``torch.autocast("cuda", dtype=torch.bfloat16)`` would for the ops listed above."""

    def __init__(self, dtype: torch.dtype = torch.bfloat16, cache_enabled: bool = True) -> None:
        super().__init__()
        self.dtype = dtype
        self.cache_enabled = cache_enabled
        self._cache: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
        self.calls: dict[str, int] = {}

    def __enter__(self) -> CudaAutocastEmulation:
        self._cache.clear()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._cache.clear()
        return super().__exit__(*exc)

    def _cast(self, t: torch.Tensor, to: torch.dtype) -> torch.Tensor:
        if not _eligible(t) or t.dtype == to:
            return t
        can_cache = (
            self.cache_enabled
            and to == self.dtype
            and t.dtype == torch.float32
            and t.requires_grad
            and t.is_leaf
            and not t._is_view()
        )
        if not can_cache:
            return t.to(to)
        hit = self._cache.get(id(t))
        if hit is not None and hit[0]() is t:
            return hit[1]
        casted = t.to(to)
        self._cache[id(t)] = (weakref.ref(t), casted)
        return casted

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", None)
        policy = POLICY.get(name) if name else None
        if policy is None:
            return func(*args, **kwargs)
        self.calls[name] = self.calls.get(name, 0) + 1
        if policy == "lower_precision_fp":
            args, kwargs = tree_map_only(
                torch.Tensor, lambda t: self._cast(t, self.dtype), (args, kwargs)
            )
        elif policy == "fp32":
            args, kwargs = tree_map_only(
                torch.Tensor, lambda t: self._cast(t, torch.float32), (args, kwargs)
            )
        elif policy == "fp32_set_opt_dtype":
            first = args[0] if args else kwargs.get("input")
            has_dtype = kwargs.get("dtype") is not None or any(
                isinstance(a, torch.dtype) for a in args
            )
            if _eligible(first) and not has_dtype:
                kwargs = {**kwargs, "dtype": torch.float32}
        elif policy == "promote":
            leaves, _ = tree_flatten((args, kwargs))
            dts = [t.dtype for t in leaves if _eligible(t)]
            if dts:
                widest = dts[0]
                for d in dts[1:]:
                    widest = torch.promote_types(widest, d)
                args, kwargs = tree_map_only(
                    torch.Tensor, lambda t: self._cast(t, widest), (args, kwargs)
                )
        return func(*args, **kwargs)


def recompute_context_fn(dtype: torch.dtype | None):
    """A ``context_fn`` for ``torch.utils.checkpoint`` that re-enters the emulation (a fresh
    region, like checkpoint re-entering ``torch.autocast``) during recomputation only."""

    def context_fn():
        if dtype is None:
            return nullcontext(), nullcontext()
        return nullcontext(), CudaAutocastEmulation(dtype)

    return context_fn
