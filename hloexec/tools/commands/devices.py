"""`hloexec devices`: the device profiles (--device), their arithmetic rules and sources."""
from __future__ import annotations

from ...options.devices import builtin_names, device_profile, toml_value
from ..common import EXIT_OK, JSON_VERSION, add_subparser, print_json


def describe(profile) -> dict:
    """A profile as JSON: name, description, platform, file, and per rule its value and source."""
    return {"name": profile.name, "description": profile.description, "platform": profile.platform,
            "file": profile.path or None,
            "rules": {rule: {"value": list(v) if isinstance(v, tuple) else v, "source": source}
                      for rule, v, source in profile.rules()}}


# What each rule does, for the listing (the values and their sources come from the profiles).
RULES = {
    "platform": "the kind of device a dump's evidence matches (--device auto)",
    "honor_algorithm": "an explicit algorithm= (PrecisionConfig.Algorithm) is computed as it says",
    "precision": "operand_precision (default / high / highest) -> the algorithm of an f32 x f32 dot",
    "matrix_vector": "the algorithm of an f32 matrix-vector dot whatever its precision",
    "tf32_rounding": "how an f32 operand becomes tf32: nearest (ties to even), nearest-away, truncate",
    "bf16_split": "how the multi-pass bf16 recipes cut an f32 into parts: truncate (top 16 bits) or nearest",
    "algorithms": "the algorithms the device runs; a dot asking for another is an error naming both",
    "split_k": "a Triton GEMM's triton_gemm_config split_k: K slices summed apart, then added",
    "fp8_fast_accumulation": "fp8 x fp8 GEMMs at DEFAULT precision (no algorithm) keep their partial sums in fewer "
                             "bits (Hopper)",
    "fp8_accumulator_bits": "with fast accumulation: significand bits the running sum keeps (truncated)",
    "excess_precision": "inside a fusion, f16/bf16 intermediates stay f32 (rounded where stored)",
    "fma_contraction": "inside a fusion, a multiply feeding an add / subtract (and a fused sum of products) rounds "
                       "once with it, as LLVM's FMA contraction does",
    "reductions": "how f16/bf16 sums round: accumulate (in f32, rounded once), per-step (row-major, every step "
                  "rounded) or xla-cpu (per-step, YNNPACK's lane order in __ynn_fusion sums)",
    "vector_width": "f32 lanes of the device's vectorized sums (reductions = xla-cpu); 0: this machine's",
}


def add_parser(subparsers, parents) -> None:
    p = add_subparser(
        subparsers, "devices", "The device profiles (--device): their arithmetic rules and sources.",
        "  hloexec devices\n"
        "  hloexec devices --show tpu > mytpu.toml     # edit, then: hloexec run f.hlo --device mytpu.toml\n"
        "  hloexec devices --json | jq '.profiles[].name'",
        [parents.common],
        "A profile file holds rules (TOML or JSON); `base = \"NAME\"` takes every rule not written\n"
        "from that profile.")
    p.add_argument("--show", metavar="NAME|FILE", help="print one profile as a file to copy and edit")
    p.set_defaults(handler=run)


def run(args) -> int:
    """`hloexec devices [--show NAME|FILE] [--json]`."""
    if args.show:
        profile = device_profile(args.show)
        if args.json:
            print_json({"command": "devices", "version": JSON_VERSION, "profile": describe(profile)})
        else:
            print(profile.to_toml(), end="")
        return EXIT_OK
    profiles = [device_profile(name) for name in sorted(builtin_names(), key=lambda n: n != "reference")]
    if args.json:
        print_json({"command": "devices", "version": JSON_VERSION, "rules": RULES,
                     "profiles": [describe(p) for p in profiles]})
        return EXIT_OK
    print("device profiles (--device NAME, or a profile file: hloexec devices --show NAME > mine.toml):\n")
    for p in profiles:
        print(f"{p.name} ({p.platform}): {p.description}")
        for rule, value, source in p.rules():
            shown = "(all)" if rule == "algorithms" and value == profiles[0].algorithms else toml_value(value)
            print(f"  {rule} = {shown}" + (f"\n      source: {source}" if source else ""))
        print()
    print("rules:")
    for rule, what in RULES.items():
        print(f"  {rule:<22} {what}")
    return EXIT_OK
