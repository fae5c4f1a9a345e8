"""Device profiles: named, documented sets of arithmetic rules -- whose arithmetic a run reproduces.

A profile is a TOML (or JSON) file of rules, each with its source; the built-in ones are the files beside this
module (profiles/NAME.toml), and a user's file copied from `hloexec devices --show NAME` and edited is read the
same way (`base = "NAME"` takes every rule not written from that profile). `reference` is the HLO text exactly as
the operation semantics define it.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path

from ..errors import ExecutionError

PROFILE_DIR = Path(__file__).parent / "profiles"
PLATFORMS = ("reference", "cpu", "gpu", "tpu")

# What an algorithm's arithmetic keeps, for error bounds and reports: (significand bits an operand keeps, counting
# the implicit bit -- for the multi-pass bf16 / tf32 recipes the bits their passes capture together; 0: the
# operand's own type --, the type products are accumulated in). xla/service/algorithm_util.cc and
# dot_algorithm_rewriter.cc.
ALGORITHM_ARITHMETIC = {
    "dot_any_f8_any_f8_f32": (0, "f32"),
    "dot_any_f8_any_f8_f32_fast_accum": (0, "f32"),
    "dot_f16_f16_f16": (11, "f16"),
    "dot_f16_f16_f32": (11, "f32"),
    "dot_bf16_bf16_bf16": (8, "bf16"),
    "dot_bf16_bf16_f32": (8, "f32"),
    "dot_bf16_bf16_f32_x3": (16, "f32"),
    "dot_bf16_bf16_f32_x6": (24, "f32"),
    "dot_bf16_bf16_f32_x9": (24, "f32"),
    "dot_tf32_tf32_f32": (11, "f32"),
    "dot_tf32_tf32_f32_x3": (22, "f32"),
    "dot_f32_f32_f32": (24, "f32"),
    "dot_f64_f64_f64": (53, "f64"),
}
# PrecisionConfig.Algorithm (xla/xla_data.proto), as HLO text spells it after `algorithm=`
ALGORITHMS = tuple(ALGORITHM_ARITHMETIC)
PRECISIONS = ("default", "high", "highest")  # operand_precision, as HLO text spells it
# How an f32 value becomes tf32 (10 stored significand bits): to nearest, ties to even; to nearest, ties away from
# zero (PTX cvt.rna.tf32.f32); or by dropping the low 13 bits.
TF32_ROUNDINGS = ("nearest", "nearest-away", "truncate")
# How the multi-pass bf16 recipes (X3, X6, X9) make each part: the f32 value's top 16 bits (dot_algorithm_rewriter.cc's
# Truncate, bits & 0xFFFF0000) or rounded to the nearest bf16 (Triton's BF16DotTC pass, arith.truncf).
BF16_SPLITS = ("truncate", "nearest")
# How reductions (reduce, reduce-window) apply an add / multiply reducer. "accumulate": f16 / bf16 / fp8 values
# accumulate in f32 and round to the type once, at the end, in an order of each tier's choosing (wider types: in
# their type, any order). "per-step": every application of the reducer rounds to the reduction's type, as the HLO
# says, one element after the other from the init value in row-major order of the reduced dims (of the window,
# for reduce-window), the same in every tier. "xla-cpu": XLA:CPU's orders (measured, jaxlib 0.10.2): "per-step"
# (its loop emitter's order), except f32 sums over the minor dims inside `__ynn_fusion` fusions, which YNNPACK
# adds in `vector_width` lanes (hloexec/ops/reduction.py, ynn_row_sum, says the order), and f32 dots there, which
# YNNPACK sums in blocks and lanes of K (hloexec/kernels/ynn_dot.py).
REDUCTIONS = ("accumulate", "per-step", "xla-cpu")
# How f32 transcendentals (exp, log, tanh, log1p, expm1, erf, logistic) compute. "accurate": to the nearest f32 but
# where the exact value lies within about 2**-51 of a rounding boundary (numpy, the compiled tier's float64 helpers).
# "xla-cpu": XLA:CPU's own approximations (its f32 polynomials as its LLVM IR spells them, each multiply-add one
# FMA where LLVM contracts it: kernels/approximations.py).
TRANSCENDENTALS = ("accurate", "xla-cpu")


@dataclass(frozen=True)
class DeviceProfile:
    """The arithmetic rules of one device. Every field is a rule a profile file may set; `sources` says, per
    rule, where it comes from."""

    name: str
    platform: str = "reference"  # one of PLATFORMS: what `--device auto` matches a dump's evidence with
    description: str = ""
    # -- dots ---------------------------------------------------------------------------------------------------
    honor_algorithm: bool = True  # an explicit algorithm= is computed as it says (XLA:CPU ignores it)
    precision: dict = field(default_factory=dict)  # operand_precision -> the algorithm of an f32 x f32 dot
    matrix_vector: str = ""  # the algorithm of an f32 matrix-vector dot whatever its precision ("": none)
    tf32_rounding: str = "nearest"  # how an f32 operand becomes tf32: one of TF32_ROUNDINGS
    bf16_split: str = "truncate"  # how the multi-pass bf16 recipes cut an f32 into parts: one of BF16_SPLITS
    algorithms: tuple = ALGORITHMS  # the algorithms the device runs; any other is an error naming both
    split_k: bool = False  # a Triton GEMM fusion's unsplit dot: triton_gemm_config split_k slices of K
    # summed apart, then added in f32
    fp8_fast_accumulation: bool = False  # fp8 GEMMs never promote their partial sums to f32 (Hopper's fast accum)
    fp8_accumulator_bits: int = 14  # with fast accumulation: significand bits the running sum keeps (truncated)
    # -- elementwise and reductions ------------------------------------------------------------------------------
    excess_precision: bool = False  # inside a fusion, f16/bf16 intermediates stay f32 (rounded where stored)
    fma_contraction: bool = False  # inside a fusion, a multiply feeding an add / subtract rounds once with it
    # (hloexec/ir/fma.py)
    reductions: str = "accumulate"  # see hloexec.options.REDUCTIONS
    transcendentals: str = "accurate"  # see TRANSCENDENTALS
    vector_width: int = 0  # f32 lanes of the device's vectorized sums (reductions = "xla-cpu": 16 with
    # AVX-512, 8 with AVX2); 0: this machine's (machine_vector_width)
    flush_subnormals: bool = False  # f32 (and bf16, computed in f32) arithmetic reads operands below f32's smallest
    # normal as 0 (DAZ) and makes results below it 0 (FTZ); moves, negate, abs and converts keep them
    nan_ignoring_reductions: int = 0  # max and min reduces (and reduce-windows whose strides are their sizes) of
    # at least this many elements (operand or result) may ignore NaN terms: the others' max, the init where all are
    # NaN (XLA:CPU's YNNPACK offload: 4096; f32 / f64 always, f16 / bf16 by the NaN's sign bit); 0: none, NaN
    # propagates as HLO's maximum says
    divide_by_reciprocal: bool = False  # x / broadcast(m) is computed as x * broadcast(1 / m), x / constant as
    # x * (1 / constant), x / sqrt(m) as x * rsqrt(m): the reciprocal rounds once more (XLA's algebraic simplifier)
    divide_of_divides: bool = False  # (a / b) / (c / d), (a / b) / c and a / (b / c) are computed as (a*d) / (b*c),
    # a / (b*c) and (a*c) / b, f16 and f32: the products' range decides (XLA's algebraic simplifier on XLA:CPU)
    folded_constant_sums: bool = False  # (a + c1) + c2 and (c1 - a) + c2 are computed as a + fl(c1 + c2) and
    # fl(c1 + c2) - a (f16, f32): the folded constant rounds (XLA's algebraic simplifier)
    power_as_products: bool = False  # pow(a, 3) is computed as a * (a * a) (f16, f32): two roundings
    factored_sums: bool = False  # a * c + b * c (c a power of 2) is computed as (a + b) * c (f16, f32): a + b may
    # overflow where the products' sum does not
    exp_of_differences: bool = False  # exp(a) / exp(b) is computed as exp(a - b) (f16, f32): the difference's
    # rounding, carried by exp
    log_of_powers: bool = False  # log(pow(a, b)) is computed as b * log(|a|) (0 where b is 0; f16, f32): finite
    # where pow(a, b) is negative, NaN or out of the type's range
    tree_reduction_window: int = 0  # the device's compiler rewrites a 16-bit sum over a dim longer than this into
    # a reduce-window of this size and a reduce of the windows' sums (XLA:CPU's TreeReductionRewriter: 32); the
    # error bounds follow that order; hloexec runs a module as written. 0: no rewrite
    sources: dict = field(default_factory=dict)  # rule name -> its source (a file of XLA or JAX, an issue)
    path: str = ""  # the file it was read from

    def __hash__(self):
        return hash((self.name, self.path))

    def rules(self) -> list[tuple[str, object, str]]:
        """(rule, value, source) for every rule, in the order of the fields."""
        skip = {"name", "description", "sources", "path"}
        return [
            (f.name, getattr(self, f.name), self.sources.get(f.name, "")) for f in fields(self) if f.name not in skip
        ]

    def dot_algorithm(
        self, algorithm: str, precisions: tuple[str, ...], f32_operands: bool, matrix_vector: bool
    ) -> str:
        """The algorithm this device computes a dot with: its explicit `algorithm` ("" when the text has none)
        where the device honours it, else the one its operand precisions (lower case, as HLO text) select for
        f32 operands; "" means the dot as its operand and result types say."""
        if algorithm and self.honor_algorithm:
            return algorithm
        if not f32_operands:
            return ""
        if matrix_vector and self.matrix_vector:
            return self.matrix_vector
        return self.precision.get(max(precisions, key=PRECISIONS.index, default="default"), "")

    def to_toml(self) -> str:
        """The profile as a file a user can copy and edit (`hloexec devices --show NAME`)."""
        lines = [f"# {self.description}" if self.description else "", f"name = {toml_value(self.name)}"]
        for rule, value, source in self.rules():
            if source:
                lines.append(f"# {source}")
            lines.append(f"{rule} = {toml_value(value)}")
        return "\n".join(line for line in lines if line) + "\n"


def toml_value(value) -> str:
    """`value` as TOML writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


@cache
def machine_vector_width() -> int:
    """f32 lanes of this machine's widest vector unit XLA:CPU compiles for: 16 with AVX-512, 8 with AVX / AVX2 (x86
    flags in /proc/cpuinfo), else 4 (SSE, NEON)."""
    try:
        flags = next(
            (
                line.split(":", 1)[1].split()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("flags")
            ),
            [],
        )
    except OSError:
        flags = []
    return 16 if "avx512f" in flags else 8 if "avx" in flags else 4


def builtin_names() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


@cache
def device_profile(name_or_path: str) -> DeviceProfile:
    """The profile called `name_or_path` (a built-in) or read from that file (.toml or .json)."""
    path = PROFILE_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        path = Path(name_or_path)
        if path.suffix not in (".toml", ".json") or not path.is_file():
            raise ExecutionError(
                f"device {name_or_path!r}: not a built-in profile ({', '.join(builtin_names())}) "
                "nor a .toml or .json profile file"
            )
    return _read(path)


def _read(path: Path) -> DeviceProfile:
    try:
        data = tomllib.loads(path.read_text()) if path.suffix == ".toml" else json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:  # TOMLDecodeError and JSONDecodeError are ValueErrors
        raise ExecutionError(f"{path}: not a readable device profile ({e})") from None
    if not isinstance(data, dict):
        raise ExecutionError(f"{path}: a device profile is a table of rules, not {type(data).__name__}")
    base = data.pop("base", None)
    unknown = sorted(set(data) - {f.name for f in fields(DeviceProfile)} - {"path"})
    if unknown:
        raise ExecutionError(
            f"{path}: unknown rule(s) {', '.join(unknown)}; a profile's rules are "
            f"{', '.join(r for r, _, _ in DeviceProfile('x').rules())}"
        )
    values = {}
    if base is not None:
        parent = device_profile(str(base))
        values = {f.name: getattr(parent, f.name) for f in fields(DeviceProfile)}
        values["sources"] = {**parent.sources, **data.get("sources", {})}
    values |= {k: v for k, v in data.items() if k != "sources" or base is None}
    values["name"] = data.get("name", path.stem)
    values["path"] = str(path) if path.parent != PROFILE_DIR else ""
    if isinstance(values.get("algorithms"), list):
        values["algorithms"] = tuple(values["algorithms"])
    profile = DeviceProfile(**values)
    _check(profile, path)
    return profile


def _check(p: DeviceProfile, path: Path) -> None:
    def need(ok: bool, what: str):
        if not ok:
            raise ExecutionError(f"{path}: {what}")

    need(p.platform in PLATFORMS, f"platform = {p.platform!r}: expected one of {', '.join(PLATFORMS)}")
    need(p.reductions in REDUCTIONS, f"reductions = {p.reductions!r}: expected one of {', '.join(REDUCTIONS)}")
    need(
        p.transcendentals in TRANSCENDENTALS,
        f"transcendentals = {p.transcendentals!r}: expected one of {', '.join(TRANSCENDENTALS)}",
    )
    need(
        p.tf32_rounding in TF32_ROUNDINGS,
        f"tf32_rounding = {p.tf32_rounding!r}: expected one of {', '.join(TF32_ROUNDINGS)}",
    )
    need(p.bf16_split in BF16_SPLITS, f"bf16_split = {p.bf16_split!r}: expected one of {', '.join(BF16_SPLITS)}")
    need(
        isinstance(p.fp8_accumulator_bits, int) and 2 <= p.fp8_accumulator_bits <= 24,
        f"fp8_accumulator_bits = {p.fp8_accumulator_bits!r}: expected an integer from 2 to 24",
    )
    need(
        isinstance(p.precision, dict) and set(p.precision) <= set(PRECISIONS),
        f"precision = {p.precision!r}: expected a table with keys among {', '.join(PRECISIONS)}",
    )
    named = [*p.precision.values(), *([p.matrix_vector] if p.matrix_vector else []), *p.algorithms]
    bad = [a for a in named if a not in ALGORITHMS]
    need(
        not bad,
        f"unknown dot algorithm(s) {', '.join(map(repr, bad))}: expected names of "
        f"PrecisionConfig.Algorithm as HLO text spells them ({', '.join(ALGORITHMS)})",
    )
    need(
        isinstance(p.vector_width, int) and p.vector_width >= 0 and p.vector_width & (p.vector_width - 1) == 0,
        f"vector_width = {p.vector_width!r}: expected 0 (this machine's) or a power of two (f32 lanes)",
    )
    need(
        isinstance(p.nan_ignoring_reductions, int) and p.nan_ignoring_reductions >= 0,
        f"nan_ignoring_reductions = {p.nan_ignoring_reductions!r}: expected 0 (none) or a number of elements",
    )
    need(
        isinstance(p.tree_reduction_window, int) and p.tree_reduction_window >= 0,
        f"tree_reduction_window = {p.tree_reduction_window!r}: expected 0 (none) or a window's length",
    )
    flags = ("honor_algorithm", "split_k", "fp8_fast_accumulation", "excess_precision", "fma_contraction")
    rewrites = ("divide_by_reciprocal", "divide_of_divides", "folded_constant_sums", "power_as_products")
    for flag in (*flags, "flush_subnormals", *rewrites, "factored_sums", "exp_of_differences", "log_of_powers"):
        need(isinstance(getattr(p, flag), bool), f"{flag} = {getattr(p, flag)!r}: expected true or false")


REFERENCE = device_profile("reference")
