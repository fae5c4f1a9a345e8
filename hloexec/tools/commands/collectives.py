"""`hloexec collectives`: collective traffic, groups, bytes, estimated times (tools/collectives.py)."""

from __future__ import annotations

from .. import costmodel
from ..common import (
    EXIT_OK,
    JSON_VERSION,
    add_subparser,
    described_device_count,
    load_module,
    non_negative_float,
    positive_float,
    positive_int,
    print_json,
)


def add_parser(subparsers, parents) -> None:
    p = add_subparser(
        subparsers,
        "collectives",
        "Collective traffic: groups, bytes, algorithm volume, estimated times.",
        "  hloexec collectives gpt_16dev.hlo\n"
        "  hloexec collectives tpu_8dev.hlo --link ici-v5p --chip tpu-v5p\n"
        "  hloexec collectives step.hlo --bandwidth 100 --latency 2 --json | jq '.total_bytes'",
        [parents.common, parents.stages],
        "Per collective: its kind, its replica groups as device ids, its bytes per device (the buffer;\n"
        "the gathered result for all-gather, as nccl-tests and `hloexec stats` count), the bytes each\n"
        "device sends under a ring algorithm, and a latency-bandwidth time on a named link. Totals per\n"
        "kind and per group; the critical collectives (time not hidden behind the compute an async\n"
        "start/done pair encloses, by a roofline on --chip). Links:\n"
        + "\n".join(
            f"  {k:<9}{v.name}: {v.bandwidth / 1e9:g} GB/s, {v.latency * 1e6:g} us/step"
            for k, v in costmodel.LINKS.items()
        )
        + "\nChips: "
        + ", ".join(costmodel.CHIPS),
    )
    p.add_argument("file", metavar="FILE")
    add_model_options(p)
    p.add_argument(
        "--link",
        choices=sorted(costmodel.LINKS),
        default=costmodel.DEFAULT_LINK,
        help=f"link preset (default {costmodel.DEFAULT_LINK})",
    )
    p.add_argument(
        "--bandwidth", type=positive_float, metavar="GB/s", help="link bandwidth each way per device (overrides)"
    )
    p.add_argument(
        "--latency", type=non_negative_float, metavar="US", help="link latency per algorithm step (overrides)"
    )
    p.add_argument("--top", type=positive_int, default=40, metavar="N", help="collectives listed (default 40)")
    p.set_defaults(handler=run)


def add_model_options(p) -> None:
    """--module, --partitions, --replicas, --chip: what the traffic reports and exports share."""
    p.add_argument("--module", metavar="NAME", help="the module to use when the file holds several")
    p.add_argument(
        "--partitions",
        type=described_device_count,
        metavar="N",
        help="partitions per replica (default: header or inferred)",
    )
    p.add_argument(
        "--replicas", type=described_device_count, metavar="R", help="replicas (default: header or inferred)"
    )
    p.add_argument(
        "--chip",
        choices=sorted(costmodel.CHIPS),
        default=costmodel.DEFAULT_CHIP,
        help=f"device for the compute roofline (default {costmodel.DEFAULT_CHIP})",
    )


def run(args) -> int:
    from ..collectives import collectives_report, format_report  # the executor: not at startup

    module, _ = load_module(args)
    r = collectives_report(
        module,
        args.file,
        args.partitions,
        args.replicas,
        args.link,
        args.chip,
        args.bandwidth * 1e9 if args.bandwidth is not None else None,
        args.latency * 1e-6 if args.latency is not None else None,
    )
    if args.json:
        print_json({"command": "collectives", "version": JSON_VERSION, **r.to_dict()})
    else:
        print(format_report(r, args.top))
    return EXIT_OK
