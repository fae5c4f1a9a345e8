"""SPMD participants as Ray actors: `run_spmd(..., runner="ray")` (the optional extra `hloexec[ray]`).

The participants of one run are grouped into workers, one Ray actor each, placed by Ray's scheduler (a
placement group of one bundle per worker, spread over the nodes, each bundle asking for the worker's
CPUs and its memory estimate). Inside a worker the participants are threads, exactly as in
hloexec.spmd (`run_participants`); the workers' mailboxes (`RayMailboxes`) are the same
`Mailboxes`, with payloads for a device of another worker sent to that worker's mailboxes: by value in
the actor call when small, else put once in Ray's object store (`ray.put`), the receiver fetching the
reference (`ray.get`: zero-copy from its node's store, transferred between nodes by Ray). Collectives
(hloexec.ops.collectives) see only `exchange(inst, sends, sources)` and fold in the same order, so the
results are those of the thread runner, bit for bit.

- Placement (`place`, hloexec.spmd.placement): the devices of the module's heaviest collective groups are kept
  in one worker where they fit, then the groups are packed into workers of `participants_per_worker`.
- Each worker parses and prepares the module itself: the HLO text travels (put once), not a plan.
  Inputs: per-device arrays are put once each (a replicated one, the same array for every device, once
  for all) and read zero-copy by the workers; global arrays are put once and split on each worker for
  its own devices; a seed travels alone (the workers draw the same global arrays and split them).
- Checks: a payload from another instruction is a mismatch at once (as between threads); what one worker
  cannot see (a device of another worker that ran a collective without addressing us, finished early,
  or a deadlock across workers) the driver finds from the workers' mailbox states, taken while nothing
  moves and no payload is in flight, with the same `Mailboxes` rules and messages. A worker that fails
  or dies ends the run at once (the others are killed): never a hang.
- Outputs stay on the workers (`RayOutputs`): `digests()` are made there (check_replicated compares them),
  `outputs[d]` fetches a device's values.
"""

from __future__ import annotations

import hashlib
import os
import resource
import sys
import time
from dataclasses import dataclass

import numpy as np

from ..errors import ExecutionError
from ..exec.executor import Executable
from ..ir.module import pick_module
from ..parser import parse
from .communicators import Mailboxes, ThreadCommunicator, run_participants
from .devices import device_ranges
from .memory import check_fits, gb, leaves, memory_estimate, sharded_input_bytes
from .placement import place
from .shardings import GlobalInputs

# Payloads smaller than this go by value in the actor call (Ray inlines arguments up to 100 KB itself);
# larger ones are put in the object store once, whatever the number of receivers.
INLINE_BYTES = 100 * 1024
# While no worker finished, the driver looks at the workers' mailboxes this often.
POLL_SECONDS = 1.0
# How long Ray may take to reserve the workers' resources before the run is refused.
PLACEMENT_TIMEOUT = 300.0
# Threads of a worker actor serving calls (deliveries from the others, status) while its run goes on.
ACTOR_THREADS = 16


def import_ray():
    try:
        import ray
    except ImportError:
        raise ExecutionError("runner='ray' needs Ray: pip install 'hloexec[ray]'") from None
    return ray


# -- inputs ---------------------------------------------------------------------------------------------
def _input_bytes(module, inputs, devices, num_devices: int) -> int:
    """Bytes of the distinct input buffers the `devices` of one worker hold: per-device arrays by identity
    (a replicated array shared by all is one buffer), global ones as split_global shares them."""
    if not isinstance(inputs, GlobalInputs):
        distinct = {id(a): a.nbytes for d in devices for a in leaves(inputs[d]) if isinstance(a, np.ndarray)}
        return sum(distinct.values())
    return sharded_input_bytes(module, num_devices, devices)


# -- the transport --------------------------------------------------------------------------------------
def _nbytes(payload) -> int:
    return sum(a.nbytes for a in leaves(payload) if isinstance(a, np.ndarray))


def _identity(payload):
    """What makes two payloads of one exchange the same: the arrays they hold (collectives build a tuple
    per destination around the same arrays)."""
    return tuple(map(id, leaves(payload))) if isinstance(payload, tuple) else id(payload)


class RayMailboxes(Mailboxes):
    """A worker's mailboxes: its own participants post here for each other as threads do; a payload for a
    device of another worker goes to that worker (`deliver`), which posts it in its own mailboxes.

    Every device id of the run is known (`device_ids`), but the posts and the progress of the other
    workers' devices are not: the rules that need them never fire here for those sources, the driver
    applies them to the states of all workers (`status`)."""

    def __init__(self, local, num_devices: int, timeout: float, compute_slots: int):
        super().__init__(range(num_devices), timeout=timeout, compute_slots=compute_slots)
        self.local = set(local)
        self.peers: dict[int, tuple[object, int]] = {}  # device of another worker -> (its actor, its index)
        self.same_node: set[int] = set()  # the workers on this worker's node
        self.sent = self.delivered = 0  # deliver calls made / served (the driver compares sums)
        self.moved = {"object_store": 0, "actor_calls": 0, "between_nodes": 0, "messages": 0}

    def endpoint(self, device_id: int) -> RayCommunicator:
        return RayCommunicator(self, device_id)

    def post(self, source, seq, name, sends):
        # other workers' payloads leave first: an exchange counts as posted once all of it is on its way
        remote = {d: p for d, p in sends.items() if d in self.peers}
        if remote:
            self._send(source, seq, name, remote)
        super().post(source, seq, name, {d: p for d, p in sends.items() if d not in self.peers})

    def _send(self, source, seq, name, sends):
        ray = import_ray()
        travelling: dict = {}  # _identity(payload) -> (the payload or its object-store ref, bytes)
        by_worker: dict[int, list] = {}
        for dest, payload in sends.items():
            by_worker.setdefault(self.peers[dest][1], []).append((dest, payload))
        for worker, items in by_worker.items():
            message, counted, moved = [], set(), dict.fromkeys(self.moved, 0)
            for dest, payload in items:
                key = _identity(payload)
                if key not in travelling:
                    size = _nbytes(payload)
                    travelling[key] = (ray.put(payload) if size >= INLINE_BYTES else payload, size)
                item, size = travelling[key]
                message.append((dest, item))
                if key not in counted:  # a payload for several devices of one worker moves once
                    counted.add(key)
                    moved["object_store" if isinstance(item, ray.ObjectRef) else "actor_calls"] += size
                    moved["between_nodes"] += 0 if worker in self.same_node else size
            moved["messages"] = 1
            with self.cond:  # participants send from their own threads
                self.sent += 1
                for kind, amount in moved.items():
                    self.moved[kind] += amount
            # refs inside the list are not resolved by Ray: the receiving participant fetches them
            self.peers[items[0][0]][0].deliver.remote(source, seq, name, message)

    def deliver(self, source, seq, name, message) -> None:
        with self.cond:
            for dest, payload in message:
                self.boxes[(source, dest, seq)] = (name, payload)
            self.delivered += 1
            self.progress = time.monotonic()
            self.cond.notify_all()

    def status(self, detail: bool = False) -> dict:
        """This worker's part of the run's state: the deliveries made and served, how many exchanges its devices
        posted, which finished, which wait for what, how many payloads wait to be received (equal readings:
        nothing changed in between); with `detail`, what its devices posted and which payloads wait."""
        with self.cond:
            status = {
                "sent": self.sent,
                "delivered": self.delivered,
                "posts": sum(len(self.posted[d]) for d in self.local),
                "finished": sorted(self.finished & self.local),
                "waiting": {d: (s, name, list(pending)) for d, (s, name, pending) in self.waiting.items()},
                "boxes": len(self.boxes),
            }
            if detail:
                status["detail"] = {
                    "posted": {d: list(self.posted[d]) for d in self.local},
                    "boxes": sorted(self.boxes),
                }
            return status


class RayCommunicator(ThreadCommunicator):
    """One participant's end of its worker's RayMailboxes: payloads from other workers arrive as object-store
    references, fetched (all at once) after the exchange, while the participant holds no compute slot."""

    def _exchange(self, inst, sends, sources):
        got = super()._exchange(inst, sends, sources)
        ray = import_ray()
        stored = [k for k, p in enumerate(got) if isinstance(p, ray.ObjectRef)]
        if stored:
            for k, value in zip(stored, ray.get([got[k] for k in stored])):
                got[k] = value
        return got


def disagreement(statuses: list[dict], num_devices: int) -> str | None:
    """Why the run cannot go on, from the states of all workers taken while nothing moved and no payload was
    in flight (so they are one state of the run): the rules of Mailboxes over all devices. None: it may."""
    view = Mailboxes(range(num_devices))
    for status in statuses:
        view.posted.update(status["detail"]["posted"])
        view.finished.update(status["finished"])
        view.waiting.update(status["waiting"])
        view.boxes.update(dict.fromkeys(map(tuple, status["detail"]["boxes"]), ("", None)))
    for d, (seq, name, pending) in sorted(view.waiting.items()):
        for src in pending:
            if (src, d, seq) not in view.boxes:
                why = view._why_not(d, seq, name, src)
                if why is not None:
                    return why
    return None


# -- the worker actor -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Digest:
    """What a worker tells of an output array without moving it (not a tuple: outputs' tuples hold these)."""

    shape: tuple
    dtype: str
    sha256: str


def digest(value):
    """A Digest per array of an output (tuples as tuples)."""
    if isinstance(value, tuple):
        return tuple(digest(v) for v in value)
    a = np.ascontiguousarray(value)
    return Digest(tuple(a.shape), str(a.dtype), hashlib.sha256(a.reshape(-1).view(np.uint8).data).hexdigest())


def _resolve(structure, ray):
    """`structure` (lists, tuples, dicts) with its object-store refs replaced by their values, fetched at
    once; a ref that appears several times gives one object (a shared input stays shared)."""
    refs: dict = {}

    def collect(x):
        if isinstance(x, ray.ObjectRef):
            refs[x] = None
        elif isinstance(x, (list, tuple)):
            for v in x:
                collect(v)
        elif isinstance(x, dict):
            for v in x.values():
                collect(v)

    collect(structure)
    values = dict(zip(refs, ray.get(list(refs)))) if refs else {}

    def build(x):
        if isinstance(x, ray.ObjectRef):
            return values[x]
        if isinstance(x, (list, tuple)):
            return type(x)(build(v) for v in x)
        if isinstance(x, dict):
            return {k: build(v) for k, v in x.items()}
        return x

    return build(structure)


class Worker:
    """A Ray actor holding some participants of a run (made with ray.remote by `run_on_ray`)."""

    def __init__(
        self,
        source: bytes,
        module_name: str,
        options: dict,
        devices: list[int],
        P: int,
        R: int,
        timeout: float,
        slots: int,
    ):
        # the thread pool of big products and fused loops uses the CPUs Ray reserved for this worker
        os.environ["HLOEXEC_NUM_THREADS"] = str(slots)
        self.exe = Executable(pick_module(parse(source), module_name), **options)
        self.devices, self.P, self.R = list(devices), P, R
        self.mailboxes = RayMailboxes(devices, P * R, timeout, slots)
        self.outputs: dict = {}

    def where(self) -> dict:
        ray = import_ray()
        return {
            "node": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
        }

    def connect(self, routes: list, me: int) -> None:
        """`routes`: per worker (actor, devices, node id)."""
        mine = routes[me][2]
        for index, (actor, devices, node) in enumerate(routes):
            if index == me:
                continue
            for d in devices:
                self.mailboxes.peers[d] = (actor, index)
            if node == mine:
                self.mailboxes.same_node.add(index)

    def run(self, inputs: tuple) -> dict:
        """Run this worker's participants; `inputs`: ("per_device", {device: input list with refs}),
        ("global", [global values or refs]) or ("seed", seed)."""
        ray = import_ray()
        kind, data = inputs
        start = time.perf_counter()
        if kind == "per_device":
            by_device = _resolve(data, ray)
        else:
            global_inputs = GlobalInputs(seed=data) if kind == "seed" else GlobalInputs(_resolve(data, ray))
            by_device = dict(zip(self.devices, global_inputs.split(self.exe.module, self.P * self.R, self.devices)))
        inputs_seconds = time.perf_counter() - start
        self.outputs = run_participants(self.exe, by_device, self.P, self.R, self.mailboxes)
        return {
            "seconds": time.perf_counter() - start,
            "inputs_seconds": inputs_seconds,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "moved": dict(self.mailboxes.moved),
        }

    def deliver(self, source: int, seq: int, name: str, message: list) -> None:
        self.mailboxes.deliver(source, seq, name, message)

    def status(self, detail: bool = False) -> dict:
        return self.mailboxes.status(detail)

    def undelivered(self) -> list[str]:
        return self.mailboxes.undelivered()

    def digests(self) -> dict:
        return {d: digest(out) for d, out in self.outputs.items()}

    def fetch(self, devices: list[int]) -> dict:
        return {d: self.outputs[d] for d in devices}

    def apply(self, fn, requests: dict) -> dict:
        """{device: {leaf index: fn(leaf index, array)}} for the leaves (depth first) `requests` names per device."""
        return {
            d: {i: fn(i, arrays[i]) for i in wanted}
            for d, wanted in requests.items()
            for arrays in [list(leaves(self.outputs[d]))]
        }


# -- outputs --------------------------------------------------------------------------------------------
class RayOutputs:
    """The outputs of a Ray run, indexed by global device id like the thread runner's list, left on the workers.

    `outputs[d]` (and iterating) fetches device d's outputs (read-only arrays, zero-copy from the object
    store); `digests()` gives a Digest per output array, made by the workers; `apply(fn, requests)` runs
    `fn(leaf index, array)` where the arrays are. `report` says where the participants ran, how long it
    took and the bytes moved. The workers (processes holding no Ray resources once the run is over) end with
    this object, or at `release()`."""

    def __init__(self, workers: list, groups: list[list[int]], report: dict):
        import weakref

        self._workers = workers
        self._worker_of = {d: w for w, group in enumerate(groups) for d in group}
        self.report = report
        self._fetched: dict = {}
        self._digests: list | None = None
        self._release = weakref.finalize(self, _release, workers)

    def __len__(self) -> int:
        return len(self._worker_of)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[d] for d in range(len(self))[index]]
        d = range(len(self))[index]
        if d not in self._fetched:
            self._fetch([d])
        return self._fetched[d]

    def __iter__(self):
        self._fetch([d for d in range(len(self)) if d not in self._fetched])
        return (self._fetched[d] for d in range(len(self)))

    def _fetch(self, devices: list[int]) -> None:
        ray = import_ray()
        parts: dict[int, list] = {}
        for d in devices:
            parts.setdefault(self._worker_of[d], []).append(d)
        for got in ray.get([self._workers[w].fetch.remote(ds) for w, ds in parts.items()]):
            for d, value in got.items():
                self._fetched[d] = value
                self.report["bytes_moved"]["outputs_fetched"] += _nbytes(value)

    def digests(self) -> list:
        """Per device, a Digest per output array (tuples as the outputs are), made where the outputs are."""
        if self._digests is None:
            ray = import_ray()
            found: dict = {}
            for got in ray.get([w.digests.remote() for w in self._workers]):
                found.update(got)
            self._digests = [found[d] for d in range(len(self))]
        return self._digests

    def apply(self, fn, requests: dict) -> dict:
        """{device: {leaf index: fn(leaf index, array)}} for the output leaves (depth first) `requests` names
        per device: `fn` travels to the workers (an importable function, or a closure cloudpickle can take)."""
        ray = import_ray()
        parts: dict[int, dict] = {}
        for d, wanted in requests.items():
            parts.setdefault(self._worker_of[d], {})[d] = list(wanted)
        found: dict = {}
        for got in ray.get([self._workers[w].apply.remote(fn, part) for w, part in parts.items()]):
            found.update(got)
        return found

    def release(self) -> None:
        """End the workers now (their outputs with them)."""
        self._release()


def _release(workers: list) -> None:
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    for worker in workers:
        try:
            ray.kill(worker)
        except Exception:  # noqa: BLE001  (already gone)
            pass


# -- the driver -----------------------------------------------------------------------------------------
def connect(address: str | None):
    """Ray, connected: to the instance this process already joined, else to `address` ("auto",
    "ray://host:port", "host:port"), else (None or "local") to a new local instance."""
    local = address in (None, "local")
    if local and "ray" not in sys.modules:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # a local instance serves this machine alone: Ray then binds it to the loopback interface
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray = import_ray()
    if not ray.is_initialized():
        if local:
            ray.init(address="local", include_dashboard=False)
        else:
            ray.init(address=address)
    return ray


def _module_source(module) -> bytes:
    """The text the module was parsed from (the workers parse it and pick the module by name)."""
    tables = getattr(module.entry, "tables", None)
    if tables is None:
        raise ExecutionError(f"{module.name} was not parsed from HLO text: the Ray runner sends its workers the text")
    return bytes(tables.buf)


def _worker_memory(exe, inputs, devices: list[int], slots: int, num_devices: int) -> dict:
    """memory_estimate for the participants of one worker, its distinct inputs counted as it holds them."""
    estimate = memory_estimate(exe, [()] * len(devices), slots)
    estimate["inputs"] = _input_bytes(exe.module, inputs, devices, num_devices)
    estimate["total"] = estimate["work"] + estimate["inputs"]
    return estimate


def _fits(bundles: list[dict], nodes: list[dict]) -> bool:
    """Whether the workers' bundles fit the nodes' resources, placed first fit (largest first)."""
    free = [dict(node["Resources"]) for node in nodes]
    for bundle in sorted(bundles, key=lambda b: (-b.get("memory", 0), -b["CPU"])):
        for resources in free:
            if all(resources.get(key, 0) >= amount for key, amount in bundle.items()):
                for key, amount in bundle.items():
                    resources[key] -= amount
                break
        else:
            return False
    return True


def _input_payloads(ray, inputs, groups: list[list[int]]) -> tuple[list, int]:
    """What each worker is sent for its inputs, and the bytes put in the object store for them."""
    if isinstance(inputs, GlobalInputs):
        if inputs.values is None:
            return [("seed", inputs.seed or 0)] * len(groups), 0
        return [("global", [ray.put(v) for v in inputs.values])] * len(groups), sum(map(_nbytes, inputs.values))
    stored: dict[int, object] = {}
    put = 0

    def store(value):
        nonlocal put
        if isinstance(value, (tuple, list)):
            return type(value)(store(v) for v in value)
        if id(value) not in stored:  # a replicated input, the same array for every device: put once
            stored[id(value)] = ray.put(value)
            put += _nbytes(value)
        return stored[id(value)]

    return [("per_device", {d: [store(v) for v in inputs[d]] for d in group}) for group in groups], put


def run_on_ray(
    exe,
    inputs,
    P: int,
    R: int,
    *,
    ray_address: str | None = None,
    participants_per_worker: int | None = None,
    timeout: float = 900.0,
    check_memory: bool = True,
    max_memory: int | None = None,
    concurrency: int | None = None,
    report=None,
) -> RayOutputs:
    """hloexec.spmd.run_spmd with runner="ray" (see there and this module's docstring): `inputs` are one input
    list per device or GlobalInputs; `max_memory` bounds the run's total estimate.

    Workers: groups of `participants_per_worker` (default: the participants spread evenly over the nodes
    with CPUs, fewer per worker where a worker's memory estimate would exceed the largest node's `memory`
    resource), each asking Ray for its memory estimate and CPUs: one per participant, at most the largest
    node's CPUs over the workers a node holds when they are spread evenly; `concurrency` participants of a
    worker compute at a time (default: its CPUs)."""
    say = report or (lambda message: print(message, file=sys.stderr))
    if participants_per_worker is not None and participants_per_worker < 1:
        raise ExecutionError(f"participants_per_worker must be at least 1, not {participants_per_worker}")
    source = _module_source(exe.module)
    ray = connect(ray_address)
    nodes = [node for node in ray.nodes() if node["Alive"] and node["Resources"].get("CPU", 0) >= 1]
    if not nodes:
        raise ExecutionError("the Ray cluster has no live node with a CPU to run workers on")
    workers_plan = _plan_workers(exe, inputs, P, R, nodes, participants_per_worker, concurrency, check_memory)
    say(workers_plan.describe(len(nodes)))
    if check_memory:
        workers_plan.check_memory(exe.module.name, max_memory)
    workers_plan.check_fits(nodes)

    from ray.util.placement_group import placement_group, remove_placement_group

    started = time.perf_counter()
    # The placement group reserves the workers' CPUs and memory for the run and spreads them over the
    # nodes; the actors sit on its bundles' nodes without resources of their own, so that once the run is
    # over the reservation goes and the actors stay with the outputs (a next run need not wait for them).
    placement = placement_group(workers_plan.bundles, strategy="SPREAD")
    workers: list = []
    try:
        where = _start_workers(ray, exe, source, workers_plan, placement, P, R, timeout, workers)
        names = [
            f"worker {i} (devices {device_ranges(g)}, node {info['node'][:8]}, pid {info['pid']})"
            for i, (g, info) in enumerate(zip(workers_plan.groups, where))
        ]
        say(
            "ray: "
            + "; ".join(
                f"devices {device_ranges(g)} on node {info['node'][:8]} ({info['ip']}, pid {info['pid']})"
                for g, info in zip(workers_plan.groups, where)
            )
        )
        payloads, input_bytes = _input_payloads(ray, inputs, workers_plan.groups)
        start_seconds = time.perf_counter() - started
        results = _wait(ray, workers, names, [w.run.remote(p) for w, p in zip(workers, payloads)], P * R)
        run_seconds = time.perf_counter() - started - start_seconds
        leftover = _undelivered(ray, workers)
        if leftover:
            raise ExecutionError(
                "payloads sent but never received (replica groups disagree across devices):\n  "
                + "\n  ".join(leftover[:10])
            )
    except BaseException:
        _release(workers)
        raise
    finally:
        remove_placement_group(placement)
    moved = {key: sum(r["moved"][key] for r in results) for key in results[0]["moved"]}
    moved.update(inputs=input_bytes, outputs_fetched=0)
    say(
        f"ray: ran in {run_seconds:.2f} s ({start_seconds:.2f} s to start the workers); between workers "
        f"{gb(moved['object_store'])} through the object store and {gb(moved['actor_calls'])} in actor calls "
        f"({moved['messages']} messages), {gb(moved['between_nodes'])} of it between nodes; inputs put: "
        f"{gb(input_bytes)}"
    )
    summary = {
        "address": ray_address,
        "nodes": len(nodes),
        "participants_per_worker": workers_plan.per_worker,
        "workers": _worker_summaries(workers_plan, where, results),
        "memory": workers_plan.totals(),
        "bytes_moved": moved,
        "seconds": {"start": start_seconds, "run": run_seconds},
    }
    return RayOutputs(workers, workers_plan.groups, summary)


def _worker_summaries(workers_plan, where: list, results: list) -> list[dict]:
    """What each worker was and did, for the run's summary."""
    return [
        {
            "devices": g,
            "node": info["node"],
            "ip": info["ip"],
            "pid": info["pid"],
            "cpus": c,
            "memory_estimate": int(m["total"]),
            "peak_rss_bytes": r["peak_rss_bytes"],
            "seconds": r["seconds"],
        }
        for g, info, c, m, r in zip(workers_plan.groups, where, workers_plan.cpus, workers_plan.memory, results)
    ]


@dataclass
class WorkersPlan:
    """The workers of a run: their devices, CPUs, compute slots and memory estimates (per worker), and the
    placement group bundles asking Ray for them."""

    per_worker: int
    groups: list[list[int]]
    cpus: list[int]
    slots: list[int]
    memory: list[dict]
    bundles: list[dict]
    most_cpus: int
    most_memory: float

    def describe(self, num_nodes: int) -> str:
        return (
            f"ray: {sum(map(len, self.groups))} participants in {len(self.groups)} workers of up to "
            f"{self.per_worker} on {num_nodes} node(s); per participant {gb(self.memory[0]['per_device_peak'])} "
            f"peak; per worker up to {gb(max(m['total'] for m in self.memory))} estimated; largest node: "
            f"{self.most_cpus} CPUs, {gb(self.most_memory)} (Ray's 'memory' resource)"
        )

    def totals(self) -> dict:
        """The run's memory estimate: the workers' summed."""
        return {
            "participants": sum(map(len, self.groups)),
            "per_device_peak": self.memory[0]["per_device_peak"],
            **{key: int(sum(m[key] for m in self.memory)) for key in ("inputs", "inputs_unshared", "work", "total")},
        }

    def check_memory(self, module_name: str, max_memory: int | None) -> None:
        """Each worker against the largest node's memory, the run against `max_memory`."""
        for group, m in zip(self.groups, self.memory):
            if m["total"] > self.most_memory:
                raise ExecutionError(
                    f"a worker of {len(group)} participants (devices {device_ranges(group)}) "
                    f"needs about {gb(m['total'])}, more than the largest node's "
                    f"{gb(self.most_memory)}: put fewer participants in a worker "
                    f"(participants_per_worker, --participants-per-worker)"
                )
        check_fits(module_name, self.totals(), max_memory, None)

    def check_fits(self, nodes: list[dict]) -> None:
        if not _fits(self.bundles, nodes):
            wanted = sorted(
                {f"{b['CPU']} CPUs" + (f" and {gb(b['memory'])}" if "memory" in b else "") for b in self.bundles}
            )
            have = [f"{node['Resources']['CPU']:g} CPUs and {gb(node['Resources'].get('memory', 0))}" for node in nodes]
            raise ExecutionError(
                f"the Ray cluster's nodes cannot hold {len(self.groups)} workers of "
                f"{', '.join(wanted)}: its nodes have {', '.join(have)}"
            )


def _plan_workers(
    exe,
    inputs,
    P: int,
    R: int,
    nodes: list[dict],
    participants_per_worker: int | None,
    concurrency: int | None,
    check_memory: bool,
) -> WorkersPlan:
    """Workers of `participants_per_worker`, else of the participants spread evenly over the nodes, fewer while a
    worker's estimate exceeds the largest node's memory."""
    n = P * R
    most_cpus = int(max(node["Resources"]["CPU"] for node in nodes))
    most_memory = max(node["Resources"].get("memory", 0) for node in nodes)

    def plan(k: int) -> WorkersPlan:
        groups = place(exe.module, P, R, k)
        share = most_cpus // -(-len(groups) // len(nodes))  # the CPUs of a node over the workers it may hold
        cpus = [max(1, min(len(g), share)) for g in groups]
        slots = [concurrency or c for c in cpus]
        memory = [_worker_memory(exe, inputs, g, s, n) for g, s in zip(groups, slots)]
        bundles = [{"CPU": c, **({"memory": int(m["total"])} if check_memory else {})} for c, m in zip(cpus, memory)]
        return WorkersPlan(k, groups, cpus, slots, memory, bundles, most_cpus, most_memory)

    k = min(participants_per_worker or -(-n // len(nodes)), n)
    workers_plan = plan(k)
    while (
        participants_per_worker is None
        and check_memory
        and k > 1
        and max(m["total"] for m in workers_plan.memory) > most_memory
    ):
        k -= 1
        workers_plan = plan(k)
    return workers_plan


def _start_workers(
    ray, exe, source: bytes, workers_plan: WorkersPlan, placement, P: int, R: int, timeout: float, workers: list
) -> list[dict]:
    """Start the workers (appended to `workers`, so that a failure can release those started) on the placement
    group's bundles, connected to each other; returns where each runs."""
    from ray.util.placement_group import placement_group_table
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    bundles = workers_plan.bundles
    if not placement.wait(PLACEMENT_TIMEOUT):
        raise ExecutionError(
            f"Ray could not reserve {len(bundles)} workers ({bundles[0]['CPU']} CPUs"
            + (f", {gb(bundles[0]['memory'])}" if "memory" in bundles[0] else "")
            + f" each) within {PLACEMENT_TIMEOUT:.0f} s: the cluster's resources are in use"
        )
    bundle_nodes = placement_group_table(placement)["bundles_to_node_id"]
    actor = ray.remote(Worker)
    text = ray.put(source)
    options = {
        "options": exe.options,
        "use_numba": exe.context.use_numba,
        "compile_after": exe.context.compile_after,
        "compile": exe.context.compile,
    }
    for i, (group, s) in enumerate(zip(workers_plan.groups, workers_plan.slots)):
        workers.append(
            actor.options(
                num_cpus=0,
                max_concurrency=ACTOR_THREADS,
                scheduling_strategy=NodeAffinitySchedulingStrategy(bundle_nodes[i], soft=False),
            ).remote(text, exe.module.name, options, group, P, R, timeout, s)
        )
    names = [f"worker {i} (devices {device_ranges(g)})" for i, g in enumerate(workers_plan.groups)]
    where = [_result(ray, w.where.remote(), name) for w, name in zip(workers, names)]
    routes = [(w, g, info["node"]) for w, g, info in zip(workers, workers_plan.groups, where)]
    ray.get([w.connect.remote(routes, i) for i, w in enumerate(workers)])
    return where


def _result(ray, ref, name: str):
    """The value of a worker call, or ExecutionError: the participant's own error as the thread runner gives
    it, or the worker's death (Ray's failure detection) naming the worker."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        cause = e.cause
        if isinstance(cause, ExecutionError):
            raise ExecutionError(str(cause)) from None
        raise ExecutionError(f"{name} failed: {type(cause).__name__}: {cause}") from None
    except ray.exceptions.RayActorError as e:
        raise ExecutionError(f"{name} died: {_first_lines(str(e))}") from None


def _first_lines(text: str, limit: int = 600) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + " ..."


def _wait(ray, workers: list, names: list[str], runs: list, num_devices: int) -> list:
    """The workers' run results; the first failure ends the run. While no run finishes, the workers' states
    are read every POLL_SECONDS: when a reading equals the last one, no delivery is in flight and a detailed
    reading then still agrees, nothing moved in between: one state of the run, and `disagreement` says
    whether it can go on."""
    pending = dict(zip(runs, range(len(runs))))
    results: list = [None] * len(runs)
    previous = None

    def read(detail: bool):
        return ray.get([w.status.remote(detail) for w in workers], timeout=10 * POLL_SECONDS)

    while pending:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_SECONDS)
        for ref in done:
            i = pending.pop(ref)
            results[i] = _result(ray, ref, names[i])
        if done:
            continue
        try:
            statuses = read(False)
            quiet = sum(s["sent"] for s in statuses) == sum(s["delivered"] for s in statuses)
            if quiet and statuses == previous:
                detailed = read(True)
                if [{k: v for k, v in s.items() if k != "detail"} for s in detailed] == statuses:
                    why = disagreement(detailed, num_devices)
                    if why is not None:
                        raise ExecutionError(why)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayError):
            statuses = None  # a busy or dead worker: its run's result will say which
        previous = statuses
    return results


def _undelivered(ray, workers: list) -> list[str]:
    """Payloads left in the workers' mailboxes once every delivery made has been served."""
    for _ in range(100):
        statuses = ray.get([w.status.remote() for w in workers])
        if sum(s["sent"] for s in statuses) == sum(s["delivered"] for s in statuses):
            break
        time.sleep(0.05)
    return sorted(line for lines in ray.get([w.undelivered.remote() for w in workers]) for line in lines)
