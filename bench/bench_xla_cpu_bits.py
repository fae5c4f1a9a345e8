"""How close `device="xla-cpu"` comes to XLA:CPU's own bits on XLA:CPU's optimized dumps of f16/bf16 programs.

Each program of tests/numerics_programs.py's BITS_PROGRAMS (LayerNorm / RMSNorm / softmax cross-entropy
gradients, Adam, a bf16 train step) is jit-compiled by jax on XLA:CPU; hloexec runs the optimized text
(`compiled.as_text()`) on the same inputs under each device profile, and each output is compared with XLA:CPU's:
the fraction of elements bit-identical and the largest distance in ULPs of the output's scale
(tests/xla_compare.py, bits_agreement). The goal (issue 27): >= 99% bit-identical on every output, none further
than 1 ULP of the scale, under xla-cpu.

    python bench/bench_xla_cpu_bits.py [--devices xla-cpu,reference] [--programs a,b] [--markdown]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import hloexec  # noqa: E402
import numerics_programs  # noqa: E402
from xla_compare import bits_agreement, flatten  # noqa: E402


def measure(name: str, devices: list[str]) -> list[tuple[str, int, str, float, float]]:
    """(device, output index, dtype[shape], fraction bit-identical, max ULPs of scale) for each output."""
    dump = numerics_programs.dump(name)
    rows = []
    for device in devices:
        got = flatten(hloexec.load(dump.opt, device=device)(*dump.inputs))
        for i, (g, w) in enumerate(zip(got, dump.xla)):
            same, ulps = bits_agreement(g, w)
            rows.append((device, i, f"{w.dtype}{list(w.shape)}", same, ulps))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", default="xla-cpu,reference")
    ap.add_argument("--programs", default=",".join(numerics_programs.BITS_PROGRAMS))
    ap.add_argument("--markdown", action="store_true", help="print a table for bench/README.md")
    args = ap.parse_args(argv)
    devices = args.devices.split(",")
    start = time.perf_counter()
    if args.markdown:
        print("| program | output | " + " | ".join(f"{d}: identical, max ULPs" for d in devices) + " |")
        print("|---|---|" + "---|" * len(devices))
    worst = {d: (1.0, 0.0) for d in devices}
    for name in args.programs.split(","):
        rows = measure(name, devices)
        by_output: dict[int, dict] = {}
        for device, i, what, same, ulps in rows:
            by_output.setdefault(i, {"what": what})[device] = (same, ulps)
            worst[device] = (min(worst[device][0], same), max(worst[device][1], ulps))
        for i, cells in by_output.items():
            values = [f"{100 * cells[d][0]:.2f}%, {cells[d][1]:.2g}" for d in devices]
            if args.markdown:
                print(f"| {name} | {i}: {cells['what']} | " + " | ".join(values) + " |")
            else:
                print(f"{name:24s} {i}: {cells['what']:24s} " + "   ".join(f"{d} {v}" for d, v in zip(devices, values)),
                      flush=True)
    print("\nworst output per device: " + "; ".join(f"{d} {100 * s:.2f}% identical, {u:.2g} ULPs of scale"
                                                    for d, (s, u) in worst.items()))
    print(f"({time.perf_counter() - start:.0f} s, {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
