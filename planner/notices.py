"""What a request assumed or could not check, as typed lines: ``Notice`` is the text a user reads
(a ``str``: JSON writes it as one, tables print it) that also knows its kind, so that front
ends route it by kind, never by matching words in it."""

from __future__ import annotations

from enum import StrEnum


class Kind(StrEnum):
    APPROXIMATE_READING = "approximate-reading"
    """A config.json read with --approximate: what the reading left out."""
    CONFIG = "config"
    """Other remarks on a config.json reading."""
    SHAPE_ASSUMED = "shape-assumed"
    """The model's shape was assumed from --params."""
    DEEPSPEED_AUTO = "deepspeed-auto"
    """DeepSpeed "auto" values filled in from the model."""
    CALIBRATION_STALE = "calibration-stale"
    """The calibration was measured under another software stack."""
    JOB = "job"
    """A job file's reading: what was read, assumed or not modelled."""
    ONE_GPU = "one-gpu"
    """A sharding strategy on one GPU, estimated as plain training."""
    FLOAT8 = "float8"
    """--float8: how far the float8 step time is from published runs."""
    ONEBIT = "onebit"
    """DeepSpeed's 1-bit optimizers: the engine planned as DDP, the step after the warm-up."""
    INERT = "inert"
    """A field given that changes nothing in this request (a CP option at degree 1)."""


class Notice(str):
    """One line of text with its ``kind`` (a ``Kind``)."""

    __slots__ = ("kind",)

    def __new__(cls, text: str, kind: Kind) -> Notice:
        self = super().__new__(cls, text)
        self.kind = Kind(kind)
        return self

    def __reduce__(self):  # pickles (the webhook's worker processes) keep the kind
        return (Notice, (str(self), self.kind))


def of_kind(lines, kind: Kind) -> list[Notice]:
    """The lines of ``kind`` (plain strings have none)."""
    return [w for w in lines if getattr(w, "kind", None) == kind]
