"""`hloexec run --spmd / --partitions N / --replicas R / --ray`: every participant of a partitioned module, the
collectives between them; per output, the devices that agree grouped (on Ray workers by digests: no array
moves), and whether the outputs meant to be replicated agree."""

from __future__ import annotations

import hashlib
import sys

import numpy as np

from ..arrays import array_summary, flatten
from ..compare import is_float
from ..common import EXIT_MISMATCH, EXIT_OK, JSON_VERSION, SUMMARY_HEADER, inputs_text, print_json, summary_row
from ..participants import spmd_outputs
from ..stats import human_bytes
from ..xla_cpu import save_arrays


def output_groups(index: int, per_device: list) -> list[dict]:
    """An output's per-device summaries, devices with equal values grouped: [{devices, summary}, ...] (by a digest
    of each value: comparing every device's with every group's was quadratic, minutes for 4,096 devices that all
    differ)."""
    groups: dict[bytes, dict] = {}
    for d, value in enumerate(per_device):
        groups.setdefault(_equality_digest(value), {"devices": [], "value": value})["devices"].append(d)
    return [{"devices": g["devices"], "summary": array_summary(index, g["value"])} for g in groups.values()]


def _equality_digest(value) -> bytes:
    """Equal for values np.array_equal(equal_nan=True) finds equal: same shape and dtype, -0.0 as 0.0, every NaN
    as one."""
    a = np.ascontiguousarray(value)
    if is_float(a.dtype) or a.dtype.kind == "c":
        zero = np.zeros((), a.dtype)
        a = np.ascontiguousarray(np.where(np.isnan(a), np.array(np.nan, a.dtype), a + zero))
    h = hashlib.blake2b(f"{a.shape} {a.dtype.str} {a.dtype.name}".encode(), digest_size=16)
    h.update(a.reshape(-1).view(np.uint8).data)
    return h.digest()


def remote_output_groups(outputs) -> list[list[dict]]:
    """output_groups for outputs left on Ray workers (a RayOutputs): devices grouped by their digests (the
    same bytes), each group's summary made by a worker that holds it; no array moves."""
    digests = [flatten(d) for d in outputs.digests()]
    groups: list[list[list[int]]] = []
    for i in range(len(digests[0])):
        by_digest: dict = {}
        for d, leaves in enumerate(digests):
            by_digest.setdefault(leaves[i], []).append(d)
        groups.append(list(by_digest.values()))
    requests: dict[int, list[int]] = {}
    for i, output in enumerate(groups):
        for devices in output:
            requests.setdefault(devices[0], []).append(i)
    summaries = outputs.apply(array_summary, requests)
    return [
        [{"devices": devices, "summary": summaries[devices[0]][i]} for devices in output]
        for i, output in enumerate(groups)
    ]


def run_spmd(exe, args, text_out, seconds: dict) -> int:
    """`hloexec run --spmd / --partitions N / --replicas R`: every participant, collectives between them."""
    from ... import spmd  # the executor: not at startup

    counts, outputs, assemble = spmd_outputs(exe, args, text_out)
    seconds["execute"] = counts.pop("execute_seconds")
    if isinstance(outputs, list):
        per_device = [flatten(out) for out in outputs]
        groups = [output_groups(i, [leaves[i] for leaves in per_device]) for i in range(len(per_device[0]))]
    else:
        groups = remote_output_groups(outputs)
    problems = spmd.check_replicated(exe.module, outputs)
    checked = sum(
        1
        for s, output in zip(spmd.output_shardings(exe.module), groups)
        if spmd.agreeing_groups(s, counts["devices"], len(output[0]["summary"]["shape"]))
    )
    nan_found = any(g["summary"]["nan"] for output in groups for g in output)
    if args.out is not None:  # with --ray: gathers every device's outputs here
        arrays = {f"out{i}": a for i, a in enumerate(flatten(assemble()))}
        arrays.update({f"dev{d}/out{i}": a for d, out in enumerate(outputs) for i, a in enumerate(flatten(out))})
        save_arrays(args.out, arrays)
    replicated = {"outputs_checked": checked, "agree": not problems, "problems": problems}
    if args.json:
        print_json(
            {
                "command": "run",
                "version": JSON_VERSION,
                "file": args.file,
                "module": exe.module.name,
                "spmd": counts,
                "seconds": seconds,
                "replicated": replicated,
                "nan_found": nan_found,
                "outputs": [{"index": i, "devices_agree": len(g) == 1, "per_device": g} for i, g in enumerate(groups)],
                "out": args.out,
            }
        )
    else:
        n = counts["devices"]
        print(
            f"module {exe.module.name}: {counts['partitions']} partitions x {counts['replicas']} replicas, "
            f"{len(groups)} output{'s' if len(groups) != 1 else ''} per device, inputs " + inputs_text(args)
        )
        print(f"{'out':>4}  {'devices':<16} {SUMMARY_HEADER}")
        for i, output in enumerate(groups):
            if len(output) > 1:  # devices differ: one line, min/max over all of them
                s = _across_devices(i, output)
                devices = f"{spmd.device_ranges(list(range(n)))} ({len(output)} values)"
            else:
                s, devices = output[0]["summary"], spmd.device_ranges(output[0]["devices"])
            print(f"{i:>4}  {devices:<16} {summary_row(s)}")
        if problems:
            print(f"replicated outputs: {len(problems)} disagreement{'s' if len(problems) != 1 else ''}")
            for line in problems:
                print(f"  {line}")
        else:
            print(
                f"replicated outputs: {checked} output{'s' if checked != 1 else ''} meant to agree across devices "
                f"(by their shardings) agree exactly"
            )
        print(
            f"time: parse {seconds['parse'] * 1e3:.1f} ms, prepare {seconds['prepare'] * 1e3:.1f} ms, "
            f"execute {seconds['execute']:.2f} s ({n} participants)"
        )
        if "ray" in counts:
            moved, workers = counts["ray"]["bytes_moved"], counts["ray"]["workers"]
            print(
                f"ray: {len(workers)} workers on {len({w['node'] for w in workers})} node(s); moved between "
                f"workers {human_bytes(moved['object_store'])} through the object store, "
                f"{human_bytes(moved['actor_calls'])} in actor calls ({human_bytes(moved['between_nodes'])} between "
                f"nodes); inputs put {human_bytes(moved['inputs'])}, outputs fetched "
                f"{human_bytes(moved['outputs_fetched'])}; peak RSS per worker "
                + ", ".join(human_bytes(w["peak_rss_bytes"]) for w in workers)
            )
        if args.out is not None:
            print(f"outputs written to {args.out} (out{{i}} global, dev{{d}}/out{{i}} per device)")
    if problems:
        print(f"error: {len(problems)} replicated output(s) disagree across devices", file=sys.stderr)
        return EXIT_MISMATCH
    if nan_found and args.fail_on_nan:
        print("error: NaN in the outputs (--fail-on-nan)", file=sys.stderr)
        return EXIT_MISMATCH
    return EXIT_OK


def _across_devices(index: int, output: list[dict]) -> dict:
    """One summary line for an output whose devices hold different values: extremes over all devices,
    the mean of their means (every device's array has the same size)."""
    summaries = [g["summary"] for g in output for _ in g["devices"]]
    present = [s for s in summaries if s["min"] is not None]
    first = summaries[0]
    same_shape = all(s["shape"] == first["shape"] for s in summaries)
    # float(): array_summary gives infinities as the strings "inf"/"-inf" (JSON has none)
    return {
        "index": index,
        "shape": first["shape"] if same_shape else "varies",
        "dtype": first["dtype"],
        "min": min((float(s["min"]) for s in present), default=None),
        "max": max((float(s["max"]) for s in present), default=None),
        "mean": sum(float(s["mean"]) for s in present) / len(present) if present else None,
        "nan": sum(s["nan"] for s in summaries),
        "inf": sum(s["inf"] for s in summaries),
    }
