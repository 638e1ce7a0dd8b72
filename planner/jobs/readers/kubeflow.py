"""A Kubeflow PyTorchJob manifest (kubeflow.org/v1), a batch Job or Pod, or a Trainer v2
TrainJob / (Cluster)TrainingRuntime: the GPU count, and the training spec if the manifest
carries one.

hardware.n = sum over replicas of the pod's nvidia.com/gpu limits (spec.nprocPerNode, when a
number, is the processes per pod); gpus_per_node = the per-pod count when every pod holds the
same. The ``fitcheck.io/spec`` annotation (a fitcheck spec, JSON or YAML) overrides what the
manifest says, as in the admission webhook; ``fitcheck.io/job`` names a job config file
(relative to the manifest) whose settings it starts from. Training hyper-parameters in the
container arguments are not read.
"""

from __future__ import annotations

from typing import Any

from planner.jobs.readers.common import MISSING, Reader
from planner.jobs.record import JobError, JobFormat

GPU = "nvidia.com/gpu"
SPEC_ANNOTATION = "fitcheck.io/spec"
JOB_ANNOTATION = "fitcheck.io/job"
MAX_PODS = 1 << 16
"""Pods a manifest may describe, replicas summed over its roles (planner.webhook's bound):
counted before any list is built (120 roles x 2^20 replicas took 1 GB and the gate's whole
timeout)."""
KINDS = ("PyTorchJob", "TrainJob", "ClusterTrainingRuntime", "TrainingRuntime", "Job", "Pod")


def detect(doc: Any) -> int:
    return 10 if "apiVersion" in doc and "kind" in doc else 0


def pick(docs: list[Any], name: str) -> Any:
    """The training object of a multi-document manifest."""
    for d in docs:
        if isinstance(d, dict) and d.get("kind") in KINDS:
            return d
    return docs[0]


def _pod_gpus(r: Reader, pod: Any, where: str) -> int:
    if not isinstance(pod, dict):
        return 0
    total = 0
    for i, c in enumerate(pod.get("containers") or []):
        res = c.get("resources") if isinstance(c, dict) else None
        for kind in ("limits", "requests"):
            m = res.get(kind) if isinstance(res, dict) else None
            if isinstance(m, dict) and GPU in m:
                total += r.count(m[GPU], f"{where}.containers[{i}].resources.{kind}.{GPU}",
                                 zero=True) or 0
                break
    return total


def _template_pod(tmpl: Any) -> Any:
    return tmpl.get("spec") if isinstance(tmpl, dict) else None


def _pods(r: Reader, pods: list[int], per: int, copies: int, where: str) -> list[int]:
    """``pods`` and ``copies`` pods of ``per`` GPUs (none when ``per`` is 0), or JobError
    naming ``where`` past MAX_PODS."""
    if per and len(pods) + copies > MAX_PODS:
        raise JobError(f"{r.name}: {where}: too many pods: more than {MAX_PODS}")
    return pods + [per] * copies if per else pods


def read(r: Reader) -> None:
    doc = r.mapping(r.doc, "file")
    kind = doc.get("kind")
    spec = r.mapping(doc.get("spec"), "spec")
    pods: list[int] = []
    where = "spec"
    if kind == "PyTorchJob":
        roles = r.mapping(spec.get("pytorchReplicaSpecs"), "spec.pytorchReplicaSpecs")
        nproc = spec.get("nprocPerNode", spec.get("nProcPerNode"))
        per_proc = r.count(nproc, "spec.nprocPerNode", auto=True) \
            if nproc not in (None, "auto", "gpu", "cpu") else None
        for role, rs in roles.items():
            rs = r.mapping(rs, f"spec.pytorchReplicaSpecs.{role}")
            w = f"spec.pytorchReplicaSpecs.{role}"
            replicas = r.count(rs.get("replicas", 1), f"{w}.replicas", zero=True) or 0
            per = _pod_gpus(r, _template_pod(rs.get("template")), f"{w}.template.spec")
            if per_proc is not None and per and per_proc != per:
                r.warn(f"{r.name}: spec.nprocPerNode {per_proc} processes per pod but {w} holds "
                       f"{per} GPUs: counted {per_proc} per pod")
            per = per_proc if (per_proc is not None and per) else per
            pods = _pods(r, pods, per, replicas, f"{w}.replicas")
        where = "spec.pytorchReplicaSpecs"
        if isinstance(spec.get("elasticPolicy"), dict):
            ep = spec["elasticPolicy"]
            r.warn(f"{r.name}: elastic job (minReplicas {ep.get('minReplicas')}, maxReplicas "
                   f"{ep.get('maxReplicas')}): checked at the replicas given")
    elif kind == "TrainJob":
        trainer = r.mapping(spec.get("trainer"), "spec.trainer")
        nodes = r.count(trainer.get("numNodes", 1), "spec.trainer.numNodes") or 1
        res = r.mapping(trainer.get("resourcesPerNode"), "spec.trainer.resourcesPerNode")
        per = 0
        for k in ("limits", "requests"):
            m = r.mapping(res.get(k), f"spec.trainer.resourcesPerNode.{k}")
            if GPU in m:
                per = r.count(m[GPU], f"spec.trainer.resourcesPerNode.{k}.{GPU}") or 0
                break
        pods = _pods(r, [], per, nodes, "spec.trainer.numNodes")
        where = "spec.trainer"
    elif kind in ("ClusterTrainingRuntime", "TrainingRuntime"):
        ml = r.mapping(spec.get("mlPolicy"), "spec.mlPolicy")
        nodes = r.count(ml.get("numNodes", 1), "spec.mlPolicy.numNodes") or 1
        torch = r.mapping(ml.get("torch"), "spec.mlPolicy.torch")
        nproc = torch.get("numProcPerNode")
        per = r.count(nproc, "spec.mlPolicy.torch.numProcPerNode", auto=True) \
            if nproc is not None else None
        if per:
            pods = _pods(r, [], per, nodes, "spec.mlPolicy.numNodes")
        else:
            r.warn(f"{r.name}: spec.mlPolicy.torch.numProcPerNode is {nproc!r}: the GPU count "
                   "comes from the TrainJob's resourcesPerNode; give --n")
        where = "spec.mlPolicy"
    elif kind == "Pod":
        per = _pod_gpus(r, spec, "spec")
        pods = [per] if per else []
    else:  # a batch Job, or anything with replicas and a pod template
        per = _pod_gpus(r, _template_pod(spec.get("template")), "spec.template.spec")
        copies = spec.get("parallelism" if kind == "Job" else "replicas", 1)
        copies = r.count(copies, "spec.parallelism", zero=True) or 0
        pods = _pods(r, [], per, copies, "spec.parallelism" if kind == "Job" else "spec.replicas")
    if pods:
        r.set("hardware.n", sum(pods), f"{where} (replicas x {GPU})")
        if len(set(pods)) == 1:
            r.set("hardware.gpus_per_node", pods[0], f"{where} ({GPU} per pod)")
        else:
            r.warn(f"{r.name}: pods hold different GPU counts {sorted(set(pods))}; give "
                   "--gpus-per-node")
    elif kind not in ("ClusterTrainingRuntime", "TrainingRuntime"):
        r.warn(f"{r.name}: no {GPU} limits in the pod templates; give --n")
    annotations(r, doc)


def annotations(r: Reader, doc: dict) -> None:
    from planner.jobs.text import parse

    meta = r.mapping(doc.get("metadata"), "metadata")
    ann = r.mapping(meta.get("annotations"), "metadata.annotations")
    job_ref = ann.get(JOB_ANNOTATION, MISSING)
    if job_ref is not MISSING:
        base = r.reference(job_ref, f"metadata.annotations.{JOB_ANNOTATION}", None)
        if base is not None:
            r.bases.append(base)
    text = ann.get(SPEC_ANNOTATION, MISSING)
    if text is MISSING:
        if job_ref is MISSING:
            r.warn(f"{r.name}: no {SPEC_ANNOTATION} annotation: the model and training settings "
                   "come from the command line")
        return
    key = f"metadata.annotations.{SPEC_ANNOTATION}"
    if not isinstance(text, str):
        raise r.fail(key, "must be a string holding a JSON or YAML spec")
    _, spec = parse(text, f"{r.name} {key}")
    top = r.read_doc(spec, f"{r.name} {key}", JobFormat.SPEC, r.base_dir, r.depth + 1)
    mine_n = r.raw.get("hardware.n")
    theirs = top.raw.get("hardware.n")
    if mine_n is not None and theirs is not None and mine_n != theirs:
        r.warn(f"{r.name}: {SPEC_ANNOTATION} says hardware.n={theirs!r} but the pods request "
               f"{mine_n} GPUs; checked with the spec's")
    r.tops.append(top)
