"""How participants of a collective exchange payloads.

`exchange(inst, sends, sources)`: `sends` maps destination global device id -> payload;
returns the payloads received from `sources`, in that order. Payloads are read-only: a receiver
gets the sender's array itself, not a copy.

This is the seam between the collectives (hloexec.ops.collectives) and whatever carries the
payloads: `MirrorCommunicator` (one participant alone), `ThreadCommunicator` (participants as
threads of one process, hloexec.spmd.communicators), `RayCommunicator` (participants in the actors of a Ray
cluster, hloexec.spmd.ray_runner: the same mailboxes, with payloads for other actors posted to them). Only the
first is exec/'s: a prepared module plays one participant; the SPMD layer above (hloexec.spmd) runs them all.
"""

from __future__ import annotations


class MirrorCommunicator:
    """One participant runs alone and every other participant is taken to hold the same values.

    So a payload from any source is what this participant addresses to itself (or, when it
    addresses no one but itself, to anyone: collective-permute sends the same value to all).
    all-reduce(sum) then gives N*x, all-gather N copies: consistent shapes and plausible numbers,
    not a multi-device run (that is hloexec.spmd).
    """

    distinct_participants = False  # the others are this one: work cannot be split with them

    def __init__(self, device):
        self.device = device

    def exchange(self, inst, sends, sources):
        me = self.device.global_id
        if not sources:
            return []
        if me in sends:
            payload = sends[me]
        elif sends:
            payload = next(iter(sends.values()))
        else:
            raise RuntimeError(f"mirror exchange for %{inst.name}: nothing to mirror")
        return [payload] * len(sources)
