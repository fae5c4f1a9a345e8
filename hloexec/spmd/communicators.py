"""Participants as threads of one process, exchanging payloads through shared `Mailboxes` (the seam itself,
`exchange(inst, sends, sources)`, and the one-participant `MirrorCommunicator` are hloexec.exec.communicators):
`run_participants` runs them."""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
import time

from ..errors import ExecutionError
from ..exec.communicators import MirrorCommunicator
from ..exec.context import Device


class ParticipantFailed(ExecutionError):
    """This participant stopped because another one failed (the other's error is the one to report)."""


class Mailboxes:
    """What the participants of one run share: payloads keyed by (source, destination, sequence number).

    A participant's k-th exchange posts its sends under k, then waits for its sources' k-th posts.
    All participants run the same program, so their k-th collectives must be the same instruction:
    a post from another instruction is a mismatch, a source that posted its k-th exchange without
    addressing us (or finished) will never send, and every live participant waiting is a deadlock.
    Each is an ExecutionError at once; `timeout` bounds a wait on a source that is still running, counted
    from the last sign of progress of any participant (a post, a compute slot taken or given up): with
    few slots a source may rightly wait long for its turn.

    `compute_slots` bounds how many participants compute at once (None: all): a participant holds a slot
    while it runs and gives it up while it waits in an exchange, so the temporaries of at most that many
    are alive at a time and the machine's cores are not oversubscribed.

    `groups` (lists of device ids, each device in one): the groups take turns, a participant computes only in
    its group's turn; the turn passes to the next group when every participant of this one waits for a payload
    from outside it (or has finished). So the participants of one group run while the others wait at their
    start or at a collective that reaches across groups, holding only what is alive there (a data-parallel
    all-reduce of gradients: not the activations). The payloads, and so the results, are the same.
    """

    def __init__(
        self, device_ids, timeout: float = 900.0, compute_slots: int | None = None, groups: list | None = None
    ):
        self.device_ids = list(device_ids)
        self.timeout = timeout
        self.slots = threading.BoundedSemaphore(compute_slots) if compute_slots else None
        self.groups = [list(g) for g in groups] if groups and len(groups) > 1 else None
        self.group_of = {d: k for k, g in enumerate(self.groups or ()) for d in g}
        self.turn = 0  # the group computing (with groups)
        self.progress = time.monotonic()  # when a participant last posted or took/gave up a slot
        self.cond = threading.Condition()
        self.boxes: dict[tuple[int, int, int], tuple[str, object]] = {}
        self.posted: dict[int, list[str]] = {d: [] for d in self.device_ids}  # instruction names by sequence
        self.waiting: dict[int, tuple[int, str, list[int]]] = {}  # sequence, instruction, sources pending
        self.finished: set[int] = set()
        self.failure: tuple[int, BaseException] | None = None

    def endpoint(self, device_id: int) -> ThreadCommunicator:
        return ThreadCommunicator(self, device_id)

    def take_slot(self, device_id: int) -> None:
        if self.groups is not None:
            with self.cond:
                while self.group_of[device_id] != self.turn and self.failure is None:
                    self.cond.wait(1.0)
        if self.slots is not None:
            self.slots.acquire()
            self.progress = time.monotonic()

    def give_slot(self) -> None:
        if self.slots is not None:
            self.progress = time.monotonic()
            self.slots.release()

    def post(self, source: int, seq: int, name: str, sends: dict) -> None:
        """`source`'s exchange number `seq` (instruction `name`) addresses `sends` (destination -> payload)."""
        with self.cond:
            for dest, payload in sends.items():
                self.boxes[(source, dest, seq)] = (name, payload)
            self.posted[source].append(name)
            self.progress = time.monotonic()
            self.cond.notify_all()

    def finish(self, device_id: int) -> None:
        with self.cond:
            self.finished.add(device_id)
            self.pass_turn()
            self.cond.notify_all()

    def pass_turn(self) -> None:
        """(With groups, holding `cond`.) The next group with a live participant takes the turn when every
        participant of this one has finished or waits for a payload not there yet."""
        if self.groups is None:
            return
        group = self.groups[self.turn]
        if not all(d in self.finished or (d in self.waiting and not self._ready(d)) for d in group):
            return
        for step in range(1, len(self.groups) + 1):
            k = (self.turn + step) % len(self.groups)
            if any(d not in self.finished for d in self.groups[k]):
                self.turn = k
                self.cond.notify_all()
                return

    def fail(self, device_id: int, error: BaseException) -> None:
        with self.cond:
            if self.failure is None and not isinstance(error, ParticipantFailed):
                self.failure = (device_id, error)
            self.cond.notify_all()

    def undelivered(self) -> list[str]:
        """Payloads posted but never received (a group the receiver did not share), for the report."""
        return [
            f"device {s} -> device {d}: %{name} (collective #{seq})"
            for (s, d, seq), (name, _) in sorted(self.boxes.items())
        ]

    def _why_not(self, me: int, seq: int, name: str, src: int) -> str | None:
        """Why the post from `src` can never come, or None while it still may."""
        posted = self.posted[src]
        if len(posted) > seq:
            if posted[seq] != name:
                return (
                    f"collective mismatch: device {me}'s collective #{seq} is %{name}, device {src}'s is %{posted[seq]}"
                )
            return f"device {src} ran %{name} (collective #{seq}) without sending to device {me}: their groups disagree"
        if src in self.finished:
            return f"device {src} finished after {len(posted)} collectives; device {me} waits for its #{seq} (%{name})"
        live = [d for d in self.device_ids if d not in self.finished]
        if all(d in self.waiting for d in live) and not any(self._ready(d) for d in live):
            where = "; ".join(
                f"device {d} at #{s} %{n} waiting for {srcs}" for d, (s, n, srcs) in sorted(self.waiting.items())
            )
            return f"deadlock: every participant waits ({where})"
        return None

    def _ready(self, device_id: int) -> bool:
        seq, _, sources = self.waiting[device_id]
        return all((s, device_id, seq) in self.boxes for s in sources)


class ThreadCommunicator:
    """One participant's end of the shared Mailboxes."""

    distinct_participants = True  # collectives may split their work (all-reduce folds) between them

    def __init__(self, mailboxes: Mailboxes, device_id: int):
        self.mailboxes = mailboxes
        self.device_id = device_id
        self.sequence = 0

    def exchange(self, inst, sends, sources):
        with self.idle():
            return self._exchange(inst, sends, sources)

    @contextlib.contextmanager
    def idle(self):
        """While this participant waits (in a collective, or for another run it is paired with), it computes
        nothing: another one may take its compute slot meanwhile."""
        self.mailboxes.give_slot()
        try:
            yield
        finally:
            self.mailboxes.take_slot(self.device_id)

    def _exchange(self, inst, sends, sources):
        box, me, seq = self.mailboxes, self.device_id, self.sequence
        self.sequence += 1
        box.post(me, seq, inst.name, sends)
        with box.cond:
            box.waiting[me] = (seq, inst.name, list(sources))
            try:
                return [self._receive(src, seq, inst.name) for src in sources]
            finally:
                del box.waiting[me]

    def _receive(self, src: int, seq: int, name: str):
        box, me = self.mailboxes, self.device_id
        key = (src, me, seq)
        started = time.monotonic()
        while key not in box.boxes:
            if box.failure is not None:
                raise ParticipantFailed(f"device {me} stopped: device {box.failure[0]} failed")
            if src not in box.device_ids:
                raise ExecutionError(
                    f"%{name}: device {me} expects a payload from device {src}, which is not a "
                    f"participant (devices {box.device_ids[0]}..{box.device_ids[-1]})"
                )
            why = box._why_not(me, seq, name, src)
            if why is not None:
                raise ExecutionError(why)
            remaining = max(box.progress, started) + box.timeout - time.monotonic()
            if remaining <= 0:
                raise ExecutionError(
                    f"timeout: device {me} waited at %{name} (collective #{seq}) for device {src}, "
                    f"no participant progressing for {box.timeout:.0f} s"
                )
            box.pass_turn()
            box.cond.wait(min(remaining, 1.0))
        sender_name, payload = box.boxes.pop(key)
        box.waiting[me][2].remove(src)
        if sender_name != name:
            raise ExecutionError(
                f"collective mismatch: device {me}'s collective #{seq} is %{name}, device {src}'s is %{sender_name}"
            )
        return payload


def run_participants(
    exe,
    inputs: dict,
    P: int,
    R: int,
    mailboxes: Mailboxes,
    *,
    observe=None,
    observe_operands: bool = False,
    observed=None,
) -> dict:
    """Run the participants `inputs` names (device id -> input list) as threads meeting in `mailboxes`;
    returns device id -> outputs (`observe`, `observed`: as run_spmd's). Raises ExecutionError naming the device
    that failed first."""
    outputs: dict = {}
    errors: dict[int, BaseException] = {}

    def participant(d: int, holding_slot: bool = False):
        device = Device(
            replica_id=d // P, partition_id=d % P, num_replicas=R, num_partitions=P, communicator=mailboxes.endpoint(d)
        )
        exe.context.play(device)
        if not holding_slot:
            mailboxes.take_slot(d)
        try:
            watched = observe is not None and (observed is None or d in observed)
            seen = functools.partial(observe, d) if watched else None
            outputs[d] = exe.run(*inputs[d], observe=seen, observe_operands=observe_operands)
            mailboxes.finish(d)
        except BaseException as e:  # noqa: BLE001  (reported below, with the device)
            errors[d] = e
            mailboxes.fail(d, e)
        finally:
            mailboxes.give_slot()

    if mailboxes.groups is None and mailboxes.slots is not None:
        _run_on_reused_threads(participant, list(inputs), mailboxes)
    else:
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


def _run_on_reused_threads(participant, device_ids: list[int], mailboxes: Mailboxes) -> None:
    """`participant(d, holding_slot=True)` for each of `device_ids`, each started once a compute slot is free, on a
    thread whose participant has finished when there is one, else on a new thread (one waiting in a collective
    gives its slot up: the next one starts). A thread per participant cost ~0.3 ms each to start on two cores
    (--partitions 100000 of a module without collectives: 37 s, most of it starting threads)."""
    jobs: queue.SimpleQueue = queue.SimpleQueue()
    idle = threading.Semaphore(0)  # threads waiting for a job
    threads: list[threading.Thread] = []

    def worker():
        while (d := jobs.get()) is not None:
            participant(d, holding_slot=True)
            idle.release()

    for d in device_ids:
        mailboxes.take_slot(d)
        if mailboxes.failure is not None:  # the run is lost: start no more
            mailboxes.give_slot()
            break
        if not idle.acquire(blocking=False):
            threads.append(threading.Thread(target=worker, name=f"hloexec-participants-{len(threads)}"))
            threads[-1].start()
        jobs.put(d)
    for _ in threads:
        jobs.put(None)
    for t in threads:
        t.join()


def run_mirrored(exe, inputs: list, P: int, R: int, observe=None, observe_operands: bool = False):
    """Device 0's outputs, run alone: its peers are taken to send what it sends (participants that compute the
    same, hloexec.spmd.identical), in a thread of its own (the device it plays is that thread's)."""
    result: dict = {}

    def participant():
        device = Device(replica_id=0, partition_id=0, num_replicas=R, num_partitions=P)
        device.communicator = MirrorCommunicator(device)
        exe.context.play(device)
        seen = None if observe is None else functools.partial(observe, 0)
        try:
            result["outputs"] = exe.run(*inputs, observe=seen, observe_operands=observe_operands)
        except BaseException as e:  # noqa: BLE001  (raised in the caller's thread)
            result["error"] = e

    thread = threading.Thread(target=participant, name="hloexec-device-0")
    thread.start()
    thread.join()
    if "error" in result:
        raise ExecutionError(f"device 0 (its peers mirrored) failed: {result['error']}") from result["error"]
    return result["outputs"]
