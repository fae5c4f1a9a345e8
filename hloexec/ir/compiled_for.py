"""What a dump was compiled for: `compiled_for(module)` reads the platform (gpu, tpu, cpu, unknown) off the habits
each XLA backend leaves in its optimized text, with the evidence; `auto_device(module)` names the device profile
that reproduces that platform's arithmetic (what `--device auto` picks).

Strong evidence names one backend: XLA:GPU's library calls (`__cublas$...`, `__cudnn$...`), its Triton fusions
and its GpuBackendConfig fields (operation queues, cuDNN/cuBLAS configs); a TPU's tiled layouts `T(8,128)`, memory
spaces `S(n)` and its TPU backend configs (window_config, scoped memory); XLA:CPU's YNNPACK and oneDNN fusions and
calls, its fusion backend configs (`outer_dimension_partitions`) and front-end attributes (`xla_cpu_*`). Weak
evidence is a habit: an optimized module whose fusions are kInput (XLA:GPU's reduction fusions), or whose fusions
are all kLoop/kOutput with the dots left unfused (XLA:CPU). Weak evidence decides only when no strong evidence
exists. A pre-optimization module has none of these: `unknown`.
"""

from __future__ import annotations

import re
import weakref
from collections import Counter
from dataclasses import dataclass, field

from .module import Module

PLATFORMS = ("gpu", "tpu", "cpu", "unknown")

# custom-call target prefix -> (platform, what it is)
_TARGETS = (
    ("__cublas$lt$matmul$f8", "gpu", "cuBLASLt fp8 GEMM"),
    ("__cublas$", "gpu", "cuBLAS GEMM"),
    ("__cudnn$", "gpu", "cuDNN call"),
    ("__triton", "gpu", "Triton kernel"),
    ("__gpu$", "gpu", "XLA:GPU runtime call"),
    ("tpu_custom_call", "tpu", "Mosaic TPU kernel (Pallas)"),
    ("__onednn$", "cpu", "oneDNN call"),
    ("__ynn", "cpu", "YNNPACK call"),
    ("lapack_", "cpu", "LAPACK call (jaxlib's CPU kernels)"),
    ("xla_python_cpu_callback", "cpu", "CPU host callback"),
    ("TopK", "cpu", "XLA:CPU's TopK runtime call"),  # XLA:GPU's is __gpu$TopK
    ("AwsNeuron", "unknown", "AWS Neuron call (no profile for Neuron)"),
)
# fusion backend_config "kind" -> platform
_FUSION_KINDS = {
    "__triton_gemm": "gpu",
    "__triton": "gpu",
    "__triton_nested_gemm_fusion": "gpu",
    "__cudnn$fusion": "gpu",
    "__custom_fusion": "gpu",
    "__ynn_fusion": "cpu",
    "__onednn_fusion": "cpu",
}
# substrings of a backend_config -> (platform, what it is)
_CONFIG_KEYS = (
    ("operation_queue_id", "gpu", "GpuBackendConfig operation queues"),
    ("gemm_backend_config", "gpu", "GpuBackendConfig GEMM config"),
    ("cudnn_conv_backend_config", "gpu", "GpuBackendConfig cuDNN config"),
    ("triton_gemm_config", "gpu", "Triton GEMM tiling"),
    ("block_level_fusion_config", "gpu", "Triton block-level fusion"),
    ("window_config", "tpu", "TPU fusion window config"),
    ("scoped_memory_config", "tpu", "TPU scoped memory config"),
    ("outer_dimension_partitions", "cpu", "XLA:CPU fusion partitioning config"),
)
_FP8 = ("f8e4m3fn", "f8e5m2", "f8e4m3fnuz", "f8e5m2fnuz", "f8e4m3", "f8e3m4", "f8e8m0fnu")
_HOPPER = re.compile(r'sm_(9\d|1\d\d)|"major":\s*"?(9|1\d)\b|"is_tma_allowed":\s*true')


@dataclass
class CompiledFor:
    """The platform a module was compiled for and why: `evidence` lines, strongest first."""

    platform: str
    evidence: list[str] = field(default_factory=list)
    hopper: bool = False  # GPU evidence of a Hopper-class part (fp8 GEMMs, sm_90, TMA): an h100

    def to_dict(self) -> dict:
        return {"platform": self.platform, "evidence": list(self.evidence)}


def compiled_for(module: Module) -> CompiledFor:
    """Read the platform `module` was compiled for from its text's backend habits."""
    strong: dict[str, Counter] = {p: Counter() for p in PLATFORMS}
    hopper: Counter = Counter()
    fusion_kinds: Counter = Counter()
    dots_outside_fusions, loop_reductions, fp8 = 0, 0, False
    fused = {
        c.name: str(inst.attrs.get("kind", ""))
        for inst in module.instructions()
        if inst.opcode == "fusion"
        for c in inst.called_computations
    }
    for shape, n in module.shape_counts().items():
        for leaf in _leaves(shape):
            layout = leaf.layout
            if layout is not None and layout.tiles:
                strong["tpu"]["tiled layouts T(...)"] += n
            if layout is not None and layout.memory_space:
                strong["tpu"][f"memory space S({layout.memory_space})"] += n
            if leaf.element_type.name in _FP8:
                fp8 = True
    for comp in module.computations:
        for inst in comp.instructions:
            config = inst.attrs.get("backend_config", "")
            if inst.opcode == "custom-call":
                target = str(inst.attr("custom_call_target", "")).strip('"')
                for prefix, platform, what in _TARGETS:
                    if target == prefix if prefix == "TopK" else target.startswith(prefix):
                        strong[platform][f"{what} ({target})"] += 1
                        if prefix == "__cublas$lt$matmul$f8":
                            hopper["fp8 cuBLASLt GEMM"] += 1
                        break
            elif inst.opcode == "fusion":
                fusion_kinds[inst.attrs.get("kind", "")] += 1
                kind = re.search(r'"kind":\s*\\?"([^"\\]+)', config)
                if kind and kind.group(1) in _FUSION_KINDS:
                    strong[_FUSION_KINDS[kind.group(1)]][f"{kind.group(1)} fusions"] += 1
            elif inst.opcode in ("dot", "convolution") and comp.name not in fused:
                dots_outside_fusions += 1
            elif inst.opcode in ("reduce", "reduce-window") and fused.get(comp.name) == "kLoop":
                loop_reductions += 1
            if config:
                for key, platform, what in _CONFIG_KEYS:
                    if key in config:
                        strong[platform][f"{what} ({key})"] += 1
                if _HOPPER.search(config):
                    hopper["compute capability 9.x or TMA in a backend config"] += 1
            attrs = inst.attrs.get("frontend_attributes", "")
            if "xla_cpu_" in attrs:
                strong["cpu"]["XLA:CPU front-end attributes (xla_cpu_*)"] += 1
    scores = {p: sum(c.values()) for p, c in strong.items() if p != "unknown" and c}
    if fp8 and scores.get("gpu"):
        hopper["fp8 element types"] += 1
    evidence = [
        f"{p}: {what} x{n}"
        for p in sorted(scores, key=lambda p: scores[p], reverse=True)
        for what, n in strong[p].most_common()
    ]
    evidence += [f"unknown: {what} x{n}" for what, n in strong["unknown"].most_common()]
    if len(scores) == 1:
        platform = next(iter(scores))
    elif scores:
        ranked = sorted(scores.values(), reverse=True)
        platform = max(scores, key=lambda p: scores[p]) if ranked[0] > 4 * ranked[1] else "unknown"
        if platform == "unknown":
            evidence.append("conflicting evidence: no platform dominates")
    else:
        platform, weak = _weak(fusion_kinds, dots_outside_fusions, loop_reductions)
        evidence += weak
    if platform == "gpu" and hopper:
        evidence += [f"gpu (Hopper): {what} x{n}" for what, n in hopper.most_common()]
    if not evidence:
        evidence.append("no backend-specific ops, layouts or configs (a pre-optimization module?)")
    return CompiledFor(platform, evidence, hopper=platform == "gpu" and bool(hopper))


def _weak(fusion_kinds: Counter, dots_outside_fusions: int, loop_reductions: int) -> tuple[str, list[str]]:
    """The platform an optimized module's fusion habits suggest, when nothing names one."""
    if fusion_kinds.get("kInput"):
        return "gpu", [f"gpu (weak): kInput fusions x{fusion_kinds['kInput']} (XLA:GPU's reduction fusions)"]
    if fusion_kinds and set(fusion_kinds) <= {"kLoop", "kOutput"} and (dots_outside_fusions or loop_reductions):
        habits = [
            f"{n} {what}"
            for n, what in (
                (dots_outside_fusions, "dot(s)/convolution(s) left unfused"),
                (loop_reductions, "reduction(s) inside kLoop fusions"),
            )
            if n
        ]
        return "cpu", [
            f"cpu (weak): only kLoop/kOutput fusions (x{sum(fusion_kinds.values())}), "
            f"{' and '.join(habits)} (XLA:CPU's habits)"
        ]
    if fusion_kinds:
        return "unknown", [f"fusions ({', '.join(sorted(fusion_kinds))}) without a backend's marks"]
    return "unknown", []


def _leaves(shape):
    if shape.is_tuple:
        for s in shape.tuple_shapes:
            yield from _leaves(s)
    else:
        yield shape


# platform -> the device profile that reproduces its arithmetic
_PROFILES = {"tpu": "tpu", "cpu": "xla-cpu", "unknown": "reference"}


def auto_device(module: Module) -> tuple[str, str]:
    """(device profile name, why) for `--device auto`: a GPU dump's profile is h100 on Hopper evidence (fp8
    GEMMs, compute capability 9.x), else a100; a TPU's tpu, XLA:CPU's xla-cpu, anything else reference."""
    found = compiled_for(module)
    name = ("h100" if found.hopper else "a100") if found.platform == "gpu" else _PROFILES[found.platform]
    head = found.evidence[0] if found.evidence else ""
    reason = f"compiled for {found.platform}" + (f" ({head})" if head else "")
    if found.platform == "gpu":
        reason += "; Hopper evidence" if found.hopper else "; no Hopper evidence (fp8 GEMMs, sm_90): an A100"
    return name, reason


_YNN_COMPUTATIONS: weakref.WeakKeyDictionary[Module, frozenset[str]] = weakref.WeakKeyDictionary()


def ynn_computations(module: Module) -> frozenset[str]:
    """Names of the computations XLA:CPU runs through YNNPACK (called by `__ynn_fusion` fusions): their sums
    have YNNPACK's order, not XLA's loop emitter's. Computed once per module."""
    names = _YNN_COMPUTATIONS.get(module)
    if names is None:
        names = _YNN_COMPUTATIONS[module] = frozenset(
            c.name
            for inst in module.instructions()
            if inst.opcode == "fusion" and "__ynn_fusion" in inst.attrs.get("backend_config", "")
            for c in inst.called_computations
        )
    return names
