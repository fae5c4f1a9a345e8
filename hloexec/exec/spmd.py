"""SPMD runs: every participant (replica, partition) of a partitioned module, collectives between them.

The participants run as threads of this process (numpy, BLAS and the Numba kernels release the GIL),
sharing one prepared plan: ops that depend on the device (partition-id, replica-id, the collectives)
read `ctx.device`, which each thread sets to its own `Device`. Their collectives meet in shared
`Mailboxes` (hloexec.exec.communicators). Global device ids are XLA's flattened ids,
replica * num_partitions + partition.

Inputs are per-device lists, or global arrays split by the entry parameters' `sharding`
(`split_global`); outputs go back to global arrays by the output shardings (`assemble_global`): the
ROOT's `sharding`, else, for an output aliased to a parameter (input_output_alias), that parameter's.
`check_replicated` says where outputs that should agree across devices do not.
"""
from __future__ import annotations

import functools
import math
import re
import sys
import threading
from dataclasses import dataclass

import numpy as np

from ..errors import ExecutionError
from ..kernels.threads import CORES
from .executor import available_memory
from ..ir.attributes import Sharding
from ..ir.module import Module
from ..ir.shape import Shape, array_shape
from ..ir.shardy import module_meshes, sharding_of
from ..ops.tiles import assemble_global, global_shape, split_global, tile_layout  # noqa: F401  (spmd API)
from .communicators import Mailboxes
from .context import Device
from .inputs import from_npz_void

_GROUPED = ("all-reduce", "all-reduce-start", "all-gather", "all-gather-start", "reduce-scatter", "all-to-all",
            "ragged-all-to-all", "collective-broadcast", "collective-permute", "collective-permute-start", "send",
            "recv")


# -- how many participants ------------------------------------------------------------------------------
def device_counts(module: Module, partitions: int | None = None, replicas: int | None = None):
    """(partitions, replicas, note): given, else from the header (where one given or one in the header
    leaves the other at the header's value or XLA's default, 1), else inferred from the largest ids in
    replica groups, source_target_pairs and shardings (note then says so; None otherwise)."""
    from ..ops.collectives import SEND_RECV_PAIRS, group_mode
    from ..ops.registry import async_shorthand
    header_p, header_r = module.attrs.get("num_partitions"), module.attrs.get("replica_count")
    if any(v is not None for v in (partitions, replicas, header_p, header_r)):
        partitions = partitions if partitions is not None else int(header_p if header_p is not None else 1)
        replicas = replicas if replicas is not None else int(header_r if header_r is not None else 1)
        return partitions, replicas, None
    most = {"partition": 0, "replica": 0, "device": 0}
    for inst in module.instructions():
        shorthand = async_shorthand(inst.opcode)            # all-to-all-start: an async all-to-all
        if (shorthand[1] if shorthand else inst.opcode) in _GROUPED:
            mode = group_mode(inst)
            kind = {"flattened": "device", "cross_partition": "partition"}.get(mode, "replica")
            ids = [i for g in (inst.attr("replica_groups").groups if "replica_groups" in inst.attrs else ())
                   for i in g]
            ids += [i for pair in inst.attr("source_target_pairs", ()) for i in pair]
            pairs = (inst.attr("frontend_attributes") or {}).get(SEND_RECV_PAIRS)
            if pairs is not None:
                ids += [int(i) for i in re.findall(r"\d+", pairs)]
            most[kind] = max([most[kind], *(i + 1 for i in ids)])
        if "sharding" in inst.attrs:
            most["partition"] = max(most["partition"], *(d + 1 for d in _sharding_devices(inst.attr("sharding"))))
    for mesh in module_meshes(module).values():        # Shardy's meshes (pre-partition modules)
        most["partition"] = max(most["partition"], max(mesh.devices, default=0) + 1)
    inferred_r = max(most["replica"], 1)
    inferred_p = max(most["partition"], -(-most["device"] // inferred_r), 1)
    note = (f"{module.name}: no num_partitions/replica_count in the header; running {inferred_p} partitions x "
            f"{inferred_r} replicas, from the largest device ids in its replica groups, source_target_pairs "
            f"and shardings (set partitions=/replicas= to override)")
    return inferred_p, inferred_r, note


def device_ranges(devices) -> str:
    """[0,1,2,3,8] -> '0-3,8'."""
    runs: list[list[int]] = []
    for d in sorted(devices):
        if runs and d == runs[-1][-1] + 1:
            runs[-1].append(d)
        else:
            runs.append([d])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _sharding_devices(sharding: Sharding):
    if sharding.kind == "tuple":
        return [d for e in sharding.elements for d in _sharding_devices(e)] or [0]
    if sharding.kind == "maximal":
        return [sharding.device]
    return list(sharding.devices) or [0]


# -- splitting and assembling by sharding ---------------------------------------------------------------
def parameter_shardings(module: Module) -> list[Sharding | None]:
    return [sharding_of(p) for p in module.entry.parameters]


def _root_shardings(module: Module, n: int) -> list[Sharding | None]:
    root = module.entry.root
    s = sharding_of(root)
    if s is None:
        return [None] * n
    return list(s.elements) if s.kind == "tuple" and root.shape.is_tuple else [s] * n


def output_shardings(module: Module, pre_partition: Module | None = None) -> list[Sharding | None]:
    """One per output leaf of a tuple ROOT (or one for an array ROOT): the ROOT's sharding, else the
    sharding of the parameter an output is aliased to (a donated buffer keeps its sharding), else the
    ROOT sharding of `pre_partition`, the same program before SPMD partitioning (XLA:CPU's optimized
    text drops the ROOT's sharding; jax's pre-optimization HLO keeps explicit out_shardings), else None."""
    root = module.entry.root
    n = len(root.shape.tuple_shapes) if root.shape.is_tuple else 1
    shardings = _root_shardings(module, n)
    params = parameter_shardings(module)
    for alias in module.attr("input_output_alias", ()) or ():
        index = alias.output_index[0] if alias.output_index else 0
        if len(alias.output_index) <= 1 and not alias.parameter_index and shardings[index] is None:
            shardings[index] = params[alias.parameter]
    if pre_partition is not None:
        before = _root_shardings(pre_partition, n)
        shardings = [s if s is not None else b for s, b in zip(shardings, before)]
    return shardings


def split_inputs(module: Module, global_inputs, num_devices: int, devices=None) -> list[list]:
    """Per-device input lists from global inputs, split by the entry parameters' shardings: for every
    device, or for `devices` only (a list of ids: their input lists, in that order)."""
    params = module.entry.parameters
    if len(global_inputs) != len(params):
        raise ExecutionError(f"{module.name} takes {len(params)} inputs, got {len(global_inputs)}")
    wanted = None if devices is None else set(devices)
    pieces = [split_global(v if p.shape.is_tuple else from_npz_void(v, p.shape.dtype), s, p.shape, num_devices,
                           wanted)
              for v, s, p in zip(global_inputs, parameter_shardings(module), params)]
    return [[piece[d] for piece in pieces] for d in (range(num_devices) if devices is None else devices)]


@dataclass(frozen=True)
class GlobalInputs:
    """Global entry arguments for `run_spmd`, split by the parameters' shardings where the participants
    run (a Ray worker splits them for its own devices): `values`, or random ones from `seed`
    (random_global_inputs: what `random_inputs` splits)."""
    values: list | None = None
    seed: int | None = None

    def split(self, module: Module, num_devices: int, devices=None) -> list[list]:
        values = self.values if self.values is not None else random_global_inputs(module, self.seed or 0)
        return split_inputs(module, values, num_devices, devices)


def assemble_outputs(module: Module, per_device_outputs: list, global_shapes=None,
                     pre_partition: Module | None = None):
    """Global outputs (a tuple for a tuple ROOT) from per-device ones, by `output_shardings`;
    `global_shapes` (one per output) crops the padding of unevenly tiled outputs."""
    shardings = output_shardings(module, pre_partition)
    if not module.entry.root.shape.is_tuple:
        return assemble_global(per_device_outputs, shardings[0], global_shapes[0] if global_shapes else None)
    shapes = global_shapes or [None] * len(shardings)
    return tuple(assemble_global([out[i] for out in per_device_outputs], s, g)
                 for i, (s, g) in enumerate(zip(shardings, shapes)))


def random_global_inputs(module: Module, seed: int = 0) -> list:
    """A random global value per entry parameter: the per-device shape times its sharding's tile counts."""
    from .domains import input_domains
    from .inputs import check_inputs_fit, random_value
    rng = np.random.default_rng(seed)
    domains = input_domains(module)
    params = module.entry.parameters
    shapes = [p.shape if p.shape.is_tuple else array_shape(p.shape.element_type.name, global_shape(p.shape, s))
              for p, s in zip(params, parameter_shardings(module))]
    check_inputs_fit(module.name, shapes)
    return [random_value(full, rng, domains.get(p.parameter_number)) for p, full in zip(params, shapes)]


def random_inputs(module: Module, num_devices: int, seed: int = 0) -> list[list]:
    """Per-device random inputs that are consistent: a global value per parameter, split by its sharding
    (replicated parameters shared), so outputs meant to be replicated can be checked for agreement."""
    return split_inputs(module, random_global_inputs(module, seed), num_devices)


# -- memory ---------------------------------------------------------------------------------------------
def memory_estimate(exe, per_device_inputs, concurrency: int | None = None) -> dict:
    """Bytes N participants need at peak: N x (per-device peak of stored values - inputs), what the steps
    hold while they run (scratch) for the `concurrency` participants that compute at a time (default: the
    cores), and the distinct inputs.

    `per_device_inputs`: the input lists (their distinct arrays are counted), or a participant count N
    (inputs counted as `split_inputs` would share them: see sharded_input_bytes).

    Scratch (f32 copies of f16 operands, a fusion's op-by-op first run) lives only while a kernel runs;
    counting it for all N participants at once refused the 16-device GPT seed (32 GB estimated, 11.6 GB
    measured), counting it for the running ones matches the measurement."""
    if isinstance(per_device_inputs, int):
        n, input_bytes = per_device_inputs, sharded_input_bytes(exe.module, per_device_inputs)
    else:
        n = len(per_device_inputs)
        leaves = [list(_leaves(inputs)) for inputs in per_device_inputs]
        distinct = {id(a): a.nbytes for device in leaves for a in device if isinstance(a, np.ndarray)}
        input_bytes = sum(distinct.values())
    per_device_inputs_bytes = sum(p.shape.nbytes for p in exe.module.entry.parameters)
    per_device_peak = exe.peak_bytes()
    stored_peak = exe.plan.memory.peak_bytes(scratch=False)
    running = min(n, concurrency or CORES)
    work = n * max(stored_peak - per_device_inputs_bytes, 0) + running * (per_device_peak - stored_peak)
    return {"participants": n, "per_device_peak": per_device_peak, "inputs": input_bytes,
            "inputs_unshared": n * per_device_inputs_bytes, "work": work, "total": work + input_bytes}


def sharded_input_bytes(module: Module, num_devices: int, devices=None) -> int:
    """Bytes of the distinct input buffers `split_inputs` makes for `num_devices` participants (or for the
    participants `devices` of them: a Ray worker's): one per replicated (or unsharded, or maximal)
    parameter, one per distinct tile of a tiled one (devices of a replicated subgroup share theirs)."""
    wanted = None if devices is None else set(devices)

    def distinct(shape: Shape, sharding: Sharding | None) -> int:
        if shape.is_tuple:
            elements = sharding.elements if sharding is not None and sharding.kind == "tuple" \
                else [sharding] * len(shape.tuple_shapes)
            return sum(distinct(sub, s) for sub, s in zip(shape.tuple_shapes, elements))
        if sharding is None or sharding.kind != "tiled":
            return shape.nbytes
        counts, tile_devices = tile_layout(sharding, shape.rank)
        if wanted is None:
            return min(math.prod(counts), num_devices) * shape.nbytes
        return len({index[:shape.rank] for index in np.ndindex(tile_devices.shape)
                    if int(tile_devices[index]) in wanted}) * shape.nbytes
    return sum(distinct(p.shape, s) for p, s in zip(module.entry.parameters, parameter_shardings(module)))


def _leaves(value):
    if isinstance(value, (tuple, list)):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def _gb(n: int) -> str:
    return f"{n / 2**30:.2f} GB"


# -- running --------------------------------------------------------------------------------------------
def run_spmd(exe, per_device_inputs, partitions: int | None = None, replicas: int | None = None, *,
             runner: str = "threads", ray_address: str | None = None, participants_per_worker: int | None = None,
             timeout: float = 900.0, check_memory: bool = True, memory_limit: int | None = None,
             concurrency: int | None = None, report=None, observe=None, observe_operands: bool = False):
    """Run all participants; returns their outputs indexed by global device id.

    `per_device_inputs`: one input list per device (global id order), a dict {device id: inputs}, or
    `GlobalInputs` (global arrays or a seed, split by the parameters' shardings where the participants run).
    `report(message)` receives what the run says before starting (inferred counts, memory); default stderr.
    Raises ExecutionError naming the device when a participant fails, when collectives mismatch or
    deadlock, or when the estimated memory exceeds what the machine has available (the working memory
    beyond the already loaded inputs against MemAvailable) or `memory_limit` (the total).
    At most `concurrency` participants compute at a time (default: the CPU count; the others wait at
    their start or in collectives), which bounds the op temporaries the estimate does not count.
    `observe(device id, inst, value[, operands])`: as Executable.run's `observe`, called from each participant's
    thread with its global device id first (threads only).

    `runner="ray"`: the participants run in the actors of a Ray cluster (`ray_address`: None starts a local
    instance, or joins the one this process is connected to; "auto", "ray://host:port" or "host:port" joins
    a cluster), `participants_per_worker` to an actor; the outputs stay on the workers (a RayOutputs: see
    hloexec.exec.ray_runner).
    """
    say = report or (lambda message: print(message, file=sys.stderr))
    P, R, note = device_counts(exe.module, partitions, replicas)
    if note:
        say(note)
    n = P * R
    if runner == "ray":
        if observe is not None:
            raise ExecutionError("observe runs in this process: it follows participants run as threads, not Ray actors")
        from .ray_runner import run_on_ray
        return run_on_ray(exe, per_device_inputs, P, R, ray_address=ray_address,
                          participants_per_worker=participants_per_worker, timeout=timeout, check_memory=check_memory,
                          memory_limit=memory_limit, concurrency=concurrency, report=say)
    if runner != "threads":
        raise ExecutionError(f"runner must be 'threads' or 'ray', not {runner!r}")
    if ray_address is not None or participants_per_worker is not None:
        raise ExecutionError("ray_address and participants_per_worker are options of runner='ray'")
    if isinstance(per_device_inputs, GlobalInputs):
        per_device_inputs = per_device_inputs.split(exe.module, n)
    if isinstance(per_device_inputs, dict):
        per_device_inputs = [per_device_inputs[d] for d in range(n)]
    if len(per_device_inputs) != n:
        raise ExecutionError(f"{n} participants ({P} partitions x {R} replicas) need {n} input lists, "
                             f"got {len(per_device_inputs)}")
    memory = memory_estimate(exe, per_device_inputs, concurrency)
    available = available_memory()
    say(f"{n} participants: {_gb(memory['per_device_peak'])} peak each; inputs {_gb(memory['inputs'])} "
        f"({_gb(memory['inputs_unshared'])} unshared), {_gb(memory['work'])} working memory; "
        f"{_gb(available) if available is not None else 'unknown'} available")
    if check_memory and memory_limit is not None and memory["total"] > memory_limit:
        raise ExecutionError(f"{n} participants need about {_gb(memory['total'])}, more than the {_gb(memory_limit)} "
                             f"allowed")
    if check_memory and memory_limit is None and available is not None and memory["work"] > available:
        raise ExecutionError(f"{n} participants need about {_gb(memory['work'])} beyond their inputs, the machine "
                             f"has {_gb(available)} available: run fewer participants per machine (docs/spmd.md)")

    mailboxes = Mailboxes(range(n), timeout=timeout, compute_slots=concurrency or CORES)
    outputs = run_participants(exe, dict(enumerate(per_device_inputs)), P, R, mailboxes, observe=observe,
                               observe_operands=observe_operands)
    leftover = mailboxes.undelivered()
    if leftover:
        raise ExecutionError("payloads sent but never received (replica groups disagree across devices):\n  "
                             + "\n  ".join(leftover[:10]))
    return [outputs[d] for d in range(n)]


def run_participants(exe, inputs: dict, P: int, R: int, mailboxes: Mailboxes, *, observe=None,
                     observe_operands: bool = False) -> dict:
    """Run the participants `inputs` names (device id -> input list) as threads meeting in `mailboxes`;
    returns device id -> outputs (`observe`: as run_spmd's). Raises ExecutionError naming the device that
    failed first."""
    outputs: dict = {}
    errors: dict[int, BaseException] = {}

    def participant(d: int):
        device = Device(replica_id=d // P, partition_id=d % P, num_replicas=R, num_partitions=P,
                        communicator=mailboxes.endpoint(d))
        exe.context.play(device)
        mailboxes.take_slot()
        try:
            seen = None if observe is None else functools.partial(observe, d)
            outputs[d] = exe.run(*inputs[d], observe=seen, observe_operands=observe_operands)
            mailboxes.finish(d)
        except BaseException as e:  # noqa: BLE001  (reported below, with the device)
            errors[d] = e
            mailboxes.fail(d, e)
        finally:
            mailboxes.give_slot()

    threads = [threading.Thread(target=participant, args=(d,), name=f"hloexec-device-{d}") for d in inputs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if mailboxes.failure is not None:
        d, e = mailboxes.failure
        raise ExecutionError(f"device {d} (replica {d // P}, partition {d % P}) failed: {e}") from e
    if errors:
        d, e = next(iter(errors.items()))
        raise ExecutionError(f"device {d} failed: {e}") from e
    return outputs


# -- checks ---------------------------------------------------------------------------------------------
def agreeing_groups(sharding: Sharding | None, num_devices: int, rank: int) -> list[list[int]]:
    """Sets of devices that must hold the same value of an output with this sharding."""
    if sharding is None:
        return []
    if sharding.kind == "replicated":
        return [list(range(num_devices))]
    if sharding.kind != "tiled" or len(sharding.tile_dims) == rank \
            or any(kind != "replicated" for kind in sharding.last_tile_dims):
        return []
    _, devices = tile_layout(sharding, rank)
    by_tile = devices.reshape(math.prod(sharding.tile_dims[:rank]), -1)
    return [sorted(int(d) for d in row) for row in by_tile if len(row) > 1]


def check_replicated(module: Module, per_device_outputs: list, *, atol: float = 0.0) -> list[str]:
    """Where outputs meant to be equal across devices (by their output shardings) are not: one line per
    output and group, naming the devices and the largest difference. Empty when all agree.
    Outputs left on Ray workers (hloexec.exec.ray_runner.RayOutputs) are compared by the digests the
    workers make of them; only values whose digests differ are fetched, to measure the difference."""
    n = len(per_device_outputs)
    is_tuple = module.entry.root.shape.is_tuple
    digests = per_device_outputs.digests() if hasattr(per_device_outputs, "digests") else None
    first = (digests or per_device_outputs)[0]
    problems = []
    for i, sharding in enumerate(output_shardings(module)):
        pick = (lambda out: out[i]) if is_tuple else (lambda out: out)    # noqa: E731
        if isinstance(pick(first), tuple) or not hasattr(pick(first), "shape"):
            continue
        for group in agreeing_groups(sharding, n, len(pick(first).shape)):
            for d in group[1:]:
                if digests is not None and pick(digests[d]) == pick(digests[group[0]]):
                    continue
                diff = _max_diff(pick(per_device_outputs[group[0]]), pick(per_device_outputs[d]))
                if diff > atol:
                    problems.append(f"output {i} ({sharding.text or sharding.kind}): device {d} differs from "
                                    f"device {group[0]} by up to {diff:g}")
    return problems


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    if a.dtype == np.bool_ or a.dtype.kind in "iu":
        return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0.0))
    x, y = a.astype(np.float64), b.astype(np.float64)
    same = (x == y) | (np.isnan(x) & np.isnan(y))
    with np.errstate(invalid="ignore"):     # inf vs NaN: the difference is NaN, reported as such
        return float(np.max(np.where(same, 0.0, np.abs(x - y)), initial=0.0))
