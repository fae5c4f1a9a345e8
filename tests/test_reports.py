"""The reports and exports of issue 18: `hloexec memory`, `collectives`, `export --chakra/--astra-sim`, `graph`
(hloexec/tools/memory.py, collectives.py, costmodel.py, export.py, chakra.py, graph.py)."""
from __future__ import annotations

import html.parser
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import hloexec
from hloexec import spmd
from hloexec.tools import chakra, costmodel
from hloexec.tools.cli import main
from hloexec.tools.collectives import collectives_report
from hloexec.tools.export import astra_sim_text, program, write_chakra
from hloexec.tools.graph import neighbourhood, own_svg, to_dot, to_html
from hloexec.tools.memory import memory_report, xla_numbers
from hloexec.tools.stats import module_stats

from conftest import headless_browser, shared_path

TPU = ("seeds", "tpu_seqparallel_remat_8dev.hlo")
GPT = ("seeds", "gpt_train_step_shard_parallel_16dev.hlo")

# Three chained dots (never fused): while d3 runs, p0, d1, d2 and d3 are live (4 x 64x64 f32).
DOTS = """HloModule dots

ENTRY e {
  p0 = f32[64,64] parameter(0)
  d1 = f32[64,64] dot(p0, p0), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  d2 = f32[64,64] dot(d1, p0), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT d3 = f32[64,64] dot(d2, d1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""

# 4 partitions: an all-reduce over {0,1},{2,3}, an all-gather over all four, a reduce-scatter, a permute ring.
COLLECTIVES = """HloModule colls, num_partitions=4

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY e {
  p = f32[1024] parameter(0)
  ar = f32[1024] all-reduce(p), channel_id=1, replica_groups={{0,1},{2,3}}, use_global_device_ids=true, to_apply=add
  ag = f32[4096] all-gather(ar), channel_id=2, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true
  rs = f32[1024] reduce-scatter(ag), channel_id=3, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true, to_apply=add
  ROOT cp = f32[1024] collective-permute(rs), channel_id=4, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
}
"""


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_report_commands_have_help_with_examples(capsys):
    for command in ("memory", "collectives", "export", "graph"):
        code, out, _ = run_cli(capsys, command, "--help")
        assert code == 0 and "examples:" in out and "exit codes:" in out


def load(text_or_path):
    return hloexec.load(text_or_path, compile_kernels=False)


# -- memory -------------------------------------------------------------------------------------------
def test_memory_peak_and_live_values_of_three_dots():
    r = memory_report(load(DOTS))
    block = 64 * 64 * 4
    assert r.peak_bytes == 4 * block
    assert r.peak_at["name"] == "d3"
    live = {v.name: v for v in r.live_at_peak}
    assert set(live) == {"%p0", "%d1", "%d2", "%d3"}
    assert live["%p0"].kind == "parameter" and live["%d3"].kind == "output"
    assert live["%d1"].why == live["%d2"].why == "read by this step for the last time"
    assert live["%d3"].why.startswith("an output")
    # one step earlier d1 waits for d3: the report says so where d1 is made and d2 runs
    d1 = next(life for life in r.lives if life.producer.name == "d1")
    assert [r.steps[k].name for k in d1.readers] == ["d2", "d3"]


def test_memory_report_adds_up_to_the_estimate_run_checks(shared_path):
    exe = load(shared_path(*TPU))
    r = memory_report(exe, spmd=True)
    assert r.peak_bytes == exe.peak_bytes() == sum(v.bytes for v in r.live_at_peak)
    assert r.series[r.peak_step] == max(r.series) and len(r.series) == len(exe.plan.steps) + 1
    # the all-participants figure is run --spmd's, with inputs as split_inputs shares them
    assert r.spmd["all_participants"] == spmd.memory_estimate(exe, spmd.random_inputs(exe.module, 8))


def test_memory_answers_which_gathered_values_stay_live_in_the_tpu_seed(shared_path):
    """The JAX issue's question: the collective results, from where to where."""
    exe = load(shared_path(*TPU))
    r = memory_report(exe, spmd=True)
    order = [s.name for s in r.steps]
    by_name = {v.name: v for v in r.collective_values}
    assert set(by_name) == {"%all-gather", "%all-gather.1", "%all-reduce"}
    for name, v in by_name.items():
        inst = exe.module.entry.by_name[name[1:]]
        last_user = max(inst.users, key=lambda u: order.index(u.name) if u.name in order else -1)
        assert v.producer["name"] == inst.name and v.last_user["name"] == last_user.name
        assert v.bytes == inst.shape.nbytes and v.producer["phase"] == "backward"
    # the all-reduced activation is held from its step to the ROOT's, across the backward's fusions
    ar = by_name["%all-reduce"]
    assert order[ar.made] == "all-reduce" and order[ar.last] == exe.module.entry.root.name
    assert any(v.name == "%all-reduce" for v in r.live_at_values_peak)


def test_memory_cli_json_and_plot(capsys, tmp_path, shared_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "timeline.png"
    code, out, _ = run_cli(capsys, "memory", shared_path(*TPU), "--spmd", "--json", "--plot", png)
    assert code == 0
    doc = json.loads(out)
    assert doc["peak_bytes"] == [doc["peak_bytes"][0]] * 8 and doc["devices"] == 8
    assert {"name", "kind", "bytes", "why", "producer", "last_user"} <= set(doc["live_at_peak"][0])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    code, out, _ = run_cli(capsys, "memory", shared_path(*TPU))
    assert code == 0 and "values made by collectives" in out and "%all-reduce" in out


def test_memory_cli_refuses_an_unknown_module_cleanly(capsys, tmp_path):
    bad = tmp_path / "bad.hlo"
    bad.write_text(DOTS.replace("dot(p0, p0)", "frobnicate(p0, p0)"))
    code, _, err = run_cli(capsys, "memory", bad)
    assert code == 2 and "frobnicate" in err and "internal" not in err


@pytest.mark.xla
def test_memory_reads_xla_dump_numbers_beside_the_module(tmp_path, capsys):
    script = ("import jax, jax.numpy as jnp\n"
              "f = jax.jit(lambda x, w: jnp.tanh(x @ w).sum())\n"
              "f(jnp.ones((64, 128)), jnp.ones((128, 256))).block_until_ready()\n")
    # JAX_ENABLE_X64=0: the tests' own jax (hloexec.tools.xla_cpu) turns x64 on, and its children inherit that
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_ENABLE_X64="0",
               XLA_FLAGS=f"--xla_dump_to={tmp_path} --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*jit__lambda.*")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    modules = sorted(tmp_path.glob("*jit__lambda*cpu_after_optimizations.txt"))
    assert modules, sorted(p.name for p in tmp_path.iterdir())
    x = xla_numbers(str(modules[0]))
    assert set(x["files"]) == {"buffer-assignment", "memory-usage-report", "live-range"}
    assert x["total_bytes"] == x["allocated_bytes"]        # two of XLA's files agree
    assert x["allocations"]["parameter"] == (64 * 128 + 128 * 256) * 4
    assert 0 < x["peak_live_bytes"] <= x["total_bytes"]
    code, out, _ = run_cli(capsys, "memory", modules[0])
    assert code == 0 and "XLA's numbers" in out


# -- collectives --------------------------------------------------------------------------------------
def test_collectives_groups_bytes_and_ring_times_by_hand():
    module = hloexec.parse(COLLECTIVES)[0]
    r = collectives_report(module, bandwidth=100e9, latency=2e-6)
    ar, ag, rs, cp = r.collectives
    assert ar.groups == [[0, 1], [2, 3]] and ag.groups == rs.groups == [[0, 1, 2, 3]]
    assert (ar.bytes, ag.bytes, rs.bytes, cp.bytes) == (4096, 16384, 16384, 4096)
    assert ar.sent == [4096.0] * 4                          # 2(n-1)/n x 4096 with n = 2
    assert ag.sent == rs.sent == [3 / 4 * 16384] * 4
    assert cp.groups == [[0, 1], [1, 2], [2, 3], [3, 0]] and cp.sent == cp.received == [4096.0] * 4
    base = costmodel.BASE_LATENCY
    assert ar.seconds == pytest.approx(base + 2 * 2e-6 + 4096 / 100e9)
    assert ag.seconds == pytest.approx(base + 3 * 2e-6 + 12288 / 100e9)
    assert cp.seconds == pytest.approx(base + 2e-6 + 4096 / 100e9)
    doc = r.to_dict()
    assert doc["total_bytes"] == 4096 + 16384 + 16384 + 4096
    assert [c["name"] for c in doc["collectives"]] == ["ar", "ag", "rs", "cp"]


def test_collectives_of_the_gpt_seed_match_stats(capsys, shared_path):
    path = shared_path(*GPT)
    code, out, _ = run_cli(capsys, "collectives", path, "--json")
    assert code == 0
    doc = json.loads(out)
    stats = module_stats(hloexec.parse(path)[0])
    assert doc["total_bytes"] == sum(c.bytes for c in stats.collectives)
    assert len(doc["collectives"]) == sum(c.count for c in stats.collectives) == 43
    groups = {json.dumps(c["groups"]) for c in doc["collectives"]}
    assert groups == {json.dumps([list(range(8)), list(range(8, 16))]),
                      json.dumps([[d, d + 8] for d in range(8)])}
    assert doc["devices"] == 16 and doc["link"]["name"].startswith("NVLink")
    assert all(c["kind"] == "all-reduce" and c["bytes"] > 0 for c in doc["collectives"])


# -- exports ------------------------------------------------------------------------------------------
def test_astra_sim_text_of_the_gpt_seed(tmp_path, capsys, shared_path):
    path = shared_path(*GPT)
    out = tmp_path / "workload.txt"
    code, text, _ = run_cli(capsys, "export", path, "--astra-sim", out, "--json")
    assert code == 0
    summary = json.loads(text)["astra_sim"]
    lines = out.read_text().splitlines()
    header = lines[0].split()
    assert header[0] == "HYBRID_TRANSFORMER_FWD_IN_BCKWD" and header[1:3] == ["model_parallel_NPU_group:", "8"]
    assert header[header.index("all_gpus:") + 1] == "16"
    assert int(lines[1]) == len(lines) - 2 == summary["rows"]
    rows = [line.split("\t") for line in lines[2:]]
    assert all(len(row) == 12 and row[1] == "-1" for row in rows)
    assert [row[0] for row in rows if row[0].startswith("layer_")] == [f"layer_{i}" for i in range(6)]
    # totals against `collectives` (bytes per kind) and `stats` (FLOPs), compute against the roofline
    module = hloexec.parse(path)[0]
    comm = sum(int(row[k]) for row in rows for k in (4, 7, 10))
    assert comm == collectives_report(module).to_dict()["total_bytes"]
    assert summary["flops"] == module_stats(module).flops
    p = program(module)
    compute = sum(int(row[k]) for row in rows for k in (2, 5, 8, 11))
    assert abs(compute - sum(e.seconds for e in p.events if e.collective is None) * 1e9) <= 4 * len(rows)


def test_astra_sim_rows_parse_with_chakras_text_converter(tmp_path, shared_path):
    converter = pytest.importorskip("chakra.src.converter.text_converter",
                                    reason="mlc-chakra not installed (pip install --no-deps mlc-chakra)")
    text, _ = astra_sim_text(program(hloexec.parse(shared_path(*TPU))[0]))
    for line in text.splitlines()[2:]:
        layer = converter.Layer(line)
        assert layer.fwd_comm_type in ("NONE", "ALLREDUCE", "ALLGATHER", "REDUCESCATTER", "ALLTOALL")


def _check_chakra_dir(directory, report):
    """Every device's trace: node ids in order, dependencies on earlier nodes, collectives the device is in
    with the report's sizes, communicator groups that exist and hold the device."""
    groups = json.loads(next(directory.glob("*.comm_group.json")).read_text())
    traces = sorted(directory.glob("*.et"), key=lambda p: int(p.suffixes[-2][1:]))
    assert len(traces) == report.devices
    for d, path in enumerate(traces):
        metadata, nodes = chakra.read_stream(path)
        assert metadata.version == chakra.SCHEMA_VERSION
        assert [n.id for n in nodes] == list(range(len(nodes)))
        for n in nodes:
            assert all(dep < n.id for dep in (*n.data_deps, *n.ctrl_deps))
        sizes = {}
        for n in nodes:
            a = chakra.attrs_of(n)
            if n.type == chakra.COMM_COLL_NODE:
                assert d in groups[a["pg_name"]]
                sizes[n.name] = a["comm_size"]
            elif n.type == chakra.COMP_NODE:
                assert a["num_ops"] >= 1 and not a["is_cpu_op"]
        expected = {c.inst.name: c.bytes for c in report.collectives
                    if c.kind != "collective-permute" and any(d in g for g in c.groups)}
        assert sizes == expected
    return traces


def test_chakra_traces_of_the_tpu_seed(tmp_path, shared_path):
    module = hloexec.parse(shared_path(*TPU))[0]
    written = write_chakra(program(module), tmp_path)
    assert len(written["files"]) == 8 and written["nodes"]["collective"] == 3 * 8
    _check_chakra_dir(tmp_path, collectives_report(module))


def test_chakra_traces_send_recv_for_a_permute(tmp_path):
    module = hloexec.parse(COLLECTIVES)[0]
    write_chakra(program(module), tmp_path)
    _check_chakra_dir(tmp_path, collectives_report(module))
    _, nodes = chakra.read_stream(tmp_path / "colls.2.et")
    p2p = [(n.type, chakra.attrs_of(n)["comm_src"], chakra.attrs_of(n)["comm_dst"]) for n in nodes
           if n.type in (chakra.COMM_SEND_NODE, chakra.COMM_RECV_NODE)]
    assert sorted(p2p) == [(chakra.COMM_SEND_NODE, 2, 3), (chakra.COMM_RECV_NODE, 1, 2)]


def test_chakra_traces_read_by_mlc_chakra(tmp_path, shared_path):
    protolib = pytest.importorskip("chakra.src.third_party.utils.protolib",
                                   reason="mlc-chakra not installed (pip install --no-deps mlc-chakra)")
    from chakra.schema.protobuf.et_def_pb2 import GlobalMetadata, Node
    write_chakra(program(hloexec.parse(shared_path(*TPU))[0]), tmp_path)
    for path in tmp_path.glob("*.et"):
        _, ours = chakra.read_stream(path)
        f = protolib.openFileRd(str(path))
        metadata = GlobalMetadata()
        assert protolib.decodeMessage(f, metadata)
        theirs = []
        node = Node()
        while protolib.decodeMessage(f, node):
            theirs.append((node.id, node.type, list(node.data_deps), {a.name for a in node.attr}))
            node = Node()
        assert theirs == [(n.id, n.type, list(n.data_deps), {a.name for a in n.attr}) for n in ours]


def test_export_needs_a_target(capsys, tmp_path):
    path = tmp_path / "m.hlo"
    path.write_text(DOTS)
    code, _, err = run_cli(capsys, "export", path)
    assert code == 2 and "--chakra" in err


# -- graph --------------------------------------------------------------------------------------------
class _Tags(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.external = []
        self.groups = 0

    def handle_starttag(self, tag, attrs):
        for key, value in attrs:
            if key in ("src", "href") and value and not value.startswith("#"):
                self.external.append(value)
        if tag == "g" and ("class", "node") in attrs:
            self.groups += 1


def test_graph_neighbourhood_is_bounded_and_self_contained(tmp_path, capsys, shared_path):
    module = hloexec.parse(shared_path(*GPT))[0]
    g = neighbourhood(module, "all-reduce.4", depth=2, max_nodes=40)
    assert g.center.name == "all-reduce.4" and 1 < len(g.nodes) <= 40
    names = {n.name for n in g.nodes}
    assert {o.name for o in g.center.operands} | {u.name for u in g.center.users} <= names
    assert all(a.name in names and b.name in names and a in b.operands for a, b in g.edges)
    assert g.kind(g.center) == "collective"
    dot = to_dot(g)
    assert dot.startswith("digraph") and "all-reduce.4" in dot and dot.count("->") >= len(g.edges)
    for svg in (own_svg(g), None):      # our layout, and Graphviz's where installed
        page = to_html(g, svg)
        tags = _Tags()
        tags.feed(page)
        assert tags.external == [] and tags.groups == len(g.nodes)
    out = tmp_path / "g.html"
    code, text, _ = run_cli(capsys, "graph", shared_path(*GPT), "--around", "%all-reduce.4", "-o", out)
    assert code == 0 and out.stat().st_size > 1000 and "all-reduce.4" in text


@pytest.mark.skipif(headless_browser() is None, reason="no headless Chromium (apt-get install chromium-headless-shell)")
def test_graph_html_runs_in_a_headless_browser(tmp_path, shared_path):
    module = hloexec.parse(shared_path(*TPU))[0]
    g = neighbourhood(module, "all-reduce", depth=2)
    page = tmp_path / "g.html"
    page.write_text(to_html(g))
    done = subprocess.run([headless_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                           page.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f'data-nodes="{len(g.nodes)}"' in done.stdout       # the page's script ran and found every node
