"""Value types that describe a planning question: the model, the training run, the candidate.

Pure data: no I/O, no torch. Every byte count elsewhere in the planner is derived from these.
Parameter shapes follow the reference implementation in ``probes/models.py`` exactly (a test
builds the real module and compares ``param_tensors`` with ``named_parameters``), so the
planner and the trace probes describe one model.
"""

from __future__ import annotations

import enum
from dataclasses import field, replace
from typing import Any

from planner.lazy_dataclass import dataclass


class MlpKind(enum.StrEnum):
    GELU = "gelu"  # up -> GELU -> down (GPT-2, BERT, BLOOM, Falcon)
    SWIGLU = "swiglu"  # down(silu(gate(x)) * up(x)) (Llama, Mistral, Qwen, Phi-3)
    GEGLU = "geglu"  # down(gelu(gate(x)) * up(x)) (Gemma)

    @property
    def gated(self) -> bool:
        return self is not MlpKind.GELU


class NormKind(enum.StrEnum):
    LAYERNORM = "layernorm"  # weight + bias
    RMSNORM = "rmsnorm"  # weight only
    LAYERNORM_PLAIN = "layernorm-plain"  # no weight, no bias (OLMo-1's non-parametric norm)


class QkNorm(enum.StrEnum):
    """An RMSNorm on the queries and keys before RoPE."""

    NONE = "none"
    HEAD = "head"  # over each head's head_dim (Qwen3, Gemma-3: q_norm/k_norm of head_dim)
    FULL = "full"  # over all heads at once (OLMo-2: q_norm of n_heads*head_dim, k_norm of kv_dim)


class PositionKind(enum.StrEnum):
    ROPE = "rope"  # rotary, no parameters
    LEARNED = "learned"  # absolute position table of max_positions x hidden
    ALIBI = "alibi"  # linear biases, no parameters (BLOOM)


class Precision(enum.StrEnum):
    FP32 = "fp32"
    FP16_AMP = "fp16-amp"  # fp32 params/master, fp16 compute
    BF16_AMP = "bf16-amp"  # fp32 params/master, bf16 compute
    BF16 = "bf16"  # pure bf16 params, grads and optimizer state

    @property
    def param_bytes(self) -> int:
        """Bytes of one stored (master) parameter element."""
        return 2 if self is Precision.BF16 else 4

    @property
    def compute_bytes(self) -> int:
        """Bytes of one activation / working-copy element in matmuls."""
        return 4 if self is Precision.FP32 else 2

    @property
    def amp(self) -> bool:
        return self in (Precision.FP16_AMP, Precision.BF16_AMP)


class Dtype(enum.StrEnum):
    """A floating-point dtype a training framework lets one choose."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"

    @property
    def nbytes(self) -> int:
        return 4 if self is Dtype.FP32 else 2


@dataclass(frozen=True, slots=True, kw_only=True)
class MixedPrecision:
    """FSDP's mixed-precision policy (FSDP2 ``MixedPrecisionPolicy``, FSDP1 ``MixedPrecision``)
    and the dtype the sharded parameters are stored in. Each field overrides one value of the
    ``--precision`` shorthand, the others keep it (``FsdpDtypes.of``). Read by the FSDP
    candidates only (DDP runs torch.autocast, DeepSpeed its own engine)."""

    param_dtype: Dtype | None = None
    """The all-gathered (unsharded) parameters, the compute and the unsharded gradients."""
    reduce_dtype: Dtype | None = None
    """The reduce-scatter input; FSDP2 also accumulates unsynced gradients in it
    (``FSDPParam.to_accumulated_grad_if_needed``)."""
    output_dtype: Dtype | None = None
    """The root module's forward outputs cast to this dtype (None: no cast)."""
    storage_dtype: Dtype | None = None
    """The sharded parameters as stored: their gradients and optimizer state take it too."""

    @property
    def given(self) -> bool:
        return any(getattr(self, f) is not None for f in
                   ("param_dtype", "reduce_dtype", "output_dtype", "storage_dtype"))


@dataclass(frozen=True, slots=True, kw_only=True)
class FsdpDtypes:
    """Bytes per element of each FSDP copy. ``--precision`` is the shorthand: fp32 (fp32
    storage, no policy), bf16 (bf16 storage, no policy), bf16-amp / fp16-amp (fp32 storage,
    ``MixedPrecisionPolicy(param_dtype=16-bit, reduce_dtype=fp32)``: torchtitan's
    ``mixed_precision_param`` / ``_reduce`` defaults); each ``MixedPrecision`` field given
    replaces one of these values. What FSDP2 does with an unset one (``_fsdp_param.py``
    ``init_dtype_attrs``; ``_fsdp_collectives.py`` ``foreach_reduce``): no param_dtype
    computes in the storage dtype, no reduce_dtype reduces in the gradients' dtype
    (param_dtype)."""

    storage: int
    param: int
    reduce: int
    output: int
    """The root's outputs' bytes per element (param when no output_dtype is given)."""

    @classmethod
    def of(cls, precision: Precision, mp: MixedPrecision) -> FsdpDtypes:
        storage = mp.storage_dtype.nbytes if mp.storage_dtype else precision.param_bytes
        if mp.param_dtype:
            param = mp.param_dtype.nbytes
        else:
            param = precision.compute_bytes if precision.amp else storage
        if mp.reduce_dtype:
            reduce = mp.reduce_dtype.nbytes
        else:
            reduce = 4 if precision.amp else param
        output = mp.output_dtype.nbytes if mp.output_dtype else param
        return cls(storage=storage, param=param, reduce=reduce, output=output)


class OptimizerKind(enum.StrEnum):
    ADAMW = "adamw"
    ADAM = "adam"
    SGD = "sgd"
    SGD_MOMENTUM = "sgd-momentum"
    ADAFACTOR = "adafactor"
    ADAMW_8BIT = "adamw-8bit"
    LION = "lion"
    # DeepSpeed's communication-compressing optimizers (stage-0 engine only; planner/onebit.py)
    ONEBIT_ADAM = "onebit-adam"
    ZERO_ONE_ADAM = "zero-one-adam"
    ONEBIT_LAMB = "onebit-lamb"

    @property
    def onebit(self) -> bool:
        """DeepSpeed's 1-bit optimizers (planner/onebit.py, imported only for them)."""
        return self in (OptimizerKind.ONEBIT_ADAM, OptimizerKind.ZERO_ONE_ADAM,
                        OptimizerKind.ONEBIT_LAMB)


class OptimizerImpl(enum.StrEnum):
    FOREACH = "foreach"  # torch default on CUDA: multi-tensor kernels, grouped temporaries
    FUSED = "fused"  # one fused kernel per group: no temporaries
    FOR_LOOP = "for-loop"  # single-tensor: temporaries of the largest tensor only


class Strategy(enum.StrEnum):
    DDP = "ddp"
    NO_SHARD = "no_shard"
    SHARD_GRAD_OP = "shard_grad_op"
    FULL_SHARD = "full_shard"
    HYBRID_SHARD = "hybrid_shard"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    ZERO3 = "zero3"

    @property
    def is_fsdp(self) -> bool:
        return self in (
            Strategy.NO_SHARD,
            Strategy.SHARD_GRAD_OP,
            Strategy.FULL_SHARD,
            Strategy.HYBRID_SHARD,
        )

    @property
    def is_zero(self) -> bool:
        return self in (Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3)


class Offload(enum.StrEnum):
    NONE = "none"
    OPTIMIZER = "optimizer"  # optimizer state (and master weights) live in host RAM
    PARAMS_AND_OPTIMIZER = "params_and_optimizer"  # sharded params too (FSDP CPUOffloadPolicy)


class Checkpointing(enum.StrEnum):
    NONE = "none"
    SELECTIVE = "selective"  # recompute attention core + MLP activation only
    FULL = "full"  # keep only each block's input
    AUTO = "auto"  # planner picks the least that fits (expanded before estimation)


class SacList(enum.StrEnum):
    """Which op save list torchtitan's op-level selective checkpointing runs
    (``torchtitan/distributed/activation_checkpoint.py``; docs/model.md §5.6).

    CURRENT: since torchtitan 114151ad4 (#2357, 2026-03-23) every op of torch's
    ``torch._functorch.partitioners.get_default_op_list().compute_intensive_ops`` (mm, addmm,
    bmm, _scaled_mm, the flash / efficient SDPA ops, ...) plus the other SDPA backends,
    ``aten.max``, ``linear``, the reduce-scatter and all-to-all collectives, and ``aten.topk``
    since 7074b056a (#3146, 2026-05-26); only mm / linear alternate. PRE_2026_03_23: the
    per-model ``_op_sac_save_list`` of ``parallelize.py`` before that commit: mm (linear), the
    SDPA ops, reduce-scatter, all-to-all (MoE models), max, flex attention."""

    CURRENT = "current"
    PRE_2026_03_23 = "pre-2026-03-23"


class Attention(enum.StrEnum):
    SDPA = "sdpa"  # flash / memory-efficient kernels: no T x T scores kept
    EAGER = "eager"  # materialized scores and probabilities


class GradSync(enum.StrEnum):
    """When gradients are reduced under gradient accumulation."""

    EVERY = "every"  # every micro-batch's backward (plain DDP / FSDP loops)
    LAST = "last"  # only the last: DDP/FSDP1 no_sync(), FSDP2 set_requires_gradient_sync(False)


class PipeSchedule(enum.StrEnum):
    """A ``torch.distributed.pipelining`` schedule (torchtitan's
    ``pipeline_parallel_schedule``): those whose micro-batch counts planner/pipeline.py
    derives. Looped BFS is refused by name when parsed."""

    GPIPE = "gpipe"  # ScheduleGPipe: every forward, then every backward
    ONE_F_ONE_B = "1f1b"  # Schedule1F1B
    INTERLEAVED_1F1B = "interleaved-1f1b"  # ScheduleInterleaved1F1B (v stages per rank)
    ZBV = "zbv"  # ScheduleZBVZeroBubble (2 stages per rank in a V, split backward)
    DUALPIPEV = "dualpipev"  # ScheduleDualPipeV (the same V; full and split backwards)
    INTERLEAVED_ZB = "interleaved-zb"  # ScheduleInterleavedZeroBubble (looped, split backward)


class PipeKeptOutputs(enum.StrEnum):
    """Which stage outputs ``torch.distributed.pipelining`` keeps to the end of the step
    (``PipelineStage.output_chunks``, cleared when the next step starts): a version's
    behaviour (docs/model.md §8.7)."""

    NONE = "none"  # torch 2.13 with return_outputs=False (torchtitan since it passes it)
    LAST = "last"  # after pytorch PR #153383 with return_outputs=True: the last stage's
    ALL = "all"  # before pytorch PR #153383 (2025-05): every stage's (forward_one_chunk)


@dataclass(frozen=True, slots=True, kw_only=True)
class Pipeline:
    """Pipeline parallel as torchtitan runs it (``torchtitan/distributed/pipeline_parallel.py``):
    ``degree`` ranks, each holding ``virtual`` stages of the model; a step runs
    ``microbatches`` micro-batches of ``TrainingSpec.micro_batch`` through the schedule.
    degree 1: no pipeline."""

    degree: int = 1
    schedule: PipeSchedule = PipeSchedule.ONE_F_ONE_B
    microbatches: int = 1
    virtual: int = 1
    kept_outputs: PipeKeptOutputs = PipeKeptOutputs.NONE
    """The stage outputs of every micro-batch kept to the step's end (``--pp-kept-outputs``)."""

    @property
    def enabled(self) -> bool:
        return self.degree > 1

    @property
    def n_stages(self) -> int:
        return self.degree * self.virtual


class MeshMode(enum.StrEnum):
    """``--mesh``: plan the parallel degrees as given, or search them (planner/mesh.py)."""

    GIVEN = "given"  # --tp / --pp / --cp as given (the default)
    AUTO = "auto"  # every modelled (TP, PP, CP) layout of the GPUs, the fastest that fits


class OffloadImpl(enum.StrEnum):
    """Which ``OffloadActivations`` runs --activation-offload (docs/model.md §3.7): torchtune's
    (``torchtune/training/_activation_offloading.py``; torchtune's recipes) or TRL's copy
    (``trl/models/activation_offloading.py``; TRL and axolotl), which keeps a repeated save of
    a storage on the GPU and skips parameters' storages."""

    TORCHTUNE = "torchtune"
    TRL = "trl"


class Float8Recipe(enum.StrEnum):
    """torchao float8 training (``torchao.float8.Float8LinearRecipeName``): the linears of the
    blocks swapped for ``Float8Linear`` (torchtitan's float8 converter; the output head kept)."""

    NONE = "none"
    TENSORWISE = "tensorwise"  # one scale per tensor, e4m3 forward / e5m2 grad_output
    ROWWISE = "rowwise"  # a scale per row (axiswise), e4m3 everywhere
    ROWWISE_WITH_GW_HP = "rowwise_with_gw_hp"  # rowwise, the weight gradient in bf16


class LossKind(enum.StrEnum):
    """How the cross-entropy over the vocabulary is computed."""

    FP32 = "fp32"  # logits.float() then cross_entropy (HF ForCausalLMLoss, torchtitan)
    BF16 = "bf16"  # cross_entropy on the low-precision logits
    CHUNKED = "chunked"  # N chunks, each upcast on its own (torchtune CEWithChunkedOutputLoss)
    FUSED = "fused"  # fused linear + cross-entropy, no full logits (Liger)


class CpRotate(enum.StrEnum):
    """How context parallel's ring moves keys and values (torch's ``set_rotate_method``)."""

    ALLGATHER = "allgather"  # torch's default: one all-gather of every rank's k, v
    ALLTOALL = "alltoall"  # a permute (all_to_all) to the next rank each step


class CpKv(enum.StrEnum):
    """How the key/value heads enter context parallel's SDPA (docs/model.md "Context
    parallel")."""

    REPEATED = "repeated"  # torchtitan's repeat_kv, torchtune's expand: every query head
    GROUPED = "grouped"  # transformers' enable_gqa=True (accelerate, the HF Trainer): kv heads


class CompileMode(enum.StrEnum):
    NONE = "none"  # eager
    BLOCKS = "blocks"  # torch.compile per transformer block (torchtitan)
    BLOCKS_LOSS = "blocks+loss"  # and the loss (torchtune compile=True, torchtitan components)
    MODEL = "model"  # the whole model in one graph, its loss included (HF computes it in forward)

    @property
    def loss_compiled(self) -> bool:
        return self in (CompileMode.BLOCKS_LOSS, CompileMode.MODEL)


class Allocator(enum.StrEnum):
    """PYTORCH_CUDA_ALLOC_CONF."""

    DEFAULT = "default"  # the caching allocator's fixed segments
    EXPANDABLE = "expandable"  # expandable_segments:True (torchtitan sets it)


class FlatParams(enum.StrEnum):
    """FSDP1 with frozen parameters: how a block's frozen and trainable tensors are wrapped."""

    APART = "apart"
    """Trainable modules in FSDP units of their own (peft's ``fsdp_auto_wrap_policy``, which
    transformers' Trainer applies under LoRA; FSDP1 requires it without use_orig_params):
    only trainable elements have gradients."""
    MIXED = "mixed"
    """``use_orig_params=True`` with frozen and trainable tensors in one flat parameter
    (``_flat_param.py`` ``_validate_tensors_to_flatten`` permits non-uniform requires_grad):
    the flat parameter's gradient covers all of it, frozen elements included."""


class InitMode(enum.StrEnum):
    """How the weights reach the devices before the first step."""

    META = "meta"  # built on the meta device, sharded, then materialized (torchtitan, FSDP2 docs)
    RANK0 = "rank0"  # rank 0 loads the full model in host RAM, broadcast (sync_module_states)
    FULL = "full"  # every rank loads the full model in host RAM (from_pretrained per rank)
    FULL_GPU = "full-gpu"  # ... and moves it to its GPU before sharding (model.to("cuda"))


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder (or encoder) transformer, described by the numbers that set its memory."""

    name: str
    """Preset id, config path or "custom"."""
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    """Key/value heads: n_heads for MHA, fewer for GQA, 1 for MQA."""
    ffn_hidden: int
    """Inner MLP width (per expert for MoE)."""
    vocab: int
    head_dim: int = 0
    """0 means hidden // n_heads (Gemma-2 sets it explicitly)."""
    tied_embeddings: bool = False
    mlp: MlpKind = MlpKind.SWIGLU
    norm: NormKind = NormKind.RMSNORM
    position: PositionKind = PositionKind.ROPE
    max_positions: int = 0
    """Rows of the learned position table (LEARNED only)."""
    bias: bool = False
    """All linear layers carry a bias (GPT-2, BERT, BLOOM)."""
    qkv_bias: bool = False
    """Only the q, k, v projections carry a bias (Qwen2)."""
    norms_per_layer: int = 2
    """2 for pre-norm blocks, 4 for Gemma-2's sandwich norms, 1 for Falcon-7B's parallel block."""
    parallel_block: bool = False
    """Attention and MLP read the same normed input and are summed (Falcon, GPT-J)."""
    n_experts: int = 1
    """MLP experts per layer; 1 for a dense model."""
    experts_per_token: int = 1
    type_vocab: int = 0
    """Token-type embedding rows (BERT: 2)."""
    embedding_norm: bool = False
    """A norm right after the embeddings (BERT, BLOOM)."""
    encoder_head: bool = False
    """BERT masked-LM head: dense + norm before the (tied) decoder, plus pooler."""
    dropout: float = 0.0
    """Dropout probability of the residual branches, attention probabilities and embeddings
    (GPT-2 and BERT train with 0.1; Llama-style models with 0). Each dropout keeps a 1-byte
    mask per element for backward."""
    shape_assumed: bool = False
    """True when the shape was derived from --params by the scaling rule, not given."""
    family: str = field(default="", compare=False)
    """The transformers ``model_type`` the shape was read as (a config.json's, a preset's);
    "" when unknown. Sets the default attention (planner/attention.py), nothing in the count."""
    attn_implementation: str = field(default="", compare=False)
    """The attention a config.json names (``attn_implementation`` / ``_attn_implementation``),
    "" when it names none."""
    # ---- features of particular families (defaults: the plain block above) -----------------
    attn_out_bias: bool = False
    """The attention output projection carries a bias (Llama's attention_bias=true)."""
    qk_norm: QkNorm = QkNorm.NONE
    post_norms: bool = False
    """The block's two norms sit on the branch outputs, not on the inputs (OLMo-2)."""
    q_lora_rank: int = 0
    """Multi-head latent attention (DeepSeek-V2/V3, Liu et al. 2024 sec. 2.1): rank of the
    query down-projection (0: a plain q projection)."""
    kv_lora_rank: int = 0
    """MLA: rank of the joint key/value compression; > 0 turns MLA on. head_dim is then the
    query/key head (qk_nope_head_dim + qk_rope_head_dim)."""
    qk_rope_dim: int = 0
    """MLA: the decoupled RoPE part of each query/key head (one shared key part)."""
    v_head_dim: int = 0
    """MLA: the value head (0: head_dim)."""
    shared_ffn: int = 0
    """MoE: the inner width of the always-on shared expert(s), all together (DeepSeek:
    n_shared_experts x moe_intermediate_size; Qwen2-MoE: shared_expert_intermediate_size)."""
    router_fp32: bool = False
    """MoE: the router multiplies in fp32 (DeepSeek's gate: F.linear(x.float(), w.float())),
    saving an fp32 copy of its input."""
    shared_expert_gate: bool = False
    """MoE: a sigmoid gate (hidden -> 1) scales the shared expert (Qwen2-MoE)."""
    n_dense_layers: int = 0
    """MoE: blocks with a dense MLP of dense_ffn_hidden instead of experts (DeepSeek's
    first_k_dense_replace, Qwen-MoE's mlp_only_layers / decoder_sparse_step)."""
    dense_ffn_hidden: int = 0
    fused_gate_up: bool = False
    """One gate_up projection whose (tokens, 2 ffn) output is split in two (Phi-3)."""
    fused_qkv: bool = False
    """One qkv projection whose output is split into q, k, v views (Phi-3)."""
    partial_rotary: bool = False
    """RoPE on part of each head, the parts concatenated again (phi-2's
    partial_rotary_factor 0.4)."""
    norm_weight_fp32: bool = False
    """The RMSNorm multiplies by its weight in fp32 before casting back (Gemma's
    x_normed * (1 + w), OLMo-2's w * x_normed): it saves an fp32 product, not a cast."""
    python_gelu: bool = False
    """The tanh GELU written out op by op (HF ``gelu_new``: GPT-2, phi-2), not one kernel."""
    sliding_window: int = 0
    """Tokens a sliding-window layer attends to (0: none); past it such a layer's SDPA gets an
    explicit mask (Mistral-7B-v0.1, Phi-3-mini, Gemma-3's local layers)."""
    sliding_layers: int = 0
    """How many of the blocks attend through the sliding window."""
    attn_softcap: bool = False
    """tanh soft-capping of the attention logits (Gemma-2; eager attention)."""
    final_softcap: bool = False
    """tanh soft-capping of the output logits (Gemma-2)."""
    pooler: bool = True
    """BERT (encoder_head): the pooler dense layer (BertForPreTraining has it,
    BertForMaskedLM not)."""
    head_bias: bool = False
    """The output projection carries a bias (phi-2)."""
    loss_upcast: bool = True
    """The class's own loss upcasts the logits to fp32 (HF ForCausalLMLoss); False: it takes
    cross-entropy in the logits' dtype (BertForMaskedLM's CrossEntropyLoss)."""
    loss_upcast_since: tuple[int, int] = (4, 31)
    """The first transformers release whose class upcasts (planner/loss_dtype.py): 4.31 for
    LlamaForCausalLM (``logits = logits.float()``; not in 4.30.2) and the families that copied
    its head later; 4.49 for GPT-2, Falcon and BLOOM (``self.loss_function``, ForCausalLMLoss;
    4.48.0 still took CrossEntropyLoss on the low-precision logits)."""

    def __post_init__(self) -> None:
        for name in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if self.head_dim == 0 and self.hidden % self.n_heads:
            raise ValueError(
                f"hidden ({self.hidden}) must be a multiple of n_heads ({self.n_heads})"
                " unless head_dim is given"
            )
        if self.experts_per_token > self.n_experts:
            raise ValueError(
                f"experts_per_token ({self.experts_per_token}) must be <= n_experts"
                f" ({self.n_experts})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if self.position is PositionKind.LEARNED and self.max_positions <= 0:
            raise ValueError("max_positions must be positive for learned positions")
        if self.n_dense_layers and not (self.is_moe and self.n_dense_layers < self.n_layers
                                        and self.dense_ffn_hidden > 0):
            raise ValueError(f"n_dense_layers ({self.n_dense_layers}) needs an MoE model with "
                             "fewer dense layers than layers and dense_ffn_hidden")
        if not 0 <= self.sliding_layers <= self.n_layers:
            raise ValueError(f"sliding_layers ({self.sliding_layers}) must be between 0 and "
                             f"n_layers ({self.n_layers})")
        if self.kv_lora_rank and not (self.head_dim and 0 < self.qk_rope_dim < self.head_dim):
            raise ValueError("multi-head latent attention needs head_dim (qk_nope + qk_rope) "
                             f"above qk_rope_dim ({self.qk_rope_dim}) > 0")

    @property
    def d_head(self) -> int:
        return self.head_dim or self.hidden // self.n_heads

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.d_head

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.d_head

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 1

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def o_in_dim(self) -> int:
        """Width of the attention output (the o projection's input)."""
        return self.n_heads * (self.v_head_dim or self.d_head)

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.n_dense_layers if self.is_moe else 0


class Quantize(enum.StrEnum):
    """Frozen base weights of a parameter-efficient fine-tune (bitsandbytes)."""

    NONE = "none"
    NF4 = "nf4"  # 4-bit NormalFloat, QLoRA (Dettmers et al. 2023)
    INT8 = "int8"  # LLM.int8 (Dettmers et al. 2022)


LINEAR_MODULES = ("q", "k", "v", "o", "gate", "up", "down")
"""A block's linear layers (gate only in gated MLPs), by the names LoRA targets use."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FineTune:
    """Which parameters train: everything (the default), LoRA adapters on a frozen (maybe
    quantized) base, or all but frozen embeddings / first layers."""

    lora_rank: int = 0
    """0: no LoRA (the base trains unless frozen below)."""
    lora_targets: tuple[str, ...] = ("q", "v")
    """Adapted linears of each block (peft's default for Llama is q_proj, v_proj)."""
    lora_fp32: bool = True
    """Adapters in fp32 over a low-precision base (peft's autocast_adapter_dtype=True
    default); False: in the base's dtype (torchtune)."""
    lora_dropout: bool = False
    """lora_dropout > 0 (peft default 0.0)."""
    quantize_base: Quantize = Quantize.NONE
    double_quant: bool = True
    """NF4 absmax quantized again (QLoRA recipes; bitsandbytes' own default is False)."""
    freeze_embeddings: bool = False
    freeze_layers: int = 0
    """The first N blocks frozen."""
    train_last_layers: int = 0
    """Everything frozen but the last N blocks (LLaMA-Factory's freeze tuning; 0: unused)."""

    def __post_init__(self) -> None:
        if not isinstance(self.lora_rank, int) or isinstance(self.lora_rank, bool) \
                or self.lora_rank < 0:
            raise ValueError(f"lora_rank must be a non-negative integer, got {self.lora_rank!r}")
        bad = [m for m in self.lora_targets if m not in LINEAR_MODULES]
        if bad or not self.lora_targets:
            raise ValueError(f"lora_targets must be some of {', '.join(LINEAR_MODULES)}, got "
                             f"{', '.join(self.lora_targets) or 'none'}")
        if self.quantize_base is not Quantize.NONE and not self.lora_rank:
            raise ValueError("a quantized base trains only LoRA adapters: give a LoRA rank")
        for name in ("freeze_layers", "train_last_layers"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
        if self.lora_rank and (self.freeze_layers or self.train_last_layers
                               or self.freeze_embeddings):
            raise ValueError("LoRA freezes the whole base already: drop the freeze")

    @property
    def lora(self) -> bool:
        return self.lora_rank > 0

    @property
    def embeddings_frozen(self) -> bool:
        return self.lora or self.freeze_embeddings or bool(self.train_last_layers)

    def head_frozen(self, tied: bool) -> bool:
        """The output head gets no gradient (a tied head is the embedding table)."""
        return self.lora or bool(self.train_last_layers) or (self.freeze_embeddings and tied)

    def frozen_blocks(self, n_layers: int) -> int:
        """Leading blocks with no trainable parameter and no adapter."""
        if self.lora:
            return 0
        if self.train_last_layers:
            return max(0, n_layers - self.train_last_layers)
        return min(self.freeze_layers, n_layers)

    @property
    def full(self) -> bool:
        """Every parameter trains."""
        return not (self.lora or self.freeze_embeddings or self.freeze_layers
                    or self.train_last_layers)


HF_AUTO = "auto"
"""A DeepSpeed value the Hugging Face integration fills in (``DeepSpeedConfig.resolved``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeepSpeedConfig:
    """The DeepSpeed engine settings that hold device or host memory, with DeepSpeed's own
    defaults (``deepspeed/runtime/zero/config.py`` at v0.19.6, commit edaa7221; the config
    docs' table of stage-3 defaults is out of date). Sizes are elements, as in DeepSpeed's
    JSON. ``"auto"`` is the Hugging Face integration's placeholder, resolved from the model's
    hidden size by ``resolved``."""

    reduce_bucket_size: int | str = 500_000_000
    """Gradient bucket (elements): ZeRO-1/2 allocate it during backward, ZeRO-3 at init."""
    allgather_bucket_size: int | str = 500_000_000
    """ZeRO-1/2 parameter all-gather after the step: with current torch the partitions are
    gathered straight into the flat parameter buffer, so it holds no memory of its own."""
    overlap_comm: bool | None = None
    """None: DeepSpeed's validator default, True for stage 3 and False for stages 0-2."""
    contiguous_gradients: bool = True
    sub_group_size: int = 1_000_000_000
    """ZeRO-3: elements of the flat fp32 partition the optimizer steps at a time."""
    stage3_prefetch_bucket_size: int | str = 50_000_000
    stage3_param_persistence_threshold: int | str = 100_000
    """ZeRO-3: parameters with fewer elements stay gathered on every rank."""
    stage3_max_live_parameters: int = 1_000_000_000
    stage3_max_reuse_distance: int = 1_000_000_000
    stage3_gather_16bit_weights_on_model_save: bool = False
    """ZeRO-3 saving: rank 0 gathers a 16-bit state dict into host RAM (module by module on
    the GPU: no more than the gathered working set)."""
    zero_init: bool = True
    """ZeRO-3: the model is built under ``deepspeed.zero.Init`` (partitioned as it is
    constructed; the HF integration does this when the config says stage 3)."""
    # ---- ZeRO++ (Wang et al. 2023, arXiv 2306.10209; ZeRO-3 only: stage_1_and_2.py reads
    # none of the three): planner/memory/zero.py (memory), planner/throughput.py (traffic)
    zero_quantized_weights: bool = False
    """qwZ: ZeRO-3's parameter all-gathers move int8 with an fp32 scale per group of at most
    8000 elements (``partition_parameters.py`` ``CUDAQuantizer``), dequantized on arrival."""
    zero_hpz_partition_size: int = 1
    """hpZ: a secondary 16-bit copy of the parameters sharded over this many ranks (a node),
    kept from the forward to the step; every gather but the first forward's reads it inside
    the group (``_partition_param_sec``). 0 or 1: off."""
    zero_quantized_gradients: bool = False
    """qgZ: on more than one node, ZeRO-3 reduces each gradient matrix by int4 all-to-alls,
    inside the node and then across nodes (``comm/coalesced_collectives.py``
    ``all_to_all_quant_reduce``), instead of a reduce-scatter."""
    fused_adam: bool = True
    """The optimizer is DeepSpeed's own (an ``optimizer`` block: FusedAdam, DeepSpeedCPUAdam
    under offload), else the client's torch optimizer (the HF Trainer without one)."""
    local_step_clipper: int = 16
    """0/1 Adam (``optimizer.params.local_step_clipper``): after ``var_freeze_step`` it
    all-reduces its momentum once every this many steps at most (``zoadam.py``: the local
    step interval doubles up to it); the step time is the average step at that interval."""
    offload_device: str = "cpu"
    """Where ZeRO-3's offload goes: "cpu" (ZeRO-Offload) or "nvme" (ZeRO-Infinity: the states
    live on NVMe; host RAM holds only the swapper's pinned buffers)."""
    grad_accum_dtype: Dtype | None = None
    """``data_types.grad_accum_dtype`` (None: the model's dtype). A bf16 model with fp32
    accumulation under ZeRO stage 1 without offload runs ``BF16_Optimizer``
    (``bf16_optimizer``); the ZeRO optimizers of stages 2-3 (and stage 1 under offload) do
    not read it."""
    bf16_master_weights_and_grads: bool = False
    """``bf16.bf16_master_weights_and_grads``: the ZeRO optimizer's master partition and the
    gradient partition it steps are bf16 (``base_optimizer.py`` ``_configure_master_weights``)."""
    bf16_optimizer_states: bool = False
    """``bf16.bf16_optimizer_states``: the optimizer's moments in bf16 too (the optimizer
    steps bf16 master weights); without it they stay fp32, which DeepSpeed allows only under
    ZeRO-Offload with DeepSpeedCPUAdam."""

    def bf16_optimizer(self, strategy: Strategy, offload: Offload, precision: Precision) -> bool:
        """The engine wraps the optimizer in ``BF16_Optimizer`` rather than the ZeRO optimizer:
        a bf16 model, fp32 gradient accumulation, ZeRO stage 1, no optimizer offload
        (``engine.py`` ``_do_optimizer_sanity_check``, DeepSpeed 0.19.6-0.19.8)."""
        return (strategy is Strategy.ZERO1 and offload is Offload.NONE
                and precision is Precision.BF16_AMP and self.grad_accum_dtype == Dtype.FP32)

    @property
    def zeropp(self) -> bool:
        """Any ZeRO++ variant on."""
        return (self.zero_quantized_weights or self.zero_quantized_gradients
                or self.zero_hpz_partition_size > 1)

    def overlap(self, stage3: bool) -> bool:
        """overlap_comm as DeepSpeed resolves it (``overlap_comm_valid``)."""
        return stage3 if self.overlap_comm is None else self.overlap_comm

    def resolved(self, hidden: int) -> DeepSpeedConfig:
        """"auto" values as ``transformers.integrations.deepspeed``
        (``HfTrainerDeepSpeedConfig.trainer_config_finalize``) and accelerate fill them in:
        reduce_bucket_size = h^2, stage3_prefetch_bucket_size = int(0.9 h^2),
        stage3_param_persistence_threshold = 10 h."""
        auto = {"reduce_bucket_size": hidden * hidden,
                "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
                "stage3_param_persistence_threshold": 10 * hidden}
        changes = {k: v for k, v in auto.items() if getattr(self, k) == HF_AUTO}
        if self.allgather_bucket_size == HF_AUTO:
            changes["allgather_bucket_size"] = 500_000_000
        return replace(self, **changes) if changes else self

    @property
    def autos(self) -> tuple[str, ...]:
        """The settings still "auto"."""
        return tuple(k for k in ("reduce_bucket_size", "allgather_bucket_size",
                                 "stage3_prefetch_bucket_size",
                                 "stage3_param_persistence_threshold")
                     if getattr(self, k) == HF_AUTO)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSpec:
    seq: int = 2048
    micro_batch: int = 1
    grad_accum: int = 1
    precision: Precision = Precision.BF16_AMP
    optimizer: OptimizerKind = OptimizerKind.ADAMW
    optimizer_impl: OptimizerImpl = OptimizerImpl.FOREACH
    attention: Attention = Attention.SDPA
    grad_sync: GradSync = GradSync.EVERY
    """Under accumulation: reduce every micro-batch, or only the last (no_sync)."""
    loss: LossKind = LossKind.FP32
    loss_chunks: int = 8
    """Chunks of the chunked loss (torchtune's default num_output_chunks)."""
    keep_logits: bool = False
    """The loop holds the logits through backward (their fp32 copy is freed once log_softmax
    has run: autograd saves its output, not its input; traced)."""
    optimizer_in_backward: bool = False
    """Every parameter is stepped by its own optimizer in a post-accumulate-grad hook as soon
    as its gradient is accumulated, then its gradient is freed (torchtune
    ``optimizer_in_bwd``): no full gradient set, no step after backward (docs/model.md
    "Optimizer in backward")."""
    activation_offload: bool = False
    """Saved activations offloaded to pinned host RAM (torchtune/TRL ``OffloadActivations``):
    the GPU keeps what is in flight, the host a copy of every offloaded tensor."""
    activation_offload_impl: OffloadImpl = OffloadImpl.TORCHTUNE
    """Whose ``OffloadActivations`` (torchtune's or TRL's copy) runs --activation-offload."""
    compile: CompileMode = CompileMode.NONE
    tf32: bool = False
    """fp32 matmuls on TF32 tensor cores (``torch.backends.cuda.matmul.allow_tf32``, off by
    default since torch 1.12; the HF Trainer's ``tf32``): the step's fp32 matmuls at the
    profile's ``tf32_tflops`` instead of ``fp32_tflops``. No memory effect."""
    sac_list: SacList = SacList.CURRENT
    """The op save list of ``--checkpointing selective`` (torchtitan's, by release: SacList)."""
    sac_force_recompute: tuple[str, ...] = ("moe.router.gate",)
    """torchtitan's ``force_recompute_mm_shapes_by_fqns`` under ``--checkpointing selective``:
    module names whose linears' weight shapes are recomputed and left out of the every-other-mm
    count (planner/sac.py; torchtitan's default since 2025-07-16)."""
    float8: Float8Recipe = Float8Recipe.NONE
    """torchao float8 training of the blocks' linears (docs/model.md "Float8 training")."""
    float8_all_gather: bool = False
    """FSDP all-gathers the float8 linears' weights in float8 (torchao
    ``enable_fsdp_float8_all_gather``; tensorwise only)."""
    allocator: Allocator = Allocator.DEFAULT
    fsdp_version: int = 2
    """FSDP1 (FullyShardedDataParallel) or FSDP2 (fully_shard), for the FSDP strategies."""
    flat_params: FlatParams = FlatParams.APART
    """FSDP1 with frozen parameters: trainable modules wrapped apart, or mixed into each
    block's flat parameter (use_orig_params=True)."""
    param_dtype: Dtype | None = None
    """FSDP's mixed-precision policy (``mixed_precision``): the all-gathered parameters, the
    compute, the unsharded gradients. None here and below: what ``precision`` implies."""
    reduce_dtype: Dtype | None = None
    """FSDP's reduce-scatter input; FSDP2 also accumulates unsynced gradients in it."""
    output_dtype: Dtype | None = None
    """FSDP's cast of the root module's forward outputs."""
    storage_dtype: Dtype | None = None
    """The sharded parameters as stored (the model as loaded)."""
    init: InitMode = InitMode.META
    finetune: FineTune = field(default_factory=FineTune)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    """The DeepSpeed engine's settings, for the ZeRO candidates."""
    pipeline: Pipeline = field(default_factory=Pipeline)
    """Pipeline parallel (``--pp``): FSDP2 over the data-parallel ranks of each stage."""
    cp: int = 1
    """Context-parallel degree (torch's ``context_parallel``, ring attention): each GPU of a
    CP group holds seq / cp tokens; 1: none (planner/context_parallel.py)."""
    cp_rotate: CpRotate = CpRotate.ALLGATHER
    """How the ring moves keys and values (torch's ``set_rotate_method``)."""
    cp_kv: CpKv = CpKv.REPEATED
    """The key/value heads SDPA is given under CP: repeated to the query heads (torchtitan,
    torchtune) or grouped, as the model has them (transformers' ``enable_gqa``)."""
    ep: int = 1
    """Expert-parallel degree (torchtitan's ``expert_parallel_degree``): each GPU of an EP
    group owns n_experts / ep routed experts; 1: none (planner/expert_parallel.py)."""
    ep_imbalance: float = 1.0
    """EP: the rows the busiest rank's experts receive over the balanced t x top_k (1:
    balanced routing; dropless)."""
    transformers_version: str | None = None
    """The transformers release the model's own loss comes from ("major.minor"); None: a
    recent one (planner/loss_dtype.py)."""

    def __post_init__(self) -> None:
        for name in ("seq", "micro_batch", "grad_accum", "loss_chunks", "cp", "ep"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.fsdp_version not in (1, 2):
            raise ValueError(f"fsdp_version must be 1 or 2, got {self.fsdp_version!r}")
        if not 1.0 <= self.ep_imbalance <= 1024.0:
            raise ValueError(f"ep_imbalance must be in [1, 1024], got {self.ep_imbalance!r}")

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.seq * self.micro_batch

    @property
    def local_seq(self) -> int:
        """Tokens of a sequence on one GPU: seq / cp under context parallel."""
        return self.seq // self.cp

    @property
    def mixed_precision(self) -> MixedPrecision:
        """FSDP's mixed-precision policy and the sharded parameters' dtype, as given."""
        return MixedPrecision(param_dtype=self.param_dtype, reduce_dtype=self.reduce_dtype,
                              output_dtype=self.output_dtype, storage_dtype=self.storage_dtype)

    @property
    def fsdp_dtypes(self) -> FsdpDtypes:
        """The FSDP copies' bytes per element (the policy, else ``precision``'s)."""
        return FsdpDtypes.of(self.precision, self.mixed_precision)


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    strategy: Strategy
    offload: Offload = Offload.NONE
    checkpointing: Checkpointing = Checkpointing.NONE
    tp: int = 1
    """Tensor-parallel degree (with sequence parallel), composed with FSDP on a 2-D mesh as
    torchtitan does; 1: none."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuProfile:
    """One GPU type (and the node it usually sits in). Loaded from hardware_profiles/*.toml."""

    id: str
    name: str
    vendor: str
    memory_bytes: int
    """Total device memory as the driver reports it (nvidia-smi / rocm-smi total)."""
    bf16_tflops: float
    fp16_tflops: float
    tf32_tflops: float
    fp32_tflops: float
    """Dense peak rates, TFLOP/s (no structured sparsity)."""
    fp8_tflops: float | None = None
    """Dense float8 tensor-core peak (e4m3/e5m2 inputs); None: the GPU has none."""
    fp8_matmul_speedup: float | None = None
    """Measured float8 (``torch._scaled_mm``, tensorwise scales) matmul rate over the bf16
    ``mm`` rate at training linears' shapes; None: not measured, fp8_tflops / bf16_tflops is
    *assumed* (planner/float8.py)."""
    fp8_rowwise_matmul_speedup: float | None = None
    """The same for the rowwise-scaled kernel."""
    hbm_bandwidth_bytes_per_s: float
    intra_node_link: str
    intra_node_bandwidth_bytes_per_s: float
    """Per-GPU unidirectional bandwidth to its peers inside a node."""
    inter_node_bandwidth_bytes_per_s: float
    """Per-GPU unidirectional network bandwidth between nodes (default assumption)."""
    gpus_per_node: int
    host_ram_bytes_per_node: int
    pcie_bandwidth_bytes_per_s: float
    """Host <-> device, unidirectional, per GPU (offload traffic)."""
    cuda_context_bytes: int
    """Device memory taken by the CUDA/ROCm context and loaded kernels before any tensor."""
    compute_efficiency: float = 0.5
    """Achieved fraction of the dense peak in large-model training, eager (fitted per GPU family on
    public throughput measurements; calibrations replace it)."""
    compiled_compute_efficiency: float | None = None
    """The same under torch.compile (training.compile != none), fitted per GPU family on the
    compiled public runs; None: compute_efficiency."""
    sources: dict[str, str] = field(default_factory=dict)
    """Field name -> where the value comes from."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    gpu: GpuProfile
    n_gpus: int
    gpus_per_node: int
    host_ram_bytes_per_node: int

    def __post_init__(self) -> None:
        if self.n_gpus <= 0:
            raise ValueError(f"n must be a positive integer, got {self.n_gpus!r}")
        if self.gpus_per_node <= 0:
            raise ValueError(f"gpus_per_node must be positive, got {self.gpus_per_node!r}")

    @property
    def n_nodes(self) -> int:
        return -(-self.n_gpus // self.gpus_per_node)

    @property
    def gpus_on_busiest_node(self) -> int:
        return min(self.n_gpus, self.gpus_per_node)


@dataclass(frozen=True, slots=True, kw_only=True)
class TracedModel:
    """A model known by the real module's own structure and counts, not by a shape: what
    tracing it found (probes.hf.inspect for a Hugging Face class, probes.api for a module).
    A request for such a model (``planner.request.build_request(..., traced=...)``) is
    planned from traces (probes/trace_plan.py); every count it prints comes from here."""

    name: str
    cls: str
    n_layers: int
    """Decoder layers (the repeated blocks)."""
    period: int | None
    """The layers repeat with this period (None: they do not; traced at full depth)."""
    params: int
    active_params: int
    """Used per token (MoE: the top-k experts)."""
    per_block_params: tuple[int, ...]
    root_params: int
    matmul_per_block: tuple[int, ...]
    """Matmul weights a token multiplies, per block (planner.throughput.matmul_params)."""
    matmul_head: int
    q_dim: int
    """Attention width (heads x head_dim): the attention FLOPs; 0 when unknown."""
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    ffn: int | None = None
    vocab: int | None = None
    experts: int | None = None
    top_k: int | None = None
    tied_embeddings: bool = False
    block_class: str = ""
    notes: tuple[str, ...] = ()

    @classmethod
    def from_inspect(cls, d: dict[str, Any], name: str) -> TracedModel:
        return cls(name=name, cls=d["class"], n_layers=d["n_layers"], period=d["period"],
                   params=d["params"], active_params=d["active_params"],
                   per_block_params=tuple(d["per_block_params"]), root_params=d["root_params"],
                   matmul_per_block=tuple(d["matmul_per_block"]), matmul_head=d["matmul_head"],
                   q_dim=d["q_dim"], hidden=d.get("hidden"), heads=d.get("heads"),
                   kv_heads=d.get("kv_heads"), ffn=d.get("ffn"), vocab=d.get("vocab"),
                   experts=d.get("experts"), top_k=d.get("top_k"),
                   tied_embeddings=bool(d.get("tied_embeddings")),
                   block_class=d.get("block_class", ""), notes=tuple(d.get("notes", ())))

    def proxy_spec(self) -> ModelSpec:
        """A ModelSpec with this model's depth and the widths it knows, for the parts of the
        plan that read one (the step-time model's bandwidth terms). Its parameter counts
        are NOT the model's: every count the plan prints comes from this object."""
        h = self.hidden or 64
        heads = self.heads or 1
        kv = self.kv_heads or heads
        try:
            return ModelSpec(name=f"{self.name} (traced)", n_layers=self.n_layers, hidden=h,
                             n_heads=heads,
                             n_kv_heads=kv if heads % kv == 0 else heads,
                             head_dim=(self.q_dim // heads) if self.q_dim % heads == 0 else 0,
                             ffn_hidden=self.ffn or 4 * h, vocab=self.vocab or 1,
                             tied_embeddings=self.tied_embeddings)
        except ValueError:
            return ModelSpec(name=f"{self.name} (traced)", n_layers=self.n_layers, hidden=h, n_heads=1,
                             n_kv_heads=1, ffn_hidden=4 * h, vocab=self.vocab or 1)

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "source": "trace", "class": self.cls,
                "params": self.params, "active_params": self.active_params,
                "layers": self.n_layers, "layer_period": self.period,
                "block_class": self.block_class, "block_params": list(self.per_block_params),
                "root_params": self.root_params, "hidden": self.hidden, "heads": self.heads,
                "kv_heads": self.kv_heads, "ffn": self.ffn, "vocab": self.vocab,
                "experts": self.experts, "experts_per_token": self.top_k,
                "tied_embeddings": self.tied_embeddings, "q_dim": self.q_dim,
                "notes": list(self.notes)}


def efficiency_provenance(gpu: GpuProfile, compile: CompileMode = CompileMode.NONE) -> str:
    """'measured', 'derived' or 'assumed': read from the source of the efficiency
    ``planner.throughput.default_compute_efficiency`` uses (hardware_profiles/*.toml
    ``[sources]``, or ``calibration <id>`` once a calibration replaced it). A source starting "fitted" or
    "measured", or a calibration, is measured; "derived", derived; anything else, or none (a
    user's file without a source), assumed."""
    key = ("compiled_compute_efficiency" if compile is not CompileMode.NONE
           and gpu.compiled_compute_efficiency is not None else "compute_efficiency")
    src = gpu.sources.get(key, "").strip().lower()
    if src.startswith(("fitted", "measured", "calibration ")):
        return "measured"
    if src.startswith("derived"):
        return "derived"
    return "assumed"
