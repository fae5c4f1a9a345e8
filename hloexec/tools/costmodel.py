"""Time estimates for the reports and the simulator exports: collectives on named links (a latency-bandwidth
model of ring algorithms) and compute on named devices (a roofline over `stats`' FLOPs and the bytes an
instruction reads and writes). Every figure is a named preset with its source, printed with the results.

Collectives (ring algorithms, as NCCL's ring and nccl-tests' bus bandwidth count them; Thakur, Rabenseifner
& Gropp, "Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1), 2005):
  all-reduce       2(n-1) steps, each device sends and receives 2(n-1)/n x the buffer
  all-gather       n-1 steps, (n-1)/n x the gathered result
  reduce-scatter   n-1 steps, (n-1)/n x the operand
  all-to-all       n-1 steps (pairwise exchange), (n-1)/n x the operand
  broadcast        n-1 steps (pipelined ring), the buffer once: every device but the last sends it
  permute          1 step, the buffer from each source to its target
time = base latency + steps x per-step latency + bytes each device sends / link bandwidth (NCCL's own model:
`latency + nBytes / algBw` in src/graph/tuning.cc, with per-step latencies from the same file).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..ir.module import Instruction
from .stats import Walk, collective_bytes, instruction_flops


@dataclass(frozen=True)
class Link:
    name: str
    bandwidth: float  # bytes/s each way, per device
    latency: float  # seconds per algorithm step
    source: str

    def to_dict(self) -> dict:
        return asdict(self)


# NCCL src/graph/tuning.cc (NVIDIA/nccl): ring/Simple latencies, base 8.4 us per collective, per step
# NVLink 3.4 us, PCI 5.7 us, network 9.6 us.
BASE_LATENCY = 8.4e-6
_NCCL = "per-step latency: NCCL's ring/Simple hwLat (src/graph/tuning.cc)"
LINKS = {
    "nvlink3": Link(
        "NVLink 3 (A100 SXM)",
        300e9,
        3.4e-6,
        "NVIDIA A100 datasheet: NVLink 600 GB/s per GPU, both directions -> 300 GB/s each way; " + _NCCL,
    ),
    "nvlink4": Link(
        "NVLink 4 (H100 SXM)",
        450e9,
        3.4e-6,
        "NVIDIA H100 datasheet: NVLink 900 GB/s per GPU, both directions -> 450 GB/s each way; " + _NCCL,
    ),
    "pcie4": Link(
        "PCIe 4.0 x16",
        31.5e9,
        5.7e-6,
        "PCI-SIG PCIe 4.0: 16 GT/s x 16 lanes, 128b/130b encoding -> 31.5 GB/s each way; " + _NCCL,
    ),
    "pcie5": Link(
        "PCIe 5.0 x16",
        63e9,
        5.7e-6,
        "PCI-SIG PCIe 5.0: 32 GT/s x 16 lanes, 128b/130b encoding -> 63 GB/s each way; " + _NCCL,
    ),
    "ib-hdr": Link(
        "InfiniBand HDR, one 200 Gb/s port per device",
        25e9,
        9.6e-6,
        "InfiniBand HDR: 200 Gb/s per port -> 25 GB/s each way; " + _NCCL,
    ),
    "ib-ndr": Link(
        "InfiniBand NDR, one 400 Gb/s port per device",
        50e9,
        9.6e-6,
        "InfiniBand NDR: 400 Gb/s per port -> 50 GB/s each way; " + _NCCL,
    ),
    "ici-v5p": Link(
        "TPU v5p ICI (3D torus, 6 links per chip)",
        600e9,
        1e-6,
        "Cloud TPU v5p documentation: 1200 GB/s bidirectional ICI per chip -> 600 GB/s each way over its "
        "6 links (a ring along one torus axis uses 2 of them: divide by 3); per-step latency 1 us "
        "assumed (not published)",
    ),
}
DEFAULT_LINK = "nvlink3"


@dataclass(frozen=True)
class Chip:
    name: str
    flops: float  # peak FLOP/s of the dot units (16-bit inputs, dense)
    bandwidth: float  # memory bytes/s
    source: str

    def to_dict(self) -> dict:
        return asdict(self)


CHIPS = {
    "a100": Chip(
        "NVIDIA A100 SXM 80GB",
        312e12,
        2039e9,
        "NVIDIA A100 datasheet: 312 TFLOP/s BF16/FP16 tensor (dense), HBM2e 2,039 GB/s",
    ),
    "h100": Chip(
        "NVIDIA H100 SXM", 989e12, 3350e9, "NVIDIA H100 datasheet: 989 TFLOP/s BF16/FP16 tensor (dense), HBM3 3.35 TB/s"
    ),
    "v100": Chip("NVIDIA V100 SXM2", 125e12, 900e9, "NVIDIA V100 datasheet: 125 TFLOP/s tensor, HBM2 900 GB/s"),
    "tpu-v4": Chip("TPU v4", 275e12, 1200e9, "Cloud TPU v4 documentation: 275 TFLOP/s BF16, HBM 1,200 GB/s"),
    "tpu-v5p": Chip("TPU v5p", 459e12, 2765e9, "Cloud TPU v5p documentation: 459 TFLOP/s BF16, HBM 2,765 GB/s"),
}
DEFAULT_CHIP = "a100"


def collective_kind(inst: Instruction) -> str | None:
    """all-reduce / all-gather / reduce-scatter / all-to-all / collective-permute / collective-broadcast for a
    collective or its -start (the -done is not one), else None."""
    op = inst.opcode
    if op.endswith("-done"):
        return None
    kind = op.removesuffix("-start")
    return kind if kind in COLLECTIVE_KINDS else None


COLLECTIVE_KINDS = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
)


def buffer_bytes(inst: Instruction) -> int:
    """The collective's size as nccl-tests counts it (and `hloexec stats`): the operands, the gathered result
    for an all-gather."""
    return collective_bytes(inst, collective_kind(inst))


def ring_model(kind: str, size: int, n: int) -> tuple[int, float]:
    """(algorithm steps, bytes each device sends) for a group of n devices and a buffer of `size` bytes."""
    if n <= 1:
        return 0, 0.0
    if kind == "all-reduce":
        return 2 * (n - 1), 2 * (n - 1) / n * size
    if kind in ("all-gather", "reduce-scatter", "all-to-all"):
        return n - 1, (n - 1) / n * size
    if kind == "collective-broadcast":
        return n - 1, float(size)
    return 1, float(size)  # collective-permute: one send per source


def collective_time(kind: str, size: int, n: int, link: Link) -> float:
    steps, sent = ring_model(kind, size, n)
    if steps == 0:
        return 0.0
    return BASE_LATENCY + steps * link.latency + sent / link.bandwidth


# Instructions that move no data of their own (views, markers, tuples).
FREE_OPCODES = frozenset(
    {
        "parameter",
        "constant",
        "tuple",
        "get-tuple-element",
        "bitcast",
        "after-all",
        "add-dependency",
        "opt-barrier",
        "optimization-barrier",
        "partition-id",
        "replica-id",
        "domain",
        "copy-done",
        "all-reduce-done",
        "all-gather-done",
        "collective-permute-done",
        "async-done",
        "async-update",
    }
)


def compute_cost(inst: Instruction, chip: Chip, walk: Walk | None = None) -> tuple[int, int, float]:
    """(FLOPs, bytes, seconds) of one instruction on `chip`: max(FLOPs / peak, bytes / bandwidth), FLOPs as
    `hloexec stats` counts them (dots, convolutions, gemms, those inside fusions and calls too), bytes the
    operands read and the result written. Collectives and free instructions cost 0 here."""
    if inst.opcode in FREE_OPCODES or collective_kind(inst) is not None:
        return 0, 0, 0.0
    flops = instruction_flops(inst, walk)
    moved = inst.shape.nbytes + sum(o.shape.nbytes for o in inst.operands)
    return flops, moved, max(flops / chip.flops, moved / chip.bandwidth)
