"""Thread runner vs Ray runner on an SPMD seed: wall time, peak RSS, bytes moved (bench/README.md's table).

    flock /tmp/hloexec-heavy.lock python bench/spmd_ray.py [SEED.hlo] [--nodes 2] [--per-worker 8]

Runs `hloexec run SEED --spmd --json` (threads), then starts a simulated Ray cluster on this machine
(`ray.cluster_utils.Cluster`: a head without CPUs and NODES nodes splitting the cores, each with the
memory for its workers) and runs `hloexec run SEED --spmd --ray ADDRESS --json` against it; both in child
processes, timed from outside (the cluster's own start is not counted: a real cluster is already up).
Prints a markdown row per runner and the machine's load average before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SEED = Path(__file__).resolve().parents[2] / "shared" / "seeds" / "gpt_train_step_shard_parallel_16dev.hlo"


def run(argv: list[str]) -> tuple[dict, float, int]:
    """(JSON document, wall seconds, peak RSS of the child in bytes) of one `hloexec` command."""
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "hloexec", "run", *argv], stdout=subprocess.PIPE, text=True)
    out = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)       # its own rusage: the peak RSS of that process
    seconds = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        raise SystemExit(f"hloexec run {' '.join(argv)} failed ({code})")
    return json.loads(out), seconds, usage.ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("seed", nargs="?", default=str(SEED))
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--per-worker", type=int, default=8)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    load = [os.getloadavg()[0]]

    threads, thread_seconds, thread_rss = run([args.seed, "--spmd", "--json"])
    load.append(os.getloadavg()[0])

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")      # loopback only
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                            "object_store_memory": 256 << 20})
    for _ in range(args.nodes):
        cluster.add_node(num_cpus=max(1, cores // args.nodes), memory=12 << 30, object_store_memory=2 << 30,
                         wait=False)
    cluster.wait_for_nodes()
    try:
        ray, ray_seconds, driver_rss = run([args.seed, "--spmd", "--json", "--ray", cluster.address,
                                            "--participants-per-worker", str(args.per_worker)])
    finally:
        cluster.shutdown()
    load.append(os.getloadavg()[0])

    same = [o["per_device"] for o in threads["outputs"]] == [o["per_device"] for o in ray["outputs"]]
    report = ray["spmd"]["ray"]
    moved = report["bytes_moved"]
    gb = lambda n: f"{n / 2**30:.2f} GiB"      # noqa: E731
    print(f"\n{Path(args.seed).name}: {threads['spmd']['devices']} participants; outputs' per-device summaries "
          f"{'identical' if same else 'DIFFER'}; load average {' -> '.join(f'{x:.1f}' for x in load)} "
          f"({cores} cores)")
    print("| runner | wall time | execute | peak RSS | bytes moved between workers |")
    print("|---|---|---|---|---|")
    print(f"| threads (one process) | {thread_seconds:.1f} s | {threads['seconds']['execute']:.1f} s | "
          f"{gb(thread_rss)} | - |")
    workers = ", ".join(gb(w["peak_rss_bytes"]) for w in report["workers"])
    print(f"| Ray, {len(report['workers'])} workers on {args.nodes} simulated nodes | {ray_seconds:.1f} s | "
          f"{ray['seconds']['execute']:.1f} s (start {report['seconds']['start']:.1f} s, run "
          f"{report['seconds']['run']:.1f} s) | workers {workers}; driver {gb(driver_rss)} | "
          f"{gb(moved['object_store'])} object store + {moved['actor_calls'] / 2**20:.1f} MiB in actor calls "
          f"({moved['messages']} messages), {gb(moved['between_nodes'])} between nodes |")


if __name__ == "__main__":
    main()
