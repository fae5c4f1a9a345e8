"""LLVM pass settings for the direct compiler (issue 29 item 2): compile CPU per kernel and warm speed of each.

    python bench/bench_llvm_passes.py                                  # compile CPU, the three default modules
    python bench/bench_llvm_passes.py gpt_step_d256_f32_opt --warm 2   # also warm runs, 2 rounds of processes

Compile: every kernel the module's run compiles that the direct compiler translates (bench/bench_compile.py's
kernels_of), translated once, then compiled under each setting in turn, kernel by kernel, in one process (the
settings alternate, so a changing load meets all of them; CPU time, the least of 2 rounds per kernel), split into
the IR pipeline (parse and verify included) and machine code. Warm (`--warm N`): N rounds of one fresh process
per setting (the settings alternating, an empty kernel cache each, every kernel compiled in the process under
that setting), each timing 20 runs and 20 profiled runs: the best run, and the sum over non-dot instructions of
each one's least time (what the kernels decide; a whole run's time moves 2x with the load, this moves ~10%).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# name: (the IR pipeline's speed level (0: none, machine code only), loop unrolling, loop interleaving, codegen opt level); both vectorizers on in all
SETTINGS = {
    "O3": (3, True, True, 3),
    "O3-nounroll": (3, False, True, 3),
    "O3-nounroll-nointerleave": (3, False, False, 3),
    "O2": (2, True, True, 3),
    "O1": (1, True, True, 3),
    "O3-nounroll-codegenO1": (3, False, True, 1),
    "codegen-only": (0, False, False, 3),
}
DEFAULT = ["gpt_step_d256_f32_pre", "gpt_step_d256_f32_opt", "adam_mixed_9.4M_opt"]
WARM_SETTINGS = ["O3", "O3-nounroll-nointerleave"]


def compiler(setting: str):
    """object_code(ir_text) under `setting`, and its CPU seconds so far ({"ir": .., "mc": ..})."""
    from hloexec.kernels import machine_code as mc

    speed, unroll, interleave, codegen = SETTINGS[setting]
    llvm, _, _ = mc.llvm_engine()
    tm = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=codegen,
        reloc="default", codemodel="jitdefault", jit=True)
    spent = {"ir": 0.0, "mc": 0.0}

    def object_code(ir_text: str) -> bytes:
        with mc._LLVM_LOCK:
            t0 = time.process_time()
            module = llvm.parse_assembly(ir_text, llvm.create_context())
            module.triple, module.data_layout = tm.triple, str(tm.target_data)
            module.verify()
            if speed:
                pto = llvm.create_pipeline_tuning_options()
                pto.speed_level, pto.loop_vectorization, pto.slp_vectorization = speed, True, True
                pto.loop_unrolling, pto.loop_interleaving = unroll, interleave
                pb = llvm.create_pass_builder(tm, pto)
                pb.getModulePassManager().run(module, pb)
            t1 = time.process_time()
            code = tm.emit_object(module)
            spent["ir"] += t1 - t0
            spent["mc"] += time.process_time() - t1
            return code

    return object_code, spent


def compile_cpu(name: str, settings: list[str]) -> dict:
    import bench_compile
    from hloexec.kernels import direct, direct_kernels
    irs = []
    for _, key, source, signature in {t[1]: t for t in bench_compile.kernels_of(name)}.values():
        try:
            irs.append((key, direct_kernels.translation(source, key, signature), source.count("\n")))
        except direct.Untranslatable:
            pass
    compilers = {s: compiler(s) for s in settings}
    per: dict = {s: {} for s in settings}
    size = dict.fromkeys(settings, 0)
    for rnd in range(2):
        for key, ir, _ in irs:
            for s in settings if rnd == 0 else settings[::-1]:
                t = time.process_time()
                code = compilers[s][0](ir)
                per[s].setdefault(key, []).append(time.process_time() - t)
                size[s] += len(code) if rnd == 0 else 0
    return {"module": name, "kernels": len(irs), "lines": sum(n for *_, n in irs),
            "cpu_s": {s: sum(min(v) for v in per[s].values()) for s in settings}, "bytes": size,
            "split_s": {s: {k: v / 2 for k, v in compilers[s][1].items()} for s in settings}}


def warm_child(name: str, setting: str, runs: int) -> dict:
    import hloexec
    import profile_warm
    from bench_warmup import _inputs, module_files
    from hloexec.kernels import direct_kernels
    direct_kernels.object_code = compiler(setting)[0]
    hlo, npz, _ = module_files(name)
    exe = hloexec.load(str(hlo), compile="eager", compile_after=1)
    inputs = _inputs(exe, npz)
    for _ in range(4):
        exe.run(*inputs)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        exe.run(*inputs)
        times.append(time.perf_counter() - t)
    groups = {id(g.root): g.members for g in exe.plan.fused_groups}
    least: dict = {}
    for _ in range(runs):
        profile: dict = {}
        exe.run(*inputs, profile=profile)
        for inst, s in profile.items():
            if profile_warm.classify(inst, groups, 0) != "dot":
                least[inst.name] = min(least.get(inst.name, s), s)
    return {"best_s": min(times), "median_s": statistics.median(times), "nondot_least_s": sum(least.values())}


def warm(name: str, settings: list[str], rounds: int) -> dict:
    out: dict = {s: [] for s in settings}
    for r in range(rounds):
        for s in settings if r % 2 == 0 else settings[::-1]:
            with tempfile.TemporaryDirectory(prefix="hloexec-passes-") as cache:
                p = subprocess.run([sys.executable, __file__, "--child", name, s], capture_output=True, text=True,
                                   env=dict(os.environ, HLOEXEC_CACHE_DIR=cache, HLOEXEC_COMPILE_WORKERS="0"))
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("@@RESULT ")]
            if not lines:
                raise SystemExit(f"child exited {p.returncode}: {p.stderr[-2000:]}")
            out[s].append(json.loads(lines[0][len("@@RESULT "):]))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("modules", nargs="*", default=DEFAULT, help="bench/workloads.py names")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated names of SETTINGS")
    ap.add_argument("--warm", type=int, default=0, help="rounds of warm processes per setting (O3 against the "
                    "direct compiler's setting; 0: compile CPU only)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print("@@RESULT " + json.dumps(warm_child(*args.child, runs=20)))
        return 0
    settings = args.settings.split(",")
    print(f"| module | kernels (lines) | {' | '.join(settings)} |")
    print("|---|---|" + "---|" * len(settings))
    for name in args.modules:
        r = compile_cpu(name, settings)
        base = r["cpu_s"][settings[0]]
        cells = [f"{r['cpu_s'][s] / r['kernels'] * 1e3:.0f} ms ({r['cpu_s'][s] / base:.2f}x; IR passes "
                 f"{r['split_s'][s]['ir'] / r['kernels'] * 1e3:.0f}, machine code {r['split_s'][s]['mc'] / r['kernels'] * 1e3:.0f})"
                 for s in settings]
        print(f"| {name} | {r['kernels']} ({r['lines']}) | {' | '.join(cells)} |", flush=True)
    for name in args.modules if args.warm else []:
        for s, results in warm(name, WARM_SETTINGS, args.warm).items():
            print(f"warm {name} {s}: best run " + ", ".join(f"{x['best_s'] * 1e3:.1f}" for x in results)
                  + " ms; non-dot instructions' least times summed "
                  + ", ".join(f"{x['nondot_least_s'] * 1e3:.1f}" for x in results) + " ms", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
