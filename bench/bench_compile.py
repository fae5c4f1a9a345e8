"""Compile speed of generated kernels (issue 29 item 2): the direct compiler (hloexec/kernels/direct.py) against Numba.

    python bench/bench_compile.py                                   # the GPT d256 steps and the Adam mixed step
    python bench/bench_compile.py gpt_step_d256_f32_opt --markdown
    python bench/bench_compile.py examples/gpt_step.opt.hlo --numba-opt 1,2,3

Per module (an HLO file or a bench/workloads.py name, as bench/bench_warmup.py takes them): every kernel its
fusions and loops would compile (loaded with compile="eager" and a compile threshold never reached, run once,
then the kernels of the tiers planned), counted three ways -- fusion and loop tiers, distinct kernels (one per
source: structurally equal computations share one), and distinct modulo integer literals (what sharing
kernels across shapes would save). Then each compiler compiles every distinct kernel in a fresh child process
with an empty kernel cache dir, timed in CPU time (time.process_time: the machine may be busy): per kernel and
per generated line, the direct compiler over the kernels it translates (the others named with the reason)
and Numba over the same kernels (`--numba-opt`: also at other NUMBA_OPT levels).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_warmup import _inputs, module_files  # noqa: E402

DEFAULT = ["gpt_step_d256_f32_pre", "gpt_step_d256_f32_opt", "adam_mixed_9.4M_opt"]


def kernels_of(name: str) -> list[tuple]:
    """(tier kind, key, source, signature) of every tier a run of `name` plans to compile."""
    import hloexec
    hlo, npz, _ = module_files(name)
    exe = hloexec.load(str(hlo), compile="eager", compile_after=1 << 30)
    exe.run(*_inputs(exe, npz))
    policy = exe.context.policy
    tiers = [("fusion", t) for ts in policy._kernel_tiers.values() for t in ts]
    tiers += [("loop", t) for ts in policy._loops.values() for t in ts]
    return [(kind, *t.kernel.compile_task) for kind, t in tiers if t.kernel is not None]


def child(compiler: str, tasks_file: str) -> dict:
    """Compile every task of `tasks_file` with `compiler` ("direct", "numba"): CPU seconds and lines of each."""
    tasks = pickle.loads(Path(tasks_file).read_bytes())
    from hloexec.kernels import cache, direct, direct_kernels, machine_code
    if compiler == "numba":     # Numba's own start (its first compile) is not a kernel's
        from numba import njit
        njit(lambda x: x + 1)(1.0)
    else:
        machine_code.object_layout()
        machine_code.llvm_engine()
    times, declined = {}, collections.Counter()
    for key, source, signature in tasks:
        start = time.process_time()
        if compiler == "direct":
            try:
                direct_kernels.compile_kernel(source, key, signature, cache.cache_dir())
            except direct.Untranslatable as e:
                declined[str(e)] += 1
                continue
        else:
            cache.compile_signature(cache.load_kernel(source, key, signature), signature, source.count("\n"))
        times[key] = time.process_time() - start
    return {"times": times, "declined": dict(declined)}


def run_child(compiler: str, tasks_file: str, env: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="hloexec-compile-") as cache:
        p = subprocess.run([sys.executable, __file__, "--child", compiler, tasks_file],
                           env=dict(env, HLOEXEC_CACHE_DIR=cache, HLOEXEC_DIRECT_KERNELS="0" if compiler == "numba" else "1"),
                           capture_output=True, text=True)
    for line in p.stdout.splitlines():
        if line.startswith("@@RESULT "):
            return json.loads(line[len("@@RESULT "):])
    raise SystemExit(f"{compiler} child exited {p.returncode}: {p.stderr[-2000:]}")


def measure(name: str, numba_opts: list[str]) -> dict:
    tiers = kernels_of(name)
    distinct = {key: (source, signature) for _, key, source, signature in tiers}
    shapes_apart = {re.sub(r"\b\d+\b", "N", source.split("\n", 1)[1]) for source, _ in distinct.values()}
    lines = {key: source.count("\n") for key, (source, _) in distinct.items()}
    with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as f:
        pickle.dump([(key, source, signature) for key, (source, signature) in distinct.items()], f)
    try:
        direct = run_child("direct", f.name, dict(os.environ))
        numba = {opt: run_child("numba", f.name, dict(os.environ, NUMBA_OPT=opt)) for opt in numba_opts}
    finally:
        os.unlink(f.name)
    done = direct["times"]
    row = {"module": name, "tiers": len(tiers), "kinds": dict(collections.Counter(k for k, *_ in tiers)),
           "distinct": len(distinct), "distinct_modulo_literals": len(shapes_apart),
           "lines": sum(lines.values()), "translated": len(done), "translated_lines": sum(lines[k] for k in done),
           "declined": direct["declined"], "direct_s": sum(done.values())}
    for opt, res in numba.items():
        same = [k for k in done if k in res["times"]]
        row[f"numba_opt{opt}_s"] = sum(res["times"][k] for k in same)
        row[f"numba_opt{opt}_all_s"] = sum(res["times"].values())
    return row


def markdown(rows: list[dict], numba_opts: list[str]) -> str:
    opt = numba_opts[0]
    out = ["| module | tiers | distinct kernels (modulo literals) | lines | translated (lines) | direct: ms/kernel, "
           "ms/line | Numba (NUMBA_OPT=%s) on the same: ms/kernel, ms/line | speed-up | not translated |" % opt,
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        n, ln = max(r["translated"], 1), max(r["translated_lines"], 1)
        nb = r[f"numba_opt{opt}_s"]
        declined = ", ".join(f"{why} x{c}" for why, c in sorted(r["declined"].items()))
        out.append(f"| {r['module']} | {r['tiers']} | {r['distinct']} ({r['distinct_modulo_literals']}) | {r['lines']} | "
                   f"{r['translated']} ({r['translated_lines']}) | {r['direct_s'] / n * 1e3:.0f}, "
                   f"{r['direct_s'] / ln * 1e3:.2f} | {nb / n * 1e3:.0f}, {nb / ln * 1e3:.2f} | "
                   f"{nb / max(r['direct_s'], 1e-9):.1f}x | {declined} |")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", default=DEFAULT, help="HLO files or bench/workloads.py names")
    parser.add_argument("--numba-opt", default="3", help="NUMBA_OPT levels to time Numba at, comma-separated")
    parser.add_argument("--markdown", action="store_true", help="print the bench/README.md table")
    args = parser.parse_args(argv)
    opts = args.numba_opt.split(",")
    rows = []
    for name in args.modules:
        rows.append(measure(name, opts))
        print(json.dumps(rows[-1]), flush=True)
    if args.markdown:
        print(markdown(rows, opts))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print("@@RESULT " + json.dumps(child(sys.argv[2], sys.argv[3])))
        sys.exit(0)
    sys.exit(main())
