"""The `hloexec` command (also `python -m hloexec`): the list of commands and the handling every command shares
(exit codes, error messages, signals). Each command is a module of tools/commands/ (its arguments and its run);
what commands share is tools/common.py.

Every command prints a readable report on stdout, or with `--json` one JSON document (NaN and infinities as the
strings "nan", "inf", "-inf"); diagnostics and errors go to stderr. Errors print their message only (it names
file:line:col or the instruction); `--debug` or HLOEXEC_DEBUG=1 adds the Python traceback.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import traceback

from .. import __version__
from .commands import (
    bisect,
    collectives,
    compare,
    devices,
    diff,
    dump,
    export,
    extract,
    graph,
    memory,
    minimize,
    numerics,
    ops,
    report,
    run,
    stats,
)
from . import plugins
from .arrays import flatten as flatten  # re-exported: scripts and tests import it from here
from .common import (
    CompileNotice,
    EXIT_CODES,
    EXIT_ERROR,
    EXIT_OK,
    JSON_VERSION,
    KNOWN_ERRORS,
    error_message,
    parent_parsers,
    print_json,
)
from .common import ProgressBar as ProgressBar  # re-exported, as flatten
from .dumpdir import prepare_arguments

# in `hloexec --help` order
COMMANDS = (
    stats,
    run,
    compare,
    numerics,
    ops,
    memory,
    collectives,
    export,
    graph,
    report,
    devices,
    dump,
    diff,
    bisect,
    extract,
    minimize,
)


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that a run stops as Ctrl-C stops it: `finally` blocks and atexit
    handlers remove temporary files, stop compile workers and kill child processes (the default action would
    end the process with none of that)."""


def _terminate(signum, frame):
    raise Terminated()


class Parser(argparse.ArgumentParser):
    """argparse's parser, keeping the message of a usage error it refuses (`main` says it as JSON too with
    --json); its subcommands' parsers are of this class as well."""

    usage_error: str | None = None

    def error(self, message):
        Parser.usage_error = message
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="hloexec",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Parse, inspect, run and compare XLA HLO text on the CPU.",
        epilog="examples:\n"
        "  hloexec stats dump.hlo\n"
        "  hloexec run model.hlo --seed 0 --out out.npz\n"
        "  hloexec compare model.hlo --inputs in.npz --expected out.npz\n"
        "  hloexec ops --markdown\n\n"
        "run 'hloexec COMMAND --help' for a command's options and examples.\n\n" + EXIT_CODES,
    )
    parser.add_argument("--version", action="version", version=f"hloexec {__version__}")
    parser.add_argument("--debug", action="store_true", help="print Python tracebacks (also HLOEXEC_DEBUG=1)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    parents = parent_parsers()
    for command in COMMANDS:
        command.add_parser(subparsers, parents)
    return parser


def _asks_json(argv: list[str]) -> bool:
    """Whether a command line argparse refused has --json (or an abbreviation argparse would take for it)."""
    words = argv[: argv.index("--")] if "--" in argv else argv
    return any(len(a) > 3 and "--json".startswith(a) for a in words)


def _command_of(argv: list[str]) -> str | None:
    """The command a refused command line names (None: none, or one hloexec does not have)."""
    first = next((a for a in argv if not a.startswith("-")), None)  # the top level's options take no value
    return first if first in {command.__name__.rsplit(".", 1)[-1] for command in COMMANDS} else None


class NamedStdout:
    """sys.stdout while a command runs: a write that fails (`> out.json` on a full disk) names stdout, as a file
    the command writes is named; the error was `[Errno 28] No space left on device`, and with --json a traceback
    (the error's JSON document failed to write too)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        return self._named(self.stream.write, text)

    def flush(self) -> None:
        self._named(self.stream.flush)

    @staticmethod
    def _named(call, *args):
        try:
            return call(*args)
        except BrokenPipeError:  # `hloexec ops | head`: not an error
            raise
        except OSError as e:
            raise OSError(e.errno, e.strerror, "stdout") from None

    def __getattr__(self, name):
        return getattr(self.stream, name)


def main(argv=None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    Parser.usage_error = None
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, usage errors (argparse printed them)
        if Parser.usage_error is not None and _asks_json(argv):  # a script reading stdout gets a JSON document
            print_json({"command": _command_of(argv), "version": JSON_VERSION, "error": Parser.usage_error})
        return e.code if isinstance(e.code, int) else EXIT_ERROR
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    debug = args.debug or os.environ.get("HLOEXEC_DEBUG", "") not in ("", "0")
    previous = (
        signal.signal(signal.SIGTERM, _terminate) if threading.current_thread() is threading.main_thread() else None
    )
    stdout = sys.stdout
    try:
        if getattr(args, "plugin", None) or getattr(args, "custom_call_identity", None):
            plugins.apply(args.plugin, args.custom_call_identity)
        args.command_line = argv  # `report` shows how to rerun it
        for note in prepare_arguments(args, args.command_line):  # FILE as a dump directory, snapshot or proto
            print(note, file=sys.stderr)
        sys.stdout = NamedStdout(stdout)
        with CompileNotice():  # (a cold first run compiles for a minute or two: the user is told)
            code = args.handler(args)
        sys.stdout.flush()  # (a full disk's failure said below, not in Python's words at exit)
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("terminated", file=sys.stderr)
        return 143
    except BrokenPipeError:  # `hloexec ops | head`
        sys.stderr.close()
        return EXIT_OK
    except Exception as e:  # noqa: BLE001 - every failure becomes a message and exit code 2
        if debug:
            traceback.print_exc()
        if isinstance(e, KNOWN_ERRORS):
            message = error_message(e, getattr(args, "file", None))
            print(f"error: {message}", file=sys.stderr)
        else:
            message = f"internal error: {error_message(e)}"
            print(message, file=sys.stderr)
            if not debug:
                print("(run with --debug or HLOEXEC_DEBUG=1 for the traceback)", file=sys.stderr)
        sys.stdout = stdout
        if getattr(args, "json", False) and getattr(e, "filename", None) != "stdout":  # one JSON document on stdout
            print_json({"command": args.command, "version": JSON_VERSION, "error": message})
        return EXIT_ERROR
    finally:
        sys.stdout = stdout
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
