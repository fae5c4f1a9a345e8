"""XLA:CPU's algebraic rewrites, measured: which of XLA's AlgebraicSimplifier rules fire in jaxlib's CPU pipeline,
and whether XLA:CPU's results of each form are consistent with the module's error bounds under its own arithmetic.

    python bench/xla_cpu_rewrites.py [TYPES] [FORM ...]     # TYPES: f32,f16,bf16 (default); FORM: a name below

Per form and type: the optimized module's ops (`--ops`), and per input regime (4,096 elements a parameter: normal,
log-uniform over the type's whole range with its subnormals, near its subnormals, near its largest) the verdict on
XLA:CPU's result (`judge_run` with `xla_cpu_arithmetic()`): ok, or the reasons and the worst element.
docs/verdicts.md "XLA:CPU's algebraic rewrites, measured" has the table this printed.
"""

from __future__ import annotations

import re
import sys

import ml_dtypes
import numpy as np

import hloexec
from hloexec.tools.numerics import judge_run, xla_cpu_arithmetic
from hloexec.tools.xla_cpu import _compile, run_on_xla_cpu

N = 4096
C = "k=T[] constant(0.1) kb=T[N] broadcast(k), dimensions={} l=T[] constant(0.3) lb=T[N] broadcast(l), dimensions={}"
FORMS = {  # algebraic_simplifier.cc's rules (HandleDivide, HandleAdd, HandleMultiply, HandlePower, HandleLog...)
    "(a/b)/(c/d)": "x=T[N] divide(a,b) y=T[N] divide(c,d) ROOT r=T[N] divide(x,y)",
    "(a/b)/(a/b)": "x=T[N] divide(a,b) ROOT r=T[N] divide(x,x)",
    "(a/b)/c": "x=T[N] divide(a,b) ROOT r=T[N] divide(x,c)",
    "a/(b/c)": "x=T[N] divide(b,c) ROOT r=T[N] divide(a,x)",
    "((a/b)/c)/d": "x=T[N] divide(a,b) y=T[N] divide(x,c) ROOT r=T[N] divide(y,d)",
    "a/const": "k=T[] constant(3) kb=T[N] broadcast(k), dimensions={} ROOT r=T[N] divide(a,kb)",
    "a/constarr": "k=T[N] constant(CONSTANTS) ROOT r=T[N] divide(a,k)",
    "a/sqrt(b)": "s=T[N] sqrt(b) ROOT r=T[N] divide(a,s)",
    "a/rsqrt(b)": "s=T[N] rsqrt(b) ROOT r=T[N] divide(a,s)",
    "a/pow(b,c)": "s=T[N] power(b,c) ROOT r=T[N] divide(a,s)",
    "a/exp(b)": "s=T[N] exponential(b) ROOT r=T[N] divide(a,s)",
    "exp(a)/exp(b)": "x=T[N] exponential(a) y=T[N] exponential(b) ROOT r=T[N] divide(x,y)",
    "(a+c1)+c2": C + " x=T[N] add(a,kb) ROOT r=T[N] add(x,lb)",
    "(c1-a)+c2": C + " x=T[N] subtract(kb,a) ROOT r=T[N] add(x,lb)",
    "(a-c1)+c2": C + " x=T[N] subtract(a,kb) ROOT r=T[N] add(x,lb)",
    "(a+c1)-c2": C + " x=T[N] add(a,kb) ROOT r=T[N] subtract(x,lb)",
    "((a+c1)+c2)+c3": C + " m=T[] constant(0.7) mb=T[N] broadcast(m), dimensions={} x=T[N] add(a,kb) "
    "y=T[N] add(x,lb) ROOT r=T[N] add(y,mb)",
    "a*c+b*c (c=2^k)": "k=T[] constant(0.25) kb=T[N] broadcast(k), dimensions={} "
    "x=T[N] multiply(a,kb) y=T[N] multiply(b,kb) ROOT r=T[N] add(x,y)",
    "(a*c1)*c2": C + " x=T[N] multiply(a,kb) ROOT r=T[N] multiply(x,lb)",
    "(a*c1)*(b*c2)": C + " x=T[N] multiply(a,kb) y=T[N] multiply(b,lb) ROOT r=T[N] multiply(x,y)",
    "log(pow(a,b))": "s=T[N] power(a,b) ROOT r=T[N] log(s)",
    "log(sqrt(a))": "s=T[N] sqrt(a) ROOT r=T[N] log(s)",
    "log(rsqrt(a))": "s=T[N] rsqrt(a) ROOT r=T[N] log(s)",
    "pow(a,3)": "k=T[] constant(3) kb=T[N] broadcast(k), dimensions={} ROOT r=T[N] power(a,kb)",
    "pow(a,-1)": "k=T[] constant(-1) kb=T[N] broadcast(k), dimensions={} ROOT r=T[N] power(a,kb)",
    "rsqrt(|a|)^2": "x=T[N] abs(a) s=T[N] rsqrt(x) ROOT r=T[N] multiply(s,s)",
    "pow(|a|,0.5)": "k=T[] constant(0.5) kb=T[N] broadcast(k), dimensions={} x=T[N] abs(a) ROOT r=T[N] power(x,kb)",
    "sqrt(|a|)^2": "x=T[N] abs(a) s=T[N] sqrt(x) ROOT r=T[N] multiply(s,s)",
    "sqrt(a*a)": "x=T[N] multiply(a,a) ROOT r=T[N] sqrt(x)",
    "rsqrt(1/a)": "k=T[] constant(1) kb=T[N] broadcast(k), dimensions={} x=T[N] divide(kb,a) ROOT r=T[N] rsqrt(x)",
    "sqrt(1/a)": "k=T[] constant(1) kb=T[N] broadcast(k), dimensions={} x=T[N] divide(kb,a) ROOT r=T[N] sqrt(x)",
    "1/sqrt(a)": "k=T[] constant(1) kb=T[N] broadcast(k), dimensions={} x=T[N] sqrt(a) ROOT r=T[N] divide(kb,x)",
}
TYPES = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
REGIMES = ("normal", "log-uniform", "small", "large")


def module(form: str, t: str) -> str:
    body = re.sub(r"(\b\w+)=(?!\{)", r"\1 = ", FORMS[form]).replace("T[", t + "[").replace("[N]", f"[{N}]")
    body = body.replace("CONSTANTS", "{" + ",".join(str(3 + i % 13) for i in range(N)) + "}")
    params = " ".join(f"{n} = {t}[{N}] parameter({i})" for i, n in enumerate("abcd"))
    return f"HloModule m\nENTRY e {{ {params} {body} }}"


def optimized_ops(text: str) -> list[str]:
    """The ops of XLA:CPU's optimized module (parameters, fusions and tuples left out)."""
    exe, _, _ = _compile(text, use_cache=False)
    found = re.findall(r"= \S+ ([\w-]+)\(", exe.hlo_modules()[0].to_string())
    return [op for op in found if op not in ("parameter", "fusion", "tuple", "get-tuple-element", "bitcast", "copy")]


def inputs(regime: str, dtype, rng) -> list[np.ndarray]:
    info = ml_dtypes.finfo(dtype)
    least, normal, large = (np.log2(float(v)) for v in (info.smallest_subnormal, info.smallest_normal, info.max))
    span = {"normal": None, "log-uniform": (least, large), "small": (least, normal + 8), "large": (large - 10, large)}
    xs = []
    for _ in range(4):
        if span[regime] is None:
            x = rng.standard_normal(N) * 2
        else:
            x = np.exp2(rng.uniform(*span[regime], N)) * rng.choice([-1, 1], N)
        xs.append(x.astype(dtype))
    return xs


def verdict(form: str, t: str, regime: str) -> str:
    text = module(form, t)
    xs = inputs(regime, TYPES[t], np.random.default_rng(0))
    with np.errstate(all="ignore"):
        xla = run_on_xla_cpu(text, xs)
        v, _ = judge_run(hloexec.load(text), xs, {"XLA:CPU": xla}, known={"XLA:CPU": xla_cpu_arithmetic()})
    if v.consistent("XLA:CPU"):
        return "ok"
    c = next(c for c in v.to_dict()["outputs"][0]["candidates"] if c["name"] == "XLA:CPU")
    w = (c.get("worst") or [{}])[0]
    return f"{'; '.join(c['reasons'])} (worst: {w.get('value')} for {w.get('exact')}, bound {w.get('bound')})"


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--ops"]
    types = args[0].split(",") if args and "," in args[0] or args and args[0] in TYPES else list(TYPES)
    forms = [a for a in args if a in FORMS] or list(FORMS)
    for form in forms:
        for t in types:
            if "--ops" in sys.argv:
                print(f"{form} [{t}]: {' '.join(optimized_ops(module(form, t)))}", flush=True)
            for regime in REGIMES:
                print(f"{form} [{t}] {regime}: {verdict(form, t, regime)}", flush=True)
