"""Two checkouts of hloexec timed on the same modules in one session: "did this change make anything slower?".

    python bench/compare_revisions.py OLD_CHECKOUT NEW_CHECKOUT [--rounds 3] [FILE.hlo ...]

Each checkout runs in its own child processes (its own venv: CHECKOUT/.venv/bin/python, else this Python
with CHECKOUT first on sys.path), old and new alternating round by round, so that a load change on a shared
machine hits both. Per module and round, one fresh process with an empty kernel cache measures:
  load     hloexec.load (parse, plan)
  first    the first run (op by op: the numpy tier, dispatch)
  second   the second run (it compiles what is worth compiling)
  warm     the best of 5 warm runs after that
The table has each phase's best over the rounds for both checkouts and new/old; a ratio within ~1.1 is
noise on a loaded 2-core machine, check it again before believing it. Default modules: the repository's
examples (pre- and post-optimization) and, when ../shared is present, XLA's dispatch-bound mass_matrix
benchmark.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MASS_MATRIX = ROOT.parent / "shared" / "corpus" / "xla" / "xla__backends__cpu__benchmarks__hlo__bench_mass_matrix_35.hlo"
PHASES = ("load", "first", "second", "warm")

CHILD = r"""
import json, sys, time
# an editable install's import hook would import its own checkout whatever sys.path says
sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("_editable")]
sys.path.insert(0, sys.argv[1])
import numpy as np
import hloexec
from hloexec.exec.inputs import random_inputs
text = open(sys.argv[2]).read()
t = time.perf_counter()
try:   # the second run compiles (revisions before issue 29 take no compile=: that was their default)
    exe = hloexec.load(text, compile="eager", compile_after=1)
except TypeError:
    exe = hloexec.load(text)
load = time.perf_counter() - t
inputs = random_inputs(exe.module, 0)
def timed():
    t = time.perf_counter(); exe.run(*inputs); return time.perf_counter() - t
first, second = timed(), timed()
warm = min(timed() for _ in range(5))
print(json.dumps({"load": load, "first": first, "second": second, "warm": warm}))
"""


def python_of(checkout: Path) -> str:
    venv = checkout / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def measure(checkout: Path, module: Path) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, HLOEXEC_CACHE_DIR=cache)
        out = subprocess.run([python_of(checkout), "-c", CHILD, str(checkout), str(module)], env=env,
                             capture_output=True, text=True, timeout=1800, cwd=cache)
    if out.returncode != 0:
        raise RuntimeError(f"{checkout} on {module.name}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("modules", nargs="*", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_intermixed_args(argv)
    modules = args.modules or sorted((ROOT / "examples").glob("*.hlo")) + ([MASS_MATRIX] if MASS_MATRIX.exists() else [])
    best: dict = {}
    for r in range(args.rounds):
        for module in modules:
            for side, checkout in (("old", args.old), ("new", args.new)):
                result = measure(checkout.resolve(), module.resolve())
                for phase in PHASES:
                    key = (module.name, side, phase)
                    best[key] = min(best.get(key, float("inf")), result[phase])
            print(f"round {r + 1}: {module.name} done", file=sys.stderr, flush=True)
    print("| module | " + " | ".join(f"{p} old / new (ms)" for p in PHASES) + " |")
    print("|---|" + "---|" * len(PHASES))
    for module in modules:
        cells = []
        for phase in PHASES:
            old, new = best[(module.name, "old", phase)], best[(module.name, "new", phase)]
            cells.append(f"{old * 1e3:.1f} / {new * 1e3:.1f} ({new / old:.2f})")
        print(f"| {module.name} | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"|".join(k): v for k, v in best.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
