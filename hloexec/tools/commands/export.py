"""`hloexec export`: a module for network simulators, Chakra traces and ASTRA-sim text (tools/export.py)."""

from __future__ import annotations


from .. import costmodel
from ..common import EXIT_OK, JSON_VERSION, UsageError, add_subparser, load_module, output_file, print_json, require
from ..stats import human_bytes
from ..xla_cpu import open_output
from .collectives import add_model_options


def add_parser(subparsers, parents) -> None:
    p = add_subparser(
        subparsers,
        "export",
        "Export a module to network simulators: Chakra traces, ASTRA-sim text.",
        "  hloexec export gpt_16dev.hlo --chakra traces/     # traces/<module>.<d>.et + .comm_group.json\n"
        "  hloexec export gpt_16dev.hlo --astra-sim workload.txt --chip h100\n"
        "  hloexec export tpu_8dev.hlo --astra-sim w.txt --chakra et/ --chip tpu-v5p --json",
        [parents.common, parents.stages],
        "--chakra DIR: ASTRA-sim 2.0's input, one Chakra execution trace per device and the communicator\n"
        "groups (needs protobuf: pip install 'hloexec[chakra]'). --astra-sim OUT.txt: an ASTRA-sim 1.0 /\n"
        "SimAI text workload, a row per layer found in op_name paths. Compute times from a roofline on\n"
        "--chip (" + ", ".join(costmodel.CHIPS) + "); the assumptions are printed first.",
    )
    p.add_argument("file", metavar="FILE")
    add_model_options(p)
    p.add_argument("--chakra", metavar="DIR", help="write Chakra execution traces (.et per device) into DIR")
    p.add_argument(
        "--astra-sim", dest="astra_sim", type=output_file, metavar="OUT", help="write an ASTRA-sim 1.0 text workload"
    )
    p.set_defaults(handler=run)


def run(args) -> int:
    if not args.chakra and not args.astra_sim:
        raise UsageError("export needs --chakra DIR and/or --astra-sim OUT.txt")
    if args.chakra:
        require("google.protobuf", "chakra", "--chakra")
    from ..export import ASTRA_ASSUMPTIONS, astra_sim_text, program, write_chakra  # the executor: not at startup

    module, _ = load_module(args)
    p = program(module, args.partitions, args.replicas, args.chip)
    doc = {
        "command": "export",
        "version": JSON_VERSION,
        "file": args.file,
        "module": module.name,
        "devices": p.devices,
        "chip": p.report.chip.to_dict(),
        "assumptions": list(p.assumptions),
    }
    if args.astra_sim:
        text, summary = astra_sim_text(p)
        with open_output(args.astra_sim) as f:
            f.write(text)
        doc["astra_sim"] = {"path": args.astra_sim, **summary}
        doc["assumptions"] += ASTRA_ASSUMPTIONS + summary["left_out"]
    if args.chakra:
        doc["chakra"] = write_chakra(p, args.chakra)
    if args.json:
        print_json(doc)
        return EXIT_OK
    print(f"module {module.name}: {len(p.events)} instructions in the entry schedule, {p.devices} devices")
    print("assumptions:")
    for a in doc["assumptions"]:
        print(f"  - {a}")
    if args.astra_sim:
        s = doc["astra_sim"]
        print(
            f"ASTRA-sim text: {args.astra_sim}: {s['rows']} rows ({s['layers']} layers), model_parallel_NPU_group "
            f"{s['model_parallel_NPU_group']}, compute (ns) fwd {s['compute_ns']['fwd']} ig {s['compute_ns']['ig']} "
            f"wg {s['compute_ns']['wg']} update {s['update_ns']}; "
            + ", ".join(f"{k} {human_bytes(v)}" for k, v in s["comm_bytes"].items())
        )
    if args.chakra:
        c = doc["chakra"]
        print(
            f"Chakra: {len(c['files'])} traces in {args.chakra} ("
            + ", ".join(f"{n} {k}" for k, n in c["nodes"].items())
            + f" nodes in all), {c['groups']} "
            f"communicator groups in {c['comm_group']}"
        )
        print(f"  ASTRA-sim 2.0: {c['astra_sim']}")
    return EXIT_OK
