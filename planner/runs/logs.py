"""Training-log lines that carry memory (and speed) figures, one reader per tool.

Each reader states the source of the line it parses and the unit it prints:

=====================  ==========================================================================
format                 line (source)
=====================  ==========================================================================
torchtitan             ``step: 10  loss:  3.31  memory: 44.88GiB(32.10%)  tps: 42,136  tflops:
                       346.35  mfu: 35.02%`` (torchtitan/components/metrics.py: memory =
                       ``reserved_bytes.all.peak`` / 2**30 since the last log, % of
                       ``get_device_properties().total_memory``; older releases print ``wps``)
hf-trainer             ``train_mem_gpu_peaked_delta`` and friends (transformers
                       trainer_utils.TrainerMemoryTracker): the metrics dict, train_results.json,
                       or ``log_metrics``' block where memory is ``v >> 20`` printed "MB" (MiB);
                       peak allocated = before_init + init alloc delta + train alloc delta +
                       train peaked delta; ``train_samples_per_second`` over all processes
lightning              ``DeviceStatsMonitor`` (lightning/pytorch/callbacks/device_stats_monitor.py):
                       ``torch.cuda.memory_stats()`` keys such as ``allocated_bytes.all.peak``
                       (bytes), prefixed ``DeviceStatsMonitor.on_train_batch_end/``, in a CSV
                       logger's metrics.csv or a printed dict
deepspeed              ``see_memory_usage`` (deepspeed/runtime/utils.py): a label line, then
                       ``MA x GB Max_MA y GB CA z GB Max_CA w GB`` (1024**3, "GB"; Max_CA rounded to
                       an integer; peaks reset after every call) and ``ThroughputTimer``
                       (deepspeed/utils/timer.py): ``SamplesPerSec=..., MemAllocated=xGB,
                       MaxMemAllocated=yGB``
tracemalloc            the ``TorchTracemalloc`` context of accelerate's and PEFT's examples
                       (``Total Peak Memory consumed during the train (max): N``, MiB, floor) and
                       llama-recipes' ``MemoryTrace`` (``Max CUDA memory allocated was N GB``,
                       GiB, floor)
torchtune              ``log_memory_stats`` (torchtune/training/memory.py: ``peak memory
                       allocation: x GiB``; releases before 0.3 printed /1e9 as "GB") and the
                       per-step metric line ``peak_memory_alloc:x peak_memory_reserved:y``
nvidia-smi             ``nvidia-smi --query-gpu=...,memory.used,memory.total --format=csv``
                       (MiB)
pynvml                 ``GPU memory occupied: N MB.`` (the HF performance docs' helper:
                       NVML ``used // 1024**2``, MiB)
=====================  ==========================================================================
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable

from planner.lazy_dataclass import dataclass
from planner.runs.evidence import Moment, Quantity, Sample
from planner.runs.units import Figure, GiB, MiB, figure

__all__ = ["FORMATS", "LogFormat", "parse_logs"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True, slots=True)
class LogFormat:
    name: str
    looks_for: str
    """What the reader searches for (named in the error when a log has no memory line)."""
    parse: Callable[[list[str], str], tuple[list[Sample], dict[str, str]]]
    """(lines, file name) -> (samples, facts such as the GPU's name or versions)."""


def _num(text: str) -> float:
    return float(text.replace(",", ""))


# --------------------------------------------------------------------------- torchtitan

_TT = re.compile(r"step:\s*(\d+)\s+loss:.*?memory:\s*([0-9.]+)\s*GiB\s*\(\s*([0-9.]+)%\)"
                 r"(?:\s+(?:tps|wps):\s*([0-9,]+))?(?:\s+tflops:\s*([0-9.,]+))?"
                 r"(?:\s+mfu:\s*([0-9.]+)%)?")
_TT_CAP = re.compile(r"(?:CUDA|GPU|ROCM|XPU) capacity:\s*(.+?) with ([0-9.]+)\s*GiB memory", re.I)


def _torchtitan(lines: list[str], name: str):
    out, facts = [], {}
    for i, raw in enumerate(lines):
        line = _ANSI.sub("", raw)
        if (c := _TT_CAP.search(line)):
            facts["gpu_name"] = c.group(1).strip()
        m = _TT.search(line)
        if not m:
            continue
        step, mem, pct, tps, _tflops, mfu = m.groups()
        peak = figure(mem, GiB, f"{mem}GiB")
        figs = {Quantity.PEAK_RESERVED: peak}
        if float(pct) > 0:
            cap = round(float(mem) * GiB / (float(pct) / 100))
            # both rounded to 2 decimals: the capacity is known to their relative rounding
            res = round(cap * (0.005 / float(mem) + 0.005 / float(pct)))
            figs[Quantity.CAPACITY] = Figure(cap, res, f"{mem}GiB / {pct}%")
        out.append(Sample(where=f"{name}:{i + 1}", format="torchtitan", moment=Moment.STEP,
                          step=int(step), figures=figs,
                          tokens_per_s_per_gpu=_num(tps) if tps else None,
                          mfu=float(mfu) / 100 if mfu else None))
    return out, facts


# --------------------------------------------------------------------------- HF Trainer

_HF_KEYS = ("before_init_mem_gpu", "init_mem_gpu_alloc_delta", "train_mem_gpu_alloc_delta",
            "train_mem_gpu_peaked_delta", "train_samples_per_second", "train_runtime",
            "train_steps_per_second")
_HF = re.compile(r"['\"]?(" + "|".join(_HF_KEYS) + r")['\"]?\s*(?:[:=|])\s*"
                 r"(-?[0-9][0-9,]*(?:\.[0-9]+)?(?:e[+-]?\d+)?)\s*(MB)?")


def _hf_trainer(lines: list[str], name: str):
    blocks: list[tuple[int, dict[str, tuple[float, bool]]]] = []
    cur: dict[str, tuple[float, bool]] = {}
    start = 0
    for i, line in enumerate(lines):
        for m in _HF.finditer(line):
            key, value, mb = m.groups()
            if key in cur:  # a new report begins
                blocks.append((start, cur))
                cur = {}
            if not cur:
                start = i
            cur[key] = (_num(value), bool(mb))
    if cur:
        blocks.append((start, cur))
    out, facts = [], {}
    for start, b in blocks:
        if "train_mem_gpu_peaked_delta" not in b or "train_mem_gpu_alloc_delta" not in b:
            continue
        total = 0
        res = 0
        used = []
        for key in ("before_init_mem_gpu", "init_mem_gpu_alloc_delta",
                    "train_mem_gpu_alloc_delta", "train_mem_gpu_peaked_delta"):
            if key not in b:
                continue
            v, mb = b[key]
            total += int(v * MiB) if mb else int(v)
            res += MiB if mb else 0  # 'v >> 20' truncates: within one MiB above
            used.append(key)
        sps = b.get("train_samples_per_second")
        out.append(Sample(where=f"{name}:{start + 1}", format="hf-trainer", moment=Moment.STEP,
                          label=" + ".join(used),
                          figures={Quantity.PEAK_ALLOCATED: Figure(total, res, " + ".join(used))},
                          samples_per_s=sps[0] if sps else None))
        if "before_init_mem_gpu" not in b:
            facts["note"] = ("before_init_mem_gpu not printed (transformers < 4.12): the GPU is "
                             "taken as empty when the Trainer was created")
    return out, facts


# --------------------------------------------------------------------------- Lightning

_STAT = re.compile(r"(?:[\w.]+[/.])?(allocated_bytes|reserved_bytes|active_bytes)\.all\.(peak|"
                   r"current)['\"]?\s*[:=,]\s*([0-9][0-9.]*(?:e[+-]?\d+)?)")
_STAT_Q = {("allocated_bytes", "peak"): Quantity.PEAK_ALLOCATED,
           ("allocated_bytes", "current"): Quantity.ALLOCATED,
           ("reserved_bytes", "peak"): Quantity.PEAK_RESERVED,
           ("reserved_bytes", "current"): Quantity.RESERVED,
           ("active_bytes", "peak"): Quantity.PEAK_ACTIVE}


def _lightning(lines: list[str], name: str):
    out = []
    header_i = next((i for i, line in enumerate(lines)
                     if "allocated_bytes.all.peak" in line and "," in line
                     and not re.search(r"allocated_bytes\.all\.peak['\"]?\s*[:=]", line)), None)
    if header_i is not None:
        reader = csv.reader(io.StringIO("\n".join(lines[header_i:])))
        header = next(reader)
        cols = {}
        for j, col in enumerate(header):
            for (stat, kind), q in _STAT_Q.items():
                if col.endswith(f"{stat}.all.{kind}") and "on_train_batch" in col or \
                        col == f"{stat}.all.{kind}":
                    cols.setdefault(q, j)
        step_col = header.index("step") if "step" in header else None
        for k, row in enumerate(reader):
            figs = {}
            for q, j in cols.items():
                if j < len(row) and row[j].strip():
                    figs[q] = Figure(int(float(row[j])), 0, row[j])
            if figs:
                step = row[step_col] if step_col is not None and step_col < len(row) else ""
                out.append(Sample(where=f"{name}:{header_i + k + 2}", format="lightning",
                                  moment=Moment.STEP, figures=figs,
                                  step=int(float(step)) if step.strip() else None))
        return out, {}
    for i, line in enumerate(lines):
        figs = {}
        for m in _STAT.finditer(line):
            q = _STAT_Q.get((m.group(1), m.group(2)))
            if q is not None:
                figs[q] = Figure(int(float(m.group(3))), 0, m.group(3))
        if figs:
            out.append(Sample(where=f"{name}:{i + 1}", format="lightning", moment=Moment.STEP,
                              figures=figs))
    return out, {}


# --------------------------------------------------------------------------- DeepSpeed

_DS_MA = re.compile(r"MA ([0-9.]+) GB\s+Max_MA ([0-9.]+) GB\s+CA ([0-9.]+) GB\s+Max_CA "
                    r"([0-9.]+) GB")
_DS_LABEL = re.compile(r"see_memory_usage\]\s*(.*?)\s*$")
_DS_TP = re.compile(r"(?:RunningAvgSamplesPerSec|SamplesPerSec)=([0-9.]+).*?MemAllocated="
                    r"([0-9.]+)GB, MaxMemAllocated=([0-9.]+)GB")
_DS_STEP = re.compile(r"global_step=(\d+)|\b\d+/(\d+),")


def _ds_moment(label: str) -> Moment:
    low = label.lower()
    if re.search(r"after (the )?forward", low):
        return Moment.FORWARD
    if re.search(r"after (the )?backward", low):
        return Moment.BACKWARD
    if re.search(r"after (the )?(optimizer )?step", low):
        return Moment.OPTIMIZER
    if re.search(r"initiali[sz]|creating|partition|zero optimizer|begin|init", low):
        return Moment.LOADING
    return Moment.STEP


def _deepspeed(lines: list[str], name: str):
    out = []
    label = ""
    for i, line in enumerate(lines):
        if (m := _DS_MA.search(line)):
            ma, max_ma, ca, max_ca = m.groups()
            out.append(Sample(where=f"{name}:{i + 1}", format="deepspeed", moment=_ds_moment(label),
                              label=label, figures={
                                  Quantity.ALLOCATED: figure(ma, GiB, f"MA {ma} GB"),
                                  Quantity.PEAK_ALLOCATED: figure(max_ma, GiB,
                                                                  f"Max_MA {max_ma} GB"),
                                  Quantity.RESERVED: figure(ca, GiB, f"CA {ca} GB"),
                                  # round(x) to an integer number of GiB
                                  Quantity.PEAK_RESERVED: Figure(round(float(max_ca) * GiB),
                                                                 GiB // 2, f"Max_CA {max_ca} GB")}))
            label = ""
            continue
        if (m := _DS_LABEL.search(line)) and "CPU Virtual Memory" not in line:
            label = m.group(1)
        if (m := _DS_TP.search(line)):
            sps, ma, max_ma = m.groups()
            st = _DS_STEP.search(line)
            out.append(Sample(where=f"{name}:{i + 1}", format="deepspeed", moment=Moment.STEP,
                              label="ThroughputTimer",
                              step=int(st.group(1) or st.group(2)) if st else None,
                              figures={Quantity.ALLOCATED: figure(ma, GiB, f"MemAllocated={ma}GB"),
                                       Quantity.PEAK_ALLOCATED: figure(
                                           max_ma, GiB, f"MaxMemAllocated={max_ma}GB")},
                              samples_per_s=float(sps)))
    return out, {}


# --------------------------------------------------------------------------- tracemalloc

_TM_PEAK = re.compile(r"^(?!.*\bCPU\b).*Total Peak Memory consumed during the train \(max\):\s*"
                      r"([0-9]+)\s*$")
_LR = re.compile(r"(Max CUDA memory allocated|Max CUDA memory reserved|Peak active CUDA memory)"
                 r" was ([0-9]+) GB")
_LR_Q = {"Max CUDA memory allocated": Quantity.PEAK_ALLOCATED,
         "Max CUDA memory reserved": Quantity.PEAK_RESERVED,
         "Peak active CUDA memory": Quantity.PEAK_ACTIVE}


def _tracemalloc(lines: list[str], name: str):
    out = []
    figs: dict[Quantity, Figure] = {}
    first = None
    for i, line in enumerate(lines):
        if (m := _TM_PEAK.search(line.strip())):
            v = int(m.group(1))
            out.append(Sample(where=f"{name}:{i + 1}", format="tracemalloc", moment=Moment.STEP,
                              label="TorchTracemalloc", figures={
                                  Quantity.PEAK_ALLOCATED: Figure(v * MiB + MiB // 2, MiB // 2,
                                                                  f"{v} (MiB, floor)")}))
        if (m := _LR.search(line)):
            v = int(m.group(2))
            figs[_LR_Q[m.group(1)]] = Figure(v * GiB + GiB // 2, GiB // 2, f"{v} GB (GiB, floor)")
            first = i if first is None else first
    if figs:
        out.append(Sample(where=f"{name}:{first + 1}", format="tracemalloc", moment=Moment.STEP,
                          label="llama-recipes MemoryTrace", figures=figs))
    return out, {}


# --------------------------------------------------------------------------- torchtune

_TUNE_INIT = re.compile(r"peak memory (allocation|reserved|active): ([0-9.]+) (GiB|GB)")
_TUNE_STEP = re.compile(r"peak_memory_(active|alloc|reserved):([0-9.]+)")
_TUNE_TPS = re.compile(r"tokens_per_second_per_gpu:([0-9.]+)")
_TUNE_STEP_NO = re.compile(r"^\s*Step (\d+)")
_TUNE_Q = {"allocation": Quantity.PEAK_ALLOCATED, "alloc": Quantity.PEAK_ALLOCATED,
           "reserved": Quantity.PEAK_RESERVED, "active": Quantity.PEAK_ACTIVE}


def _torchtune(lines: list[str], name: str):
    out, facts = [], {}
    unit = None
    init: dict[Quantity, Figure] = {}
    init_at = None
    for i, line in enumerate(lines):
        for m in _TUNE_INIT.finditer(line):
            unit = GiB if m.group(3) == "GiB" else 10**9
            init[_TUNE_Q[m.group(1)]] = figure(m.group(2), unit, f"{m.group(2)} {m.group(3)}")
            init_at = i if init_at is None else init_at
    if init:
        out.append(Sample(where=f"{name}:{init_at + 1}", format="torchtune",
                          moment=Moment.LOADING, label="Memory stats after model init",
                          figures=init))
    for i, line in enumerate(lines):
        hits = _TUNE_STEP.findall(line)
        if not hits:
            continue
        if unit is None:
            facts["note"] = ("torchtune's per-step memory figures carry no unit: read as GiB "
                             "(torchtune >= 0.3; earlier releases divided by 1e9)")
        u = unit or GiB
        figs = {_TUNE_Q[k]: figure(v, u, f"{k}:{v}") for k, v in hits}
        tps = _TUNE_TPS.search(line)
        st = _TUNE_STEP_NO.search(line)
        out.append(Sample(where=f"{name}:{i + 1}", format="torchtune", moment=Moment.STEP,
                          step=int(st.group(1)) if st else None, figures=figs,
                          tokens_per_s_per_gpu=float(tps.group(1)) if tps else None))
    return out, facts


# --------------------------------------------------------------------------- nvidia-smi

_SMI_UNIT = re.compile(r"\[(MiB|GiB|KiB|B|%|W|MHz)\]")


def _nvidia_smi(lines: list[str], name: str):
    header_i = next((i for i, line in enumerate(lines) if "memory.used" in line
                     and "," in line), None)
    if header_i is None:
        return [], {}
    header = [h.strip() for h in lines[header_i].split(",")]
    used_j = next(j for j, h in enumerate(header) if h.startswith("memory.used"))
    unit = _SMI_UNIT.search(header[used_j])
    unit_b = {"MiB": MiB, "GiB": GiB, "KiB": 1024, "B": 1}[unit.group(1)] if unit else MiB
    total_j = next((j for j, h in enumerate(header) if h.startswith("memory.total")), None)
    index_j = next((j for j, h in enumerate(header) if h == "index"), None)
    name_j = next((j for j, h in enumerate(header) if h == "name"), None)
    drv_j = next((j for j, h in enumerate(header) if h == "driver_version"), None)
    out, facts = [], {}
    for k, line in enumerate(lines[header_i + 1:]):
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(header):
            continue
        m = re.match(r"([0-9.]+)", cells[used_j])
        if not m:
            continue
        figs = {Quantity.DEVICE_USED: figure(m.group(1), unit_b, cells[used_j])}
        if total_j is not None and (t := re.match(r"([0-9.]+)", cells[total_j])):
            figs[Quantity.CAPACITY] = figure(t.group(1), unit_b, cells[total_j])
        if name_j is not None:
            facts["gpu_name"] = cells[name_j]
        if drv_j is not None:
            facts["driver"] = cells[drv_j]
        idx = cells[index_j] if index_j is not None else ""
        out.append(Sample(where=f"{name}:{header_i + k + 2}", format="nvidia-smi",
                          moment=Moment.STEP, figures=figs,
                          device_index=int(idx) if idx.isdigit() else None))
    return out, facts


_NVML = re.compile(r"GPU memory occupied: ([0-9]+) MB\.")


def _pynvml(lines: list[str], name: str):
    out = []
    for i, line in enumerate(lines):
        if (m := _NVML.search(line)):
            v = int(m.group(1))
            out.append(Sample(where=f"{name}:{i + 1}", format="pynvml", moment=Moment.STEP,
                              figures={Quantity.DEVICE_USED: Figure(v * MiB + MiB // 2, MiB // 2,
                                                                    f"{v} MB (MiB, floor)")}))
    return out, {}


FORMATS: tuple[LogFormat, ...] = (
    LogFormat("torchtitan", "torchtitan 'step: N loss: ... memory: X.XXGiB(P%)'", _torchtitan),
    LogFormat("hf-trainer", "HF Trainer 'train_mem_gpu_peaked_delta' with "
              "'train_mem_gpu_alloc_delta'", _hf_trainer),
    LogFormat("lightning", "Lightning DeviceStatsMonitor 'allocated_bytes.all.peak' / "
              "'reserved_bytes.all.peak'", _lightning),
    LogFormat("deepspeed", "DeepSpeed 'MA .. GB Max_MA .. GB CA .. GB Max_CA .. GB' or "
              "'MaxMemAllocated=..GB'", _deepspeed),
    LogFormat("tracemalloc", "accelerate/PEFT 'Total Peak Memory consumed during the train (max)'"
              " or llama-recipes 'Max CUDA memory allocated was N GB'", _tracemalloc),
    LogFormat("torchtune", "torchtune 'peak memory allocation: X GiB' or "
              "'peak_memory_alloc:X'", _torchtune),
    LogFormat("nvidia-smi", "nvidia-smi --query-gpu CSV with a 'memory.used' column", _nvidia_smi),
    LogFormat("pynvml", "'GPU memory occupied: N MB.'", _pynvml),
)


def parse_logs(lines: list[str], name: str) -> tuple[list[Sample], dict[str, str]]:
    """Every memory sample of every known format in ``lines``, and the facts they state."""
    samples: list[Sample] = []
    facts: dict[str, str] = {}
    notes = []
    for fmt in FORMATS:
        s, f = fmt.parse(lines, name)
        samples += s
        if s and f.get("note"):
            notes.append(f.pop("note"))
        facts.update({k: v for k, v in f.items() if k != "note"})
    if notes:
        facts["notes"] = "\n".join(notes)
    return samples, facts
