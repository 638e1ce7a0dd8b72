"""The trace's LoRA adapter (probes/finetune_tp.py ``LoraLinear``) against peft itself: bytes a
decoder layer saves for backward, peft's ``get_peft_model`` on transformers' LlamaForCausalLM vs
the adapter on fitcheck's reference model, same shapes, pure bf16 base, fp32 adapters, real CPU
tensors (small). Needs peft (not a fitcheck dependency: ``pip install peft``).

    python benchmarks/peft_equivalence.py

Dropout: peft's ``nn.Dropout`` on CPU saves an input-dtype noise tensor; the trace emulates
CUDA's ``native_dropout`` (a bool mask), so with dropout the two differ by exactly
3 B x tokens x (sum of adapted inputs) for fp32 adapters, which the script prints.
"""

from __future__ import annotations

import sys

import torch

H, F, V, NH, KV, T, B, R = 256, 512, 2048, 8, 4, 256, 2, 8


def _saved(module: torch.nn.Module, run) -> int:
    """Bytes of the distinct non-parameter storages saved for backward inside ``module``."""
    seen: dict[int, int] = {}
    keep: list = []
    active = [False]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if active[0] and not isinstance(t, torch.nn.Parameter):
            st = t.untyped_storage()
            keep.append(st)
            seen[id(st)] = st.nbytes()
        return t

    h1 = module.register_forward_pre_hook(lambda *a: active.__setitem__(0, True))
    h2 = module.register_forward_hook(lambda *a: active.__setitem__(0, False))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    h1.remove()
    h2.remove()
    return sum(seen.values())


def hf_peft(targets: list[str], dropout: float, lora: bool, ids: torch.Tensor) -> int:
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=H, intermediate_size=F, num_attention_heads=NH,
                      num_key_value_heads=KV, num_hidden_layers=3, vocab_size=V,
                      attn_implementation="sdpa")
    m = LlamaForCausalLM(cfg).to(torch.bfloat16)
    m.requires_grad_(False)
    if lora:
        m = get_peft_model(m, LoraConfig(r=R, target_modules=[f"{t}_proj" for t in targets],
                                         lora_dropout=dropout))
        m.train()
        layers = m.get_base_model().model.layers
    else:
        layers = m.model.layers
        layers[0].self_attn.q_proj.weight.requires_grad_(True)  # gradients flow through
    return _saved(layers[1], lambda: m(input_ids=ids, labels=ids).loss)


def reference(targets: list[str], dropout: float, lora: bool, ids: torch.Tensor) -> int:
    from planner.spec import FineTune, ModelSpec, Precision
    from probes.finetune_tp import apply_finetune
    from probes.models import build_model
    from probes.trace import _to_bf16

    spec = ModelSpec(name="x", n_layers=3, hidden=H, n_heads=NH, n_kv_heads=KV, ffn_hidden=F,
                     vocab=V)
    net = build_model(spec, device="cpu")
    if lora:
        apply_finetune(net, spec, FineTune(lora_rank=R, lora_targets=tuple(targets),
                                           lora_dropout=dropout > 0), Precision.BF16)
    else:
        net.requires_grad_(False)
        net.blocks[0].attn.q.weight.requires_grad_(True)
    _to_bf16(net)
    net.train()
    return _saved(net.blocks[1], lambda: net(ids, ids))


def main() -> int:
    try:
        import peft  # noqa: F401
    except ImportError:
        print("peft is not installed (pip install peft)", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    ids = torch.randint(0, V, (B, T))
    ins = {"q": H, "k": H, "v": H, "o": H, "gate": H, "up": H, "down": F}
    for targets, dropout in ((["q", "v"], 0.0), (list(ins), 0.0), (["q", "v"], 0.05),
                             (list(ins), 0.05)):
        h = hf_peft(targets, dropout, True, ids) - hf_peft(targets, dropout, False, ids)
        r = reference(targets, dropout, True, ids) - reference(targets, dropout, False, ids)
        cpu_mask = 3 * B * T * sum(ins[t] for t in targets) if dropout else 0
        print(f"r {R} on {','.join(targets):24s} dropout {dropout:.2f}: peft adds {h:>10,} B,"
              f" trace adapter {r:>10,} B; difference {h - r:>10,} B (CPU dropout's fp32 noise"
              f" vs CUDA's bool mask: {cpu_mask:,} B)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
