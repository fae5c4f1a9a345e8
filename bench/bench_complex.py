"""How close XLA:CPU's complex results come to their error bounds (tools/bound_complex.py): per elementwise op
and complex type, one op on a rounded operand (a product of two inputs spread over six orders of magnitude; the
transcendentals' near the unit circle), the largest and median |XLA:CPU's - the shadow's| / bound over its
elements and the verdict (the verdict allows bound_factor = 1.75). A c128 program's shadow is itself c128: its
errors there are two runs' differences.

    python bench/bench_complex.py [N]        # N elements per op (default 4096)

Prints a markdown table (docs/verdicts.md "Complex values, measured") and the load.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import hloexec
from hloexec.tools.shadow_runs import judge_run
from hloexec.tools.xla_cpu import run_on_xla_cpu

OPS = ["multiply", "divide", "add", "subtract", "exponential", "sqrt", "log", "tanh", "abs", "rsqrt", "power",
       "log-plus-one", "exponential-minus-one", "sine", "cosine"]  # fmt: skip
BINARY = {"multiply", "divide", "add", "subtract", "power"}
NEAR_ONE = {"exponential", "sine", "cosine", "tanh", "exponential-minus-one", "power"}  # (finite values)


def measure(op: str, ctype: str, n: int) -> tuple:
    """(largest error / bound, median, consistent) of XLA:CPU's result of `op` on a rounded operand."""
    dtype, rtype = (np.complex64, "f32") if ctype == "c64" else (np.complex128, "f64")
    text = f"""HloModule o
ENTRY e {{ x = {ctype}[{n}] parameter(0)  y = {ctype}[{n}] parameter(1)  w = {ctype}[{n}] parameter(2)
          a = {ctype}[{n}] multiply(x, w)
          ROOT t = {rtype if op == "abs" else ctype}[{n}] {op}(a{", y" if op in BINARY else ""}) }}"""
    rng = np.random.default_rng(1)
    x, y, w = ((rng.standard_normal(n) + 1j * rng.standard_normal(n)) * np.exp(rng.uniform(-3, 3, n)) for _ in "xyw")
    if op in NEAR_ONE:
        x, y, w = 1.5 * x / np.abs(x), y / np.abs(y), w / np.abs(w)
    inputs = [v.astype(dtype) for v in (x, y, w)]
    exe = hloexec.load(text)
    [xla] = run_on_xla_cpu(text, inputs)
    verdict, run = judge_run(exe, inputs, {"xla": [xla]})
    bound = run.bounds[exe.options.device.name].bounds[0]
    error = np.abs(xla.astype(np.complex128) - np.asarray(run.shadow[0]))
    judged = np.isfinite(bound) & (bound > 0)
    ratio = error[judged] / bound[judged]
    consistent = next(c.consistent for c in verdict.outputs[0].candidates if c.name == "xla")
    return float(ratio.max()), float(np.median(ratio)), consistent


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    print("| op | c64 max / median error / bound | c128 max / median | verdicts |\n|---|---|---|---|")
    for op in OPS:
        (m64, d64, c64), (m128, d128, c128) = (measure(op, t, n) for t in ("c64", "c128"))
        verdicts = "consistent" if c64 and c128 else f"c64 {c64}, c128 {c128}"
        print(f"| {op} | {m64:.2f} / {d64:.3f} | {m128:.2f} / {d128:.3f} | {verdicts} |")
    print(f"load: {os.getloadavg()}")


if __name__ == "__main__":
    main()
