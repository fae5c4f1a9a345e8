"""`--device NAME|FILE` (whose arithmetic a run reproduces) and `hloexec devices` (the profiles, their rules and
the sources of each rule). The profiles themselves are hloexec/options/devices.py and its profiles/ files."""

from __future__ import annotations

import argparse
import sys

from ..errors import ExecutionError
from ..ir.compiled_for import auto_device
from ..options import device_profile

DEVICE_HELP = (
    "whose arithmetic to reproduce: a device profile (reference: the default, the HLO as its semantics "
    "say; xla-cpu, tpu, a100, h100: `hloexec devices` lists their rules), a .toml/.json profile file "
    "(`hloexec devices --show NAME` prints one to copy and edit), or auto: the profile of what the dump "
    "was compiled for (`hloexec stats` shows the evidence); compare --reference shadow takes a list "
    "A,B,...: judged by each device's arithmetic, the run computed as the first"
)


def add_device_argument(parser) -> None:
    parser.add_argument("--device", metavar="NAME|FILE", type=device_names, default=None, help=DEVICE_HELP)


def device_names(text: str) -> str:
    """--device's value as written, refused before anything runs when a name of it is empty (`--device ,`,
    `a100,`, `''`): a profile name or file, or a list A,B,... of them."""
    if not all(name.strip() for name in text.split(",")):
        raise argparse.ArgumentTypeError(
            f"expected a device profile name or file, or a list of them separated by commas (a100,tpu), got {text!r}"
        )
    return text


def device_option(text: str | None, module, say=None):
    """The device profile `--device` names (None: the reference profile), the one place a value of --device is
    read; `module` is the module it is for: `--device auto` picks the profile from what the dump was compiled for
    (ir/compiled_for.py) and says which and why through `say` (default: stderr)."""
    if text and "," in text:
        raise ExecutionError(
            f"--device {text}: one device profile expected (a list is for compare --reference "
            "shadow, which judges by each)"
        )
    if text == "auto":
        text, reason = auto_device(module)
        (say or (lambda m: print(m, file=sys.stderr)))(f"--device auto: {text} ({reason})")
    return device_profile(text or "reference")


def device_list(text: str, module, say=None) -> list:
    """The profiles of `--device A,B,...` (compare --reference shadow judges by each), each read by device_option."""
    return [device_option(name, module, say) for name in text.split(",")]


def describe(profile) -> dict:
    """A profile as JSON: name, description, platform, file, and per rule its value and source."""
    return {
        "name": profile.name,
        "description": profile.description,
        "platform": profile.platform,
        "file": profile.path or None,
        "rules": {
            rule: {"value": list(v) if isinstance(v, tuple) else v, "source": source}
            for rule, v, source in profile.rules()
        },
    }


# What each rule does, for the listing (the values and their sources come from the profiles).
RULES = {
    "platform": "the kind of device a dump's evidence matches (--device auto)",
    "honor_algorithm": "an explicit algorithm= (PrecisionConfig.Algorithm) is computed as it says",
    "precision": "operand_precision (default / high / highest) -> the algorithm of an f32 x f32 dot",
    "matrix_vector": "the algorithm of an f32 matrix-vector dot whatever its precision",
    "tf32_rounding": "how an f32 operand becomes tf32: nearest (ties to even), nearest-away, truncate",
    "bf16_split": "how the multi-pass bf16 recipes cut an f32 into parts: truncate (top 16 bits) or nearest",
    "algorithms": "the algorithms the device runs; a dot asking for another is an error naming both",
    "split_k": "a Triton GEMM's triton_gemm_config split_k: K slices summed apart, then added",
    "fp8_fast_accumulation": "fp8 x fp8 GEMMs at DEFAULT precision (no algorithm) keep their partial sums in fewer "
    "bits (Hopper)",
    "fp8_accumulator_bits": "with fast accumulation: significand bits the running sum keeps (truncated)",
    "excess_precision": "inside a fusion, f16/bf16 intermediates stay f32 (rounded where stored)",
    "fma_contraction": "inside a fusion, a multiply feeding an add / subtract (and a fused sum of products) rounds "
    "once with it, as LLVM's FMA contraction does",
    "reductions": "how f16/bf16 sums round: accumulate (in f32, rounded once), per-step (row-major, every step "
    "rounded) or xla-cpu (per-step, YNNPACK's lane order in __ynn_fusion sums)",
    "transcendentals": "how f32 exp, log, log1p, expm1, tanh, erf, logistic compute: accurate (to the nearest f32) "
    "or xla-cpu (XLA:CPU's own polynomial approximations, bit for bit)",
    "vector_width": "f32 lanes of the device's vectorized sums (reductions = xla-cpu); 0: this machine's",
    "nan_ignoring_reductions": "max and min reduces of at least this many elements may ignore NaN terms "
    "(YNNPACK's); 0: none",
    "divide_of_divides": "(a / b) / (c / d), (a / b) / c and a / (b / c) are computed as (a*d) / (b*c), a / (b*c) "
    "and (a*c) / b (f16, f32): the products may leave the type's range (the compiler's rewrite; error bounds only)",
    "folded_constant_sums": "(a + c1) + c2 and (c1 - a) + c2 are computed as a + (c1 + c2) and (c1 + c2) - a, the "
    "constants' sum rounded in the type (the compiler's rewrite; error bounds only)",
    "power_as_products": "pow(a, 3) is computed as a * (a * a): two roundings (the compiler's rewrite; error bounds only)",
    "factored_sums": "a * c + b * c (c a power of 2) is computed as (a + b) * c: a + b may overflow (the compiler's "
    "rewrite; error bounds only)",
    "exp_of_differences": "exp(a) / exp(b) is computed as exp(a - b): the difference rounds, exp carries it (the "
    "compiler's rewrite; error bounds only)",
    "log_of_powers": "log(pow(a, b)) is computed as b * log(|a|) (0 where b is 0): finite where pow(a, b) is "
    "negative or out of range (the compiler's rewrite; error bounds only)",
    "tree_reduction_window": "16-bit sums over a dim longer than this are a reduce-window of this size and a reduce "
    "(the compiler's rewrite; error bounds only); 0: none",
}
