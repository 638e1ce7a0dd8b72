"""The dtype the model's own loss takes cross-entropy in, where no autocast runs.

Under torch.autocast ``log_softmax`` is an fp32 op whatever the logits' dtype. Where none runs
(DeepSpeed's bf16/fp16 engines cast the module itself; pure bf16; FSDP's ``param_dtype``) the
logits come out of the head in the low precision, and the memory of the loss depends on
whether the model class upcasts them before cross-entropy (``--loss fp32``: an fp32 copy, an
fp32 log-softmax saved) or not (as ``--loss bf16``). That is a property of the transformers
release the class comes from (read in the wheels, transformers/models/*/modeling_*.py):

- 4.46 added ``transformers/loss/loss_utils.py`` ``ForCausalLMLoss``, whose first line is
  ``logits = logits.float()``; classes that call ``self.loss_function`` upcast through it.
- LlamaForCausalLM upcast in its own forward (``logits = logits.float()``) from 4.31.0 (not in
  4.30.2); Mistral, Mixtral, Qwen2, Qwen2-MoE, Gemma, Gemma-2, Phi and Phi-3, added later with
  Llama's head, upcast in 4.45.2 and call ``self.loss_function`` in 4.46.0.
- GPT-2, Falcon and BLOOM took ``CrossEntropyLoss()`` on the low-precision logits through
  4.48.0 and call ``self.loss_function`` from 4.49.0.
- BERT's masked-LM heads never upcast (``ModelSpec.loss_upcast`` False).

``ModelSpec.loss_upcast_since`` carries the release per family; ``TrainingSpec
.transformers_version`` (``--transformers-version``) the release used, default a recent one.
"""

from __future__ import annotations

import dataclasses

from planner.spec import LossKind, ModelSpec, TrainingSpec


def release(version: str) -> tuple[int, int]:
    """'4.45' -> (4, 45) (``planner.fields.parse_transformers_version`` wrote it)."""
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def upcasts(model: ModelSpec, version: str | None) -> bool:
    """The class's own loss upcasts the logits under this transformers release (None: a
    recent one, 4.49 or later)."""
    return model.loss_upcast and (version is None
                                  or release(version) >= model.loss_upcast_since)


def with_loss_dtype(model: ModelSpec, training: TrainingSpec) -> ModelSpec:
    """The model with ``loss_upcast`` as the given release has it."""
    if model.loss_upcast and not upcasts(model, training.transformers_version):
        return dataclasses.replace(model, loss_upcast=False)
    return model


def _version(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"


def assumption(model: ModelSpec, training: TrainingSpec) -> str | None:
    """The assumptions line for the default loss (None for the other --loss kinds, which
    say their own dtype)."""
    if training.loss is not LossKind.FP32:
        return None
    where = ("where no autocast runs (DeepSpeed's bf16/fp16 module, pure bf16, FSDP "
             "param_dtype), the logits stay low precision and ")
    version = training.transformers_version
    if not model.loss_upcast:
        return where + "the model's loss takes cross-entropy on them as they are"
    since = _version(model.loss_upcast_since)
    if version is None:
        return (where + f"the model's loss upcasts them to fp32 (its class does from "
                f"transformers {since}; a recent release assumed: give --transformers-version "
                "for an older one)")
    if upcasts(model, version):
        return (where + f"the model's loss upcasts them to fp32 (transformers {version} >= "
                f"{since})")
    return (where + f"the model's loss takes cross-entropy on them as they are (transformers "
            f"{version} < {since}, where this class upcasts)")
