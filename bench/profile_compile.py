"""Where the second run's time goes: the run that compiles a module's fused kernels and loops (issue 17).

    python bench/profile_compile.py                                  # the GPT d256 f32 steps, pre and opt
    python bench/profile_compile.py gpt_step_d256_bf16_opt --top 15 --json out.json

Per workload (bench/workloads.py), in one fresh process with an empty kernel cache (HLOEXEC_CACHE_DIR points
at a new temporary directory; Numba's caches of hloexec's own helpers stay as they are): `hloexec.load`, the
first run (fused kernels op by op), then the second run, which compiles them, timed piece by piece:

- source generation: `generate_source` / the loop generator, at `load` (counted there, not in the 2nd run);
- per kernel: writing and importing its generated module (`kernels.cache.load_kernel`: Python's bytecode compile and the
  `@njit` decorator), then `dispatcher.compile(signature)` ("Numba compile"), split by Numba's event API
  (`numba:run_pass` events of the kernel's own pipeline) into typing (`nopython_type_inference`), lowering
  (`native_lowering`: Numba IR -> LLVM IR, then LLVM's optimisation and machine code, timed apart around
  `CPUCodeLibrary`'s steps) and the other passes (bytecode, rewrites, inlining, SSA); and cache I/O
  (`numba.core.caching.Cache.save_overload` / `load_overload`);
- compiles at call time (`Dispatcher._compile_for_args`: a call whose argument types are not the compiled
  signature's, e.g. a read-only operand; counted per calling thread, so the time may count a wait twice);
- the kernels worker processes compiled (hloexec/kernels/workers.py; `--workers N` sets HLOEXEC_COMPILE_WORKERS,
  0: all in the process) count as loaded from the disk cache: their compile is not in the per-kernel times;
- then XLA:CPU on the same program in the same process (`run_on_xla_cpu_timed`: parse, convert, compile;
  for `*_opt` workloads the pre-optimization module, which XLA can ingest), and warm runs of both.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads as wl  # noqa: E402

def _bucket(pass_name: str) -> str | None:
    """The class of one of Numba's pass events ("native_lowering [kernel]"); None for the passes of functions
    compiled inside the kernel's (overloads, inlined helpers): they run within its typing or lowering."""
    name, _, func = pass_name.partition(" ")
    if func != "[kernel]":
        return None
    if name in ("nopython_type_inference", "partial_type_inference", "annotate_types"):
        return "typing"
    if name == "native_lowering":
        return "lowering+LLVM"
    return "other passes"


LLVM_STEPS = {"_optimize_functions": "LLVM function passes", "_optimize_final_module": "LLVM module passes",
              "_finalize_final_module": "LLVM machine code"}


def _wrap(cls, attr, record):
    """Replace method `attr` of `cls` by one that also calls `record(self, seconds spent in it)`."""
    orig = getattr(cls, attr)

    def timed(self, *a, **kw):
        t = time.perf_counter()
        try:
            return orig(self, *a, **kw)
        finally:
            record(self, time.perf_counter() - t)
    setattr(cls, attr, timed)


class Recorder:
    """Times, per kernel key, what the second run spends compiling it."""

    def __init__(self):
        self.kernels: dict[str, dict] = {}      # key -> {name, kind, lines, instructions, gen_s, ...}
        self.current: str | None = None
        self.gen_s = 0.0
        self.pass_start: dict = {}
        self.recompiles: list = []      # (module, seconds): compiles at call time, outside FusedKernel.compile

    def entry(self, key):
        return self.kernels.setdefault(key, {"names": [], "kind": "?", "lines": 0, "instructions": 0,
                                             "gen_s": 0.0, "import_s": 0.0, "compile_s": 0.0,
                                             "cache_save_s": 0.0, "cache_load_s": 0.0,
                                             "passes": defaultdict(float)})

    def install(self):
        from numba.core import caching, event
        import hloexec.kernels.fusion as fusion
        import hloexec.kernels.program as program
        rec = self

        gen_fusion = fusion.generate_source

        def generate_source(comp, **kw):
            t = time.perf_counter()
            source, gen = gen_fusion(comp, **kw)
            dt = time.perf_counter() - t
            rec.gen_s += dt
            e = rec.entry(hashlib.sha256(source.encode()).hexdigest()[:24])
            e["names"].append(comp.name)
            e.update(kind="fusion", lines=source.count("\n"), instructions=len(comp.instructions))
            e["gen_s"] += dt
            return source, gen
        fusion.generate_source = generate_source

        gen_program = program._generate

        def generate_program(inst, *a):
            t = time.perf_counter()
            source, gen = gen_program(inst, *a)
            dt = time.perf_counter() - t
            rec.gen_s += dt
            e = rec.entry(hashlib.sha256(source.encode()).hexdigest()[:24])
            e["names"].append(inst.name)
            e.update(kind="loop", lines=source.count("\n"))
            e["gen_s"] += dt
            return source, gen
        program._generate = generate_program

        import hloexec.kernels.cache as cache
        load_kernel = cache.load_kernel

        def timed_load(source, key, signature):
            fresh = key not in cache._KERNELS and (key, signature) not in cache._DIRECT
            t = time.perf_counter()
            fn = load_kernel(source, key, signature)
            if fresh:
                rec.entry(key)["import_s"] += time.perf_counter() - t
            return fn
        fusion.load_kernel = timed_load        # the name each generator module imported
        program.load_kernel = timed_load

        for cls in (fusion.FusedKernel, program.ProgramKernel):
            def timed_compile(self, _orig=cls.compile):
                prev, rec.current = rec.current, self.key
                t = time.perf_counter()
                try:
                    return _orig(self)
                finally:
                    rec.entry(self.key)["compile_s"] += time.perf_counter() - t
                    rec.current = prev
            cls.compile = timed_compile

        def add_to_current(field, passes=False):
            def record(_, seconds):
                if rec.current is not None:
                    entry = rec.entry(rec.current)
                    (entry["passes"] if passes else entry)[field] += seconds
            return record

        for attr, field in (("save_overload", "cache_save_s"), ("load_overload", "cache_load_s")):
            _wrap(caching.Cache, attr, add_to_current(field))
        from numba.core.codegen import CPUCodeLibrary
        for attr, field in LLVM_STEPS.items():
            _wrap(CPUCodeLibrary, attr, add_to_current(field, passes=True))
        # a call whose argument types match no compiled signature compiles again (e.g. a read-only operand)
        from numba.core.dispatcher import Dispatcher
        _wrap(Dispatcher, "_compile_for_args",
              lambda dispatcher, seconds: rec.recompiles.append((dispatcher.py_func.__module__, seconds)))

        class PassListener(event.Listener):
            def on_start(self, ev):
                rec.pass_start[ev.data["name"]] = time.perf_counter()

            def on_end(self, ev):
                t0 = rec.pass_start.pop(ev.data["name"], None)
                if t0 is not None and rec.current is not None:
                    rec.entry(rec.current)["passes"][ev.data["name"]] += time.perf_counter() - t0
        event.register("numba:run_pass", PassListener())


def child(name: str, top: int, cprofile: bool = False) -> dict:
    w = wl.by_name()[name]
    (path,), (npz,) = w.files()
    from hloexec.tools.xla_cpu import load_arrays
    inputs = list(load_arrays(str(npz)).values())
    t = time.perf_counter()
    import hloexec
    from hloexec import ops  # noqa: F401
    import numba  # noqa: F401
    import_s = time.perf_counter() - t
    rec = Recorder()
    rec.install()
    t = time.perf_counter()
    exe = hloexec.load(str(path), compile="eager", compile_after=1)     # the second run compiles
    load_s = time.perf_counter() - t
    times = []
    for k in range(2):
        prof = None
        if cprofile and k == 1:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        t = time.perf_counter()
        exe.run(*inputs)
        times.append(time.perf_counter() - t)
        if prof is not None:
            prof.disable()
            import pstats
            pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(40)
    warm = []
    for _ in range(5):
        t = time.perf_counter()
        exe.run(*inputs)
        warm.append(time.perf_counter() - t)

    compiled = {k: e for k, e in rec.kernels.items() if e["compile_s"] > 0}
    total = defaultdict(float)
    for e in compiled.values():
        for p, s in e["passes"].items():
            b = "LLVM (within lowering)" if p in LLVM_STEPS.values() else _bucket(p)
            if b is not None:
                total[b] += s
        for f in ("import_s", "cache_save_s", "cache_load_s"):
            total[f] += e[f]
        total["numba_s"] += e["compile_s"] - e["import_s"]     # compile() imports the module first
    pass_totals = defaultdict(float)
    for e in compiled.values():
        for p, s in e["passes"].items():
            if p in LLVM_STEPS.values() or _bucket(p) is not None:
                pass_totals[p] += s
    rows = sorted(compiled.items(), key=lambda kv: -(kv[1]["compile_s"] + kv[1]["import_s"]))
    from hloexec.kernels.workers import worker_count
    out = {
        "workload": name, "workers": worker_count(), "import_s": import_s, "load_s": load_s, "gen_s": rec.gen_s,
        "generated": len(rec.kernels), "generated_fusions": sum(e["kind"] == "fusion" for e in rec.kernels.values()),
        "first_run_s": times[0], "second_run_s": times[1], "warm_best_s": min(warm),
        "compiled_kernels": len(compiled), "compiled_names": sum(len(e["names"]) for e in compiled.values()),
        "compiled_lines": sum(e["lines"] for e in compiled.values()),
        "each_s": sorted(round(e["compile_s"] - e["import_s"], 3) for e in compiled.values()),
        "lines_each": sorted(e["lines"] for e in compiled.values()),
        "lines_and_compile_s": sorted((e["lines"], round(e["compile_s"] - e["import_s"], 3)) for e in compiled.values()),
        "recompiles": len(rec.recompiles), "recompile_s": sum(s for _, s in rec.recompiles),
        "totals": dict(total), "passes": dict(sorted(pass_totals.items(), key=lambda kv: -kv[1])[:12]),
        "top": [{"key": k, "names": e["names"][:3], "n_names": len(e["names"]), "kind": e["kind"],
                 "lines": e["lines"], "instructions": e["instructions"], "import_s": e["import_s"],
                 "compile_s": e["compile_s"] - e["import_s"], "typing_s": sum(s for p, s in e["passes"].items()
                                                             if _bucket(p) == "typing"),
                 "lowering_s": sum(s for p, s in e["passes"].items() if _bucket(p) == "lowering+LLVM"),
                 "llvm_s": sum(s for p, s in e["passes"].items() if p in LLVM_STEPS.values()),
                 "cache_save_s": e["cache_save_s"]} for k, e in rows[:top]],
    }
    from hloexec.tools.xla_cpu import run_on_xla_cpu_timed
    xla_path, xla_npz = (w.xla_files() if w.xla_files else ([path], [npz]))
    xla_inputs = list(load_arrays(str(xla_npz[0])).values())
    _, xt = run_on_xla_cpu_timed(Path(xla_path[0]).read_text(), xla_inputs, warm_runs=5)
    out["xla"] = {k: xt[k] for k in ("parse_s", "convert_s", "compile_s", "first_run_s", "warm_run_min_s")}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workloads", nargs="*", default=["gpt_step_d256_f32_pre", "gpt_step_d256_f32_opt"])
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--cprofile", action="store_true",
                    help="print cProfile's top 40 (cumulative) of the 2nd run on stderr (slows Numba's compile)")
    ap.add_argument("--workers", help="HLOEXEC_COMPILE_WORKERS for the profiled process (default: as set, else "
                                      "the usable cores but one)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print("@@RESULT " + json.dumps(child(args.child, args.top, args.cprofile)), flush=True)
        return 0
    results = []
    for name in args.workloads:
        with tempfile.TemporaryDirectory(prefix="hloexec-cold-cache-") as cache:
            env = dict(os.environ, HLOEXEC_CACHE_DIR=cache, JAX_PLATFORMS="cpu")
            if args.workers is not None:
                env["HLOEXEC_COMPILE_WORKERS"] = args.workers
            p = subprocess.run([sys.executable, __file__, "--child", name, "--top", str(args.top)]
                               + ["--cprofile"] * args.cprofile, env=env, capture_output=True, text=True)
        if args.cprofile:
            print(p.stderr, file=sys.stderr)
        line = next((x for x in p.stdout.splitlines() if x.startswith("@@RESULT ")), None)
        if line is None:
            print(f"{name}: child failed\n{p.stderr[-3000:]}", file=sys.stderr)
            return 2
        r = json.loads(line[len("@@RESULT "):])
        results.append(r)
        report(r)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


def report(r: dict) -> None:
    t, x = r["totals"], r["xla"]
    print(f"\n## {r['workload']}  (load average {os.getloadavg()[0]:.1f}, compile workers {r['workers']})")
    print(f"load {r['load_s']:.2f} s (of which source generation {r['gen_s']:.2f} s for {r['generated']} kernels), "
          f"1st run {r['first_run_s']:.2f} s, 2nd run {r['second_run_s']:.2f} s, warm best {r['warm_best_s'] * 1e3:.1f} ms")
    print(f"2nd run compiles {r['compiled_kernels']} distinct kernels ({r['compiled_names']} fusions/loops, "
          f"{r['compiled_lines']} generated lines): Numba compile {t.get('numba_s', 0):.2f} s "
          f"[typing {t.get('typing', 0):.2f}, lowering+LLVM {t.get('lowering+LLVM', 0):.2f}, "
          f"(of which LLVM {t.get('LLVM (within lowering)', 0):.2f}), "
          f"other passes {t.get('other passes', 0):.2f}, cache save {t.get('cache_save_s', 0):.2f}, "
          f"cache load {t.get('cache_load_s', 0):.2f}], write+import module (and waits for workers) "
          f"{t.get('import_s', 0):.2f} s")
    print(f"compiled again at call time (argument types not the compiled signature's): {r['recompiles']} "
          f"kernels, {r['recompile_s']:.2f} s")
    each = r["each_s"]
    print(f"per kernel: min {each[0]:.2f} s, median {each[len(each) // 2]:.2f} s, max {each[-1]:.2f} s; "
          f"generated lines per kernel: min {r['lines_each'][0]}, median {r['lines_each'][len(each) // 2]}, "
          f"max {r['lines_each'][-1]}")
    import numpy as np
    lines, secs = np.array(r["lines_and_compile_s"]).T
    slope, floor = np.polyfit(lines, secs, 1)
    print(f"least squares over the kernels: compile s = {floor:.3f} + {slope * 1e3:.1f} ms x lines")
    print("passes: " + ", ".join(f"{p} {s:.2f}" for p, s in r["passes"].items()))
    print(f"XLA:CPU: parse {x['parse_s']:.2f} s, convert {x['convert_s']:.2f} s, compile {x['compile_s']:.2f} s, "
          f"first run {x['first_run_s'] * 1e3:.1f} ms, warm best {x['warm_run_min_s'] * 1e3:.1f} ms")
    print("| kernel | kind | fusions | instructions | lines | import s | compile s | typing s | lowering+LLVM s | of which LLVM s | cache save s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for k in r["top"]:
        print(f"| {k['names'][0]} | {k['kind']} | {k['n_names']} | {k['instructions']} | {k['lines']} | "
              f"{k['import_s']:.2f} | {k['compile_s']:.2f} | {k['typing_s']:.2f} | {k['lowering_s']:.2f} | {k['llvm_s']:.2f} | "
              f"{k['cache_save_s']:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
