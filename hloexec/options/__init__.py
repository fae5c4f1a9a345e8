"""One value for how a run computes and what it may use: `Options`.

A prepared module holds one `Options` (`ExecContext.options`); the ops, the generators and the tools read the
rules they need from it where they use them, rather than taking each as a parameter. Numerics: the device
profile (devices.py: whose arithmetic the run reproduces), how f16/bf16 sums round (`reductions`) and whether
fusions keep f16/bf16 intermediates in f32 (`excess_precision`); limits: the memory a run may use.
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass, field, fields, replace

from ..errors import OptionError
from .devices import REDUCTIONS, REFERENCE, DeviceProfile, device_profile


@dataclass(frozen=True)
class Options:
    """How a module is computed (`device`, `reductions`, `excess_precision`) and what a run may use
    (`max_memory`: bytes, None: MemAvailable at each run, `available_memory()`). Build it with `Options.make`, which takes the
    device's defaults for what is not given."""

    device: DeviceProfile = field(default=REFERENCE)
    reductions: str = "accumulate"
    excess_precision: bool = False
    max_memory: int | None = None

    def __post_init__(self):
        if self.reductions not in REDUCTIONS:
            raise OptionError("reductions", self.reductions, REDUCTIONS)
        if self.excess_precision not in (False, True):  # "junk" is truthy: not taken as True
            raise OptionError("excess_precision", self.excess_precision, (False, True))
        if self.max_memory is not None and not isinstance(self.max_memory, numbers.Real):  # '8G' is the CLI's
            raise TypeError(f"max_memory={self.max_memory!r}: expected a number of bytes or None")

    @classmethod
    def make(
        cls,
        device: DeviceProfile | str | None = None,
        *,
        reductions: str | None = None,
        excess_precision: bool | None = None,
        max_memory: int | None = None,
    ) -> Options:
        """Options for `device` (a profile, its name or a profile file; None: "reference"), each numerics rule
        the device's own unless given."""
        if device is not None and not isinstance(device, (DeviceProfile, str, os.PathLike)):
            raise TypeError(f"device={device!r}: expected a DeviceProfile, a profile's name or its file")
        profile = device if isinstance(device, DeviceProfile) else device_profile(os.fspath(device or "reference"))
        return cls(
            device=profile,
            reductions=profile.reductions if reductions is None else reductions,
            excess_precision=profile.excess_precision if excess_precision is None else excess_precision,
            max_memory=max_memory,
        )

    @classmethod
    def of(cls, options: Options | None = None, device: DeviceProfile | str | None = None, **rules) -> Options:
        """`options` (None: those of `device`, "reference" if None too) with `rules` given as not None
        (reductions=, excess_precision=, max_memory=) replacing theirs: what hloexec.load's keywords make."""
        rules = {k: v for k, v in rules.items() if v is not None}
        unknown = set(rules) - {f.name for f in fields(cls)} - {"device"}
        if unknown:
            raise TypeError(
                f"unknown option(s) {', '.join(sorted(unknown))}: expected options=, device= or "
                f"{', '.join(f.name for f in fields(cls) if f.name != 'device')}"
            )
        if options is None:
            return cls.make(device, **rules)
        if not isinstance(options, Options):
            raise TypeError(f"options={options!r}: expected an hloexec.options.Options")
        if device is not None:
            options = options.but(device=cls.make(device).device)
        return options.but(**rules)

    def but(self, **changes) -> Options:
        """A copy with `changes` (field=value)."""
        return replace(self, **changes)

    def numerics(self) -> dict:
        """The rules that change the numbers, as plain values (what a compiled kernel's source depends on, what a
        report prints)."""
        return {
            f.name: getattr(self, f.name) if f.name != "device" else self.device.name
            for f in fields(self)
            if f.name != "max_memory"
        }


# The most participants (partitions x replicas) an SPMD run or model takes, given, from the header, or inferred
# from device ids: every one is a participant of this process (or of Ray workers whose outputs it gathers); 4,096
# in one all-reduce took minutes, and 10^8 asked for by a typo ran for hours before anything was said.
MOST_PARTICIPANTS = 1 << 16
# The most devices a report that runs nothing describes (`collectives`, `memory`, `export`: a cluster of 100,000
# GPUs is a real question for them); past it a count is a typo (a group of 10^8 ids is gigabytes of lists).
MOST_DESCRIBED = 1 << 24


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes; None where there is no /proc (not Linux)."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


__all__ = [
    "Options",
    "available_memory",
    "MOST_PARTICIPANTS",
    "MOST_DESCRIBED",
    "DeviceProfile",
    "device_profile",
    "REDUCTIONS",
    "REFERENCE",
]
