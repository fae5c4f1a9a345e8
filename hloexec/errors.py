"""The errors hloexec raises: one type per kind of failure a user can act on."""

from __future__ import annotations

import errno
import stat


class HloParseError(ValueError):
    """Bad HLO text: names file:line:col, shows the line and a caret, says what was expected."""

    def __init__(self, message: str, *, path: str | None = None, line: int = 0, column: int = 0, line_text: str = ""):
        self.message, self.path, self.line, self.column, self.line_text = message, path, line, column, line_text
        where = f"{path or '<text>'}:{line}:{column}"
        shown = line_text if len(line_text) <= 200 else _window(line_text, column)
        caret_col = column if len(line_text) <= 200 else min(column, 100)
        super().__init__(f"{where}: {message}\n  {shown}\n  {' ' * max(caret_col - 1, 0)}^")


def _window(line_text: str, column: int) -> str:
    """Show 200 characters of a very long line around the column (dumps have MB-long lines)."""
    start = max(column - 101, 0)
    return line_text[start : start + 200]


def not_a_regular_file(path: str, mode: int, why: str) -> OSError:
    """The error for a file argument that is a device, a socket or a pipe (`st_mode` `mode`) where a regular file
    is needed (`why`): /dev/zero mapped as 0 bytes was "empty input", read by numpy "a pickle"."""
    kinds = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a pipe"))
    kind = next((name for test, name in kinds if test(mode)), "a socket" if stat.S_ISSOCK(mode) else "no file")
    return OSError(errno.EINVAL, f"not a regular file ({kind}): {why}", path)


class OptionError(ValueError):
    """A library option given a value it does not take (hloexec.load's reductions= or compile=, run_spmd's runner=,
    hloexec.jax's stage= or reference=...): names the option, the value and the values it takes. A ValueError, as
    these were before they had a type of their own."""

    def __init__(self, option: str, value, choices):
        self.option, self.value, self.choices = option, value, tuple(choices)
        super().__init__(f"{option}={value!r}: expected one of {', '.join(map(repr, self.choices))}")


class UnsupportedError(NotImplementedError):
    """An opcode, attribute, dtype or layout that hloexec does not execute; names where it is."""

    def __init__(self, what: str, instruction=None):
        self.what = what
        self.instruction = instruction
        super().__init__(f"{what}{describe_site(instruction)}" if instruction is not None else what)


class ExecutionError(RuntimeError):
    """A module failed while running (bad inputs, out of memory budget, a failing kernel)."""


class ArrayFileError(ExecutionError):
    """An array file a user gave (--inputs, --expected, --actual, a dump's inputs) that cannot be read or does not
    fit the module: names the file, the array and what was expected."""


LIBRARY_MEMORY_ADVICE = "pass max_memory=BYTES to hloexec.load to override"  # (the command line: --max-memory)


class MemoryLimitError(ExecutionError):
    """A run refused before it starts: what it needs (`peak`: its peak live bytes, or as `counted` says) exceeds
    what it may use (`limit`, from max_memory when `given`, else MemAvailable)."""

    def __init__(
        self,
        module_name: str,
        peak: int,
        limit: int,
        given: bool,
        *,
        counted: str = "at its peak (live buffers, inputs included)",
        advice: str = LIBRARY_MEMORY_ADVICE,
    ):
        self.peak, self.limit, self.given, self.advice = peak, limit, given, advice
        source = "max_memory" if given else "MemAvailable in /proc/meminfo"
        super().__init__(
            f"{module_name} needs {peak / 2**30:.2f} GiB {counted} but {source} allows "
            f"{limit / 2**30:.2f} GiB; {advice}"
        )


def describe_site(instruction) -> str:
    """' in %name (opcode) of computation %comp, from file:line' for error messages."""
    comp = instruction.computation.name if instruction.computation is not None else "?"
    where = (
        f"\n  in %{instruction.name} = {instruction.opcode}(...) of computation %{comp} (HLO line {instruction.line})"
    )
    loc = instruction.source_location
    return where + (f", from {loc}" if loc else "")


class TierUnsupported(Exception):
    """A compiled tier (a fused kernel, a compiled loop) knowingly declines a computation: `reason` names what
    it does not handle. The computation then runs op by op -- correct, slower -- and the reason is counted
    (`hloexec run --profile`). Any other exception from a code generator is a bug (CompileWarning)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class CompileWarning(UserWarning):
    """hloexec's code generator failed on a computation (a bug, not a TierUnsupported decline), or the code it
    generated does not compile: it runs op by op instead. The test suite turns this warning into an error."""


class ElidedConstantWarning(UserWarning):
    """The module holds constants whose values its text does not (`constant({...})`): results depending on them
    are not the program's."""


def elided_constants_note(module, constants) -> str:
    """What a run of `module` should say about its elided `constants` (Instructions)."""
    names = ", ".join(f"%{c.name}" for c in constants[:5]) + (", ..." if len(constants) > 5 else "")
    return (
        f"module {module.name}: {len(constants)} constant{'s' if len(constants) != 1 else ''} ({names}) "
        "written as {...}: the dump left out their values (take it with --xla_dump_large_constants=true); "
        "hloexec runs them as zeros, so outputs that depend on them are not the program's"
    )
