"""MLP variants: GELU (up -> act -> down), gated (SwiGLU / GeGLU: down(act(gate) * up)) and
mixture of experts (routed experts of either kind, with shared experts, Qwen2-MoE's shared
gate and DeepSeek's dense first layers). ``width`` is the inner width; ``matmul_weights``
the matmul weights a token multiplies."""

from __future__ import annotations

from collections.abc import Iterator

from planner.arch.base import (FP32, Ctx, LinearOut, Saved, Shape, inputs_saved, linear,
                               linear_out, scaled)


class Gelu:
    """down(gelu(up(m))) (GPT-2, BERT, BLOOM, Falcon, phi-2)."""

    __slots__ = ("width",)
    gated = False

    def __init__(self, width: int) -> None:
        self.width = width

    def matrices(self, m) -> list[tuple[str, int]]:
        """(name, output width) of each linear in execution order."""
        return [("up", self.width), ("down", m.hidden)]

    def params(self, m, prefix: str) -> Iterator[tuple[str, Shape]]:
        h, f = m.hidden, self.width
        if self.gated:
            yield from linear(f"{prefix}.gate", f, h, m.bias)
        yield from linear(f"{prefix}.up", f, h, m.bias)
        yield from linear(f"{prefix}.down", h, f, m.bias)

    def n_inputs(self, m) -> int:
        """Linears that read the MLP's input (each casts its own copy under autocast)."""
        return 1

    def saved(self, m, x: Ctx, in_bytes: int, own_input: bool = True) -> list[Saved]:
        """The input (``own_input`` False: a tensor an earlier reader saved, the parallel
        block's shared norm output) and the intermediates over every token."""
        names = tuple(f"in{i}" for i in range(self.n_inputs(m)))
        return (inputs_saved("mlp", names, in_bytes, x, m.hidden, "mlp.input", own_input)
                + self.intermediates(m, x, x.t, "mlp", x.autocast))

    def intermediates(self, m, x: Ctx, tokens: int, prefix: str,
                      autocast: bool) -> list[Saved]:
        """What the MLP keeps over ``tokens`` rows (its input counted apart)."""
        c, f = x.c, self.width
        # down(gelu(up(m))): gelu saves up's output, down saves gelu's output.
        if m.python_gelu:
            # transformers' NewGELUActivation (gelu_new): 0.5 * x * (1 + tanh(sqrt(2/pi) *
            # (x + 0.044715 * x^3))) op by op: pow saves x, tanh saves its output, the last
            # multiply saves both operands (0.5 * x and 1 + tanh), down saves the product.
            # Under autocast pow is an fp32 op (autocast_mode.cpp's fp32 list): it saves an
            # fp32 copy of x, and everything after it up to down's cast is promoted to fp32
            # but 0.5 * x.
            wide = FP32 if autocast else c
            return [Saved(f"{prefix}.gelu.pow_input", wide * tokens * f),
                    Saved(f"{prefix}.gelu.tanh_out", wide * tokens * f),
                    Saved(f"{prefix}.gelu.half_x", c * tokens * f),
                    Saved(f"{prefix}.gelu.one_plus_tanh", wide * tokens * f),
                    Saved(f"{prefix}.down.input", c * tokens * f)]
        return [Saved(f"{prefix}.up_out", c * tokens * f),
                Saved(f"{prefix}.down.input", c * tokens * f)]

    def linear_outputs(self, m, t: int, c: int) -> list[LinearOut]:
        out: list[LinearOut] = []
        if m.fused_gate_up:
            out += linear_out("gate_up.out", 2 * self.width, t, c, m.bias, m.hidden)
        else:
            for name, width in self.matrices(m)[:-1]:
                out += linear_out(f"{name}.out", width, t, c, m.bias, m.hidden)
        return out + linear_out("down.out", m.hidden, t, c, m.bias, self.width)

    def matmul_weights(self, m) -> int:
        return len(self.matrices(m)) * m.hidden * self.width


class Gated(Gelu):
    """down(act(gate(m)) * up(m)): SwiGLU (Llama, Mistral, Qwen; Shazeer 2020), GeGLU
    (Gemma). Phi-3's fused gate_up: the two halves are views of one output."""

    __slots__ = ()
    gated = True

    def matrices(self, m) -> list[tuple[str, int]]:
        return [("gate", self.width), ("up", self.width), ("down", m.hidden)]

    def n_inputs(self, m) -> int:
        return 1 if m.fused_gate_up else 2

    def intermediates(self, m, x: Ctx, tokens: int, prefix: str,
                      autocast: bool) -> list[Saved]:
        """act saves gate's output, mul saves act's output and up's output, down saves the
        product (a fused gate_up's halves: the same bytes)."""
        n = x.c * tokens * self.width
        return [Saved(f"{prefix}.gate_out", n), Saved(f"{prefix}.act_out", n),
                Saved(f"{prefix}.up_out", n), Saved(f"{prefix}.down.input", n)]


class Moe:
    """A router over n_experts experts of ``expert``'s kind, experts_per_token of them per
    token (Mixtral, Qwen-MoE, DeepSeek); ``shared``: the always-on shared expert(s) (DeepSeek's
    shared_experts, Qwen2-MoE's shared_expert, None without); ``dense``: the MLP of the dense
    first blocks (DeepSeek's first_k_dense_replace; None without)."""

    __slots__ = ("expert", "shared", "dense")

    def __init__(self, expert: Gelu, shared: Gelu | None, dense: Gelu | None) -> None:
        self.expert, self.shared, self.dense = expert, shared, dense

    def params(self, m, prefix: str) -> Iterator[tuple[str, Shape]]:
        e, h, f = m.n_experts, m.hidden, self.expert.width
        yield f"{prefix}.router.weight", (e, h)
        if self.expert.gated:
            yield f"{prefix}.w_gate", (e, f, h)
        yield f"{prefix}.w_up", (e, f, h)
        yield f"{prefix}.w_down", (e, h, f)
        if self.shared:
            yield from self.shared.params(m, f"{prefix}.shared")
        if m.shared_expert_gate:
            yield f"{prefix}.shared_gate.weight", (1, h)

    def n_inputs(self, m) -> int:
        n = self.expert.n_inputs(m)
        if self.shared:
            n += n + m.shared_expert_gate  # the shared expert's linears read it too
        return n

    def saved(self, m, x: Ctx, in_bytes: int, own_input: bool = True) -> list[Saved]:
        """The average block (with dense first blocks: each entry weighted by how many blocks
        of its kind there are, so that n_layers x this sum is the whole model's)."""
        names = tuple(f"in{i}" for i in range(self.n_inputs(m)))
        out = inputs_saved("mlp", names, in_bytes, x, m.hidden, "mlp.input", own_input)
        t, c, e, k = x.t, x.c, m.n_experts, m.experts_per_token
        # Router: logits (t, E) in fp32 softmax, top-k; dispatch buffer (E, C, h) with
        # C = t*k/E (capacity factor 1.0) is saved by the expert bmm.
        mlp = [Saved("moe.router_probs", FP32 * t * e)]
        if m.router_fp32:
            mlp.append(Saved("moe.router.input_fp32", FP32 * t * m.hidden))
        # topk keeps its int64 indices for backward (derivatives.yaml: topk)
        mlp.append(Saved("moe.topk_indices", 8 * t * k))
        mlp.append(Saved("moe.dispatched", c * t * k * m.hidden))
        # the experts', shared experts' and dense blocks' intermediates are counted in c
        # (autocast's fp32 promotion of an op-by-op GELU is modelled for dense models only;
        # the MoE models fitcheck reads are gated)
        mlp += self.expert.intermediates(m, x, t * k, "mlp", False)
        # Combine: expert outputs (E, C, h) gathered back and weighted (weights saved).
        mlp.append(Saved("moe.expert_out", c * t * k * m.hidden))
        if self.shared:
            mlp += self.shared.intermediates(m, x, t, "mlp.shared", False)
        if m.shared_expert_gate:
            # Qwen2-MoE: sigmoid(shared_expert_gate(x)) * shared: the multiply saves both
            mlp += [Saved("mlp.shared_gate.sigmoid", c * t), Saved("mlp.shared.out",
                                                                   c * t * m.hidden)]
        if self.dense:
            L, nd = m.n_layers, m.n_dense_layers
            mlp = scaled(mlp, L - nd, L) + scaled(
                self.dense.intermediates(m, x, t, "mlp.dense", False), nd, L)
        return out + mlp

    def linear_outputs(self, m, t: int, c: int) -> list[LinearOut]:
        """The router's (DeepSeek's multiplies in fp32) and the shared experts' outputs (no
        bias); the experts run as grouped matmuls (torchtitan's ``GroupedExperts``:
        ``torch._grouped_mm``), not linears: not counted, in no save list."""
        shared: list[LinearOut] = []
        h = m.hidden
        if self.shared:
            for name, width in self.shared.matrices(m):
                shared += linear_out(f"shared.{name}.out", width, t, c,
                                     fan_in=self.shared.width if name == "down" else h)
        router_bytes = FP32 if m.router_fp32 else c
        if m.shared_expert_gate:
            # Qwen2MoeSparseMoeBlock: the shared expert first, then the router, its gate last
            return (shared + linear_out("router.out", m.n_experts, t, c, fan_in=h)
                    + linear_out("shared_gate.out", 1, t, c, fan_in=h))
        # Mixtral, Qwen3-MoE, DeepSeek: the router, the experts, then the shared experts
        return linear_out("router.out", m.n_experts, t, router_bytes, fan_in=h) + shared

    def matmul_weights(self, m) -> int:
        """The router (E x h), experts_per_token experts, the shared experts and gate."""
        n = m.n_experts * m.hidden + self.expert.matmul_weights(m) * m.experts_per_token
        if self.shared:
            n += self.shared.matmul_weights(m)
        return n + (m.hidden if m.shared_expert_gate else 0)
