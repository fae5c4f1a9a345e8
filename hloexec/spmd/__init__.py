"""SPMD runs: every participant (replica, partition) of a partitioned module, collectives between them.

This layer sits above exec/, which prepares a module and runs one participant of it (`Executable`); exec/ never
imports it: importing it fills `hloexec.exec.executor.spmd_layer` (use_spmd_layer), through which
`Executable.run_spmd` and the run of a pre-partition module's manual regions reach it (hloexec.load imports it).
Where it is imported to be installed, it is imported as `import hloexec.spmd`: `from hloexec import spmd` may give
a copy no longer in sys.modules (the package's attribute outlives it where sys.modules is restored, as pytester
does), whose import installed nothing in the executor module used now.

- how many participants (`devices.py`: device_counts, from the header or the ids the module names);
- per-device inputs from global ones and outputs back, by the shardings (`shardings.py`);
- whether they compute the same (`identical.py`: then one runs, mirrored);
- what they need (`memory.py`: the estimate, checked against the options' max_memory before a run);
- the participants as threads meeting in shared mailboxes (`communicators.py`, `run.py`: run_spmd), or in
  the actors of a Ray cluster (`ray_runner.py`; `placement.py`: which participants share an actor);
- a pre-partition module's manual regions, which need every participant (`manual.py`).
"""

from __future__ import annotations

from ..exec.executor import use_spmd_layer
from ..ops.tiles import assemble_global, global_shape, split_global, tile_layout
from .devices import device_counts, device_ranges
from .identical import why_not_identical
from .manual import PRE_PARTITION_HINT, run_with_manual_regions
from .memory import check_fits, largest_crossing, memory_estimate, run_groups, sharded_input_bytes
from .run import run_spmd
from .shardings import (
    GlobalInputs,
    agreeing_groups,
    assemble_outputs,
    check_replicated,
    holders,
    output_shardings,
    parameter_shardings,
    random_global_inputs,
    random_inputs,
    split_inputs,
)


class _Layer:
    """What exec/'s Executable asks of this layer (hloexec.exec.executor.SpmdLayer)."""

    run_spmd = staticmethod(run_spmd)
    run_with_manual_regions = staticmethod(run_with_manual_regions)


use_spmd_layer(_Layer())

__all__ = [
    "run_spmd",
    "run_with_manual_regions",
    "PRE_PARTITION_HINT",
    "device_counts",
    "why_not_identical",
    "device_ranges",
    "check_fits",
    "memory_estimate",
    "largest_crossing",
    "run_groups",
    "sharded_input_bytes",
    "GlobalInputs",
    "agreeing_groups",
    "assemble_outputs",
    "check_replicated",
    "holders",
    "output_shardings",
    "parameter_shardings",
    "random_global_inputs",
    "random_inputs",
    "split_inputs",
    "assemble_global",
    "global_shape",
    "split_global",
    "tile_layout",
]
