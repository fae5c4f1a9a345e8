"""The documentation cannot rot: the site (mkdocs.yml over docs/) builds with `mkdocs build --strict`, and every
shell command and Python snippet of README.md and docs/*.md runs.

Which code blocks run is said by their fence's language:
- ```bash (or ```sh) and ```python blocks run, and so does every `$ ` line of a ```console block (a command with
  what it printed; the output is not compared: it depends on the machine). A page's blocks run in order, each in
  a fresh process (`bash -e -o pipefail`, `python`), in one temporary directory per page that holds a copy of
  examples/ and the tests/ folder (so the commands name `examples/mlp.opt.hlo` and `tests/xla_dumps.py` as in a
  reader's checkout), with ../shared beside it when the checkout has it; a file one block writes is there for the
  next. A python block whose first line is a comment naming a file (`# ln_grad.py`) is that file: written there
  under its name, not run (a later block runs it). bash and python blocks must exit 0; a console command 0 or 1 (1: a finding, which is what
  such a transcript often shows).
- ```text (synopses, placeholders such as FILE.hlo, output alone), ```toml and the other languages are shown, not
  run. Every fenced block names its language, so a new one chooses.
README.md's first two commands (indented, not fenced) are the ones CI runs (.ci/run): not run here.
A block that needs ../shared or runs longer than ~20 s is listed in SLOW (run by `-m slow`) and one that cannot run
here in SKIPPED, each with its reason, by its page and a text the block starts with.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import SHARED

ROOT = Path(__file__).resolve().parent.parent
RUN_LANGUAGES = {"bash": "bash", "sh": "bash", "python": "python", "console": "console"}
SHOWN_LANGUAGES = {"text", "toml", "yaml", "json", "c", "hlo", "ini", "diff"}
SAVED_AS = re.compile(r"#\s*([\w.-]+\.py)\s*$")      # a python block's first line naming the file it is

# (page, how the block starts): why it runs only under -m slow
SLOW = {
    ("spmd.md", "hloexec run ../shared/seeds/tpu_seqparallel"): "the TPU seed of ../shared, 8 participants: ~20 s",
    ("spmd.md", "hloexec run spmd/sequence_parallel.hlo --spmd --ray"): "starts a local Ray instance: ~25 s",
    ("spmd.md", "import hloexec\nfrom hloexec import spmd\n\nexe = hloexec.load(\"spmd/sequence_parallel.hlo\")\n#"):
        "starts a local Ray instance: ~25 s",
}
# (page, how the block starts): why it does not run in the test suite at all
MISSING = "its files are the worked example's, not in the repository"
SKIPPED = {
    ("device-numerics.md", "$ hloexec compare mlp.hlo"): f"{MISSING} (mlp.hlo, in.npz, tpu.npz)",
    ("device-numerics.md", "$ hloexec run tf32.hlo"): f"{MISSING} (tf32.hlo)",
    ("device-numerics.md", "$ hloexec run gpt_gemm.hlo"): f"{MISSING} (gpt_gemm.hlo: one GEMM of the GPT seed)",
    ("device-numerics.md", "$ hloexec run gpt_gemm_f32.hlo"): f"{MISSING} (gpt_gemm_f32.hlo, a100_32.npz)",
    ("verdicts.md", "$ hloexec compare dot.hlo"): f"{MISSING} (dot.hlo, in.npz, device.npz, bf16dots.toml)",
    ("verdicts.md", "$ hloexec compare rms_grad.hlo"): f"{MISSING} (rms_grad.hlo, in.npz, bumped.npz)",
}


@dataclass
class Block:
    page: str
    line: int           # of the opening fence, 1-based
    language: str
    text: str

    @property
    def key(self) -> str:
        return f"{self.page}:{self.line}"

    def listed_in(self, table: dict) -> str | None:
        text = self.text.lstrip()
        return next((why for (page, start), why in table.items() if page == self.page and text.startswith(start)),
                    None)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")


def code_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a markdown file (top-level fences: a page's fences are not indented)."""
    blocks, lines = [], path.read_text().splitlines()
    k = 0
    while k < len(lines):
        opening = FENCE.match(lines[k])
        if opening is None:
            k += 1
            continue
        fence, language, start = opening.group(1), opening.group(2).lower(), k
        k += 1
        body = []
        while k < len(lines) and not lines[k].startswith(fence):
            body.append(lines[k])
            k += 1
        if k == len(lines):
            raise AssertionError(f"{path.name}:{start + 1}: a code fence is never closed")
        blocks.append(Block(path.name, start + 1, language, "\n".join(body) + "\n"))
        k += 1
    return blocks


def runnable(page: Path) -> list[Block]:
    return [b for b in code_blocks(page) if b.language in RUN_LANGUAGES]


def test_every_code_block_says_whether_it_runs():
    unlabelled = [f"{b.key} ({b.language or 'no language'})" for page in pages() for b in code_blocks(page)
                  if b.language not in RUN_LANGUAGES and b.language not in SHOWN_LANGUAGES]
    assert not unlabelled, ("fenced blocks need a language: bash/python (run by this test) or console/text "
                            f"(shown only): {unlabelled}")


def test_skip_lists_name_existing_blocks():
    """An entry of SLOW or SKIPPED whose block moved or went away would silently stop applying."""
    blocks = [b for page in pages() for b in runnable(page)]
    for table in (SLOW, SKIPPED):
        for page, start in table:
            assert any(b.page == page and b.text.lstrip().startswith(start) for b in blocks), (page, start)


def console_commands(text: str) -> list[str]:
    """The `$ ` lines of a console transcript, with their `\\` continuation lines."""
    commands, lines = [], text.splitlines()
    for k, line in enumerate(lines):
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\") and k + 1 < len(lines):
                k += 1
                command = command[:-1] + " " + lines[k].strip()
            commands.append(command)
    return commands


def run_block(block: Block, workdir: Path, env: dict) -> None:
    kind = RUN_LANGUAGES[block.language]
    if kind == "console":
        for command in console_commands(block.text):
            run_process(block, ["bash", "-o", "pipefail", "-c", command], workdir, env, allowed=(0, 1))
        return
    if kind == "bash":
        argv = ["bash", "-e", "-o", "pipefail", "-c", block.text]
    else:
        named = SAVED_AS.match(block.text.splitlines()[0])
        if named:               # a file the page's next blocks run (`python ln_grad.py`, `pytest test_model.py`)
            (workdir / named.group(1)).write_text(block.text)
            return
        script = workdir / f"snippet_{block.line}.py"
        script.write_text(block.text)
        argv = [sys.executable, script.name]
    run_process(block, argv, workdir, env, allowed=(0,))


def run_process(block: Block, argv: list[str], workdir: Path, env: dict, allowed: tuple[int, ...]) -> None:
    started = time.monotonic()
    done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - started
    print(f"{took:6.1f} s  {block.key} {argv[-1].splitlines()[0][:100]}")
    assert done.returncode in allowed, (
        f"{block.key} ({block.language} block) exited {done.returncode} after {took:.1f} s\n--- ran\n{argv[-1]}\n"
        f"--- stdout\n{done.stdout[-4000:]}--- stderr\n{done.stderr[-4000:]}")


def page_env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["MPLBACKEND"] = "Agg"
    env.pop("PYTHONPATH", None)
    return env


def pages_with_code(slow: bool) -> list[str]:
    names = []
    for page in pages():
        blocks = runnable(page)
        if any(b.listed_in(SLOW) for b in blocks) if slow else blocks:
            names.append(page.name)
    return names


def run_page(name: str, tmp_path: Path, slow: bool) -> None:
    page = ROOT / name if name == "README.md" else ROOT / "docs" / name
    workdir = tmp_path / "checkout"
    shutil.copytree(ROOT / "examples", workdir / "examples")
    (workdir / "tests").symlink_to(ROOT / "tests")          # the jax programs the docs' dumps come from
    if SHARED.is_dir():
        (tmp_path / "shared").symlink_to(SHARED)
    env = page_env()
    skipped = []
    for block in runnable(page):
        why = block.listed_in(SKIPPED)
        if why is None and not slow:
            why = block.listed_in(SLOW)
        if why is None and "../shared" in block.text and not SHARED.is_dir():
            why = "../shared is absent"
        if why is not None:
            skipped.append(f"{block.key}: {why}")
            continue
        run_block(block, workdir, env)
    if skipped:
        print("not run:", *skipped, sep="\n  ")


@pytest.mark.parametrize("name", pages_with_code(slow=False))
def test_page_code_runs(name, tmp_path):
    run_page(name, tmp_path, slow=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", pages_with_code(slow=True))
def test_page_code_runs_with_slow_blocks(name, tmp_path):
    run_page(name, tmp_path, slow=True)


def test_readme_is_the_short_entry_page():
    """README.md is the site's home page: what hloexec is, the two commands, a tour, links; the manual is docs/."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move sections to a page of docs/"
    assert (ROOT / "docs" / "index.md").read_text().strip() == '{% include-markdown "../README.md" %}'


def test_site_builds_strict(tmp_path):
    """mkdocs.yml's site: every page in the nav, every link and anchor resolving (strict: warnings fail)."""
    pytest.importorskip("mkdocs", reason="mkdocs not installed (pip install '.[docs]'; the test extra has it)")
    pytest.importorskip("material", reason="mkdocs-material not installed (pip install '.[docs]')")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert (tmp_path / "site" / "index.html").is_file()
