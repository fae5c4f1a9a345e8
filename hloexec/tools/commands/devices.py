"""`hloexec devices`: the device profiles (--device), their arithmetic rules and sources."""

from __future__ import annotations

from ...options.devices import builtin_names, device_profile, toml_value
from ..common import EXIT_OK, JSON_VERSION, add_subparser, print_json
from ..devices import RULES, describe


def add_parser(subparsers, parents) -> None:
    p = add_subparser(
        subparsers,
        "devices",
        "The device profiles (--device): their arithmetic rules and sources.",
        "  hloexec devices\n"
        "  hloexec devices --show tpu > mytpu.toml     # edit, then: hloexec run f.hlo --device mytpu.toml\n"
        "  hloexec devices --json | jq '.profiles[].name'",
        [parents.common],
        'A profile file holds rules (TOML or JSON); `base = "NAME"` takes every rule not written\nfrom that profile.',
    )
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
        print_json(
            {"command": "devices", "version": JSON_VERSION, "rules": RULES, "profiles": [describe(p) for p in profiles]}
        )
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
