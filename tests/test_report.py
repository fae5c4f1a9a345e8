"""`hloexec report` (hloexec/tools/report.py): one self-contained HTML page and its JSON twin."""
from __future__ import annotations

import html.parser
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import hloexec
from hloexec.tools.cli import main

from conftest import EXAMPLES, headless_browser

# An f16 dot-like sum (accuracy lost in the reduce), a product, and a division by zero (a NaN/Inf origin).
SMALL = """HloModule small

add {
  a = f16[] parameter(0)
  b = f16[] parameter(1)
  ROOT s = f16[] add(a, b)
}

ENTRY e {
  p0 = f16[256] parameter(0)
  p1 = f16[256] parameter(1)
  prod = f16[256] multiply(p0, p1)
  z = f16[] constant(0)
  total = f16[] reduce(prod, z), dimensions={0}, to_apply=add
  zero = f16[256] subtract(p1, p1)
  ratio = f16[256] divide(p0, zero)
  ROOT t = (f16[], f16[256], f16[256]) tuple(total, prod, ratio)
}
"""
SECTIONS = ("module", "verdict", "attribution", "nonfinite", "memory", "rerun")


@pytest.fixture
def small(tmp_path):
    """(module file, inputs file, the inputs) of SMALL: positive values, so the sum's error is the rounding's."""
    rng = np.random.default_rng(3)
    p0, p1 = (rng.uniform(0.5, 2.0, 256).astype(np.float16) for _ in range(2))
    hlo, inputs = tmp_path / "small.hlo", tmp_path / "in.npz"
    hlo.write_text(SMALL)
    np.savez(inputs, arg0=p0, arg1=p1)
    return hlo, inputs, (p0, p1)


def report(capsys, *argv):
    code = main(["report", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


class Tags(html.parser.HTMLParser):
    """Ids, <svg> count and every src/href attribute of a page."""

    def __init__(self):
        super().__init__()
        self.ids, self.svgs, self.links, self.scripts_with_src = set(), 0, [], 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        self.svgs += tag == "svg"
        self.links += [v for k, v in attrs.items() if k in ("src", "href", "xlink:href") and v]
        self.scripts_with_src += tag in ("script", "link", "img", "iframe") and bool(attrs.get("src") or attrs.get("href"))


def external_urls(page: str) -> list[str]:
    tags = Tags()
    tags.feed(page)
    found = [v for v in tags.links if re.match(r"\s*(https?:)?//", v)]
    found += re.findall(r"url\(\s*['\"]?\s*((?:https?:)?//[^)'\"]*)", page)
    found += re.findall(r"@import\s+['\"]?([^'\";]+)", page)
    return found


def test_external_url_scan_finds_what_it_looks_for():
    page = ("<img src='https://x.org/a.png'><a href=\"//cdn.x/y\">a</a><style>b { background: url(http://x/y.png) }"
            "</style><svg><path marker-end='url(#arrow)'/></svg>")
    assert external_urls(page) == ["https://x.org/a.png", "//cdn.x/y", "http://x/y.png"]


def test_report_page_has_every_section_and_fetches_nothing(small, tmp_path, capsys):
    hlo, inputs, (p0, p1) = small
    out = tmp_path / "r.html"
    code, text, err = report(capsys, hlo, "--inputs", inputs, "-o", out)
    assert code == 0, err
    assert "hloexec consistent" in text
    page = out.read_text()
    tags = Tags()
    tags.feed(page)
    assert set(SECTIONS) <= tags.ids
    assert tags.svgs == 2                     # the dataflow around the worst instruction and the memory chart
    assert external_urls(page) == [] and tags.scripts_with_src == 0
    assert "%total" in page and "%ratio" in page          # the lossy reduce; the division by zero
    assert f"hloexec {hloexec.__version__}" in page and f"report {hlo} --inputs {inputs} -o {out}" in page


def test_report_json_is_the_pages_data(small, tmp_path, capsys):
    hlo, inputs, (p0, p1) = small
    code, text, err = report(capsys, hlo, "--inputs", inputs, "-o", tmp_path / "r.html", "--json")
    assert code == 0, err
    data = json.loads(text)
    assert data["command"] == "report" and data["module"] == "small"
    assert data["stats"]["ops"]["parameter"] >= 2 and data["stats"]["compiled_for"]["platform"]
    assert set(data["verdict"]["candidates"]) == {"hloexec"} and data["verdict"]["consistent"] is True
    # the NaN/Inf origin is the division, and nothing before it
    assert [o["name"] for o in data["numerics"]["nonfinite"]["origins"]] == ["ratio"]
    assert data["memory"]["peak_bytes"][0] == hloexec.load(str(hlo), compile_kernels=False).peak_bytes()
    # the sum's error, against a numpy f64 sum of the exact f16 products: the reduce is where it is lost
    exact = float(np.sum(p0.astype(np.float64) * p1.astype(np.float64)))
    total = next(r for r in data["largest_errors"] if r["output"] == 0)
    assert total["exact"] == pytest.approx(exact, rel=1e-12)
    assert total["error"] == pytest.approx(abs(float(total["value"]) - exact) / abs(exact), rel=1e-6)
    assert data["graph"]["worst"] == data["numerics"]["top"][0]["name"]
    assert any(n["local_ulps"] > 0 for n in data["graph"]["nodes"])


def test_report_names_a_failing_candidates_worst_element(small, tmp_path, capsys):
    hlo, inputs, (p0, p1) = small
    prod = (p0.astype(np.float32) * p1.astype(np.float32)).astype(np.float16)
    total = np.float16(np.sum(prod.astype(np.float64)))
    prod[17] *= np.float16(1.25)              # one element 25% off: far beyond what f16 rounding allows
    bad = tmp_path / "bad.npz"
    with np.errstate(divide="ignore"):
        np.savez(bad, out0=total, out1=prod, out2=p0 / np.float16(0))
    out = tmp_path / "r.html"
    code, text, err = report(capsys, hlo, "--inputs", inputs, "--actual", bad, "-o", out)
    assert code == 1, err
    assert "bad.npz not consistent" in text
    page = out.read_text()
    worst = re.search(r"id='worst-element'>([^<]*)", page).group(1)
    assert "output 1 [17]" in worst and "bad.npz" in worst


def test_report_without_room_for_the_shadow_still_has_the_rest(small, tmp_path, capsys):
    """The run fits, its f64 shadow (2x the f32 bytes) does not: no verdict, local errors, the page still written.
    (SMALL in f32: an f16 program's shadow would take its 16-bit floats in f32 instead, next test.)"""
    hlo, inputs, (p0, p1) = small
    hlo.write_text(SMALL.replace("f16", "f32"))
    np.savez(inputs, arg0=p0.astype(np.float32), arg1=p1.astype(np.float32))
    peak = hloexec.load(str(hlo), compile_kernels=False).peak_bytes()
    out = tmp_path / "r.html"
    code, text, err = report(capsys, hlo, "--inputs", inputs, "--max-memory", int(peak * 1.1), "-o", out, "--json")
    assert code == 0, err
    data = json.loads(text)
    assert data["verdict"]["problem"].startswith("no verdict: small needs") and data["verdict"]["consistent"] is None
    assert data["numerics"]["mode"] == "local" and data["numerics"]["top"]
    page = out.read_text()
    assert "no verdict: small needs" in page and "id='memory'" in page


def test_report_without_room_for_an_f64_shadow_takes_16_bit_floats_in_f32(small, tmp_path, capsys):
    """The f16 run fits, its f64 shadow (4x the f16 bytes) does not, one with the f16 values in f32 does: the
    verdict is made with that one, and the run says so."""
    hlo, inputs, _ = small
    peak = hloexec.load(str(hlo), compile_kernels=False).peak_bytes()
    out = tmp_path / "r.html"
    code, text, err = report(capsys, hlo, "--inputs", inputs, "--max-memory", int(peak * 1.1), "-o", out, "--json")
    assert code == 0, err
    data = json.loads(text)
    assert data["verdict"]["consistent"] is True and "16-bit floats in f32" in err


ALL_REDUCE = """HloModule ar, num_partitions=2

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY e {
  p = f32[64] parameter(0)
  m = f32[64] multiply(p, p)
  ROOT ar = f32[64] all-reduce(m), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=add
}
"""


def test_report_of_an_spmd_module_has_its_collective_traffic(tmp_path, capsys):
    hlo, out = tmp_path / "ar.hlo", tmp_path / "ar.html"
    hlo.write_text(ALL_REDUCE)
    code, text, err = report(capsys, hlo, "--spmd", "-o", out, "--json")
    assert code == 0, err
    data = json.loads(text)
    c = data["collectives"]
    assert c["devices"] == 2 and c["by_kind"]["all-reduce"]["count"] == 1 and c["total_bytes"] == 64 * 4
    assert data["memory"]["devices"] == 2 and data["verdict"]["consistent"] is True
    tags = Tags()
    tags.feed(out.read_text())
    assert {"collectives", "memory", "verdict"} <= tags.ids and "%ar" in out.read_text()


# f16 inputs, f32 arithmetic: the shadow with its 16-bit floats in f32 is still twice the program
MIXED = ALL_REDUCE.replace("f32[64] parameter(0)", "f16[64] parameter(0)\n  c = f32[64] convert(p)").replace(
    "multiply(p, p)", "multiply(c, c)")


@pytest.mark.parametrize("module", [ALL_REDUCE, MIXED], ids=["f32", "f16-inputs"])
def test_report_of_an_spmd_module_whose_shadow_is_refused_has_the_rest(tmp_path, capsys, module):
    """The participants' run fits in --max-memory, their shadow does not (f32; f16 inputs: not even with its
    16-bit floats in f32, as the GPT seed's): the page is written, its verdict says why (the estimate against the memory allowed) and where it fits;
    the attribution gives local errors; module, memory and collective traffic are complete."""
    from hloexec import spmd

    hlo, out = tmp_path / "ar.hlo", tmp_path / "ar.html"
    hlo.write_text(module)
    exe = hloexec.load(str(hlo), compile_kernels=False)
    estimate = spmd.memory_estimate(exe, spmd.random_inputs(exe.module, 2, 0))
    # (the arrays' bytes: the mailboxes' bookkeeping, 1.6 KB here, is more than the arrays of so small a module)
    program = estimate["total"] - estimate["exchanges"]
    code, text, err = report(capsys, hlo, "--spmd", "--max-memory", int(program * 1.2), "-o", out, "--json")
    assert code == 0, err
    data = json.loads(text)
    v = data["verdict"]
    assert v["consistent"] is None and v["problem"].startswith("no verdict: ") and "needs" in v["problem"]
    assert v["shadow_needs_bytes"] > v["memory_allowed_bytes"] == int(program * 1.2)
    assert v["memory_allowed_from"] == "--max-memory" and f"report {hlo} --spmd" in v["where_it_fits"]
    n = data["numerics"]
    assert n["mode"] == "local" and n["top"][0]["name"] == "m" and n["local_errors_of"] == "participant 0 of 2"
    assert n["top"][0]["runs"] == 1  # measured on one participant only (each runs it once)
    assert data["collectives"]["by_kind"]["all-reduce"]["count"] == 1 and data["memory"]["devices"] == 2
    page = out.read_text()
    tags = Tags()
    tags.feed(page)
    assert {"no-verdict", "attribution", "memory", "collectives", "rerun"} <= tags.ids
    assert "For the verdict, --max-memory " in page


def test_report_with_an_infinite_local_error_draws_its_graph(tmp_path, capsys):
    """An f16 product that overflows where the exact one is finite: an infinite local error (the GPT seed's random
    inputs make some), drawn as the largest in the dataflow picture. Here 255.875 + 0.0625 rounds (a tie, to even)
    to 256, whose square overflows f16, while the exact 255.9375^2 = 65504.0 - 0.004 rounds to f16's largest."""
    hlo = tmp_path / "over.hlo"
    hlo.write_text("HloModule over\n\nENTRY e {\n  p = f16[4] parameter(0)\n  q = f16[4] parameter(1)\n"
                   "  a = f16[4] add(p, q)\n  m = f16[4] multiply(a, a)\n  ROOT s = f16[4] add(m, q)\n}\n")
    np.savez(tmp_path / "in.npz", arg0=np.array([255.875, 1, 2, 3], np.float16),
             arg1=np.array([0.0625, 1, 2, 3], np.float16))
    code, text, err = report(capsys, hlo, "--inputs", tmp_path / "in.npz", "-o", tmp_path / "r.html", "--json")
    assert code in (0, 1), err
    nodes = {n["name"]: n["local_ulps"] for n in json.loads(text)["graph"]["nodes"]}
    assert nodes["m"] == float("inf") or nodes["m"] == "inf"
    assert "<svg" in (tmp_path / "r.html").read_text()


def test_an_overflow_the_exact_value_makes_too_is_no_error_in_the_verdict_nor_in_numerics(tmp_path, capsys):
    """300 x 300 = 90,000 is past f16's range: inf is every correct f16 result's (the verdict's element errors),
    and numerics, following the verdict, names no instruction beyond its bound for it."""
    hlo = tmp_path / "over.hlo"
    hlo.write_text("HloModule over\n\nENTRY e {\n  p = f16[4] parameter(0)\n  q = f16[4] parameter(1)\n"
                   "  m = f16[4] multiply(p, q)\n  ROOT s = f16[4] add(m, q)\n}\n")
    np.savez(tmp_path / "in.npz", arg0=np.full(4, 300, np.float16), arg1=np.array([300, 1, 2, 3], np.float16))
    code, text, err = report(capsys, hlo, "--inputs", tmp_path / "in.npz", "-o", tmp_path / "r.html", "--json")
    data = json.loads(text)
    assert code == 0, err
    assert data["verdict"]["consistent"] and data["numerics"]["beyond_bound"] == []
    assert data["numerics"]["nonfinite"]["origins"][0]["name"] == "m"  # (still where the infinity was made)


def test_report_of_a_module_hloexec_cannot_run_is_a_clear_error(tmp_path, capsys):
    hlo = tmp_path / "cc.hlo"
    hlo.write_text('HloModule cc\n\nENTRY e {\n  p = f32[4] parameter(0)\n'
                   '  ROOT c = f32[4] custom-call(p), custom_call_target="SomethingUnknown"\n}\n')
    code, _, err = report(capsys, hlo, "-o", tmp_path / "r.html")
    assert code == 2 and "unsupported custom-call target 'SomethingUnknown'" in err and "internal" not in err
    assert not (tmp_path / "r.html").exists()


def test_report_refuses_against_xla_with_spmd(small, tmp_path, capsys):
    hlo, inputs, _ = small
    code, _, err = report(capsys, hlo, "--spmd", "--against", "xla", "-o", tmp_path / "r.html")
    assert code == 2 and "--against xla" in err and "internal" not in err


# -- in a browser --------------------------------------------------------------------------------------------
def _load(page: Path, *extra) -> subprocess.CompletedProcess:
    """The page in headless Chromium, network requests refused; stderr holds its console messages."""
    return subprocess.run([headless_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                           "--v=0", "--host-resolver-rules=MAP * ~NOTFOUND", *extra, page.as_uri()],
                          capture_output=True, text=True, timeout=120)


def screenshot(page: Path, png: Path, height: int = 2400) -> None:
    done = _load(page, "--hide-scrollbars", f"--window-size=1280,{height}", f"--screenshot={png}")
    assert done.returncode == 0 and png.stat().st_size > 10_000, done.stderr[-2000:]


@pytest.mark.skipif(headless_browser() is None, reason="no headless Chromium (apt-get install chromium-headless-shell)")
def test_report_of_the_layernorm_gradient_in_a_headless_browser(tmp_path, capsys, monkeypatch):
    """The docs' screenshot: REPORT_SCREENSHOTS=DIR writes it there (docs/reports.md). Run in a folder holding
    the example's files, so that the page's command line is the one the docs show."""
    folder = Path(os.environ.get("REPORT_SCREENSHOTS") or tmp_path).resolve()
    for suffix in ("opt.hlo", "inputs.npz", "expected.npz"):
        shutil.copy(EXAMPLES / f"layernorm_bwd.{suffix}", tmp_path)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "layernorm_bwd.html"
    code, _, err = report(capsys, "layernorm_bwd.opt.hlo", "--inputs", "layernorm_bwd.inputs.npz",
                          "--actual", "layernorm_bwd.expected.npz", "-o", out.name)
    assert code == 0, err
    done = _load(out, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    assert [line for line in done.stderr.splitlines() if "CONSOLE" in line] == []
    dom = done.stdout
    assert f'data-sections="{len(SECTIONS) - 1}"' in dom      # the script ran to its end (no NaN/Inf here)
    assert dom.count("<svg") == 2 and "id=\"worst-element\"" in dom and "layernorm_bwd.expected.npz" in dom
    # the search box, from a link: only the rows naming mul.1 stay, their folded tables open
    filtered = subprocess.run([headless_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                               out.as_uri() + "#search=mul.1"], capture_output=True, text=True, timeout=120).stdout
    rows = re.findall(r'<tr data-name="([^"]*)"( style="display: none;")?', filtered)
    assert rows and {name for name, hidden in rows if not hidden} == {n for n, _ in rows if "mul.1" in n}
    assert any("mul.1" in n for n, _ in rows) and any(hidden for _, hidden in rows)
    screenshot(out, folder / "report_layernorm_bwd.png")


# The f16 LayerNorm gradient of docs/numerics.md ("End to end"), dumped by jax as `ln_grad.py` does it there.
LN_GRAD_F16 = """
import numpy as np
import jax, jax.numpy as jnp
from jax import lax

def layernorm(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + eps) * g + b

def loss(x, g, b):
    return jnp.sum(layernorm(x, g, b) ** 2)

x = np.zeros((8, 128, 256), np.float16)
g = b = np.zeros(256, np.float16)
jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x, g, b)
"""


@pytest.mark.xla
@pytest.mark.skipif(headless_browser() is None, reason="no headless Chromium (apt-get install chromium-headless-shell)")
def test_report_of_the_f16_layernorm_gradient_against_xla_in_a_headless_browser(tmp_path, capsys, monkeypatch):
    """hloexec and XLA:CPU judged against the exact answer; REPORT_SCREENSHOTS=DIR keeps the screenshot."""
    folder = Path(os.environ.get("REPORT_SCREENSHOTS") or tmp_path).resolve()
    monkeypatch.chdir(tmp_path)
    Path("ln_grad.py").write_text(LN_GRAD_F16)
    env = {**os.environ, "XLA_FLAGS": "--xla_dump_to=dump --xla_dump_hlo_as_text", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "ln_grad.py"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    shutil.copy(next(Path("dump").glob("module_*.jit_loss.before_optimizations.txt")), "ln_grad_f16.hlo")
    code, text, err = report(capsys, "ln_grad_f16.hlo", "--against", "xla", "-o", "layernorm_f16.html")
    assert code in (0, 1), err
    assert "XLA:CPU" in text
    page = tmp_path / "layernorm_f16.html"
    done = _load(page, "--dump-dom")
    assert [line for line in done.stderr.splitlines() if "CONSOLE" in line] == []
    assert "f16[8, 128, 256]" in done.stdout and 'id="worst-element"' in done.stdout
    screenshot(page, folder / "report_layernorm_f16.png", height=2600)


@pytest.mark.slow
@pytest.mark.skipif(headless_browser() is None, reason="no headless Chromium (apt-get install chromium-headless-shell)")
@pytest.mark.skipif(not os.environ.get("REPORT_SCREENSHOTS"), reason="the docs' screenshot: REPORT_SCREENSHOTS=DIR")
def test_report_of_the_gpt_seed_in_a_headless_browser(tmp_path, capsys, shared_path, monkeypatch):
    """16 participants; when the shadow does not fit, the verdict says why and the attribution measures participant
    0 observed, the others not. Run beside a link to the seed, so that the page's command line is the one
    docs/reports.md shows; prints the time and peak memory taken."""
    folder = Path(os.environ.get("REPORT_SCREENSHOTS") or tmp_path).resolve()
    seed = "gpt_train_step_shard_parallel_16dev.hlo"
    (tmp_path / seed).symlink_to(shared_path("seeds", seed))
    monkeypatch.chdir(tmp_path)
    start = time.perf_counter()
    code, _, err = report(capsys, seed, "--spmd", "--seed", "0", "-o", "gpt.html")
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"report of the GPT seed: {seconds:.0f} s, peak resident {peak:.1f} GB\n{err}")
    assert code in (0, 1), err
    done = _load(tmp_path / "gpt.html", "--dump-dom")
    assert [line for line in done.stderr.splitlines() if "CONSOLE" in line] == []
    assert 'id="collectives"' in done.stdout and "<svg" in done.stdout
    screenshot(tmp_path / "gpt.html", folder / "report_gpt_16dev.png", height=3000)
