"""CUDA (and ROCm's HIP) out-of-memory messages, every wording PyTorch has printed, and where
in the training step the traceback above one places it.

The message is built in c10/cuda/CUDACachingAllocator.cpp (``malloc``, the out-of-memory
branch after the allocator has freed its cached blocks and retried). Its wordings, with the
releases that print them:

* <= 1.4: ``CUDA out of memory. Tried to allocate X (GPU d; T total capacity; A already
  allocated; F free; C cached)``, C = reserved - allocated (the cached blocks it could not
  release);
* 1.5-2.0: ``... F free; [L allowed; ]R reserved in total by PyTorch)``, from 1.10 followed by
  ``If reserved memory is >> allocated memory try setting max_split_size_mb to avoid
  fragmentation.``;
* 2.1: ``CUDA out of memory. Tried to allocate X. GPU d has a total capacty of T of which F is
  free. [Process P has U memory in use. ][Including non-PyTorch memory, this process has U
  memory in use. ]Of the allocated memory A is allocated by PyTorch, and R is reserved by
  PyTorch but unallocated. If reserved but unallocated memory is large try setting
  max_split_size_mb ...`` (note the typo 'capacty' of that release);
* 2.2+: the same sentence spelled 'capacity', [``L allowed; ``] before 'Of the allocated', an
  optional ``, with Y allocated in private pools (e.g., CUDA Graphs)`` and the hint
  ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``; the exception is
  ``torch.cuda.OutOfMemoryError`` since 1.13 and ``torch.OutOfMemoryError`` since 2.5.

Sizes are c10's ``format_size``: ``%.2f`` of bytes / KiB / MiB / GiB (planner/runs/units.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from planner.runs.evidence import Moment, OomEvent
from planner.runs.units import Figure, parse_size

__all__ = ["OOM_MARKER", "find_ooms", "frame_text", "parse_message", "traceback_moment"]

OOM_MARKER = re.compile(r"(?:(?:CUDA|HIP) out of memory\. )?Tried to allocate [0-9][0-9,.]*\s*"
                        r"(?:bytes|[KMGT]iB)\s*(?:\(GPU|\.(?:\s|$))", re.I)
_S = r"([0-9][0-9,]*(?:\.[0-9]+)?\s*(?:bytes|[KMGT]iB))"
_OLD = re.compile(
    r"Tried to allocate " + _S + r" \(GPU (\d+); " + _S + r" total capacity; " + _S
    + r" already allocated; " + _S + r" free; (?:" + _S + r" allowed; )?" + _S
    + r" (cached|reserved in total by PyTorch)\)")
_NEW_HEAD = re.compile(
    r"Tried to allocate " + _S + r"\. GPU (\d+)? ?has a total capac(i?)ty of " + _S
    + r" of which " + _S + r" is free\. ")
_PROCESS = re.compile(r"Process (\d+) has " + _S + r" memory in use\. ")
_THIS = re.compile(r"Including non-PyTorch memory, this process has " + _S
                   + r" memory in use\. ")
_ALLOWED = re.compile(_S + r" allowed; ")
_TAIL = re.compile(
    r"Of the allocated memory " + _S + r" is allocated by PyTorch"
    r"(?:, with " + _S + r" allocated in private pools \(e\.g\., (?:CUDA|HIP) Graphs\))?"
    r"(?:,? and " + _S + r" is reserved by PyTorch but unallocated)?\.")
_EXC = re.compile(r"([A-Za-z_][\w.]*(?:Error|Exception)):\s*$")


def _size(text: str) -> Figure:
    return parse_size(text)


def parse_message(msg: str, where: str = "<text>") -> OomEvent | None:
    """One message (whitespace already collapsed, starting at 'CUDA out of memory') -> the
    event, or None when it is not one of the wordings above."""
    backend = "HIP" if msg.upper().startswith("HIP") else "CUDA"
    m = _OLD.search(msg)
    if m:
        req, dev, cap, alloc, free, allowed, last, kind = m.groups()
        a = _size(alloc)
        if kind == "cached":
            unalloc = _size(last)
        else:
            total = _size(last)
            unalloc = Figure(value=max(0, total.value - a.value),
                             resolution=total.resolution + a.resolution,
                             text=f"{total.text} - {a.text}")
        hint = "max_split_size_mb" if "max_split_size_mb" in msg else ""
        return OomEvent(where=where, format="torch1-cached" if kind == "cached"
                        else "torch1-reserved", backend=backend, device=int(dev),
                        requested=_size(req), capacity=_size(cap), free=_size(free),
                        allocated=a, reserved_unallocated=unalloc,
                        allowed=_size(allowed) if allowed else None, hint=hint,
                        text=msg[:m.end() + 1])
    m = _NEW_HEAD.search(msg)
    if not m:
        return None
    req, dev, i, cap, free = m.groups()
    rest = msg[m.end():]
    others: list[tuple[int, Figure]] = []
    this = allowed = None
    while True:
        if (p := _PROCESS.match(rest)):
            others.append((int(p.group(1)), _size(p.group(2))))
        elif (p := _THIS.match(rest)):
            this = _size(p.group(1))
        elif (p := _ALLOWED.match(rest)):
            allowed = _size(p.group(1))
        else:
            break
        rest = rest[p.end():]
    t = _TAIL.match(rest)
    if not t:
        return None
    alloc, pools, unalloc = t.groups()
    end = len(msg) - len(rest) + t.end()
    hint = ("expandable_segments" if "expandable_segments" in msg[end:end + 200]
            else "max_split_size_mb" if "max_split_size_mb" in msg[end:end + 200] else "")
    return OomEvent(where=where, format="torch2.2" if i else "torch2.1", backend=backend,
                    device=int(dev) if dev else None, requested=_size(req),
                    capacity=_size(cap), free=_size(free), allocated=_size(alloc),
                    reserved_unallocated=_size(unalloc) if unalloc else (
                        Figure(0, 0, "(not printed)") if pools is None else None),
                    process_in_use=this, other_processes=tuple(others), allowed=allowed,
                    private_pools=_size(pools) if pools else None, hint=hint,
                    text=msg[:end])


# ---------------------------------------------------------------------------------------------
# Where in the step: the traceback


_FRAME = re.compile(r'^\s*(?:\[rank\d+\]:\s*)?File "([^"]+)", line (\d+), in (\S+)')

# (moment, pattern over 'function | source line | file'), outermost frame first decides
_OPTIMIZER = re.compile(
    r"(\b(opt|optim|optimizer|optimiser|self\.optimizer|scaler)\w*\.step\(|"
    r"torch/optim/|_multi_tensor_adam|_single_tensor_adam|_fused_adam|_init_group|"
    r"deepspeed/runtime/zero/stage|optimizer_step|\bstep\(optimizer\))")
_BACKWARD = re.compile(r"(\.backward\(|\bbackward\(loss|manual_backward|torch/autograd/|"
                       r"_engine_run_backward|run_backward)")
_LOSS = re.compile(r"(cross_entropy|log_softmax|nll_loss|loss_function|ForCausalLMLoss|"
                   r"CEWithChunkedOutputLoss|\bcriterion\(|\bloss_fn\(|compute_loss\b)")
_FORWARD = re.compile(r"(\bforward\b|_call_impl|_wrapped_call_impl|\bmodel\(|\bself\.model\(|"
                      r"\bengine\()")
_EVAL = re.compile(r"(evaluation_loop|prediction_step|\bgenerate\(|\bevaluate\(|"
                   r"validation_step|_evaluation_step|torch/utils/_contextlib.py.*no_grad)")
_LOADING = re.compile(r"(\.to\(|\.cuda\(|from_pretrained|load_state_dict|\b_apply\b|"
                      r"deepspeed\.initialize|accelerator\.prepare|\bprepare\(|"
                      r"load_checkpoint|torch/serialization\.py)")

_CATEGORY = (  # innermost frame first
    ("optimizer_states", re.compile(r"(_init_group|exp_avg\w* = torch\.zeros|state\[.exp_avg)")),
    ("optimizer_temporaries", re.compile(r"(_foreach_|_multi_tensor_adam|_fused_adam|"
                                         r"exp_avg_sq\.sqrt|\.sqrt\(\)|denom =)")),
    ("gathered_params", re.compile(r"(all_gather|unshard|_allgather|allgather|"
                                   r"fetch_sub_module|_all_gather)")),
    ("comm_buffers", re.compile(r"(reduce_scatter|foreach_reduce|allreduce_bucket|"
                                r"reduce_ipg_grads|_reduce_)")),
    ("transients", re.compile(r"(cross_entropy|log_softmax|nll_loss|\.float\(\)|"
                              r"CheckpointFunction|torch/utils/checkpoint\.py|recompute)")),
    ("activations", re.compile(r"(lm_head|self\.mlp|self\.attn|self_attn|act_fn|"
                               r"scaled_dot_product_attention|\bsoftmax\b|matmul|F\.linear|"
                               r"functional\.py)")),
    ("params", re.compile(r"(\.to\(|\.cuda\(|from_pretrained|load_state_dict|_apply)")),
)


def _frames(tb: list[str]) -> list[str]:
    """'function | source | file' per frame of a Python traceback, outermost first; lines of
    other traceback styles (IPython '---->', rich '❱') as frames of their own."""
    out: list[str] = []
    i = 0
    while i < len(tb):
        m = _FRAME.match(tb[i])
        if m:
            src = ""
            if i + 1 < len(tb) and not _FRAME.match(tb[i + 1]):
                src = re.sub(r"^\s*(?:\[rank\d+\]:\s*)?", "", tb[i + 1]).strip()
                i += 1
            out.append(f"{m.group(3)} | {src} | {m.group(1).replace(chr(92), '/')}")
        elif re.match(r"^\s*(-+>|│?\s*❱)\s*\d+", tb[i]) or re.search(r" in \w+\(", tb[i]):
            out.append(tb[i].strip())
        i += 1
    return out


def frame_text(frame: str) -> str:
    """'opt.step() (run_case, gpu_cases.py)' from a 'function | source | file' frame."""
    parts = [p.strip() for p in frame.split(" | ")]
    if len(parts) != 3:
        return frame
    func, src, path = parts
    where = f"{func}, {path.rsplit('/', 1)[-1]}"
    return f"{src} ({where})" if src else where


def traceback_moment(tb: list[str]) -> tuple[Moment, str, str | None, str]:
    """(moment, the frame that says so, category of the failing allocation, its frame) from
    the traceback lines above a message."""
    frames = _frames(tb)
    moment, evidence = Moment.UNKNOWN, ""
    for f in frames:  # the outermost training call decides (backward recomputes forward)
        if _OPTIMIZER.search(f):
            moment, evidence = Moment.OPTIMIZER, f
            break
        if _BACKWARD.search(f):
            moment, evidence = Moment.BACKWARD, f
            break
    if moment is Moment.UNKNOWN:
        for pattern, mo in ((_EVAL, Moment.FORWARD), (_LOSS, Moment.LOSS),
                            (_FORWARD, Moment.FORWARD), (_LOADING, Moment.LOADING)):
            hit = next((f for f in frames if pattern.search(f)), None)
            if hit is not None:
                moment, evidence = mo, hit
                if pattern is _EVAL:
                    evidence = f"evaluation, not a training step: {hit}"
                break
    category, cat_ev = None, ""
    for f in reversed(frames[-4:]):  # the innermost frames say what was being allocated
        for name, pattern in _CATEGORY:
            if name == "params" and moment is not Moment.LOADING:
                continue
            if pattern.search(f):
                category, cat_ev = name, f
                break
        if category:
            break
    return moment, evidence, category, cat_ev


# ---------------------------------------------------------------------------------------------
# Finding messages in a log


def _collapse(text: str) -> str:
    text = re.sub(r"\n\s*(?:\[rank\d+\]:)?\s*", " ", text)
    return re.sub(r"\s+", " ", text)


def find_ooms(lines: list[str], name: str) -> Iterator[OomEvent]:
    """Every out-of-memory message in ``lines`` (a whole log, or a message pasted alone),
    each with the moment its traceback names. Repeats of the same message (every rank
    prints one) are kept once."""
    seen: set[str] = set()
    tb_start = None
    for i, line in enumerate(lines):
        if "Traceback (most recent call last)" in line or re.search(r"-{20,}\s*$", line):
            tb_start = i
        m = OOM_MARKER.search(line)
        if not m:
            continue
        window = _collapse("\n".join(lines[i:i + 12]))
        start = OOM_MARKER.search(window)
        msg = window[start.start():]
        ev = parse_message(msg, f"{name}:{i + 1}")
        if ev is None:
            continue
        key = ev.text
        if key in seen:
            continue
        seen.add(key)
        exc = _EXC.search(line[:m.start()])
        tb = lines[tb_start:i] if tb_start is not None else []
        moment, mev, cat, cev = traceback_moment(tb)
        import dataclasses

        yield dataclasses.replace(ev, exception=exc.group(1) if exc else "", moment=moment,
                                  moment_evidence=frame_text(mev) if mev else "",
                                  category_hint=cat,
                                  category_evidence=frame_text(cev) if cev else "")
        tb_start = None
