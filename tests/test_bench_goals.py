"""bench/issue_goals.py (issue 29's one-run table) runs end to end in its --quick form and prints a row for every
goal, each with a measured value, and the machine, commit and blocks beside the table."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GOALS = [
    "later runs <= 1.5x the first",
    "time to warm <= XLA:CPU's parse + compile + first run",
    "warm <= 1.0x XLA:CPU",
    "dots >= 95% of the best BLAS installed",
    "parse >= 10x XLA's parser on every dump",
]


def test_quick_run_prints_every_goal(tmp_path):
    pytest.importorskip("jax")
    env = dict(os.environ, HLOEXEC_CACHE_DIR=str(tmp_path / "kernels"), HLOEXEC_BENCH_DIR=str(tmp_path / "bench"))
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "issue_goals.py"), "--quick", "--markdown", "--json", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and line.count("|") == 6]
    table = {line.split(" | ")[0][2:]: line.split(" | ") for line in rows}
    for goal in GOALS:
        found = [cells for name, cells in table.items() if name.startswith(goal)]
        assert found, f"no row for {goal!r} in:\n{done.stdout}"
        for cells in found:
            assert re.search(r"\d", cells[1]), f"row without a measured value: {cells}"
            assert cells[3] in ("yes", "**no**", "n/a"), cells
    header = done.stdout.splitlines()[0]
    assert re.match(r"Machine: .+, \d+ cores, .*commit [0-9a-f]{7,}.*load [\d.]+ at the start, [\d.]+ at the end", header)
    assert "| XLA:CPU parse + compile + first run (fresh processes) |" in done.stdout
