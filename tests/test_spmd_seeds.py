"""The seed dumps run with every participant (hloexec.spmd): all devices finish, and the outputs
their shardings say are replicated agree exactly across devices.

Times on the shared 2-core machine (`pytest tests/test_spmd_seeds.py --durations=0`, heavily loaded):
the TPU seed 12-40 s; the xmap seed (five 2048x8192x2048 f32 GEMMs per device) and the GPT seed
(16 participants, 151 gemms and 282 fusions each) take many minutes: `slow`.
"""
from __future__ import annotations

import numpy as np
import pytest


def _run_all(shared_path, seed: str, devices: int):
    import hloexec
    from hloexec import spmd
    exe = hloexec.load(shared_path("seeds", seed))
    partitions, replicas, _ = spmd.device_counts(exe.module)
    assert partitions * replicas == devices
    outputs = exe.run_spmd(spmd.random_inputs(exe.module, devices, seed=0), report=lambda message: None)
    assert len(outputs) == devices and all(out is not None for out in outputs)
    return exe, outputs


def test_tpu_seed_runs_on_8_partitions(shared_path):
    # tiled layouts T(8,128)(2,1) and bitcasts between them, iota and list groups, partition-id tables
    from hloexec import spmd
    exe, outputs = _run_all(shared_path, "tpu_seqparallel_remat_8dev.hlo", 8)
    assert spmd.check_replicated(exe.module, outputs) == []
    assert all(np.isfinite(out).all() for out in outputs)
    # the output is split along the sequence: the devices hold different pieces
    assert not np.array_equal(outputs[0], outputs[1])


@pytest.mark.slow
def test_xmap_seed_runs_on_4_devices(shared_path):
    from hloexec import spmd
    exe, outputs = _run_all(shared_path, "xmap_train_step_4dev.hlo", 4)
    assert spmd.check_replicated(exe.module, outputs) == []


@pytest.mark.slow
def test_gpt_seed_runs_on_16_partitions_and_replicated_outputs_agree(shared_path):
    from hloexec import spmd
    exe, outputs = _run_all(shared_path, "gpt_train_step_shard_parallel_16dev.hlo", 16)
    # the outputs are the Adam-updated parameters and optimizer state, aliased to parameters whose
    # shardings say which devices hold the same values: all 16 ({replicated}), or the data-parallel pairs
    # {0,8},{1,9},... (last_tile_dim_replicate) that all-reduce their gradients
    shardings = spmd.output_shardings(exe.module)
    leaves = outputs[0]
    groups = [spmd.agreeing_groups(s, 16, v.ndim) for s, v in zip(shardings, leaves)]
    assert sum(1 for g in groups if g == [list(range(16))]) > 100
    assert sum(1 for g in groups if g and len(g[0]) == 2) > 100
    assert spmd.check_replicated(exe.module, outputs) == []
