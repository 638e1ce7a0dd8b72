"""DeepSpeed's communication-compressing optimizers: 1-bit Adam (Tang et al. 2021, arXiv
2102.02888), 0/1 Adam (Lu et al. 2022, arXiv 2202.06009) and 1-bit LAMB (Li et al. 2021,
arXiv 2104.06069), as DeepSpeed v0.19.6 runs them (``deepspeed/runtime/fp16/onebit/adam.py``,
``zoadam.py``, ``lamb.py``; the compressed all-reduce in ``deepspeed/runtime/comm/nccl.py``
``NcclBackend.compressed_allreduce``). DeepSpeed 0.19.7 and later no longer have them (PR #8490,
tracking issue #8489): there a config naming them fails at ``deepspeed.initialize``.

They run on DeepSpeed's stage-0 engine only (``engine.py`` ``_configure_basic_optimizer``
asserts "1bit-Adam is not compatible with ZeRO", and likewise for the other two), which
fitcheck plans as torch DDP; this module adds what the optimizers themselves hold and move
(docs/model.md "1-bit Adam, 0/1 Adam, 1-bit LAMB"), in the steady state after the warm-up
(``freeze_step`` / ``var_freeze_step``), when the compressed all-reduce has replaced the
gradient all-reduce.

Every number may be a numpy array (the GPU count): arithmetic through planner/vec.py.
"""

from __future__ import annotations

from typing import Any

from planner import vec
from planner.spec import OptimizerKind, Precision, TrainingSpec

FP32 = 4
ENGINE_NAMES = {OptimizerKind.ONEBIT_ADAM: "1bit-Adam", OptimizerKind.ZERO_ONE_ADAM: "0/1 Adam",
                OptimizerKind.ONEBIT_LAMB: "1bit-Lamb"}
"""The names DeepSpeed's assertions give them (``engine.py`` ``_configure_basic_optimizer``)."""


def enabled(training: TrainingSpec) -> bool:
    return training.optimizer.onebit


def unit(n: Any) -> Any:
    """The compressed tensor's padding unit: the world size times ``divider`` = lcm(N, 8)
    (``adam.py``: ``self.divider = int(self.size * 8 / np.gcd(self.size, 8))``;
    ``corrected_tensor_size`` rounds the tensor up to a multiple of ``size * divider``).
    gcd(N, 8) is the power of two 8 shares with N."""
    g = vec.where(n % 8 == 0, 8, vec.where(n % 4 == 0, 4, vec.where(n % 2 == 0, 2, 1)))
    return n * (n * 8 // g)


def padded(elems: Any, n: Any) -> Any:
    """``corrected_tensor_size``: ``elems`` rounded up to a multiple of ``unit(n)``."""
    u = unit(n)
    return vec.ceil_div(elems, u) * u


def flat(training: TrainingSpec) -> bool:
    """Whether the optimizer compresses one flat tensor (True) or each parameter apart.

    fp16 / bf16 at stage 0: ``_do_optimizer_sanity_check`` returns FP16 / DDP_BFLOAT16 and
    ``_configure_fp16_optimizer`` wraps 1-bit Adam and 0/1 Adam in ``FP16_Optimizer``, whose
    fp32 master is one flat tensor per parameter group (one group *assumed*: the engine builds
    the optimizer from the client's parameters); 1-bit LAMB flattens its momentum into one
    padded ``exp_avg_flat`` whatever the precision (``lamb.py``, "init fused momentum").
    fp32: no wrapper, 1-bit Adam and 0/1 Adam step every parameter tensor apart."""
    return training.optimizer is OptimizerKind.ONEBIT_LAMB or \
        training.precision is not Precision.FP32


def compressed_elems(groups: Any, training: TrainingSpec, n: Any) -> Any:
    """Elements the compressed all-reduces move per communicating step (each tensor
    padded): the sum of ``corrected_tensor_size`` over the tensors compressed."""
    if flat(training):
        return padded(sum(k * _numel(s) for _, s, k in groups), n)
    return sum(k * padded(_numel(s), n) for _, s, k in groups)


def compressed_calls(groups: Any, training: TrainingSpec) -> int:
    """``compressed_allreduce`` calls per communicating step: one per flat tensor, else one
    per parameter tensor."""
    return 1 if flat(training) else sum(k for _, _, k in groups)


def largest_compressed(groups: Any, training: TrainingSpec, n: Any) -> Any:
    """The largest tensor one ``compressed_allreduce`` call pads and compresses."""
    if flat(training):
        return compressed_elems(groups, training, n)
    return padded(max((_numel(s) for _, s, _ in groups), default=0), n)


def state_bytes(groups: Any, training: TrainingSpec, n: Any) -> Any:
    """Optimizer state beyond the moments ``optimizer_state_bytes`` counts (2 fp32 per
    element for 1-bit Adam, 3 for 0/1 Adam and 1-bit LAMB), per GPU:

    - ``worker_error``: fp32, ``corrected_tensor_size`` elements, per compressed tensor
      (``adam.py`` l. 179, ``zoadam.py`` l. 193, ``lamb.py`` l. 290: ``torch.zeros`` of the
      default dtype);
    - ``server_error``: fp32, ``corrected_tensor_size // size`` (l. 180, 194, 291);
    - 1-bit LAMB: ``exp_avg_flat`` replaces the moments' storage by one padded flat copy
      (l. 275-284), so its momentum holds the padding too.

    The first step (the initialization step; ``FP16_Optimizer`` runs it at
    ``deepspeed.initialize``) makes them and then frees only the loop's last tensor's
    ("Pop out errors": ``state`` is the last one), which the first compressed step makes
    again: from the end of the warm-up every tensor holds them (under ``FP16_Optimizer``'s
    one flat tensor, none does during the warm-up; measured, tests/data/onebit_cpu.json)."""
    elems = compressed_elems(groups, training, n)
    errors = FP32 * (elems + elems // n)
    if training.optimizer is OptimizerKind.ONEBIT_LAMB:
        raw = sum(k * _numel(s) for _, s, k in groups)
        errors = errors + FP32 * (elems - raw)
    return errors


def temp_bytes(groups: Any, training: TrainingSpec, n: Any) -> Any:
    """The step's temporaries at a communicating step, from the source and measured on the CPU
    referee (probes/onebit_cpu.py, tests/data/onebit_cpu.json: to within 400 B). Inside
    ``compressed_allreduce`` the new worker error is made as ``buffer_m - worker_scale *
    sign(buffer_m)...float()``: two fp32 tensors of the padded size alive at once (the scaled
    signs and the difference) before ``set_`` frees the old error; a tensor not already
    padded is first concatenated with its padding (``torch.cat``: one more fp32 copy). The
    Adam update (``exp_avg / (exp_avg_sq.sqrt() + eps)``) holds two fp32 tensors of the
    unpadded size, no more than the former. 0/1 Adam computes its ``update`` (fp32, the
    tensor's size) before the compressed all-reduce of its accumulated momentum and holds it
    through it (``zoadam.py`` l. 240-255). 1-bit LAMB clones every momentum at each
    compressed step (``exp_avg_last_step``, fp32, the tensors' size) and keeps them through
    its update. The sign bits (uint8, cupy's pool on a GPU) are left out: M/8 and less."""
    m = largest_compressed(groups, training, n)
    temps = 2 * FP32 * m
    if flat(training):
        raw = sum(k * _numel(s) for _, s, k in groups)
    else:
        raw = max((_numel(s) for _, s, _ in groups), default=0)
    if training.optimizer is OptimizerKind.ONEBIT_LAMB:
        return temps + FP32 * raw  # exp_avg_flat is already padded: no cat
    if training.optimizer is OptimizerKind.ZERO_ONE_ADAM:
        temps = temps + FP32 * raw
    return temps + vec.where(m != raw, FP32 * m, 0)


def step_fraction(training: TrainingSpec) -> float:
    """Of the steady-state steps, the fraction that communicate: 1-bit Adam and 1-bit LAMB
    compress the momentum at every step after ``freeze_step``; 0/1 Adam after
    ``var_freeze_step`` runs local steps and all-reduces its accumulated momentum once per
    ``local_step_interval`` steps, which doubles every ``local_step_scaler`` steps up to
    ``local_step_clipper`` (``zoadam.py`` l. 247, 286-290): 1 / local_step_clipper."""
    if training.optimizer is OptimizerKind.ZERO_ONE_ADAM:
        return 1.0 / training.deepspeed.local_step_clipper
    return 1.0


def step_inputs(groups: Any, training: TrainingSpec, n: Any) -> dict[str, Any]:
    """StepInputs fields (empty when no 1-bit optimizer): the padded elements compressed per
    communicating step, the calls, and the fraction of steps that communicate."""
    if not enabled(training):
        return {}
    return {"ob_elems": compressed_elems(groups, training, n) * 1.0,
            "ob_calls": float(compressed_calls(groups, training)),
            "ob_every": step_fraction(training)}


def _numel(shape: Any) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def notice(training: TrainingSpec) -> str:
    """The assumptions line."""
    o = training.optimizer
    clip = training.deepspeed.local_step_clipper
    warm = ("var_freeze_step (0/1 Adam: before it, gradients are all-reduced uncompressed "
            "at the variance-update steps and 1-bit compressed at the others; after it, "
            f"local steps with one compressed all-reduce every {clip} steps, "
            "local_step_clipper)"
            if o is OptimizerKind.ZERO_ONE_ADAM else
            "freeze_step (the warm-up steps before it all-reduce the gradients uncompressed)")
    return (f"{o.value}: DeepSpeed's stage-0 engine planned as torch DDP; step time after "
            f"{warm}: the momentum's compressed all-reduce (1 sign bit per element, all-to-all "
            "then all-gather, and a scale per rank) in the optimizer step, not overlapped, "
            "*assumed* (no GPU run); its error buffers and step temporaries as DeepSpeed "
            "v0.19.6 holds them, measured on its CPU accelerator (DeepSpeed 0.19.7 removed "
            "these optimizers: PR #8490)")
