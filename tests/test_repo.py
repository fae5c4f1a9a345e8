"""The repo's promises to a newcomer: the README's commands are the ones CI runs."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()
    return [line.strip() for line in lines[:12] if line.startswith("    ")]


def test_readme_starts_with_two_commands():
    commands = readme_commands()
    assert len(commands) == 2
    assert "pip install" in commands[0] and "hloexec " in commands[0]
    assert "pip install" in commands[1] and "pytest" in commands[1]


def test_ci_runs_exactly_the_readme_test_command():
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert readme_commands()[1] in ci_lines


def test_bundled_examples_are_there():
    for name in ("gpt_step", "adam", "layernorm_bwd", "mlp"):
        for suffix in (".pre.hlo", ".opt.hlo", ".inputs.npz", ".expected.npz"):
            assert (ROOT / "examples" / f"{name}{suffix}").is_file()


def test_hloexec_imports_and_parses_from_the_checkout_root():
    """From the repository's root the source tree shadows the installed package, and the sources hold no built
    scanner library: the installed one is found all the same (CI installs with `pip install .`)."""
    import subprocess
    import sys
    script = "import hloexec; print(hloexec.parse('HloModule m\\nENTRY e { ROOT c = f32[] constant(1) }')[0].name)"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "m", done.stderr


def tracked_files() -> list[Path]:
    import subprocess
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        import pytest
        pytest.skip("not a git checkout")
    return [ROOT / name for name in listed.stdout.splitlines()]


def test_no_generated_or_machine_specific_files_are_tracked():
    """Generated kernels (the kernel cache) stay out of the repository, and no document names a path of the machine
    it was written on (a checkout or home directory): a reader's machine has other ones."""
    files = tracked_files()
    assert not [f for f in files if ".kcache" in f.parts or f.name.startswith("hx_")]
    machine = ("/work/", "/root/", "/home/")
    named = [f"{f.relative_to(ROOT)}: {m}" for f in files if f.suffix in (".md", ".toml", ".cfg", ".yml")
             for m in machine if f.is_file() and m in f.read_text(errors="replace")]
    assert not named, named


def test_the_package_passes_its_linter():
    """ruff with the rules pyproject.toml selects (pyflakes: unused imports and variables, undefined names...)."""
    import shutil
    import subprocess
    import sys
    ruff = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    if ruff is None:
        import pytest
        pytest.skip("ruff not installed (it comes with the test extra)")
    done = subprocess.run([ruff, "check", "--no-cache", "hloexec"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
