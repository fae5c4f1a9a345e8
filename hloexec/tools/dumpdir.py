"""XLA dump directories (`--xla_dump_to=DIR`) as inputs: what they hold, and one stage of one program as a file.

XLA names what it dumps after the module's unique id and name (xla/service/dump.cc):

    module_NNNN.<name>.before_optimizations.txt              the program as the framework gave it
    module_NNNN.<name>.<backend>_after_optimizations.txt     as it ran (cpu_, gpu_, tpu_ ...)
    module_NNNN.<name>.SSSS.<pipeline>.after_<pass>.before_<next>.txt      after each pass that changed it
                                                             (--xla_dump_hlo_pass_re=.*)
    module_NNNN.<name>.snapshot.<id>.pb, [TIMESTAMP.]module_NNNN.<name>.execution_NNNN.hlo_snapshot.pb
                                                             one execution's arguments and result
                                                             (--xla_dump_hlo_snapshots)

with `.hlo.pb` twins of the modules under --xla_dump_hlo_as_proto, and buffer assignments, memory reports, LLVM
IR and object files beside them. Text dumps print large constants as `{...}` (their values are not in the
file: hloexec reads them as zeros); where a `.hlo.pb` twin exists and jaxlib is installed, the stage is read
from the proto instead, which has them.

`program_texts(DIR)` lists the programs with their texts before and after optimization.
`resolve(DIR, module, stage)` picks one stage: `before`, `after`, `snapshot`, a step number (`8`, `0008`), a
pass name (the first stage after it: `tree_reduction_rewriter`), or a file name. `prepare_arguments` does it
for the command line: every FILE argument may be a dump directory (with --module/--stage), a snapshot or a
proto; they become text files (temporary ones for protos) before the command runs.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import HloParseError
from ..parser import parse
from .arrays import flatten
from .hloproto import ProtoError, Snapshot, module_text, read_module_proto, read_snapshot
from .xla_cpu import save_arrays

# after a pass: SSSS.<pipeline>.after_<pass>.before_<next>; during one (copy-insertion): SSSS.<pass>.<step>
_STAGE = re.compile(
    r"(?P<step>\d{4})\.(?P<pipeline>[^.]+)\.(?:after_(?P<after>.+?)\.before_(?P<before>.+)|(?P<during>[^.]+))"
)
_FILE = re.compile(r"(?:\d+\.)?module_(?P<number>\d+)\.(?P<rest>.+)")
_SUFFIXES = [
    ("before", re.compile(r"(?P<name>.+?)\.before_optimizations\.(?P<ext>txt|hlo\.pb)")),
    ("after", re.compile(r"(?P<name>.+?)\.(?P<backend>[a-z0-9]+)_after_optimizations\.(?P<ext>txt|hlo\.pb)")),
    ("pass", re.compile(r"(?P<name>.+?)\." + _STAGE.pattern + r"\.(?P<ext>txt|hlo\.pb)")),
    ("snapshot", re.compile(r"(?P<name>.+?)\.(?:snapshot\.-?\d+\.pb|execution_\d+\.hlo_snapshot\.pb)")),
]


class DumpError(ValueError):
    """A dump directory, module or stage that is not there (the message lists what is)."""


@dataclass
class Stage:
    kind: str  # before | pass | after
    path: Path  # the text dump, else the .hlo.pb
    step: int | None = None  # SSSS of a per-pass dump
    pipeline: str = ""
    after_pass: str = ""  # the pass it follows (or the step of a pass that dumps during its run)
    before_pass: str = ""
    backend: str = ""
    proto: Path | None = None  # the .hlo.pb twin

    @property
    def label(self) -> str:
        if self.kind == "pass":
            return f"{self.step:04d} {self.pipeline}: {'after ' if self.before_pass else ''}{self.after_pass}"
        return f"{self.backend + ' ' if self.backend else ''}{self.kind} optimizations"

    def text(self) -> str:
        """The module's HLO text: the text dump, or the proto (through jaxlib) where the text dump is missing
        or elides large constants and jaxlib is installed."""
        if self.path.suffix == ".txt":
            with open(self.path, encoding="utf-8", errors="surrogateescape") as f:
                text = f.read()
            if self.proto is None or "{...}" not in text:
                return text
            try:
                return module_text(read_module_proto(self.proto))
            except ProtoError:
                return text  # elided constants read as zeros (see the module docstring)
        return module_text(read_module_proto(self.path))


@dataclass
class DumpModule:
    number: int
    name: str
    before: Stage | None = None
    after: list[Stage] = field(default_factory=list)
    passes: list[Stage] = field(default_factory=list)
    snapshots: list[Path] = field(default_factory=list)
    other: list[Path] = field(default_factory=list)
    duplicates: list[tuple[Path, Path]] = field(default_factory=list)  # (file left out, the file kept instead)

    def stages(self) -> list[Stage]:
        """Every dumped stage in pipeline order: before optimizations, the passes, after optimizations."""
        return ([self.before] if self.before else []) + sorted(self.passes, key=lambda s: s.step or 0) + self.after

    def missing_steps(self) -> list[int]:
        """Pass-dump steps not in the directory: XLA numbers the pass dumps it writes for a module 0, 1, 2, ... (a
        step per dump, dump.cc), so a number below the last one without a file is a file deleted or never copied."""
        present = {s.step for s in self.passes if s.step is not None}
        return [k for k in range(max(present, default=-1) + 1) if k not in present]

    def missing(self) -> list[str]:
        """The stage files the directory lacks, said for a listing: gaps in the pass steps, before or after
        optimizations (XLA dumps both whenever it dumps a module: deleted, or the compile stopped early)."""
        found = []
        steps = self.missing_steps()
        if steps:
            from ..spmd.devices import device_ranges  # only here (the spmd package costs ~0.5 s to import)

            found.append(
                f"step{'s' if len(steps) > 1 else ''} {device_ranges(steps).replace(',', ', ')} (no file: XLA "
                "numbers its pass dumps 0, 1, 2, ...; deleted or never copied)"
            )
        if self.before is None and (self.after or self.passes):
            found.append("before optimizations (no *.before_optimizations.txt)")
        if not self.after and (self.before or self.passes):
            found.append("after optimizations (no *_after_optimizations.txt: deleted, or the compile stopped early)")
        return found

    def stage(self, which: str | None) -> Stage:
        stages = self.stages()
        if not stages:
            raise DumpError(
                f"module_{self.number:04d}.{self.name} has no HLO dump (only: "
                f"{', '.join(p.name for p in self.other[:5]) or 'nothing'})"
            )
        if which is None:
            return self.after[0] if self.after else stages[-1]
        if which == "snapshot":
            raise DumpError(
                "--stage snapshot: the snapshot's module and inputs; run, compare, diff and extract take it"
            )
        if which == "before" and self.before:
            return self.before
        if which == "after" and self.after:
            return self.after[0]
        if which.isdigit():
            found = [s for s in self.passes if s.step == int(which)]
        else:
            found = [s for s in self.passes if s.after_pass == which] or [
                s for s in stages if s.path.name == which or (s.proto is not None and s.proto.name == which)
            ]
        if not found:
            passes = sorted({s.after_pass for s in self.passes})
            steps = sorted(s.step for s in self.passes if s.step is not None)
            from ..spmd.devices import device_ranges  # only here (the spmd package costs ~0.5 s to import)

            missing = self.missing()
            raise DumpError(
                f"module_{self.number:04d}.{self.name}: no stage {which!r}"
                + (
                    " (its file is not in the directory)"
                    if which.isdigit() and int(which) in self.missing_steps()
                    else ""
                )
                + "; stages: "
                + ", ".join((["before"] if self.before else []) + (["after"] if self.after else []))
                + (
                    f", steps {device_ranges(steps).replace(',', ', ')} or a pass: {', '.join(passes)}"
                    if passes
                    else ""
                )
                + (f"; missing: {'; '.join(missing)}" if missing else "")
            )
        return found[0]


def scan(directory) -> list[DumpModule]:
    """The programs in a dump directory, by module number."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DumpError(f"{directory}: {'not a directory' if directory.exists() else 'No such file or directory'}")
    modules: dict[int, DumpModule] = {}
    protos: dict[Path, tuple[int, str, dict[str, str]]] = {}  # path -> (module number, kind, its name's parts)
    for path in sorted(directory.iterdir()):
        m = _FILE.fullmatch(path.name)
        if m is None or not path.is_file():
            continue
        number, rest = int(m.group("number")), m.group("rest")
        for kind, pattern in _SUFFIXES:
            s = pattern.fullmatch(rest)
            if s is None:
                continue
            module = modules.setdefault(number, DumpModule(number, s.group("name")))
            if kind == "snapshot":
                module.snapshots.append(path)
            elif s.group("ext") == "hlo.pb":
                protos[path] = (number, kind, s.groupdict())
            else:
                _add_stage(module, kind, path, s)
            break
        else:
            name = rest.split(".")[0]
            modules.setdefault(number, DumpModule(number, name)).other.append(path)
    stage: Stage | None
    for path, (number, kind, g) in protos.items():  # twins of text dumps, or the only dump of a stage
        module = modules[number]
        if kind == "before":
            stage = module.before = module.before or Stage("before", path)
        elif kind == "after":
            stage = next((s for s in module.after if s.backend == g["backend"]), None)
            if stage is None:
                stage = Stage("after", path, backend=g["backend"])
                module.after.append(stage)
        else:
            stage = next((s for s in module.passes if s.step == int(g["step"])), None)
            if stage is None:
                stage = Stage("pass", path, int(g["step"]), g["pipeline"], g["after"] or g["during"], g["before"] or "")
                module.passes.append(stage)
        stage.proto = path
    return [modules[n] for n in sorted(modules)]


def _add_stage(module: DumpModule, kind: str, path: Path, s: re.Match) -> None:
    """A text dump as its module's stage; a second file of the same stage (the same step, or before/after of the
    same backend twice: two runs dumped into one directory) is kept aside as a duplicate, not silently dropped."""
    if kind == "before":
        kept = module.before
        if kept is None:
            module.before = Stage("before", path)
    elif kind == "after":
        kept = next((a for a in module.after if a.backend == s.group("backend")), None)
        if kept is None:
            module.after.append(Stage("after", path, backend=s.group("backend")))
    else:
        kept = next((p for p in module.passes if p.step == int(s.group("step"))), None)
        if kept is None:
            module.passes.append(
                Stage(
                    "pass",
                    path,
                    int(s.group("step")),
                    s.group("pipeline"),
                    s.group("after") or s.group("during"),
                    s.group("before") or "",
                )
            )
    if kept is not None:
        module.duplicates.append((path, kept.path))


def check_stage(stage: Stage) -> tuple[int | None, str]:
    """(instructions, problem) of a stage's text dump: the problem is "" when it parses, else why it cannot be
    run -- an empty file, a truncated one (it ends inside the module), unparseable text. A proto stage is not
    read here ((None, ""): reading it needs jaxlib)."""
    if stage.path.suffix != ".txt":
        return None, ""
    try:
        if not stage.path.read_bytes().strip():
            return None, "empty file"
        return sum(m.instruction_count for m in parse(stage.path)), ""
    except OSError as e:
        return None, f"cannot be read ({e.strerror or e})"
    except HloParseError as e:
        first = str(e).splitlines()[0]
        return None, f"truncated ({first})" if "end of input" in e.message else f"unparseable ({first})"


def find_module(modules: list[DumpModule], which: str | None, directory) -> DumpModule:
    """A module by name or number; the only one when `which` is None."""
    listing = "\n".join(f"  {m.number:04d} {m.name}" for m in modules)
    if not modules:
        raise DumpError(f"{directory}: no XLA dump files (module_NNNN.<name>.*) found")
    if which is None:
        if len(modules) == 1:
            return modules[0]
        raise DumpError(f"{directory} holds {len(modules)} programs; pick one with --module NAME_OR_NUMBER:\n{listing}")
    found = [m for m in modules if (which.isdigit() and m.number == int(which)) or m.name == which]
    if len(found) == 1:
        return found[0]
    if not found:
        raise DumpError(f"{directory}: no program {which!r}; found:\n{listing}")
    numbers = ", ".join(f"{m.number:04d}" for m in found)
    raise DumpError(f"{directory}: {len(found)} programs named {which!r} (numbers {numbers}); pick one by number")


def resolve(directory, module: str | None = None, stage: str | None = None) -> tuple[DumpModule, Stage]:
    dump = find_module(scan(directory), module, directory)
    return dump, dump.stage(stage)


class ProgramTexts(NamedTuple):
    number: int
    name: str
    before: str | None  # the HLO text before optimizations (None: not dumped)
    after: str | None  # after optimizations (the first backend's)
    before_path: Path | None
    after_path: Path | None


def program_texts(directory) -> list[ProgramTexts]:
    """The programs of a directory written by `XLA_FLAGS=--xla_dump_to=DIR --xla_dump_hlo_as_text`, by module
    number, with their texts before and after optimization (read from the .hlo.pb twin where the text elides
    large constants and jaxlib is there: Stage.text). Raises DumpError when DIR is not a directory."""

    def text(stage: Stage | None) -> str | None:
        return None if stage is None else stage.text()

    return [
        ProgramTexts(
            m.number,
            m.name,
            text(m.before),
            text(m.after[0] if m.after else None),
            m.before.path if m.before else None,
            m.after[0].path if m.after else None,
        )
        for m in scan(directory)
    ]


def module_summary(module: DumpModule) -> dict:
    """What `hloexec dump` lists for one program."""

    def describe(stage: Stage | None) -> dict | None:
        if stage is None:
            return None
        info = {
            "file": stage.path.name,
            "bytes": stage.path.stat().st_size,
            "instructions": None,
            "proto": stage.proto.name if stage.proto else None,
        }
        if stage.backend:
            info["backend"] = stage.backend
        info["instructions"], problem = check_stage(stage)
        if problem:
            info["error"] = problem
        return info

    passes = []
    for s in sorted(module.passes, key=lambda s: s.step or 0):
        passes.append(
            {
                "step": s.step,
                "pipeline": s.pipeline,
                "after": s.after_pass,
                "before": s.before_pass,
                "file": s.path.name,
                "error": check_stage(s)[1] or None,
            }
        )
    summary: dict[str, Any] = {
        "number": module.number,
        "name": module.name,
        "before": describe(module.before),
        "after": [describe(s) for s in module.after],
        "passes": passes,
        "pass_count": len(module.passes),
        "snapshots": [p.name for p in module.snapshots],
        "other_files": len(module.other),
        "missing": module.missing(),
    }
    stages = [summary["before"], *summary["after"], *passes]
    summary["problems"] = [
        {"file": info["file"], "error": info["error"]} for info in stages if info is not None and info.get("error")
    ] + [
        {"file": left.name, "error": f"duplicate of {kept.name} (the same stage twice: left out)"}
        for left, kept in module.duplicates
    ]
    return summary


# -- FILE arguments of the command line --------------------------------------------------------------------
_temporary: list[str] = []


def _scratch() -> str:
    if not _temporary:
        _temporary.append(tempfile.mkdtemp(prefix="hloexec-dump-"))
        atexit.register(shutil.rmtree, _temporary[0], True)
    return _temporary[0]


def _write(name: str, text: str) -> str:
    path = os.path.join(_scratch(), name)
    with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(text)
    return path


def _save(name: str, arrays: dict) -> str:
    path = os.path.join(_scratch(), name)
    save_arrays(path, arrays)
    return path


def is_snapshot(path) -> bool:
    return any(p.fullmatch(Path(path).name) for kind, p in _SUFFIXES if kind == "snapshot") or str(path).endswith(
        ".hlo_snapshot.pb"
    )


def dumped_inputs(dump: DumpModule) -> tuple[str, str] | None:
    """(an .npz of arguments arg0.., what they are) where the dump holds real inputs of the module: the
    `module_NNNN.<name>.inputs.npz` beside it (hloexec.jax.dump writes one; so may a user), else the arguments
    of its first HloSnapshot (--xla_dump_hlo_snapshots). None where it holds neither."""
    saved = [p for p in dump.other if p.name == f"module_{dump.number:04d}.{dump.name}.inputs.npz"]
    if saved:
        return str(saved[0]), f"inputs: {saved[0].name} beside the module"
    if dump.snapshots:
        snap = read_snapshot(dump.snapshots[0])
        path = _save(
            dump.snapshots[0].name + ".inputs.npz", {f"arg{i}": a for i, a in enumerate(flatten(tuple(snap.arguments)))}
        )
        return path, f"inputs: the {len(snap.arguments)} arguments of the snapshot {dump.snapshots[0].name}"
    return None


def as_text_file(path: str, module: str | None, stage: str | None) -> tuple[str, Snapshot | None, str]:
    """(a text file hloexec parses, the snapshot if it is one, a note) for a FILE argument: a dump directory
    (its --module, --stage), a snapshot, an HloProto (.pb), else the path itself."""
    p = Path(path)
    if p.is_dir():
        dump = find_module(scan(p), module, p)
        if stage == "snapshot":
            if not dump.snapshots:
                raise DumpError(f"module_{dump.number:04d}.{dump.name} has no snapshot (--xla_dump_hlo_snapshots)")
            return as_text_file(str(dump.snapshots[0]), None, None)
        chosen = dump.stage(stage)
        note = f"{p}: module_{dump.number:04d}.{dump.name}, {chosen.label} ({chosen.path.name})"
        if chosen.path.suffix == ".txt":
            elided = b"{...}" in chosen.path.read_bytes()
            if chosen.proto is None:
                if elided:
                    note += (
                        "\nnote: its large constants are elided ({...}) and read as zeros; "
                        "--xla_dump_hlo_as_proto dumps them"
                    )
                return str(chosen.path), None, note
            if not elided:
                return str(chosen.path), None, note
        return _write(chosen.path.name.replace(".hlo.pb", "") + ".hlo", chosen.text()), None, note
    if p.suffix == ".pb" and p.is_file():
        if is_snapshot(p):
            snap = read_snapshot(p)
            return (
                _write(p.name + ".hlo", module_text(snap.module_proto)),
                snap,
                f"{p}: snapshot of {snap.module_name} ({len(snap.arguments)} arguments and the result)",
            )
        return _write(p.name + ".hlo", module_text(read_module_proto(p))), None, f"{p}: module proto"
    if p.is_fifo():  # a pipe (`<(zcat dump.txt.gz)`, /dev/stdin): read once; the parser maps regular files only
        with open(p, encoding="utf-8", errors="surrogateescape") as f:
            copy = _write(p.name, f.read())
        return copy, None, f"{p}: a pipe, read into {copy}"
    return path, None, ""


def prepare_arguments(args, argv: list[str]) -> list[str]:
    """Turn the FILE arguments of a parsed command line (`file`, `other`, `a`, `b`, `files`) that are dump
    directories, snapshots or protos into text files; a snapshot's arguments become --inputs and (compare
    without a reference) its result --expected, unless given; so do the real inputs a dump directory holds for
    the module (`dumped_inputs`). Returns notes for stderr."""
    notes = []
    module, stage = getattr(args, "module", None), getattr(args, "stage", None)
    resolved_module = False
    originals = [getattr(args, attr, None) for attr in ("file", "other", "a", "b")]
    if getattr(args, "b", "") is None and isinstance(getattr(args, "a", None), str) and Path(args.a).is_dir():
        args.b = args.a  # `diff DIR --stage X --stage-b Y`: two stages of one dump
    for attr in ("file", "other", "a", "b"):
        value = getattr(args, attr, None)
        if not isinstance(value, str):
            continue
        which = getattr(args, "stage_b", None) or stage if attr in ("b", "other") else stage
        path, snapshot, note = as_text_file(value, module, which)
        resolved_module |= Path(value).is_dir()
        setattr(args, attr, path)
        if note:
            notes.append(note)
        given = any(a == flag or a.startswith(flag + "=") for a in argv for flag in ("--inputs", "--seed"))
        if (
            snapshot is None
            and attr in ("file", "a")
            and Path(value).is_dir()
            and hasattr(args, "inputs")
            and not given
        ):
            real = dumped_inputs(find_module(scan(value), module, value))
            if real is not None:
                args.inputs = real[0]
                notes.append(real[1] + " (--seed N draws random ones)")
        if snapshot is not None and attr in ("file", "a"):
            if hasattr(args, "inputs") and not given:
                args.inputs = _save(
                    Path(value).name + ".inputs.npz",
                    {f"arg{i}": a for i, a in enumerate(flatten(tuple(snapshot.arguments)))},
                )
                notes.append(f"inputs: the snapshot's {len(snapshot.arguments)} arguments")
            if (
                getattr(args, "command", None) == "compare"
                and args.other is None
                and args.expected is None
                and getattr(args, "against", None) is None
            ):
                args.expected = _save(
                    Path(value).name + ".expected.npz", {f"out{i}": a for i, a in enumerate(flatten(snapshot.result))}
                )
                notes.append("expected: the snapshot's result (what the device returned)")
    if isinstance(getattr(args, "files", None), list):
        resolved_module |= any(Path(f).is_dir() for f in args.files)
        args.files = [as_text_file(f, module, stage)[0] for f in args.files]
    if resolved_module and hasattr(args, "module"):
        args.module = None  # chosen: each resolved file holds that one module
    elif stage is not None or getattr(args, "stage_b", None) is not None:  # it was silently ignored
        files = [*originals, *(getattr(args, "files", None) or ())]
        existing = [f for f in files if isinstance(f, str) and Path(f).exists()]
        if existing:
            raise DumpError(f"--stage picks a stage of a dump directory (--xla_dump_to=DIR); {existing[0]} is a file")
    return notes
