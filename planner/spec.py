"""Value types that describe a planning question: the model, the training run, the candidate.

Pure data: no I/O, no torch. Every byte count elsewhere in the planner is derived from these.
Parameter shapes follow the reference implementation in ``probes/models.py`` exactly (a test
builds the real module and compares ``param_tensors`` with ``named_parameters``), so the
planner and the trace probes describe one model.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


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


class OptimizerKind(enum.StrEnum):
    ADAMW = "adamw"
    ADAM = "adam"
    SGD = "sgd"
    SGD_MOMENTUM = "sgd-momentum"
    ADAFACTOR = "adafactor"
    ADAMW_8BIT = "adamw-8bit"
    LION = "lion"


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


class Attention(enum.StrEnum):
    SDPA = "sdpa"  # flash / memory-efficient kernels: no T x T scores kept
    EAGER = "eager"  # materialized scores and probabilities


class GradSync(enum.StrEnum):
    """When gradients are reduced under gradient accumulation."""

    EVERY = "every"  # every micro-batch's backward (plain DDP / FSDP loops)
    LAST = "last"  # only the last: DDP/FSDP1 no_sync(), FSDP2 set_requires_gradient_sync(False)


class LossKind(enum.StrEnum):
    """How the cross-entropy over the vocabulary is computed."""

    FP32 = "fp32"  # logits.float() then cross_entropy (HF ForCausalLMLoss, torchtitan)
    BF16 = "bf16"  # cross_entropy on the low-precision logits
    CHUNKED = "chunked"  # N chunks, each upcast on its own (torchtune CEWithChunkedOutputLoss)
    FUSED = "fused"  # fused linear + cross-entropy, no full logits (Liger)


class CompileMode(enum.StrEnum):
    NONE = "none"  # eager
    BLOCKS = "blocks"  # torch.compile per transformer block (torchtitan)
    MODEL = "model"  # the whole model in one graph


class Allocator(enum.StrEnum):
    """PYTORCH_CUDA_ALLOC_CONF."""

    DEFAULT = "default"  # the caching allocator's fixed segments
    EXPANDABLE = "expandable"  # expandable_segments:True (torchtitan sets it)


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

    def __post_init__(self) -> None:
        if not isinstance(self.lora_rank, int) or isinstance(self.lora_rank, bool) \
                or self.lora_rank < 0:
            raise ValueError(f"lora_rank must be a non-negative integer, got {self.lora_rank!r}")
        bad = [m for m in self.lora_targets if m not in LINEAR_MODULES]
        if bad or not self.lora_targets:
            raise ValueError(f"lora_targets must be some of {', '.join(LINEAR_MODULES)}, got "
                             f"{', '.join(self.lora_targets) or 'none'}")
        if self.quantize_base is not Quantize.NONE and not self.lora_rank:
            raise ValueError("a quantized base trains only adapters: give lora_rank")
        if not isinstance(self.freeze_layers, int) or self.freeze_layers < 0:
            raise ValueError(f"freeze_layers must be a non-negative integer, got "
                             f"{self.freeze_layers!r}")

    @property
    def lora(self) -> bool:
        return self.lora_rank > 0

    @property
    def full(self) -> bool:
        """Every parameter trains."""
        return not self.lora and not self.freeze_embeddings and not self.freeze_layers


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
    """The loop holds the logits (and their fp32 copy) through backward."""
    compile: CompileMode = CompileMode.NONE
    allocator: Allocator = Allocator.DEFAULT
    fsdp_version: int = 2
    """FSDP1 (FullyShardedDataParallel) or FSDP2 (fully_shard), for the FSDP strategies."""
    init: InitMode = InitMode.META
    finetune: FineTune = field(default_factory=FineTune)

    def __post_init__(self) -> None:
        for name in ("seq", "micro_batch", "grad_accum", "loss_chunks"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.fsdp_version not in (1, 2):
            raise ValueError(f"fsdp_version must be 1 or 2, got {self.fsdp_version!r}")

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.seq * self.micro_batch


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
    """Achieved fraction of the dense peak in large-model training (fitted per GPU family on
    public throughput measurements; calibrations replace it)."""
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
