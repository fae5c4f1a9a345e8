"""The direct compiler never takes the process down: LLVM aborts (SIGABRT, not an exception) on an object file it
cannot link, and once one failed to link, on the next one it is handed; it crashes on a damaged one; and its
linker asserts (aborts) when a 32-bit PC-relative reference does not reach -- the whole suite's abort: code made
for the small code model, its sections mapped more than 2 GB apart in a long-lived process. Each case
runs in a fresh process, first unguarded (llvmlite as the direct compiler called it before: the abort shown),
then through hloexec.kernels.machine_code / cache.load_kernel: a MachineCodeError, the kernel through Numba with
a CompileWarning, the engine still good for the next kernel. Plus threads loading direct kernels while the main
thread compiles through Numba, in a process whose first act that is."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from hloexec.kernels import direct

pytestmark = pytest.mark.skipif(direct.object_layout() is None, reason="this Python's object layout is not probed")

# a kernel calling a function no library of the process defines (as a helper Numba had not registered yet would)
NEEDS_UNDEFINED = """
declare void @hloexec_defined_nowhere()
define void @calls_undefined() {
  call void @hloexec_defined_nowhere()
  ret void
}
"""
GOOD = '@"seven.ndarray" = global ptr null\ndefine i64 @seven() {\n  ret i64 7\n}\n'

PRELUDE = f"""
import sys, warnings
import numpy as np
import llvmlite.binding as llvm
from hloexec.kernels import cache, direct_kernels, machine_code as mc
NEEDS_UNDEFINED, GOOD = {NEEDS_UNDEFINED!r}, {GOOD!r}
bad, good = mc.object_code(NEEDS_UNDEFINED), mc.object_code(GOOD)
_, _, engine = mc.llvm_engine()
SIG = (("array", "float32", 1, False), ("array", "float32", 1, True))
SRC = ("import numpy as np\\nfrom numba import njit\\n@njit(cache=True)\\n"
       "def kernel(o0, p0):\\n    for i0 in range(5):\\n        o0[i0] = p0[i0] * np.float32(2.0)\\n")
"""

UNGUARDED = {
    # the failed link is remembered: the next object file handed over aborts
    "undefined symbol": """
engine.add_object_file(llvm.ObjectFileRef.from_data(bad))
engine.finalize_object()
engine.add_object_file(llvm.ObjectFileRef.from_data(good))
engine.finalize_object()
""",
    "damaged object file": """
engine.add_object_file(llvm.ObjectFileRef.from_data(good[: len(good) // 2]))
engine.finalize_object()
""",
}

GUARDED = {
    "undefined symbol": """
try:
    mc.load_object(bad, "calls_undefined")
except mc.MachineCodeError as e:
    print("refused:", e)
seven = mc.load_object(good, "seven")       # the engine is still good
print("next kernel loads:", type(seven).__name__)
direct_kernels.object_code = lambda ir: bad  # a kernel of the cache whose machine code needs it
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    fn = cache.load_kernel(SRC, cache.source_key(SRC), SIG)
x = np.arange(5, dtype=np.float32)
out = np.zeros(5, np.float32)
fn(out, x)
print("through numba:", hasattr(fn, "py_func"), out.tolist(), [str(w.message) for w in said])
""",
    "damaged object file": """
name = direct_kernels.object_name(cache.source_key(SRC), SIG)
(cache.cache_dir() / (name + ".o")).write_bytes(good[: len(good) // 2])
fn = cache.load_kernel(SRC, cache.source_key(SRC), SIG)
x = np.arange(5, dtype=np.float32)
out = np.zeros(5, np.float32)
fn(out, x)
print("remade:", type(fn).__name__, out.tolist())
""",
}


def _run(code: str, tmp_path):
    env = dict(os.environ, HLOEXEC_CACHE_DIR=str(tmp_path))
    env.pop("HLOEXEC_DIRECT_KERNELS", None)
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + code], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("case", sorted(UNGUARDED))
def test_llvm_takes_the_process_down_unguarded(case, tmp_path):
    r = _run(UNGUARDED[case], tmp_path)
    assert r.returncode in (-signal.SIGABRT, -signal.SIGSEGV), (r.returncode, r.stderr[-2000:])


def test_an_undefined_symbol_is_refused_and_the_kernel_goes_through_numba(tmp_path):
    r = _run(GUARDED["undefined symbol"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0] == (
        "refused: kernel calls_undefined calls hloexec_defined_nowhere, which this process does not define"
    )
    assert lines[1] == "next kernel loads: builtin_function_or_method"
    assert lines[2].startswith("through numba: True [0.0, 2.0, 4.0, 6.0, 8.0] ['kernel ")
    assert "hloexec_defined_nowhere" in lines[2] and "compiled through Numba" in lines[2]


def test_a_damaged_object_file_in_the_cache_is_made_again(tmp_path):
    r = _run(GUARDED["damaged object file"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "remade: builtin_function_or_method [0.0, 2.0, 4.0, 6.0, 8.0]"


CONCURRENT = """
import sys, threading
import numpy as np
from hloexec.kernels import cache

SIG = (("array", "float64", 1, False), ("array", "float64", 1, True))


def source(k):
    return f"def kernel(o0, p0):\\n    for i0 in range({k + 3}):\\n        o0[i0] = p0[i0] * np.float64({k}.25) + 1.0\\n"


def check(fn, k):
    x = np.arange(k + 3, dtype=np.float64)
    out = np.zeros(k + 3)
    fn(out, x)
    assert (out == x * (k + 0.25) + 1.0).all(), k


errors = []


def direct_loads(first):
    try:
        for k in range(first, first + 12):
            check(cache.load_kernel(source(k), cache.source_key(source(k)), SIG), k)
    except BaseException as e:
        errors.append(repr(e))


threads = [threading.Thread(target=direct_loads, args=(12 * t,)) for t in range(3)]
for t in threads:
    t.start()
from numba import njit   # Numba compiling on this thread meanwhile (its own LLVM work)

for k in range(6):
    f = njit(lambda a, k=k: a * (k + 0.5) + np.sqrt(a))
    f(np.arange(4.0))
for t in threads:
    t.join()
print(errors or "ok", len(cache._DIRECT))
"""


def test_threads_load_direct_kernels_while_numba_compiles(tmp_path):
    env = dict(os.environ, HLOEXEC_CACHE_DIR=str(tmp_path))
    env.pop("HLOEXEC_DIRECT_KERNELS", None)
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CONCURRENT)], env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["ok", "36"]


# The address space shaped as a long-lived process's can be: the next page mapped goes where one page is free,
# everything else tens of TB lower (every free page above that is taken by a PROT_NONE mapping, which costs no
# memory). A kernel's code, constants and data are mapped one by one: they land far apart.
FAR_APART = """
import ctypes, sys
import numpy as np
import llvmlite.binding as llvm
from hloexec.kernels import cache, direct_kernels, machine_code as mc

libc = ctypes.CDLL(None)
libc.mmap.restype, libc.munmap.restype = ctypes.c_void_p, ctypes.c_int
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
PAGE, NONE, FLAGS = 4096, 0, 0x2 | 0x20 | 0x4000  # MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE
FIXED_NOREPLACE = 0x100000
SIG = (("array", "float32", 1, False), ("array", "float32", 1, True))
SRC = "def kernel(o0, p0):\\n    for i0 in range(8):\\n        o0[i0] = p0[i0] * np.float32(1.25) + np.float32(0.5)\\n"
key = cache.source_key(SRC)
name = direct_kernels.object_name(key, SIG)
ir = direct_kernels.translation(SRC, key, SIG)
if sys.argv[1] == "small":  # the direct compiler's target before: small code model
    tm = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3, reloc="pic",
        codemodel="default", jit=True)
    module = llvm.parse_assembly(ir)
    module.triple, module.data_layout = tm.triple, str(tm.target_data)
    code = tm.emit_object(module)
else:
    code = mc.object_code(ir)


def spans():
    return sorted(tuple(int(x, 16) for x in line.split()[0].split("-")) for line in open("/proc/self/maps"))


floor = max(b for a, b in spans() if a < 0x600000000000) + (64 << 30)  # 64 GB above the heap stay free
probe = libc.mmap(None, PAGE, NONE, FLAGS, -1, 0)  # where the next page goes
for (_, b0), (a1, _) in zip(spans(), spans()[1:]):
    lo, hi = max(b0, floor), min(a1, 1 << 47)
    if hi - lo >= PAGE:
        libc.mmap(lo, hi - lo, NONE, FLAGS | FIXED_NOREPLACE, -1, 0)
libc.munmap(probe, PAGE)
fn = mc.load_object(code, name)
x = np.arange(8, dtype=np.float32)
out = np.zeros(8, np.float32)
fn(out, x)
print(out.tolist() == (x * np.float32(1.25) + np.float32(0.5)).tolist())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="shapes the address space through /proc/self/maps")
def test_a_kernel_whose_sections_are_mapped_far_apart(tmp_path):
    def run(target):
        env = dict(os.environ, HLOEXEC_CACHE_DIR=str(tmp_path))
        return subprocess.run(
            [sys.executable, "-X", "faulthandler", "-c", FAR_APART, target], env=env, capture_output=True, text=True, timeout=300
        )

    small = run("small")
    assert small.returncode == -signal.SIGABRT, (small.returncode, small.stderr[-2000:])
    assert "isInt<32>(RealOffset)" in small.stderr and "finalize_object" in small.stderr
    now = run("now")
    assert now.returncode == 0, now.stderr[-3000:]
    assert now.stdout.strip() == "True"
