"""The documentation cannot rot: the site (mkdocs.yml over docs/) builds with `mkdocs build --strict`, and every
shell command and Python snippet of README.md and docs/*.md runs.

Which code blocks run is said by their fence's language:
- ```bash (or ```sh) and ```python blocks run: a page's blocks in order, each in a fresh process (`bash -e -o
  pipefail`, `python`), in one temporary directory per page that holds a copy of examples/ (so the commands name
  `examples/mlp.opt.hlo` as a reader's checkout does), with ../shared beside it when the checkout has it; a file
  one block writes is there for the next. Every command must exit 0 (a command that finds something exits 1:
  write `|| test $? = 1`).
- ```console (a command with what it printed), ```text (synopses, placeholders such as FILE.hlo), ```toml and the
  other languages are shown, not run. Every fenced block names its language, so a new one chooses.
A block that needs ../shared or runs longer than ~20 s is listed in SLOW (run by `-m slow`) and one that cannot run
here in SKIPPED, each with its reason, by its page and a text its first line starts with.
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

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
RUN_LANGUAGES = {"bash": "bash", "sh": "bash", "python": "python"}
SHOWN_LANGUAGES = {"console", "text", "toml", "yaml", "json", "c", "hlo", "ini", "diff"}

# (page, start of the block's first line): why it runs only under -m slow
SLOW = {
    ("spmd.md", "# all participants"): "the seeds in ../shared; the TPU seed on 8 participants",
}
# (page, start of the block's first line): why it does not run in the test suite at all
SKIPPED = {
    ("README.md", "python3 -m venv"): "a fresh venv and install: CI (.ci/run) runs these two commands",
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
        first = self.text.lstrip().splitlines()[0] if self.text.strip() else ""
        return next((why for (page, start), why in table.items() if page == self.page and first.startswith(start)),
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


def run_block(block: Block, workdir: Path, env: dict) -> None:
    if RUN_LANGUAGES[block.language] == "bash":
        argv = ["bash", "-e", "-o", "pipefail", "-c", block.text]
    else:
        script = workdir / f"snippet_{block.line}.py"
        script.write_text(block.text)
        argv = [sys.executable, script.name]
    started = time.monotonic()
    done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - started
    assert done.returncode == 0, (f"{block.key} ({block.language} block) exited {done.returncode} after {took:.1f} s"
                                  f"\n--- block\n{block.text}--- stdout\n{done.stdout[-4000:]}"
                                  f"--- stderr\n{done.stderr[-4000:]}")


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


def test_site_builds_strict(tmp_path):
    """mkdocs.yml's site: every page in the nav, every link and anchor resolving (strict: warnings fail)."""
    pytest.importorskip("mkdocs", reason="mkdocs not installed (pip install '.[docs]'; the test extra has it)")
    pytest.importorskip("material", reason="mkdocs-material not installed (pip install '.[docs]')")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert (tmp_path / "site" / "index.html").is_file()
