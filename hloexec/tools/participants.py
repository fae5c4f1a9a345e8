"""Who a command runs: one participant (entry arguments from --inputs / --seed), or with --spmd, --partitions,
--replicas or --ray every participant of an SPMD-partitioned module (hloexec.spmd), with its inputs per
device, the run of all of them and the numerics Runner that observes them. The executor's SPMD modules are
imported where a run needs them (every command's parser is built at startup)."""

from __future__ import annotations

import re
import sys
import time

from .arrays import flatten, read_arrays, read_values, values_of
from .common import UsageError, module_inputs


def numerics_runner(exe, args, text_out, global_inputs=None):
    """(Runner, inputs, inputs description) for the numerics commands: one participant with --inputs/--seed, or
    with --spmd all of them, inputs per device (from --inputs/--seed, or `global_inputs` split by sharding)."""
    from .shadow_runs import Runner  # the executor: not at startup

    if not is_spmd(args):
        if global_inputs is not None:
            return Runner(), global_inputs, None
        inputs, info = module_inputs(exe.module, args)
        return Runner(), inputs, info
    if args.ray is not None:
        raise UsageError(
            "--shadow, --find-nonfinite and numerics observe every participant from this process: "
            "run them as threads (--spmd), not with --ray"
        )
    partitions, replicas, note, say, inputs, info = spmd_setup(exe, args, text_out, global_inputs)
    return (
        Runner(
            {"partitions": partitions, "replicas": replicas, "report": say, "mirror_identical": True, "groups": "auto"}
        ),
        inputs,
        info,
    )


def is_spmd(args) -> bool:
    if args.participants_per_worker is not None and args.ray is None:
        raise UsageError("--participants-per-worker places participants in Ray actors: it needs --ray")
    return args.spmd or args.partitions is not None or args.replicas is not None or args.ray is not None


def global_arguments(exe, reference_exe, args) -> tuple[list, dict]:
    """Global entry arguments for a sharded module: --inputs with keys arg0..argN, or random ones of the
    reference (unsharded) module's shapes, else of the shapes the sharded parameters cover."""
    from .. import spmd

    if args.inputs is not None:
        # global arrays: their shapes are the sharded parameters' wholes
        return read_values(
            args.inputs, "arg", [p.shape for p in exe.parameters], what="entry arguments", check_shapes=False
        ), {"from": "npz", "path": args.inputs}
    values = (
        reference_exe.random_inputs(args.seed)
        if reference_exe is not None
        else spmd.random_global_inputs(exe.module, args.seed)
    )
    return values, {"from": "seed", "seed": args.seed}


def per_device_inputs(exe, args, num_devices: int) -> tuple:
    """Per-device entry arguments: an npz with dev{d}/arg{i} keys, or global arg{i} ones split by the
    parameters' shardings, or random global values (--seed) split the same way (with --ray: split by the
    workers, GlobalInputs)."""
    from .. import spmd

    if args.inputs is None:
        if args.ray is not None:
            return spmd.GlobalInputs(seed=args.seed), {"from": "seed", "seed": args.seed}
        return spmd.random_inputs(exe.module, num_devices, args.seed), {"from": "seed", "seed": args.seed}
    arrays = read_arrays(args.inputs, "arg")
    shapes = [p.shape for p in exe.parameters]
    if not any(key.startswith("dev") for key in arrays):
        inputs = values_of(arrays, args.inputs, "arg", shapes, what="entry arguments", check_shapes=False)
        split = (
            spmd.GlobalInputs(inputs) if args.ray is not None else spmd.split_inputs(exe.module, inputs, num_devices)
        )
        return split, {"from": "npz", "path": args.inputs, "split": "global arrays by sharding"}
    by_device: dict[int, dict] = {}
    for key, value in arrays.items():
        m = re.fullmatch(r"dev(\d+)/.*", key)
        if m is None:
            raise UsageError(f"{args.inputs}: unexpected key {key!r} (expected dev{{d}}/arg{{i}}, or arg{{i}} only)")
        by_device.setdefault(int(m.group(1)), {})[key] = value
    if sorted(by_device) != list(range(num_devices)):
        raise UsageError(
            f"{args.inputs}: inputs for devices {sorted(by_device)}; the run has devices 0..{num_devices - 1}"
        )
    inputs = [
        values_of(by_device[d], args.inputs, f"dev{d}/arg", shapes, what=f"entry arguments (dev{d})")
        for d in range(num_devices)
    ]
    return inputs, {"from": "npz", "path": args.inputs, "split": "per device"}


def spmd_setup(exe, args, text_out, global_inputs=None):
    """(partitions, replicas, the counts' note, say(message), per-device inputs, their description) of an SPMD
    run: counts from the flags or the module (the note, when inferred, is said at once: with --json on stderr);
    inputs from `global_inputs` split by sharding (where the participants run, with --ray), else from
    --inputs/--seed (per_device_inputs)."""
    from .. import spmd
    from ..spmd import PRE_PARTITION_HINT

    def say(message: str) -> None:  # with --json, on stderr
        print(message, file=text_out or sys.stderr, flush=True)

    if exe.manual_regions:
        raise UsageError(
            f"--spmd runs a per-device (SPMD-partitioned) module, and {exe.module.name} is not one: "
            + PRE_PARTITION_HINT
        )
    partitions, replicas, note = spmd.device_counts(exe.module, args.partitions, args.replicas)
    if note:
        say(note)
    n = partitions * replicas
    if args.ray is not None and (args.plugin or args.custom_call_identity):
        raise UsageError(
            "--plugin and --custom-call-identity register targets in this process, not in the Ray "
            "workers: to run them with --ray, install them as a package with an `hloexec.custom_calls` "
            "entry point (every worker loads those)"
        )
    if global_inputs is not None:
        per_device = (
            spmd.GlobalInputs(global_inputs)
            if args.ray is not None
            else spmd.split_inputs(exe.module, global_inputs, n)
        )
        return partitions, replicas, note, say, per_device, None
    return (partitions, replicas, note, say, *per_device_inputs(exe, args, n))


def spmd_outputs(exe, args, text_out, global_inputs=None, reference=None):
    """(counts, per-device outputs, assemble) of an SPMD run, what it says printed first; inputs from
    `global_inputs` split by sharding, else from --inputs/--seed (spmd_setup). `assemble()` gives the
    global outputs, assembled by the output shardings (the ones the `reference` module, the program before
    partitioning, annotates where the module has none), cropped to the reference's output shapes. With
    --ray the per-device outputs stay on the workers (a RayOutputs) until asked for."""
    from .. import spmd

    partitions, replicas, note, say, per_device, inputs_info = spmd_setup(exe, args, text_out, global_inputs)
    n = partitions * replicas
    ray = args.ray is not None
    runner = (
        {
            "runner": "ray",
            "ray_address": None if args.ray == "local" else args.ray,
            "participants_per_worker": args.participants_per_worker,
        }
        if ray
        else {}
    )
    start = time.perf_counter()
    outputs = exe.run_spmd(per_device, partitions=partitions, replicas=replicas, report=say, **runner)
    counts = {
        "partitions": partitions,
        "replicas": replicas,
        "devices": n,
        "note": note,
        "inputs": inputs_info,
        "runner": "ray" if ray else "threads",
        "memory": outputs.report["memory"] if ray else spmd.memory_estimate(exe, per_device),
        "execute_seconds": time.perf_counter() - start,
    }
    if ray:
        counts["ray"] = outputs.report
    global_shapes = [leaf.dims for _, leaf in reference.entry.root.shape.leaves()] if reference is not None else None
    if global_shapes is not None:
        for i, (sharding, got) in enumerate(zip(spmd.output_shardings(exe.module, reference), flatten(outputs[0]))):
            if sharding is None and tuple(got.shape) != tuple(global_shapes[i]):
                raise UsageError(
                    f"output {i} has no sharding in {exe.module.name} nor in the reference's ROOT, and "
                    f"its per-device shape {list(got.shape)} is not the reference's "
                    f"{list(global_shapes[i])}: cannot assemble it (give the reference's ROOT a "
                    f"sharding, e.g. jax's out_shardings in the pre-optimization HLO)"
                )
    return counts, outputs, lambda: spmd.assemble_outputs(exe.module, outputs, global_shapes, reference)
