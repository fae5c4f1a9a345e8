"""Async collectives, send/recv and ragged-all-to-all between SPMD participants (hloexec.spmd).

The async forms mean their synchronous op (XLA's parser reads `all-to-all-start` as an async-start wrapping an
all-to-all): each is checked against its synchronous twin, whose semantics tests/test_spmd.py checks against
XLA:CPU on 8 devices; XLA's own parser must accept every async text used here.
"""
from __future__ import annotations

import numpy as np
import pytest

import hloexec

_ADD = "add { a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT s = f32[] add(a, b) }\n"

# One op per line; {start}/{done} mark where the async text differs. Four partitions.
_FORMS = {
    "all-to-all": ("f32[8,2]", "f32[8,2] all-to-all(p), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}"),
    "reduce-scatter": ("f32[2,2]", "f32[2,2] reduce-scatter(p), channel_id=2, replica_groups={{0,1,2,3}}, "
                       "use_global_device_ids=true, dimensions={0}, to_apply=add"),
    "collective-broadcast": ("f32[8,2]", "f32[8,2] collective-broadcast(p), channel_id=3, "
                             "replica_groups={{2,0,1,3}}"),
    "all-gather": ("f32[32,2]", "f32[32,2] all-gather(p), channel_id=4, replica_groups={{0,1,2,3}}, "
                   "use_global_device_ids=true, dimensions={0}"),
    "all-reduce": ("f32[8,2]", "f32[8,2] all-reduce(p), channel_id=5, replica_groups={{0,1,2,3}}, "
                   "use_global_device_ids=true, to_apply=add"),
    "collective-permute": ("f32[8,2]", "f32[8,2] collective-permute(p), channel_id=6, "
                           "source_target_pairs={{0,1},{1,2},{2,3},{3,0}}"),
}


def _sync(op: str) -> str:
    result, body = _FORMS[op]
    return f"HloModule m, num_partitions=4\n{_ADD}ENTRY e {{\n p = f32[8,2] parameter(0)\n ROOT r = {body}\n}}\n"


def _async(op: str) -> str:
    """The async form as XLA prints it: legacy all-reduce/all-gather/collective-permute-start with their own
    shapes, the others as the async shorthand ((operands), result) with an -update between."""
    result, body = _FORMS[op]
    call = body[len(result) + 1:].replace(f"{op}(", f"{op}-start(", 1)
    if op == "all-reduce":
        start, done = f"{result} {call}", f"{result} all-reduce-done(s)"
    elif op in ("all-gather", "collective-permute"):
        start, done = f"(f32[8,2], {result}) {call}", f"{result} {op}-done(s)"
    else:
        start = f"((f32[8,2]), {result}) {call}"
        done = f"{result} {op}-done(u)"
    update = f"\n u = ((f32[8,2]), {result}) {op}-update(s)" if done.endswith("(u)") else ""
    return (f"HloModule m, num_partitions=4\n{_ADD}ENTRY e {{\n p = f32[8,2] parameter(0)\n s = {start}{update}\n"
            f" ROOT d = {done}\n}}\n")


def _inputs():
    return [[np.arange(16, dtype=np.float32).reshape(8, 2) * (d + 1) + d] for d in range(4)]


def _run(text: str):
    return hloexec.load(text).run_spmd(_inputs(), report=lambda message: None)


@pytest.mark.parametrize("op", sorted(_FORMS))
def test_async_form_is_its_sync_op(op):
    sync, asynchronous = _run(_sync(op)), _run(_async(op))
    for d in range(4):
        np.testing.assert_array_equal(asynchronous[d], sync[d])
    if op == "collective-broadcast":        # the group's first member is device 2
        assert all(np.array_equal(out, _inputs()[2][0]) for out in sync)


@pytest.mark.xla
def test_xla_parses_the_async_texts():
    from hloexec.tools.xla_cpu import parse_with_xla
    for op in _FORMS:
        parse_with_xla(_async(op))
    parse_with_xla(_WRAPPED)


# A generic async-start of a computation that calls another one holding an async collective; copy-start too.
_WRAPPED = f"""HloModule m, num_partitions=4
{_ADD}
inner {{
  x = f32[8,2] parameter(0)
  s = f32[8,2] all-reduce-start(x), channel_id=1, replica_groups={{{{0,1,2,3}}}}, use_global_device_ids=true, to_apply=add
  ROOT d = f32[8,2] all-reduce-done(s)
}}

wrapped {{
  y = f32[8,2] parameter(0)
  c = f32[8,2] call(y), to_apply=inner
  ROOT n = f32[8,2] negate(c)
}}

ENTRY e {{
  p = f32[8,2] parameter(0)
  cs = (f32[8,2], f32[8,2], u32[]) copy-start(p)
  cd = f32[8,2] copy-done(cs)
  s = ((f32[8,2]), f32[8,2], s32[]) async-start(cd), calls=wrapped, async_execution_thread="parallel"
  u = ((f32[8,2]), f32[8,2], s32[]) async-update(s)
  ROOT d = f32[8,2] async-done(u)
}}
"""


def test_async_start_of_a_computation_with_nested_collectives():
    outputs = _run(_WRAPPED)
    total = sum(x[0] for x in _inputs())
    for out in outputs:
        np.testing.assert_array_equal(out, -total)


# -- send / recv ----------------------------------------------------------------------------------------
_PAIRS = "frontend_attributes={_xla_send_recv_source_target_pairs={{0,1},{1,2},{2,3}}}"
_SEND_RECV = f"""HloModule m, num_partitions=4
body {{
  b = (s32[], f32[8,2]) parameter(0)
  i = s32[] get-tuple-element(b), index=0
  x = f32[8,2] get-tuple-element(b), index=1
  t = token[] after-all()
  s = (f32[8,2], u32[], token[]) send(x, t), channel_id=1, {_PAIRS}
  sd = token[] send-done(s), channel_id=1, {_PAIRS}
  r = (f32[8,2], u32[], token[]) recv(sd), channel_id=1, {_PAIRS}
  rd = (f32[8,2], token[]) recv-done(r), channel_id=1, {_PAIRS}
  y = f32[8,2] get-tuple-element(rd), index=0
  one = s32[] constant(1)
  j = s32[] add(i, one)
  ROOT o = (s32[], f32[8,2]) tuple(j, y)
}}

cond {{
  b = (s32[], f32[8,2]) parameter(0)
  i = s32[] get-tuple-element(b), index=0
  n = s32[] constant(2)
  ROOT lt = pred[] compare(i, n), direction=LT
}}

ENTRY e {{
  p = f32[8,2] parameter(0)
  z = s32[] constant(0)
  init = (s32[], f32[8,2]) tuple(z, p)
  w = (s32[], f32[8,2]) while(init), condition=cond, body=body
  ROOT out = f32[8,2] get-tuple-element(w), index=1
}}
"""


def test_send_recv_in_a_loop_moves_data_along_the_pairs():
    """Two pipeline steps along 0 -> 1 -> 2 -> 3: device d ends with device d-2's input, zeros where no
    pair reaches it (as collective-permute, and jax's psend/precv)."""
    outputs = _run(_SEND_RECV)
    inputs = _inputs()
    for d, out in enumerate(outputs):
        np.testing.assert_array_equal(out, inputs[d - 2][0] if d >= 2 else np.zeros((8, 2), np.float32))


@pytest.mark.xla
def test_xla_parses_the_send_recv_text():
    from hloexec.tools.xla_cpu import parse_with_xla
    parse_with_xla(_SEND_RECV)


@pytest.mark.parametrize("attrs, message", [
    (f"channel_id=1, is_host_transfer=true, {_PAIRS}", "is_host_transfer=true talks to the host"),
    ("channel_id=1", "without the frontend attribute _xla_send_recv_source_target_pairs"),
])
def test_send_recv_that_cannot_run_says_why(attrs, message):
    with pytest.raises(hloexec.UnsupportedError, match=message):
        hloexec.load(_SEND_RECV.replace(f"channel_id=1, {_PAIRS}", attrs))


def test_recv_without_its_send_is_another_program():
    text = _SEND_RECV.replace(f"channel_id=1, {_PAIRS}\n  sd", f"channel_id=2, {_PAIRS}\n  sd")
    with pytest.raises(hloexec.UnsupportedError, match="its sender is another program"):
        hloexec.load(text)


# -- ragged-all-to-all ----------------------------------------------------------------------------------
def _ragged(n: int, rows: int, k: int = 1) -> str:
    offsets = f"s32[{n * k}]"
    return (f"HloModule m, num_partitions={n}\nENTRY e {{\n x = f32[{rows}] parameter(0)\n o = f32[{rows + 1}] "
            f"parameter(1)\n a = {offsets} parameter(2)\n b = {offsets} parameter(3)\n c = {offsets} parameter(4)\n"
            f" d = {offsets} parameter(5)\n ROOT r = f32[{rows + 1}] ragged-all-to-all(x, o, a, b, c, d), "
            f"channel_id=1, replica_groups={{{{{','.join(map(str, range(n)))}}}}}\n}}\n")


def test_ragged_all_to_all_is_jax_documented_example():
    """jax.lax.ragged_all_to_all's docstring example, axis of size 2."""
    exe = hloexec.load(_ragged(2, 3))
    s32 = lambda *v: np.array(v, np.int32)      # noqa: E731
    f32 = lambda *v: np.array(v, np.float32)    # noqa: E731
    outputs = exe.run_spmd([[f32(1, 2, 2), f32(0, 0, 0, 0), s32(0, 1), s32(1, 2), s32(0, 0), s32(1, 1)],
                            [f32(3, 4, 0), f32(0, 0, 0, 0), s32(0, 1), s32(1, 1), s32(1, 2), s32(2, 1)]],
                           report=lambda message: None)
    np.testing.assert_array_equal(outputs[0], f32(1, 3, 0, 0))
    np.testing.assert_array_equal(outputs[1], f32(2, 2, 4, 0))


def test_ragged_all_to_all_with_several_updates_per_peer_matches_the_definition():
    """Random ragged layouts on 4 participants, 2 updates per peer, against jax's pseudo-code written out."""
    n, k, rows = 4, 2, 12
    rng = np.random.default_rng(0)
    send = rng.integers(0, 3, (n, n * k))                     # send[src, dst*k+i]
    offsets_in = np.cumsum(send, axis=1) - send               # packed in the input
    recv = np.stack([send[:, d * k:(d + 1) * k].reshape(-1) for d in range(n)])   # recv[dst, src*k+i]
    at_receiver = np.cumsum(recv, axis=1) - recv              # where dst writes what src*k+i brings
    offsets_out = np.stack([at_receiver[d // k, s * k + d % k] for s in range(n) for d in range(n * k)]).reshape(n, -1)
    inputs = [[rng.standard_normal(rows).astype(np.float32), np.full(rows + 1, -1, np.float32)]
              + [v[s].astype(np.int32) for v in (offsets_in, send, offsets_out, recv)] for s in range(n)]
    outputs = hloexec.load(_ragged(n, rows, k)).run_spmd(inputs, report=lambda message: None)
    for dst in range(n):
        want = np.full(rows + 1, -1, np.float32)
        for src in range(n):
            for i in range(k):
                u = dst * k + i
                size, start, at = send[src, u], offsets_in[src, u], offsets_out[src, u]
                want[at:at + size] = inputs[src][0][start:start + size]
        np.testing.assert_array_equal(outputs[dst], want)


def test_ragged_all_to_all_out_of_range_is_an_execution_error():
    exe = hloexec.load(_ragged(2, 3))
    s32 = lambda *v: np.array(v, np.int32)      # noqa: E731
    inputs = [np.zeros(3, np.float32), np.zeros(4, np.float32), s32(0, 2), s32(1, 2), s32(0, 0), s32(1, 2)]
    with pytest.raises(hloexec.ExecutionError, match="out of range"):
        exe.run_spmd([inputs, inputs], report=lambda message: None)


# -- pytorch/xla's scalar ordering token beside collective data ------------------------------------------
def test_scalar_token_operands_of_tuple_collectives():
    """pytorch/xla (AWS Neuron) threads a scalar through reduce-scatter and all-gather beside the data: XLA's
    verifier rejects a scalar there; hloexec reduces it whole (reduce-scatter, as its all-reduce does) or passes
    it through (all-gather)."""
    text = (f"HloModule m, replica_count=2\n{_ADD}ENTRY e {{\n p = f32[4] parameter(0)\n t = f32[] parameter(1)\n"
            " rs = (f32[2], f32[]) reduce-scatter(p, t), replica_groups={{0,1}}, dimensions={0}, to_apply=add\n"
            " ag = (f32[8], f32[]) all-gather(p, t), replica_groups={{0,1}}, dimensions={0}\n"
            " ROOT r = ((f32[2], f32[]), (f32[8], f32[])) tuple(rs, ag)\n}\n")
    x = [np.arange(4, dtype=np.float32) + 10 * d for d in range(2)]
    outputs = hloexec.load(text).run_spmd([[x[d], np.float32(d + 1)] for d in range(2)], report=lambda m: None)
    for d, ((scattered, reduced), (gathered, passed)) in enumerate(outputs):
        np.testing.assert_array_equal(scattered, (x[0] + x[1])[2 * d:2 * d + 2])
        assert reduced == 3 and passed == d + 1
        np.testing.assert_array_equal(gathered, np.concatenate(x))
