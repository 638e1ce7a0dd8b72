"""The architecture variants (planner/arch/): which variants a model's flags pick, their counts
against hand arithmetic, and a new variant composing into the block without a branch."""

from __future__ import annotations

import dataclasses

import pytest

from planner.activations import AmpRegime, block_saved, plan_activations
from planner.arch import Arch, variants_of
from planner.arch.base import Ctx, Saved
from planner.arch.mlp import Gelu
from planner.params import block_tensors
from planner.presets import PRESETS
from planner.spec import Attention, Checkpointing, MlpKind, ModelSpec, Precision
from planner.throughput import matmul_params


def _names(arch: Arch) -> tuple[str, ...]:
    return tuple(type(v).__name__ for v in (arch.layout, arch.norm, arch.attention, arch.mlp,
                                             arch.position))


@pytest.mark.parametrize(("preset", "expected"), [
    ("llama3-8b", ("PreNorm", "RMSNorm", "Mha", "Gated", "Rope")),
    ("gpt2", ("PreNorm", "LayerNorm", "Mha", "Gelu", "Learned")),
    ("bloom-560m", ("PreNorm", "LayerNorm", "Mha", "Gelu", "Alibi")),
    ("gemma2-9b", ("Sandwich", "RMSNorm", "Mha", "Gated", "Rope")),
    ("olmo2-7b", ("PostNorm", "RMSNorm", "Mha", "Gated", "Rope")),
    ("olmo-1b", ("PreNorm", "PlainLayerNorm", "Mha", "Gated", "Rope")),
    ("falcon-7b", ("Parallel", "LayerNorm", "Mha", "Gelu", "Rope")),
    # Falcon-40B's parallel block has two norms: the same tensors as a pre-norm block
    ("falcon-40b", ("PreNorm", "LayerNorm", "Mha", "Gelu", "Rope")),
    ("mixtral-8x7b", ("PreNorm", "RMSNorm", "Mha", "Moe", "Rope")),
    ("deepseek-v3", ("PreNorm", "RMSNorm", "Mla", "Moe", "Rope")),
])
def test_variants_follow_the_flags(preset: str, expected: tuple[str, ...]) -> None:
    assert _names(variants_of(PRESETS[preset])) == expected


def test_qk_norm_and_moe_parts() -> None:
    assert type(variants_of(PRESETS["qwen3-8b"]).attention.qk).__name__ == "HeadQkNorm"
    assert type(variants_of(PRESETS["olmo2-7b"]).attention.qk).__name__ == "FullQkNorm"
    assert type(variants_of(PRESETS["llama3-8b"]).attention.qk).__name__ == "NoQkNorm"
    ds = variants_of(PRESETS["deepseek-v2-lite"])
    assert ds.mlp.shared.width == 2816 and ds.dense_mlp.width == 10944
    assert ds.mlp.dense is ds.dense_mlp
    gemma = variants_of(PRESETS["gemma2-9b"]).attention
    assert (type(gemma.window).__name__, type(gemma.softcap).__name__) \
        == ("SlidingWindow", "TanhSoftcap")
    llama = variants_of(PRESETS["llama3-8b"]).attention
    assert (type(llama.window).__name__, type(llama.softcap).__name__) \
        == ("FullAttention", "FullAttention")
    mixtral = variants_of(PRESETS["mixtral-8x7b"])
    assert mixtral.mlp.shared is None and mixtral.dense_mlp is None


def test_matmul_weights_by_hand() -> None:
    """Matmul weights a token multiplies per block, each variant's own count."""
    # Llama-3-8B: q and o 4096 x 4096, k and v 1024 x 4096 -> 4096 * 10240 = 41,943,040;
    # SwiGLU 3 * 4096 * 14336 = 176,160,768
    llama = variants_of(PRESETS["llama3-8b"])
    assert llama.attention.matmul_weights(PRESETS["llama3-8b"]) == 41_943_040
    assert llama.mlp.matmul_weights(PRESETS["llama3-8b"]) == 176_160_768
    assert llama.norm.matmul_weights(PRESETS["llama3-8b"]) == 0
    # Qwen1.5-MoE-A2.7B: router 60 * 2048 = 122,880; 4 of 60 experts 4 * 3 * 2048 * 1408
    # = 34,603,008; shared expert 3 * 2048 * 5632 = 34,603,008; shared gate 2048
    qwen = PRESETS["qwen1.5-moe-a2.7b"]
    assert variants_of(qwen).mlp.matmul_weights(qwen) == 122_880 + 34_603_008 + 34_603_008 + 2048
    # DeepSeek-V2-Lite, MLA without a q rank (h 2048, 16 heads of 128 + 64, v 128, rank 512):
    # q 16 * 192 * 2048 = 6,291,456; kv_a (512 + 64) * 2048 = 1,179,648;
    # kv_b 16 * (128 + 128) * 512 = 2,097,152; o 2048 * 16 * 128 = 4,194,304 -> 13,762,560
    ds = PRESETS["deepseek-v2-lite"]
    assert variants_of(ds).attention.matmul_weights(ds) == 13_762_560
    # its MoE: router 64 * 2048 = 131,072; 6 experts 6 * 3 * 2048 * 1408 = 51,904,512;
    # shared 3 * 2048 * 2816 = 17,301,504 -> 69,337,088; the dense first block's MLP
    # 3 * 2048 * 10944 = 67,239,936. The average of 26 MoE blocks and 1 dense block:
    # (83,099,648 * 26 + 81,002,496) // 27 = 83,021,975
    assert matmul_params(ds) == (83_021_975, 102400 * 2048)


TINY = ModelSpec(name="tiny", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128,
                 vocab=256)
"""h 64, 4 heads of 16 (q 64), 2 kv heads (kv 32), SwiGLU of 128, RMSNorm, RoPE."""


def test_block_saved_by_hand() -> None:
    """One micro-batch of 32 tokens in bf16 module regime (c = r = 2), flash SDPA."""
    saved = block_saved(TINY, 32, 1, 32, Attention.SDPA, AmpRegime.MODULE, 2, 2)
    # norm1: fp32 input 4 * 32 * 64 = 8192, rstd 4 * 32 = 128, normed 2 * 32 * 64 = 4096
    norm = 8192 + 128 + 4096
    # q, k, v's shared input 4096; SDPA q 2 * 32 * 64 = 4096, k and v 2 * 32 * 32 = 2048
    # each, out 4096, logsumexp 4 * 1 * 4 * 32 = 512
    attention = 4096 + 4096 + 2048 + 2048 + 4096 + 512
    # norm2 as norm1; the MLP's input 4096; gate, act, up outputs and down's input
    # 2 * 32 * 128 = 8192 each
    mlp = norm + 4096 + 4 * 8192
    assert sum(s.nbytes for s in saved) == norm + attention + mlp == 78_592


class Relu2(Gelu):
    """A made-up MLP for the test: down(relu(up(m)) ** 2) (Primer's squared ReLU, So et al.
    2021): relu saves its output, the square saves relu's output (the same tensor), down saves
    the square."""

    __slots__ = ()

    def intermediates(self, m, x: Ctx, tokens: int, prefix: str,
                      autocast: bool) -> list[Saved]:
        n = x.c * tokens * self.width
        return [Saved(f"{prefix}.relu_out", n), Saved(f"{prefix}.down.input", n)]


def test_a_new_variant_composes_without_a_branch() -> None:
    """Swapping the MLP variant changes the block's parameters and saved tensors in place;
    the layout, norm and attention parts are untouched."""
    m = dataclasses.replace(TINY, mlp=MlpKind.GELU)
    base = variants_of(m)
    arch = Arch(base.layout, base.norm, base.position, base.attention, Relu2(128), None)
    x = Ctx(32, 1, 32, Attention.SDPA, False, 2, 2)
    saved = arch.block_saved(m, x)
    old = base.block_saved(m, x)
    # GELU saves up's output and down's input; Relu2 relu's output and down's input: the
    # same bytes, one name changed, in the same place
    assert [s.name for s in saved] == [s.name.replace("mlp.up_out", "mlp.relu_out")
                                       for s in old]
    assert [s.nbytes for s in saved] == [s.nbytes for s in old]
    # parameters: up and down, as the GELU MLP it derives from
    assert [n for n, _ in arch.block_params(m)] == [n for n, _ in block_tensors(m)]
    # q, o 64 x 64, k, v 32 x 64; up and down 128 x 64
    assert arch.block_matmul_weights(m) == base.block_matmul_weights(m) \
        == 64 * (2 * 64 + 2 * 32) + 2 * 64 * 128


def test_dense_first_blocks_have_their_own_mlp() -> None:
    """DeepSeek-V2-Lite's first block: a SwiGLU of 10944 instead of the router and experts."""
    ds = PRESETS["deepseek-v2-lite"]
    dense = dict(block_tensors(ds, dense=True))
    assert dense["mlp.gate.weight"] == (10944, 2048)
    assert not any(n.startswith("mlp.w_") or "router" in n for n in dense)
    moe = [n for n, _ in block_tensors(ds) if n.startswith("mlp.")]
    assert moe == ["mlp.router.weight", "mlp.w_gate", "mlp.w_up", "mlp.w_down",
                   "mlp.shared.gate.weight", "mlp.shared.up.weight", "mlp.shared.down.weight"]


def test_plan_activations_reads_the_variants() -> None:
    """The whole plan goes through the composed block: the tiny model's eager sum above."""
    plan = plan_activations(TINY, batch=1, seq=32, precision=Precision.BF16,
                            attention=Attention.SDPA, checkpointing=Checkpointing.NONE,
                            uses_autocast=False)
    assert plan.block_bytes == 78_592


def test_window_and_softcap_by_hand() -> None:
    """TINY with one of its two blocks sliding over 16 tokens and soft-capped logits; 32
    tokens, c = 2."""
    m = dataclasses.replace(TINY, sliding_window=16, sliding_layers=1, attn_softcap=True)
    sdpa = {s.name: s.nbytes for s in block_saved(m, 32, 1, 32, Attention.SDPA,
                                                  AmpRegime.MODULE, 2, 2)}
    # the (1, 1, 32, 32) additive mask in c, kept by 1 of 2 blocks: 2 * 32 * 32 * 1 // 2
    assert sdpa["sdpa.window_mask"] == 1024
    assert "attn.softcap_tanh" not in sdpa  # flash SDPA takes no soft-cap
    eager = {s.name: s.nbytes for s in block_saved(m, 32, 1, 32, Attention.EAGER,
                                                   AmpRegime.MODULE, 2, 2)}
    # tanh's output over the (1, 4 heads, 32, 32) scores in c: 2 * 4 * 32 * 32
    assert eager["attn.softcap_tanh"] == 8192
    assert "sdpa.window_mask" not in eager
    # within the window: no mask
    short = block_saved(m, 16, 1, 16, Attention.SDPA, AmpRegime.MODULE, 2, 2)
    assert "sdpa.window_mask" not in {s.name for s in short}
