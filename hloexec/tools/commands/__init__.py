"""The `hloexec` commands, one module each: `add_parser(subparsers, parents)` adds the command's arguments,
help text and examples; `run(args)` carries it out and returns the exit code (run_spmd.py is `run --spmd`'s
part of run.py). What several commands share is tools/common.py (and tools/participants.py for SPMD runs);
the analysis itself lives in the library modules of tools/ that each command calls. tools/cli.py lists the
commands in their --help order."""
