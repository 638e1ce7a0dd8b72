"""Which attention a Hugging Face model runs when the job does not say (issue 24 item 6).

transformers picks the attention when ``attn_implementation`` is not given: sdpa when the
model class supports it, else eager, which materialises the T x T scores and probabilities.
Since 4.36 (``PreTrainedModel._autoset_attn_implementation``: "SDPA implementation, if
available and supported by the model type"); in 5.x ``get_correct_attn_implementation`` turns
None into "sdpa" and falls back to "eager" when ``_sdpa_can_dispatch`` raises, which it does
for a class whose ``_supports_sdpa`` is False (transformers/modeling_utils.py). Support is a
class attribute of each family's ``<Family>PreTrainedModel`` in
``transformers/models/<family>/modeling_<family>.py``.

``FAMILIES`` is read from those files in the releases 4.36.0, 4.40.0, 4.42.0, 4.45.0, 4.48.0
and 5.24.0: the families fitcheck reads from a config.json (planner/hf_config.py), whether
5.24.0 sets ``_supports_sdpa = True``, and the first of those releases that did. A
``config.json`` that names its attention (``attn_implementation`` or
``_attn_implementation``) is followed; a family not in the table is assumed to default to
sdpa, and the assumption says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.spec import Attention, ModelSpec

RELEASES_READ = ("4.36.0", "4.40.0", "4.42.0", "4.45.0", "4.48.0", "5.24.0")
"""The transformers releases whose modeling files ``FAMILIES`` was read from."""


@dataclass(frozen=True, slots=True)
class FamilyAttention:
    cls: str
    """The ``PreTrainedModel`` subclass that carries ``_supports_sdpa``."""
    sdpa: bool
    """``_supports_sdpa = True`` in 5.24.0."""
    since: str = ""
    """The first release read with ``_supports_sdpa = True`` ("" for none)."""
    history: str = ""
    """Where the releases read disagree with 5.24.0."""
    eager_until: str = ""
    """The last release read in which the class existed without sdpa ("" for none: the class
    is newer than the releases read before ``since``, or the history is not one switch)."""


FAMILIES: dict[str, FamilyAttention] = {
    # model_type as planner/hf_config.py spells it (lower case, "-" for "_")
    "llama": FamilyAttention("LlamaPreTrainedModel", True, "4.36.0"),
    "mistral": FamilyAttention("MistralPreTrainedModel", True, "4.40.0", eager_until="4.36.0"),
    "mixtral": FamilyAttention("MixtralPreTrainedModel", True, "4.40.0", eager_until="4.36.0"),
    "qwen2": FamilyAttention("Qwen2PreTrainedModel", True, "4.40.0"),
    "qwen2-moe": FamilyAttention("Qwen2MoePreTrainedModel", True, "4.40.0"),
    "qwen3": FamilyAttention("Qwen3PreTrainedModel", True, "5.24.0"),
    "qwen3-moe": FamilyAttention("Qwen3MoePreTrainedModel", True, "5.24.0"),
    "phi3": FamilyAttention("Phi3PreTrainedModel", True, "4.45.0",
                            "4.42.0 sets _supports_sdpa = False: eager", "4.42.0"),
    "phi": FamilyAttention("PhiPreTrainedModel", True, "4.40.0", eager_until="4.36.0"),
    "gemma": FamilyAttention("GemmaPreTrainedModel", True, "4.40.0"),
    "gemma2": FamilyAttention(
        "Gemma2PreTrainedModel", False, "4.42.0",
        "'sdpa does not support softcapping'; 4.42.0 and 4.48.0 defaulted to sdpa, 4.45.0 "
        "to eager"),
    "gemma3-text": FamilyAttention("Gemma3PreTrainedModel", True, "5.24.0"),
    "olmo": FamilyAttention("OlmoPreTrainedModel", True, "4.40.0"),
    "olmo2": FamilyAttention("Olmo2PreTrainedModel", True, "4.48.0"),
    "deepseek-v2": FamilyAttention("DeepseekV2PreTrainedModel", True, "5.24.0"),
    "deepseek-v3": FamilyAttention("DeepseekV3PreTrainedModel", True, "5.24.0"),
    "gpt2": FamilyAttention("GPT2PreTrainedModel", True, "4.42.0", "4.40.0 and before: eager",
                            "4.40.0"),
    "bert": FamilyAttention("BertPreTrainedModel", True, "4.42.0", "4.40.0 and before: eager",
                            "4.40.0"),
    "roberta": FamilyAttention("RobertaPreTrainedModel", True, "4.45.0",
                               "4.42.0 and before: eager", "4.42.0"),
    "xlm-roberta": FamilyAttention("XLMRobertaPreTrainedModel", True, "4.45.0",
                                   "4.42.0 and before: eager", "4.42.0"),
    "bloom": FamilyAttention("BloomPreTrainedModel", False),  # ALiBi scores via baddbmm
    "falcon": FamilyAttention("FalconPreTrainedModel", True, "4.36.0"),
}

ALIASES = {"refinedweb": "falcon", "refinedwebmodel": "falcon"}
"""model_type values transformers builds with another family's class (FalconConfig)."""

IMPLEMENTATIONS = {"eager": Attention.EAGER, "paged|eager": Attention.EAGER,
                   "sdpa": Attention.SDPA, "flash_attention_2": Attention.SDPA,
                   "flash_attention_3": Attention.SDPA, "flex_attention": Attention.SDPA}
"""``attn_implementation`` values -> the planner's kinds: every kernel but eager keeps no
T x T tensor (planner/jobs/readers/trainer.py maps the job files' values the same way)."""


def family_key(model: ModelSpec) -> str:
    raw = model.family.lower().replace("_", "-")
    return ALIASES.get(raw, raw)


def default_attention(model: ModelSpec, version: str | None = None) -> tuple[Attention, str]:
    """The attention transformers would run for ``model`` when the job names none, and the
    assumption line that says why. ``version``: the transformers release the job runs
    (``--transformers-version``; None: a recent one)."""
    named = model.attn_implementation
    kind = IMPLEMENTATIONS.get(named.lower()) or IMPLEMENTATIONS.get(
        named.lower().removeprefix("paged|"))
    if kind is not None:
        return kind, f"attention: {kind} (config.json attn_implementation {named!r})"
    attn, line = _family_default(model, version)
    if named:
        line += f"; config.json attn_implementation {named!r} not recognised"
    return attn, line


def release(version: str) -> tuple[int, ...]:
    """'4.45.0' -> (4, 45): releases compared by major and minor."""
    return tuple(int(x) for x in version.split(".")[:2])


def _before_sdpa(fam: FamilyAttention, version: str | None) -> str:
    """How ``version`` runs a family that gained sdpa in ``fam.since`` after a release read
    without it: "read" (at or before ``eager_until``: eager), "between" (between the two
    releases read: taken as eager, the larger need, and said so), "" (sdpa, or nothing read
    for that release: the class may not exist yet)."""
    if not (version and fam.eager_until) or release(version) >= release(fam.since):
        return ""
    return "read" if release(version) <= release(fam.eager_until) else "between"


def _family_default(model: ModelSpec, version: str | None = None) -> tuple[Attention, str]:
    key = family_key(model)
    fam = FAMILIES.get(key)
    if fam is None:
        what = f"model_type {model.family!r}" if model.family else "this model"
        return Attention.SDPA, (f"attention: sdpa (transformers' default since 4.36 when the "
                                f"class supports it; ASSUMED for {what}, not in fitcheck's "
                                "table: --attention eager if it has no sdpa)")
    source = f"models/{key.replace('-', '_')}/modeling_{key.replace('-', '_')}.py {fam.cls}"
    history = f"; {fam.history}" if fam.history else ""
    before = _before_sdpa(fam, version)
    if before:
        why = (f"{fam.eager_until} has no sdpa for it" if before == "read" else
               f"between {fam.eager_until} (no sdpa) and {fam.since} (sdpa), the releases "
               "read: ASSUMED eager")
        return Attention.EAGER, (f"attention: eager, T x T scores kept (transformers {version}: "
                                 f"{source}._supports_sdpa; {why})")
    if fam.sdpa:
        return Attention.SDPA, (f"attention: sdpa (transformers default for {key}: {source}."
                                f"_supports_sdpa = True since {fam.since}{history})")
    return Attention.EAGER, (f"attention: eager, T x T scores kept ({key} has no sdpa in "
                             f"transformers 5.24: {source}._supports_sdpa is "
                             f"{'False' if fam.since else 'not set'}{history})")
