"""SPMD participants as Ray actors (hloexec.spmd.ray_runner) on a simulated cluster of 4 nodes (conftest's
`ray_cluster`): the same outputs as the thread runner, bit for bit, and the same errors.

The GPT seed's 16 participants on 2 nodes of 8 need ~11 GB:
`flock /tmp/hloexec-heavy.lock pytest -m slow tests/test_spmd_ray.py -k gpt`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from hloexec.errors import MemoryLimitError

from test_spmd import PROGRAMS, jax_programs  # noqa: F401  (the module-scoped fixture: writes the programs once)

_QUIET = {"report": lambda message: None}

ALL_REDUCE_GATHER = """HloModule m, num_partitions=4
add { a = f32[] parameter(0)
 b = f32[] parameter(1)
 ROOT s = f32[] add(a, b) }
ENTRY e { p = f32[300000] parameter(0)
 r = f32[300000] all-reduce(p), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add
 q = f32[3] slice(r), slice={[0:3]}
 g = f32[12] all-gather(q), channel_id=2, replica_groups={{0,1,2,3}}, use_global_device_ids=true, dimensions={0}
 ROOT t = (f32[300000], f32[12]) tuple(r, g) }
"""


def _same_bits(a, b, what: str) -> None:
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    assert len(a) == len(b), what
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), f"{what}, output {i}"


def _nodes(outputs) -> list[str]:
    return [w["node"] for w in outputs.report["workers"]]


# -- placement (no Ray needed) --------------------------------------------------------------------------------
def _grid_module(tp_elements: int, dp_elements: int) -> str:
    """16 partitions: all-reduces over the tensor-parallel groups {0..7},{8..15} and the data-parallel pairs
    {0,8},{1,9},..., carrying tp_elements / dp_elements f32 each."""
    return f"""HloModule m, num_partitions=16
add {{ a = f32[] parameter(0)
 b = f32[] parameter(1)
 ROOT s = f32[] add(a, b) }}
ENTRY e {{ x = f32[{tp_elements}] parameter(0)
 y = f32[{dp_elements}] parameter(1)
 t = f32[{tp_elements}] all-reduce(x), channel_id=1, use_global_device_ids=true, to_apply=add,
   replica_groups={{{{0,1,2,3,4,5,6,7}},{{8,9,10,11,12,13,14,15}}}}
 d = f32[{dp_elements}] all-reduce(y), channel_id=2, use_global_device_ids=true, to_apply=add,
   replica_groups={{{{0,8}},{{1,9}},{{2,10}},{{3,11}},{{4,12}},{{5,13}},{{6,14}},{{7,15}}}}
 ROOT r = (f32[{tp_elements}], f32[{dp_elements}]) tuple(t, d) }}
"""


def test_placement_keeps_the_heaviest_collective_groups_in_one_worker():
    import hloexec
    from hloexec.spmd.placement import place
    tp_heavy = hloexec.parse(_grid_module(4096, 16))[0]
    assert place(tp_heavy, 16, 1, 8) == [list(range(8)), list(range(8, 16))]
    dp_heavy = hloexec.parse(_grid_module(16, 4096))[0]
    assert place(dp_heavy, 16, 1, 2) == [[d, d + 8] for d in range(8)]
    # four data-parallel pairs to a worker of 8 (the tensor-parallel groups do not fit)
    assert place(dp_heavy, 16, 1, 8) == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]
    # tensor-parallel groups larger than a worker: kept in pieces rather than the pairs of the lighter group
    assert place(tp_heavy, 16, 1, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert place(dp_heavy, 16, 1, 4) == [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12, 13], [6, 7, 14, 15]]


def test_split_inputs_for_some_devices_gives_their_pieces():
    import hloexec
    from hloexec import spmd
    module = hloexec.parse("""HloModule m, num_partitions=4
ENTRY e { x = f32[2,3] parameter(0), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
 y = f32[5] parameter(1), sharding={replicated}
 ROOT t = (f32[2,3], f32[5]) tuple(x, y) }""")[0]
    values = spmd.random_global_inputs(module, seed=3)
    whole = spmd.split_inputs(module, values, 4)
    some = spmd.GlobalInputs(values).split(module, 4, [3, 1])
    for mine, d in zip(some, [3, 1]):
        for a, b in zip(mine, whole[d]):
            np.testing.assert_array_equal(a, b)
    assert some[0][0] is not some[1][0] and some[0][1] is some[1][1]    # tiles per device, one replicated copy
    np.testing.assert_array_equal(spmd.GlobalInputs(seed=3).split(module, 4)[2][0], whole[2][0])


def test_ray_runner_without_ray_installed_says_how_to_get_it():
    """`import hloexec` and the thread runner need no Ray; runner='ray' says what to install."""
    code = """
import sys
sys.modules["ray"] = None            # as if not installed
import numpy as np, hloexec
exe = hloexec.load('''HloModule m, num_partitions=2
ENTRY e { p = f32[2] parameter(0)
 ROOT n = f32[2] negate(p) }''')
print(exe.run_spmd([[np.ones(2, np.float32)]] * 2, report=lambda m: None)[1])
try:
    exe.run_spmd([[np.ones(2, np.float32)]] * 2, runner="ray")
except hloexec.ExecutionError as e:
    print(e)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "[-1. -1.]" in done.stdout and "pip install 'hloexec[ray]'" in done.stdout


# -- on the simulated cluster ---------------------------------------------------------------------------------
@pytest.mark.xla
@pytest.mark.parametrize("per_worker", [4, 2], ids=["2_nodes", "4_nodes"])
def test_jax_programs_match_the_thread_runner_bit_for_bit(ray_cluster, jax_programs, per_worker):
    import hloexec
    for name in PROGRAMS:
        exe = hloexec.load(jax_programs / f"{name}.hlo")
        saved = np.load(jax_programs / f"{name}.npz")
        inputs = [[saved[f"dev{d}/arg{i}"] for i in range(len(exe.parameters))] for d in range(8)]
        expected = exe.run_spmd(inputs, **_QUIET)
        got = exe.run_spmd(inputs, runner="ray", participants_per_worker=per_worker, **_QUIET)
        assert len(set(_nodes(got))) == 8 // per_worker, got.report["workers"]
        moved = got.report["bytes_moved"]
        if name == "model_parallel" and per_worker == 4:
            # its one all-reduce is within the 'model' groups of 4, which placement keeps inside the workers
            assert moved["messages"] == 0 and [w["devices"] for w in got.report["workers"]] == [[0, 1, 2, 3],
                                                                                                 [4, 5, 6, 7]]
        else:
            assert moved["between_nodes"] == moved["actor_calls"] + moved["object_store"] > 0
        for d in range(8):
            _same_bits(got[d], expected[d], f"{name}: device {d}")


def test_bytes_moved_between_workers(ray_cluster):
    """4 devices in 2 workers of 2: what crosses is counted once per payload and receiving worker."""
    import hloexec
    from hloexec import spmd
    exe = hloexec.load(ALL_REDUCE_GATHER)
    inputs = [[np.random.default_rng(d).standard_normal(300000).astype(np.float32)] for d in range(4)]
    expected = exe.run_spmd(inputs, **_QUIET)
    got = exe.run_spmd(inputs, runner="ray", participants_per_worker=2, **_QUIET)
    assert [w["devices"] for w in got.report["workers"]] == [[0, 1], [2, 3]]
    moved = got.report["bytes_moved"]
    # all-reduce: each device's 1.2 MB to the other worker (one put for its two devices), then its folded
    # quarter (300 KB); all-gather: 12 bytes each, by value in the actor call
    assert moved["object_store"] == 4 * 1_200_000 + 4 * 300_000
    assert moved["actor_calls"] == 4 * 12 and moved["messages"] == 3 * 4
    assert moved["between_nodes"] == moved["object_store"] + moved["actor_calls"]
    assert moved["inputs"] == 4 * 1_200_000 and moved["outputs_fetched"] == 0
    assert spmd.check_replicated(exe.module, got) == []
    assert moved["outputs_fetched"] == 0            # compared by digests, nothing fetched
    for d in range(4):
        _same_bits(got[d], expected[d], f"device {d}")
    assert moved["outputs_fetched"] == 4 * (1_200_000 + 48)


def test_global_inputs_and_seeds_are_split_on_the_workers(ray_cluster):
    import hloexec
    from hloexec import spmd
    text = """HloModule m, num_partitions=4
add { a = f32[] parameter(0)
 b = f32[] parameter(1)
 ROOT s = f32[] add(a, b) }
ENTRY e { x = f32[2,3] parameter(0), sharding={devices=[4,1]<=[4]}
 w = f32[3] parameter(1), sharding={replicated}
 t = f32[2,3] all-reduce(x), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add
 b = f32[2,3] broadcast(w), dimensions={1}
 ROOT r = f32[2,3] multiply(t, b) }"""
    exe = hloexec.load(text)
    expected = exe.run_spmd(spmd.random_inputs(exe.module, 4, seed=5), **_QUIET)
    from_seed = exe.run_spmd(spmd.GlobalInputs(seed=5), runner="ray", participants_per_worker=1, **_QUIET)
    assert from_seed.report["bytes_moved"]["inputs"] == 0
    seeded = [from_seed[d] for d in range(4)]
    from_seed.release()         # its 4 workers hold the cluster's 4 CPUs until then
    values = spmd.random_global_inputs(exe.module, seed=5)
    from_values = exe.run_spmd(spmd.GlobalInputs(values), runner="ray", participants_per_worker=2, **_QUIET)
    assert from_values.report["bytes_moved"]["inputs"] == values[0].nbytes + values[1].nbytes   # put once
    for d in range(4):
        _same_bits(seeded[d], expected[d], f"seed: device {d}")
        _same_bits(from_values[d], expected[d], f"values: device {d}")


_BRANCHES = """HloModule m, num_partitions=4
add { a = f32[] parameter(0)
 b = f32[] parameter(1)
 ROOT s = f32[] add(a, b) }
low { x = f32[4] parameter(0)
 ROOT lo = f32[4] all-reduce(x), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add }
high { x = f32[4] parameter(0)
 ROOT hi = f32[4] HIGH }
ENTRY e { p = f32[4] parameter(0)
 i = u32[] partition-id()
 two = u32[] constant(2)
 c = pred[] compare(i, two), direction=LT
 ROOT r = f32[4] conditional(c, p, p), true_computation=low, false_computation=high }
"""


@pytest.mark.parametrize("high, message", [
    ("all-reduce(x), channel_id=2, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add",
     r"collective mismatch: device \d's collective #0 is %(lo|hi), device \d's is %(hi|lo)"),
    ("negate(x)", r"device [23] finished after 0 collectives; device [01] waits for its #0 \(%lo\)"),
])
def test_disagreements_across_workers_are_the_thread_runners_errors(ray_cluster, high, message):
    """Devices 0-1 (worker 0) and 2-3 (worker 1) run different branches: the same error as with threads, once
    across workers (a mismatch seen by the receiver, a finished device seen by the driver), without a hang."""
    import hloexec
    exe = hloexec.load(_BRANCHES.replace("HIGH", high))
    inputs = [[np.ones(4, np.float32)]] * 4
    with pytest.raises(hloexec.ExecutionError, match=message):
        exe.run_spmd(inputs, **_QUIET)
    start = time.monotonic()
    with pytest.raises(hloexec.ExecutionError, match=message):
        exe.run_spmd(inputs, runner="ray", participants_per_worker=2, timeout=120, **_QUIET)
    assert time.monotonic() - start < 60


def test_a_worker_that_dies_fails_the_run(ray_cluster):
    """Devices 2-3 spin in a long loop while 0-1 wait for them in an all-reduce; their worker is killed."""
    import hloexec
    spin = """HloModule m, num_partitions=4
add { a = f32[] parameter(0)
 b = f32[] parameter(1)
 ROOT s = f32[] add(a, b) }
cond { s = s64[] parameter(0)
 n = s64[] constant(9000000000000000000)
 ROOT lt = pred[] compare(s, n), direction=LT }
body { s = s64[] parameter(0)
 one = s64[] constant(1)
 ROOT t = s64[] add(s, one) }
ENTRY e { p = f32[4] parameter(0)
 i = u32[] partition-id()
 z = u32[] constant(2)
 low = pred[] compare(i, z), direction=LT
 zero = s64[] constant(0)
 n = s64[] constant(9000000000000000000)
 start = s64[] select(low, n, zero)
 w = s64[] while(start), condition=cond, body=body
 wf = f32[] convert(w)
 b = f32[4] broadcast(wf), dimensions={}
 q = f32[4] add(p, b)
 ROOT r = f32[4] all-reduce(q), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add }
"""
    exe = hloexec.load(spin, use_numba=False)        # interpreted, the loop spins (compiled, LLVM folds it)
    killed = []

    def kill_the_spinning_worker(message: str) -> None:
        """The run says where its workers are before it starts: the one of devices 2-3 is killed 3 s later."""
        if "devices 2-3 on node" in message:
            pid = int(message.split("devices 2-3 on node")[1].split("pid ")[1].split(")")[0])
            killed.append(pid)
            threading.Timer(3.0, os.kill, (pid, signal.SIGKILL)).start()
    start = time.monotonic()
    with pytest.raises(hloexec.ExecutionError, match=r"worker 1 \(devices 2-3, node \w+, pid \d+\) died"):
        exe.run_spmd([[np.ones(4, np.float32)]] * 4, runner="ray", participants_per_worker=2, timeout=120,
                     report=kill_the_spinning_worker)
    assert killed and time.monotonic() - start < 60


def test_what_does_not_fit_is_refused_before_starting(ray_cluster):
    """The nodes have 1 CPU and 12 GB (Ray's 'memory' resource) each: checked before any worker starts."""
    import hloexec
    from hloexec import spmd
    # 3.2 GB tiles: a worker of 4 needs ~24 GB, of 2 ~12 GB, of 1 ~6 GB
    text = ("HloModule m, num_partitions=8\nENTRY e { p = f32[800000000] parameter(0), "
            "sharding={devices=[8]<=[8]}\n ROOT n = f32[800000000] negate(p) }")
    big = hloexec.load(text)
    with pytest.raises(hloexec.ExecutionError, match=r"a worker of 4 participants \(devices 0-3\) needs about "
                                                     r"23\.\d\d GB, more than the largest node's 12\.00 GB"):
        big.run_spmd(spmd.GlobalInputs(seed=0), runner="ray", participants_per_worker=4, **_QUIET)
    # the run's limit is the options' max_memory, as for one participant; memory_limit= is its deprecated name
    refused = r"m on 8 participants needs \d+\.\d\d GiB in all .* but max_memory allows 0\.00 GiB"
    with pytest.raises(MemoryLimitError, match=refused):
        hloexec.load(text, max_memory=1 << 20).run_spmd(spmd.GlobalInputs(seed=0), runner="ray",
                                                         participants_per_worker=1, **_QUIET)
    with pytest.raises(MemoryLimitError, match=refused), pytest.warns(DeprecationWarning, match="max_memory"):
        big.run_spmd(spmd.GlobalInputs(seed=0), runner="ray", participants_per_worker=1, memory_limit=1 << 20,
                     **_QUIET)
    with pytest.raises(hloexec.ExecutionError, match=r"nodes cannot hold 8 workers of 1 CPUs and 5\.\d\d GB"):
        big.run_spmd(spmd.GlobalInputs(seed=0), runner="ray", participants_per_worker=1, **_QUIET)


# -- the command line -----------------------------------------------------------------------------------------
def test_cli_run_with_ray_reports_what_the_thread_runner_does(ray_cluster, tmp_path, capsys):
    from test_spmd_cli import SPMD_MODULE, run_cli
    from hloexec.tools.xla_cpu import load_arrays
    path = tmp_path / "tiled_sum.hlo"
    path.write_text(SPMD_MODULE)
    code, out, _ = run_cli(capsys, "run", path, "--spmd", "--seed", "1", "--json", "--out", tmp_path / "threads.npz")
    threads = json.loads(out)
    code_ray, out, err = run_cli(capsys, "run", path, "--spmd", "--seed", "1", "--json", "--out", tmp_path / "ray.npz",
                               "--ray", ray_cluster.address, "--participants-per-worker", "2")
    assert out, err
    ray = json.loads(out)
    assert code == code_ray == 1                  # out2 claims to be replicated and is not: found by digests
    assert ray["replicated"] == threads["replicated"] and ray["outputs"] == threads["outputs"]
    assert threads["spmd"]["runner"] == "threads" and ray["spmd"]["runner"] == "ray"
    report = ray["spmd"]["ray"]
    assert [w["devices"] for w in report["workers"]] == [[0, 1], [2, 3]]
    assert report["bytes_moved"]["actor_calls"] > 0 and report["bytes_moved"]["outputs_fetched"] > 0
    assert all(w["peak_rss_bytes"] > 0 for w in report["workers"])
    expected, got = load_arrays(tmp_path / "threads.npz"), load_arrays(tmp_path / "ray.npz")
    assert sorted(expected) == sorted(got)
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key])


def test_cli_participants_per_worker_needs_ray(tmp_path, capsys):
    from test_spmd_cli import SPMD_MODULE, run_cli
    path = tmp_path / "tiled_sum.hlo"
    path.write_text(SPMD_MODULE)
    code, _, err = run_cli(capsys, "run", path, "--spmd", "--participants-per-worker", "2")
    assert code == 2 and "--participants-per-worker places participants in Ray actors: it needs --ray" in err


@pytest.mark.xla
def test_cli_compare_with_ray_gives_the_thread_runners_report(ray_cluster, jax_programs, tmp_path, capsys):
    from test_spmd_cli import run_cli
    from hloexec.tools.xla_cpu import save_arrays
    saved = np.load(jax_programs / "sequence_parallel.npz")
    save_arrays(tmp_path / "global.npz", {f"arg{i}": saved[f"global/arg{i}"] for i in range(4)})
    argv = ["compare", jax_programs / "sequence_parallel.hlo", jax_programs / "sequence_parallel.pre.hlo", "--spmd",
            "--inputs", tmp_path / "global.npz", "--atol", "0.05", "--rtol", "1e-3", "--json"]
    code, text, _ = run_cli(capsys, *argv)
    code_ray, text_ray, _ = run_cli(capsys, *argv, "--ray", ray_cluster.address)   # global arrays split on workers
    assert code == code_ray == 0 and json.loads(text_ray) == json.loads(text)


def test_cli_joins_a_cluster_by_address(ray_cluster, tmp_path):
    from test_spmd_cli import SPMD_MODULE
    path = tmp_path / "tiled_sum.hlo"
    path.write_text(SPMD_MODULE)
    done = subprocess.run([sys.executable, "-m", "hloexec", "run", str(path), "--ray", ray_cluster.address, "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr      # out2's disagreement
    report = json.loads(done.stdout)["spmd"]["ray"]
    assert report["nodes"] == 4 and len({w["node"] for w in report["workers"]}) == 4
    assert "ray: ran in" in done.stderr


# -- the seeds ------------------------------------------------------------------------------------------------
def _seed_matches(shared_path, seed: str, devices: int, per_worker: int):
    """The seed's random inputs (seed 0): the Ray runner's outputs have the thread runner's digests (held as
    digests: the GPT seed's outputs are 2.9 GB) and the replicated ones agree."""
    import hloexec
    from hloexec import spmd
    from hloexec.spmd.ray_runner import digest
    exe = hloexec.load(shared_path("seeds", seed))
    expected = [digest(out) for out in exe.run_spmd(spmd.random_inputs(exe.module, devices, seed=0), **_QUIET)]
    got = hloexec.load(shared_path("seeds", seed)).run_spmd(
        spmd.GlobalInputs(seed=0), runner="ray", participants_per_worker=per_worker, **_QUIET)
    assert len(set(_nodes(got))) == devices // per_worker
    assert got.digests() == expected
    assert spmd.check_replicated(exe.module, got) == []
    return got


def test_tpu_seed_on_8_partitions_across_2_nodes(ray_cluster, shared_path):
    _seed_matches(shared_path, "tpu_seqparallel_remat_8dev.hlo", 8, 4)


@pytest.mark.slow
def test_xmap_seed_on_4_partitions_across_2_nodes(ray_cluster, shared_path):
    _seed_matches(shared_path, "xmap_train_step_4dev.hlo", 4, 2)


@pytest.mark.slow
def test_gpt_seed_16_participants_on_2_nodes_of_8(ray_cluster, shared_path):
    """~11 GB: `flock /tmp/hloexec-heavy.lock pytest -m slow tests/test_spmd_ray.py -k gpt`."""
    got = _seed_matches(shared_path, "gpt_train_step_shard_parallel_16dev.hlo", 16, 8)
    # the tensor-parallel groups inside the workers: only the data-parallel all-reduces cross them
    assert [w["devices"] for w in got.report["workers"]] == [list(range(8)), list(range(8, 16))]
