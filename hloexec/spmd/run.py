"""SPMD runs: every participant (replica, partition) of a partitioned module, collectives between them: as threads
of this process (hloexec.spmd.communicators) or in the actors of a Ray cluster (hloexec.spmd.ray_runner)."""

from __future__ import annotations

import sys
import warnings

from ..errors import ExecutionError, OptionError
from ..options import available_memory
from ..kernels.threads import CORES
from .communicators import Mailboxes, run_mirrored, run_participants
from .devices import device_counts
from .identical import why_not_identical
from .memory import check_fits, gb, memory_estimate, run_groups
from .ray_runner import run_on_ray
from .shardings import GlobalInputs


def run_spmd(
    exe,
    per_device_inputs,
    partitions: int | None = None,
    replicas: int | None = None,
    *,
    runner: str = "threads",
    ray_address: str | None = None,
    participants_per_worker: int | None = None,
    timeout: float = 900.0,
    check_memory: bool = True,
    memory_limit: int | None = None,
    concurrency: int | None = None,
    report=None,
    observe=None,
    observe_operands: bool = False,
    observed=None,
    mirror_identical: bool = False,
    groups=None,
):
    """Run all participants; returns their outputs indexed by global device id.

    `per_device_inputs`: one input list per device (global id order), a dict {device id: inputs}, or
    `GlobalInputs` (global arrays or a seed, split by the parameters' shardings where the participants run).
    `report(message)` receives what the run says before starting (inferred counts, memory); default stderr.
    Raises ExecutionError naming the device when a participant fails, when collectives mismatch or
    deadlock, or when the estimated memory exceeds what the machine has available (the working memory
    beyond the already loaded inputs against MemAvailable), or the module's `max_memory` (Options.max_memory:
    the total): MemoryLimitError. `memory_limit`: a deprecated name of max_memory, overriding the module's.
    At most `concurrency` participants compute at a time (default: the CPU count; the others wait at
    their start or in collectives), which bounds the op temporaries the estimate does not count.
    `observe(device id, inst, value[, operands])`: as Executable.run's `observe`, called from each participant's
    thread with its global device id first (threads only); `observed` (device ids): only those participants are
    observed, the others run as unobserved runs do (fusions compiled).
    `mirror_identical`: participants that compute the same (hloexec.spmd.identical) run as device 0 alone, its
    outputs every participant's (observed as device 0; said). `groups`: lists of device ids that take turns
    (Mailboxes: one group computes while the others wait at their start or at a collective reaching across
    groups; the same results), or "auto": memory.run_groups' when all together would not fit (said).
    `runner="ray"`: the participants run in the actors of a Ray cluster (`ray_address`: None starts a local
    instance, or joins the one this process is connected to; "auto", "ray://host:port" or "host:port" joins
    a cluster), `participants_per_worker` to an actor; the outputs stay on the workers (a RayOutputs: see
    hloexec.spmd.ray_runner).
    """
    say = report or (lambda message: print(message, file=sys.stderr))
    if memory_limit is not None:
        warnings.warn(
            "run_spmd(memory_limit=) is the options' max_memory now: hloexec.load(..., max_memory=BYTES)",
            DeprecationWarning,
            stacklevel=3,
        )
    max_memory = exe.max_memory if memory_limit is None else memory_limit
    P, R, note = device_counts(exe.module, partitions, replicas)
    if note:
        say(note)
    n = P * R
    if isinstance(per_device_inputs, dict):
        per_device_inputs = [per_device_inputs[d] for d in range(n)]
    if not isinstance(per_device_inputs, GlobalInputs) and len(per_device_inputs) != n:
        raise ExecutionError(
            f"{n} participants ({P} partitions x {R} replicas) need {n} input lists, got {len(per_device_inputs)}"
        )
    if runner == "ray":
        if observe is not None:
            raise ExecutionError("observe runs in this process: it follows participants run as threads, not Ray actors")
        return run_on_ray(
            exe,
            per_device_inputs,
            P,
            R,
            ray_address=ray_address,
            participants_per_worker=participants_per_worker,
            timeout=timeout,
            max_memory=max_memory,
            check_memory=check_memory,
            concurrency=concurrency,
            report=say,
        )
    if runner != "threads":
        raise OptionError("runner", runner, ("threads", "ray"))
    if ray_address is not None or participants_per_worker is not None:
        raise ExecutionError("ray_address and participants_per_worker are options of runner='ray'")
    if isinstance(per_device_inputs, GlobalInputs):
        per_device_inputs = per_device_inputs.split(exe.module, n)
    per_device_inputs, groups = _fitting_threads(
        exe, per_device_inputs, P, R, mirror_identical, groups, concurrency, max_memory, check_memory, say
    )
    if len(per_device_inputs) < n:  # participants that compute the same: device 0's run is each one's
        seen = observe if observed is None or 0 in observed else None
        return [run_mirrored(exe, per_device_inputs[0], P, R, seen, observe_operands)] * n
    mailboxes = Mailboxes(range(n), timeout=timeout, compute_slots=concurrency or CORES, groups=groups)
    watch = {"observe": observe, "observe_operands": observe_operands, "observed": observed}
    outputs = run_participants(exe, dict(enumerate(per_device_inputs)), P, R, mailboxes, **watch)
    leftover = mailboxes.undelivered()
    if leftover:
        raise ExecutionError(
            "payloads sent but never received (replica groups disagree across devices):\n  "
            + "\n  ".join(leftover[:10])
        )
    return [outputs[d] for d in range(n)]


def _spans(group: list[int]) -> str:
    """{0..7} for a run of ids, else {0,8}."""
    if len(group) > 2 and group == list(range(group[0], group[-1] + 1)):
        return f"{{{group[0]}..{group[-1]}}}"
    return "{" + ",".join(map(str, group)) + "}"


def _fitting_threads(exe, per_device_inputs, P, R, mirror_identical, groups, concurrency, max_memory, check, say):
    """(the input lists of the participants that run: device 0's alone when they compute the same and
    `mirror_identical`, the groups they take turns in or None): the memory estimate said, and checked (`check`)."""
    if isinstance(groups, str) and groups != "auto":
        raise OptionError("groups", groups, ("auto",))  # or lists of device ids
    n = P * R
    why_not = why_not_identical(exe, per_device_inputs, P, R) if mirror_identical else "not asked"
    if why_not is None:
        say(f"the {n} participants compute the same (equal inputs, equal values made from their ids): device 0 runs")
        per_device_inputs = per_device_inputs[:1]
    memory = memory_estimate(exe, per_device_inputs, concurrency, counts=(P, R))
    available = available_memory()
    if groups == "auto":
        limit = max_memory if max_memory is not None else available
        fits = why_not is None or limit is None or memory["total"] <= limit
        groups = None if fits else run_groups(exe, P, R)
    if groups is not None:
        memory = memory_estimate(exe, per_device_inputs, concurrency, groups, (P, R))
        say(f"the participants take turns in {len(groups)} groups: " + " ".join(_spans(g) for g in groups))
    running = len(per_device_inputs)
    say(
        f"{running} participant{'s' if running > 1 else ''}: {gb(memory['per_device_peak'])} peak each; inputs "
        f"{gb(memory['inputs'])} ({gb(memory['inputs_unshared'])} unshared), {gb(memory['work'])} working memory; "
        f"{gb(available) if available is not None else 'unknown'} available"
    )
    if check:
        check_fits(exe.module.name, memory, max_memory, available)
    return per_device_inputs, groups
