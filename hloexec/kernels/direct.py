"""Generated kernels compiled straight to machine code with llvmlite, without Numba's typing and lowering.

Numba takes ~10 ms per generated line, 60% of it in its own Python passes (bytecode analysis, typing, lowering,
the CPython wrapper) and the rest in LLVM, which runs its O3 pipeline twice. Most generated kernels use a
tiny part of Python: `for` over `range`, assignments, `if`, arithmetic on one float type, int64 index
arithmetic, array loads and stores with `np.uint64` indices and a few numpy casts. `translate` turns such a
source (given the kernel signature, kernels/cache.py) into LLVM IR directly, with Numba's meaning of each
construct -- the same IEEE operations in the same order, no fast-math, so the same bits (but which NaN comes
out where two meet: LLVM orders commutative operands as it likes) -- and `compile_kernel` compiles it with one
O3 pipeline for this CPU, keeps the object code in the disk cache and makes it a Python builtin function
(METH_FASTCALL: called as directly as a Numba dispatcher; kernels/direct_kernels.py, kernels/machine_code.py). A source using anything else raises
`Untranslatable` and goes to Numba as before (kernels/cache.py).

The rules this translator holds to where Python and Numba would allow more (each one declines):
binary operations take operands of one type (f32, f64, or int64 -- int32 operands widened to int64 first, as
Numba types them; bool for `&`, `|`), but a comparison of a
float with an int64 (in float64, as Numba types it); `//` and `%` take a positive integer literal (Python's
floor semantics on int64), shifts a constant in [0, 64); `np.float32`/`np.float64` convert from floats, int64,
int32 and bool, `np.int32`, `np.int64` and `np.uint64` from int64 (and int32); indices are int64 (Numba's
wraparound of a negative one kept) or `np.uint64` (none), one per dimension; local arrays (`np.empty`,
`stack_array`) have a literal size (np.empty's beyond MAX_LOCAL_ELEMENTS floats from the heap); calls: `range`, `min` and `max` of two int64,
`abs`, `np.sqrt`, `np.isfinite`, `f16_to_f32_simd`, the bitcasts and `_muladd` (`llvm.fmuladd`, as
kernels/scalar.py's intrinsic), `add_lanes`, and kernels/scalar.py's njit helpers, inlined from their source
(with its module constants).

The function checks its arguments as Numba's dispatcher would (count; per array: an ndarray of the signature's
dtype and rank, native byte order, C-contiguous, writable for an output; TypeError otherwise), reads each
array's data pointer and dims from numpy's C struct (`object_layout`), then runs the loops without the GIL.
"""

from __future__ import annotations

import ast
import copy
import operator
from pathlib import Path

import numpy as np

from .machine_code import ndarray_slot, object_layout, type_nums

MAX_INLINED = 64  # helper calls inlined per kernel at most
MAX_LOCAL_ELEMENTS = 1 << 14  # a local array's elements at most (it lives in the stack frame)


class Untranslatable(Exception):
    """The source uses something `translate` does not (it compiles through Numba instead)."""


def _need(cond, why: str):
    if not cond:
        raise Untranslatable(why)


# -- types ---------------------------------------------------------------------------------------------------
# value types: the name of the numpy scalar type Numba gives the value
_FLOATS = ("float32", "float64")
_DTYPES = ("float32", "float64", "int64", "int32", "uint16", "bool")  # array element types translated


def _ir_types():
    from llvmlite import ir

    return {
        "float32": ir.FloatType(),
        "float64": ir.DoubleType(),
        "int64": ir.IntType(64),
        "int32": ir.IntType(32),
        "uint32": ir.IntType(32),
        "uint64": ir.IntType(64),
        "uint16": ir.IntType(16),
        "bool": ir.IntType(1),
    }


class _Array:
    __slots__ = ("data", "dims", "dtype", "readonly")

    def __init__(self, data, dims, dtype, readonly):
        self.data, self.dims, self.dtype, self.readonly = data, dims, dtype, readonly


def _c_api(module) -> dict:
    """The C functions a kernel calls (CPython's and the C library's; machine_code.llvm_engine resolves them),
    declared in LLVM `module`."""
    from llvmlite import ir

    i64, i32, ptr = ir.IntType(64), ir.IntType(32), ir.IntType(8).as_pointer()
    return {
        sym: ir.Function(module, ir.FunctionType(ret, args), name=sym)
        for sym, ret, args in (
            ("PyErr_SetString", ir.VoidType(), [ptr, ptr]),
            ("PyType_IsSubtype", i32, [ptr, ptr]),
            ("PyLong_AsLongLong", i64, [ptr]),
            ("PyErr_Occurred", ptr, []),
            ("Py_IncRef", ir.VoidType(), [ptr]),
            ("PyEval_SaveThread", ptr, []),
            ("PyEval_RestoreThread", ir.VoidType(), [ptr]),
            ("PyErr_NoMemory", ptr, []),
            ("malloc", ptr, [i64]),
            ("free", ir.VoidType(), [ptr]),
        )
    }


class _Translator:
    """One kernel's LLVM function, built statement by statement from the Python AST (single pass: the
    generators define every name before its first use, in source order)."""

    def __init__(self, fn_ast: ast.FunctionDef, signature, name: str, layout: dict):
        from llvmlite import ir

        self.ir = ir
        self.T = _ir_types()
        self.module = m = ir.Module(name=name)
        i64, i32, i8 = ir.IntType(64), ir.IntType(32), ir.IntType(8)
        ptr = i8.as_pointer()
        # PyObject *name(PyObject *self, PyObject *const *args, Py_ssize_t nargs): METH_FASTCALL
        self.fn = ir.Function(m, ir.FunctionType(ptr, [ptr, ptr.as_pointer(), i64]), name=name)
        api = _c_api(m)
        type_error = ir.GlobalVariable(m, i8, "hloexec.TypeError")
        none = ir.GlobalVariable(m, i8, "hloexec.None")
        ndarray = ir.GlobalVariable(m, ptr, ndarray_slot(name))  # set when loaded (load_object)
        ndarray.initializer = ir.Constant(ptr, None)
        text = bytearray(f"kernel arguments do not match its signature {signature}".encode() + b"\0")
        message = ir.GlobalVariable(m, ir.ArrayType(i8, len(text)), f"{name}.message")
        message.initializer, message.global_constant = ir.Constant(ir.ArrayType(i8, len(text)), text), True

        entry = self.fn.append_basic_block("entry")
        ab = ir.IRBuilder(entry)  # the argument checks, then the set-up before the body (its blocks)
        self.entry = entry  # where the allocas go: at its start (promoted to registers)
        mismatch = ir.IRBuilder(self.fn.append_basic_block("mismatch"))
        mismatch.call(api["PyErr_SetString"], [type_error, mismatch.bitcast(message, ptr)])
        mismatch.ret(ir.Constant(ptr, None))
        failed = ir.IRBuilder(self.fn.append_basic_block("failed"))  # an exception is set already
        failed.ret(ir.Constant(ptr, None))
        self.vars: dict[str, tuple] = {}  # name -> (alloca, type)
        self.scalars: dict[str, object] = {}  # int64 parameters
        self.arrays: dict[str, _Array] = {}
        self.inlined = 0  # helper calls inlined so far
        params = [a.arg for a in fn_ast.args.args]
        _need(len(params) == len(signature), "parameter count")

        def field(base, offset, ty):
            return ab.load(ab.bitcast(ab.gep(base, [ir.Constant(i64, offset)]), ty.as_pointer()))

        def check(ok, otherwise=mismatch.block):
            nxt = self.fn.append_basic_block("checked")
            ab.cbranch(ok, nxt, otherwise)
            ab.position_at_end(nxt)

        check(ab.icmp_signed("==", self.fn.args[2], ir.Constant(i64, len(signature))))
        for k, (pname, arg) in enumerate(zip(params, signature)):
            obj = ab.load(ab.gep(self.fn.args[1], [ir.Constant(i64, k)]))
            if arg[0] != "array":
                _need(arg == ("scalar", "int64"), f"scalar {arg}")
                value = ab.call(api["PyLong_AsLongLong"], [obj])
                error = ab.icmp_signed("!=", ab.call(api["PyErr_Occurred"], []), ir.Constant(ptr, None))
                check(ab.not_(ab.and_(ab.icmp_signed("==", value, ir.Constant(i64, -1)), error)), failed.block)
                self.scalars[pname] = value
                continue
            _, dtype, ndim, readonly = arg
            _need(dtype in _DTYPES, f"array of {dtype}")
            check(
                ab.icmp_signed(
                    "!=",
                    ab.call(api["PyType_IsSubtype"], [field(obj, layout["ob_type"], ptr), ab.load(ndarray)]),
                    ir.Constant(i32, 0),
                )
            )
            descr = field(obj, layout["descr"], ptr)
            ok = ab.icmp_signed("==", field(obj, layout["nd"], i32), ir.Constant(i32, ndim))
            nums = [
                ab.icmp_signed("==", field(descr, layout["type_num"], i32), ir.Constant(i32, n))
                for n in type_nums(dtype)
            ]
            for n in nums[1:]:
                nums[0] = ab.or_(nums[0], n)
            ok = ab.and_(ok, nums[0])
            ok = ab.and_(
                ok, ab.icmp_signed("!=", field(descr, layout["byteorder"], i8), ir.Constant(i8, ord(layout["swapped"])))
            )
            wanted = layout["c_contiguous"] | (0 if readonly else layout["writeable"])
            flags = field(obj, layout["flags"], i32)
            check(ab.and_(ok, ab.icmp_signed("==", ab.and_(flags, ir.Constant(i32, wanted)), ir.Constant(i32, wanted))))
            elt = i8 if dtype == "bool" else self.T[dtype]
            data = ab.bitcast(field(obj, layout["data"], ptr), elt.as_pointer())
            dims_ptr = ab.bitcast(field(obj, layout["dims"], ptr), i64.as_pointer())
            dims = [ab.load(ab.gep(dims_ptr, [ir.Constant(i64, d)])) for d in range(ndim)]
            self.arrays[pname] = _Array(data, dims, dtype, readonly)
        thread = ab.call(api["PyEval_SaveThread"], [])  # the loops run without the GIL (Numba's nogil)
        no_memory = ir.IRBuilder(self.fn.append_basic_block("no_memory"))  # a local array not allocated
        no_memory.call(api["PyEval_RestoreThread"], [thread])
        no_memory.call(api["PyErr_NoMemory"], [])
        no_memory.ret(ir.Constant(ptr, None))
        self.api, self.setup, self.no_memory = api, ab, no_memory.block
        self.heap: list = []  # local arrays from the heap, freed at the end
        body = self.fn.append_basic_block("body")
        self.b = ir.IRBuilder(body)
        self.statements(fn_ast.body)
        for data in self.heap:
            self.b.call(api["free"], [data])
        self.b.call(api["PyEval_RestoreThread"], [thread])
        self.b.call(api["Py_IncRef"], [none])
        self.b.ret(self.b.bitcast(none, ptr))
        ab.branch(body)

    # -- statements --------------------------------------------------------------------------------------
    def statements(self, stmts):
        for s in stmts:
            self.statement(s)

    def statement(self, s):
        ir, b = self.ir, self.b
        if isinstance(s, ast.Assign):
            _need(len(s.targets) == 1, "multiple targets")
            target = s.targets[0]
            if isinstance(target, ast.Name) and _callee(s.value) in ("np.empty", "stack_array"):
                self.local_array(target.id, s.value)
            elif isinstance(target, ast.Tuple):  # `a, b = helper(...)`: a helper returning a tuple
                helper = _helpers().get(_callee(s.value))
                _need(helper is not None and all(isinstance(t, ast.Name) for t in target.elts), "assignment target")
                values = self.inline(helper, [self.expr(a) for a in s.value.args])
                _need(isinstance(values, list) and len(values) == len(target.elts), "assignment target")
                for t, (value, ty) in zip(target.elts, values):
                    self.assign(t.id, value, ty)
            elif isinstance(target, ast.Name):
                value, ty = self.expr(s.value)
                self.assign(target.id, value, ty)
            elif isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Slice):
                self.fill(target, s.value)
            elif isinstance(target, ast.Subscript):
                arr, ptr = self.element(target)
                _need(not arr.readonly, "store to a read-only array")
                value, ty = self.expr(s.value)
                value = self.convert(value, ty, arr.dtype)
                b.store(b.zext(value, ir.IntType(8)) if arr.dtype == "bool" else value, ptr)
            else:
                raise Untranslatable("assignment target")
        elif isinstance(s, ast.For):
            self.for_range(s)
        elif isinstance(s, ast.If):
            cond = self.condition(s.test)
            with b.if_else(cond) as (then, otherwise):
                with then:
                    self.statements(s.body)
                with otherwise:
                    self.statements(s.orelse)
        elif isinstance(s, ast.Expr) and _callee(s.value) == "add_lanes":
            self.add_lanes(s.value)
        elif isinstance(s, ast.Pass):
            pass
        else:
            raise Untranslatable(type(s).__name__)

    def local_array(self, name, call):
        """`name = np.empty(n, np.float32)` or `stack_array(n, np.float32)` (n a literal): a 1-d array of the
        kernel's life, in the entry block's stack frame (np.empty's heap memory in Numba: the values are the
        same), or from the heap beyond MAX_LOCAL_ELEMENTS; made once however often the statement runs."""
        ir = self.ir
        _need(
            len(call.args) == 2 and not call.keywords and name not in self.arrays and name not in self.vars,
            "local array",
        )
        n, dtype = _int_literal(call.args[0]), _callee_name(call.args[1])
        _need(
            n is not None
            and (0 < n <= MAX_LOCAL_ELEMENTS or _callee(call) == "np.empty")
            and dtype in ("np.float32", "np.float64"),
            "local array of a literal size and float type",
        )
        dtype = dtype[3:]
        if n <= MAX_LOCAL_ELEMENTS:
            data = self.alloca(self.T[dtype], n, name)
        else:  # too big for a thread's stack: from the heap, freed at the end (Numba's np.empty: MemoryError)
            setup = self.setup
            size = ir.Constant(self.T["int64"], n * (4 if dtype == "float32" else 8))
            raw = setup.call(self.api["malloc"], [size])
            allocated = self.fn.append_basic_block("allocated")
            setup.cbranch(setup.icmp_unsigned("!=", raw, ir.Constant(raw.type, None)), allocated, self.no_memory)
            setup.position_at_end(allocated)
            self.heap.append(raw)
            data = setup.bitcast(raw, self.T[dtype].as_pointer())
        self.arrays[name] = _Array(data, [ir.Constant(self.T["int64"], n)], dtype, False)

    def alloca(self, ty, count, name):
        """Stack space made at the start of the entry block (where LLVM promotes it to registers)."""
        b = self.ir.IRBuilder(self.entry)
        b.position_at_start(self.entry)
        return b.alloca(ty, size=None if count is None else self.ir.Constant(self.T["int64"], count), name=name)

    def fill(self, target, value):
        """`a[:] = value`: every element of a local 1-d array."""
        ir, b = self.ir, self.b
        sl = target.slice
        _need(
            isinstance(target.value, ast.Name)
            and target.value.id in self.arrays
            and sl.lower is None
            and sl.upper is None
            and sl.step is None,
            "slice assignment",
        )
        arr = self.arrays[target.value.id]
        _need(len(arr.dims) == 1 and not arr.readonly and arr.dtype != "bool", "slice assignment")
        value, ty = self.expr(value)
        value = self.convert(value, ty, arr.dtype)
        pre, header = b.block, self.fn.append_basic_block("fill")
        body, end = self.fn.append_basic_block("fill.body"), self.fn.append_basic_block("fill.end")
        b.branch(header)
        b.position_at_end(header)
        i = b.phi(self.T["int64"])
        i.add_incoming(ir.Constant(self.T["int64"], 0), pre)
        b.cbranch(b.icmp_signed("<", i, arr.dims[0]), body, end)
        b.position_at_end(body)
        b.store(value, b.gep(arr.data, [i]))
        i.add_incoming(b.add(i, ir.Constant(self.T["int64"], 1)), body)
        b.branch(header)
        b.position_at_end(end)

    def add_lanes(self, call):
        """scalar.add_lanes(lanes, values, start, count): lanes[k] += values[start + k] for k < count (a
        literal), each lane its own add, as whole 32-byte vectors (as scalar.add_lanes: LLVM's SLP vectorizer
        often leaves the scalar form scalar)."""
        ir, b = self.ir, self.b
        _need(
            len(call.args) == 4 and all(isinstance(a, ast.Name) and a.id in self.arrays for a in call.args[:2]),
            "add_lanes",
        )
        lanes, values = (self.arrays[a.id] for a in call.args[:2])
        count = _int_literal(call.args[3])
        _need(count is not None and lanes.dtype == values.dtype and lanes.dtype in _FLOATS, "add_lanes")
        start = self.int64(call.args[2])
        size = 4 if lanes.dtype == "float32" else 8
        width = 32 // size
        _need(count % width == 0, "add_lanes of a part of a vector")
        vector = ir.VectorType(self.T[lanes.dtype], width).as_pointer()
        for k in range(0, count, width):
            at = b.bitcast(b.gep(lanes.data, [ir.Constant(self.T["int64"], k)]), vector)
            x = b.bitcast(b.gep(values.data, [b.add(start, ir.Constant(self.T["int64"], k))]), vector)
            b.store(b.fadd(b.load(at, align=size), b.load(x, align=size)), at, align=size)

    def assign(self, name, value, ty):
        _need(name not in self.arrays and name not in self.scalars, "assignment to a parameter")
        slot = self.vars.get(name)
        if slot is None:
            slot = (self.alloca(self.T[ty], None, name), ty)
            self.vars[name] = slot
        _need(slot[1] == ty, f"{name} holds values of two types")
        self.b.store(value, slot[0])

    def for_range(self, s):
        ir, b = self.ir, self.b
        _need(isinstance(s.target, ast.Name) and not s.orelse, "for target")
        call = s.iter
        _need(
            isinstance(call, ast.Call) and _callee(call) == "range" and 1 <= len(call.args) <= 3 and not call.keywords,
            "for over something but range",
        )
        bounds = [self.int64(a) for a in call.args]
        start, stop = (ir.Constant(self.T["int64"], 0), bounds[0]) if len(bounds) == 1 else bounds[:2]
        step = 1
        if len(call.args) == 3:
            step = _int_literal(call.args[2])
            _need(step is not None and step > 0, "range step not a positive literal")
        header = self.fn.append_basic_block("for")
        body = self.fn.append_basic_block("for.body")
        end = self.fn.append_basic_block("for.end")
        pre = b.block
        b.branch(header)
        b.position_at_end(header)
        i = b.phi(self.T["int64"])
        i.add_incoming(start, pre)
        b.cbranch(b.icmp_signed("<", i, stop), body, end)
        b.position_at_end(body)
        self.assign(s.target.id, i, "int64")
        self.statements(s.body)
        i.add_incoming(b.add(i, ir.Constant(self.T["int64"], step)), b.block)
        b.branch(header)
        b.position_at_end(end)

    # -- expressions: (llvm value, type name) -------------------------------------------------------------
    def int64(self, e):
        value, ty = self.expr(e)
        _need(ty == "int64", f"an int64 expected, got {ty}")
        return value

    def condition(self, e):
        value, ty = self.expr(e)
        _need(ty == "bool", "condition not a bool")
        return value

    def expr(self, e):
        ir, b, T = self.ir, self.b, self.T
        if isinstance(e, ast.Name):
            if e.id in self.scalars:
                return self.scalars[e.id], "int64"
            if e.id not in self.vars and e.id in _constants():  # kernels/scalar.py's module constants
                value = _constants()[e.id]
                return (
                    (ir.Constant(T["float64"], value), "float64")
                    if isinstance(value, float)
                    else (ir.Constant(T["int64"], value), "int64")
                )
            _need(e.id in self.vars, f"name {e.id}")
            slot, ty = self.vars[e.id]
            return b.load(slot), ty
        if isinstance(e, ast.Constant):
            v = e.value
            if isinstance(v, bool):
                return ir.Constant(T["bool"], int(v)), "bool"
            if isinstance(v, int):
                _need(-(1 << 63) <= v < (1 << 63), "int literal")
                return ir.Constant(T["int64"], v), "int64"
            if isinstance(v, float):
                return ir.Constant(T["float64"], v), "float64"
            raise Untranslatable("constant")
        if isinstance(e, ast.Attribute):
            literal = _float_literal(e)
            _need(literal is not None, f"attribute {ast.unparse(e)}")
            return ir.Constant(T["float64"], literal), "float64"
        if isinstance(e, ast.Subscript):
            arr, ptr = self.element(e)
            value = b.load(ptr)
            return (
                (b.icmp_unsigned("!=", value, ir.Constant(ir.IntType(8), 0)), "bool")
                if arr.dtype == "bool"
                else (value, arr.dtype)
            )
        if isinstance(e, ast.BinOp):
            return self.binop(e)
        if isinstance(e, ast.UnaryOp):
            value, ty = self.expr(e.operand)
            if isinstance(e.op, ast.USub) and ty in _FLOATS:
                return b.fneg(value), ty
            if isinstance(e.op, ast.USub) and ty == "int64":
                return b.neg(value), ty
            if isinstance(e.op, ast.Not) and ty == "bool":
                return b.not_(value), ty
            raise Untranslatable(f"unary {type(e.op).__name__} on {ty}")
        if isinstance(e, ast.Compare):
            _need(len(e.ops) == 1, "chained comparison")
            (x, tx), (y, ty) = self.expr(e.left), self.expr(e.comparators[0])
            if tx != ty and {tx, ty} <= {*_FLOATS, "int64"} and {tx, ty} & set(_FLOATS):
                # Numba's typing: a float and an int64 compare as float64
                (x, y), tx = [self.convert(v, t, "float64") for v, t in ((x, tx), (y, ty))], "float64"
                ty = tx
            _need(tx == ty, f"comparison of {tx} and {ty}")
            op = _COMPARE.get(type(e.ops[0]))
            _need(op is not None, "comparison operator")
            if tx in _FLOATS:  # Python: every comparison with NaN is False but !=
                return (b.fcmp_unordered(op, x, y) if op == "!=" else b.fcmp_ordered(op, x, y)), "bool"
            if tx in ("int64", "int32"):
                return b.icmp_signed(op, x, y), "bool"
            _need(tx in ("uint64", "uint16", "bool"), f"comparison of {tx}")
            return b.icmp_unsigned(op, x, y), "bool"
        if isinstance(e, ast.BoolOp):  # of bools: both sides are pure, so no short circuit is needed
            values = [self.condition(v) for v in e.values]
            acc = values[0]
            for v in values[1:]:
                acc = b.and_(acc, v) if isinstance(e.op, ast.And) else b.or_(acc, v)
            return acc, "bool"
        if isinstance(e, ast.IfExp):  # branches: an arm may load where only its condition makes it valid
            cond = self.condition(e.test)
            then_bb, else_bb = self.fn.append_basic_block("if.then"), self.fn.append_basic_block("if.else")
            end_bb = self.fn.append_basic_block("if.end")
            b.cbranch(cond, then_bb, else_bb)
            b.position_at_end(then_bb)
            x, tx = self.expr(e.body)
            then_end = b.block
            b.branch(end_bb)
            b.position_at_end(else_bb)
            y, ty = self.expr(e.orelse)
            else_end = b.block
            b.branch(end_bb)
            _need(tx == ty, f"conditional of {tx} and {ty}")
            b.position_at_end(end_bb)
            phi = b.phi(T[tx])
            phi.add_incoming(x, then_end)
            phi.add_incoming(y, else_end)
            return phi, tx
        if isinstance(e, ast.Call):
            return self.call(e)
        raise Untranslatable(type(e).__name__)

    def binop(self, e):
        b = self.b
        op = type(e.op)
        if op in (ast.FloorDiv, ast.Mod):
            x = self.int64(e.left)
            d = _int_literal(e.right)
            _need(d is not None and d > 0, "// or % by anything but a positive literal")
            c = self.ir.Constant(self.T["int64"], d)
            q, r = b.sdiv(x, c), b.srem(x, c)
            negative = b.icmp_signed("<", r, self.ir.Constant(self.T["int64"], 0))  # Python floors
            if op is ast.FloorDiv:
                return b.select(negative, b.sub(q, self.ir.Constant(self.T["int64"], 1)), q), "int64"
            return b.select(negative, b.add(r, c), r), "int64"
        (x, tx), (y, ty) = self.expr(e.left), self.expr(e.right)
        if {tx, ty} <= {"int32", "int64"}:  # Numba computes integer arithmetic in int64 (int32 + int32 too)
            (x, tx), (y, ty) = self.widened(x, tx), self.widened(y, ty)
        _need(tx == ty, f"{op.__name__} of {tx} and {ty}")
        if tx in _FLOATS:
            f = {ast.Add: b.fadd, ast.Sub: b.fsub, ast.Mult: b.fmul, ast.Div: b.fdiv}.get(op)
            _need(f is not None, f"{op.__name__} of floats")
            return f(x, y), tx
        if tx == "int64" and op in (ast.LShift, ast.RShift):  # by a constant in [0, 64): Python's meaning
            _need(isinstance(y, self.ir.Constant) and 0 <= y.constant < 64, "shift by a non-constant")
            return (b.shl(x, y) if op is ast.LShift else b.ashr(x, y)), tx
        if tx == "int64":
            f = {
                ast.Add: b.add,
                ast.Sub: b.sub,
                ast.Mult: b.mul,
                ast.BitAnd: b.and_,
                ast.BitOr: b.or_,
                ast.BitXor: b.xor,
            }.get(op)
            _need(f is not None, f"{op.__name__} of int64")
            return f(x, y), tx
        if tx == "bool":
            f = {ast.BitAnd: b.and_, ast.BitOr: b.or_}.get(op)
            _need(f is not None, f"{op.__name__} of bools")
            return f(x, y), tx
        raise Untranslatable(f"{op.__name__} of {tx}")

    def widened(self, value, ty: str) -> tuple:
        """An int32 `value` sign-extended to int64 (a constant stays one), any other as it is."""
        if ty != "int32":
            return value, ty
        if isinstance(value, self.ir.Constant):
            return self.ir.Constant(self.T["int64"], value.constant), "int64"
        return self.b.sext(value, self.T["int64"]), "int64"

    def call(self, e):
        ir, b = self.ir, self.b
        name = _callee(e)
        _need(not e.keywords, "keyword arguments")
        args = e.args
        if name in ("np.float32", "np.float64") and len(args) == 1:
            to = name[3:]
            literal = _float_literal(args[0])
            if literal is not None:  # a literal: numpy's rounding of the Python float
                return ir.Constant(self.T[to], float(np.dtype(to).type(literal))), to
            value, ty = self.expr(args[0])
            return self.convert(value, ty, to), to
        if name in ("np.int32", "np.uint64") and len(args) == 1:
            value = self.int64(args[0])
            to = name[3:]
            return (b.trunc(value, self.T["int32"]) if to == "int32" else value), to
        if name in ("min", "max") and len(args) == 2:  # (of ints: which of equals comes out is the same value)
            x, y = self.int64(args[0]), self.int64(args[1])
            return b.select(b.icmp_signed("<" if name == "min" else ">", y, x), y, x), "int64"
        if name == "np.sqrt" and len(args) == 1:
            value, ty = self.expr(args[0])
            _need(ty in _FLOATS, f"sqrt of {ty}")
            return b.call(self.module.declare_intrinsic("llvm.sqrt", [self.T[ty]]), [value]), ty
        if name == "np.isfinite" and len(args) == 1:
            value, ty = self.expr(args[0])
            _need(ty in _FLOATS, f"isfinite of {ty}")
            return b.fcmp_ordered(
                "<",
                b.call(self.module.declare_intrinsic("llvm.fabs", [self.T[ty]]), [value]),
                ir.Constant(self.T[ty], float("inf")),
            ), "bool"
        helper = _helpers().get(name)
        if helper is not None:
            value = self.inline(helper, [self.expr(a) for a in args])
            _need(not isinstance(value, list), f"the tuple {name} returns used as a value")
            return value
        if name == "_muladd" and len(args) == 3:  # scalar._muladd: llvm.fmuladd on float64
            values = [self.expr(a) for a in args]
            _need(all(ty == "float64" for _, ty in values), "_muladd of non-float64")
            f64 = self.T["float64"]
            fn = self.module.declare_intrinsic("llvm.fmuladd", [f64], ir.FunctionType(f64, [f64, f64, f64]))
            return b.call(fn, [v for v, _ in values]), "float64"
        if name.startswith("bitcast_") and len(args) == 1:  # half.py's bitcast intrinsics
            src, _, dst = name[len("bitcast_") :].partition("_to_")
            src, dst = _BITCAST_TYPES.get(src), _BITCAST_TYPES.get(dst)
            value, ty = self.expr(args[0])
            _need(src is not None and dst is not None and ty == src, f"call of {name} on {ty}")
            return b.bitcast(value, self.T[dst]), dst
        if name == "abs" and len(args) == 1:
            value, ty = self.expr(args[0])
            _need(ty in _FLOATS, f"abs of {ty}")
            return b.call(self.module.declare_intrinsic("llvm.fabs", [self.T[ty]]), [value]), ty
        if name == "np.int64" and len(args) == 1:
            value, ty = self.expr(args[0])
            _need(ty in ("int64", "int32"), f"np.int64 of {ty}")
            return (b.sext(value, self.T["int64"]) if ty == "int32" else value), "int64"
        if name == "f16_to_f32_simd" and len(args) == 1:
            value, ty = self.expr(args[0])
            _need(ty == "uint16", "f16_to_f32_simd of a non-f16")
            return b.fpext(b.bitcast(value, ir.HalfType()), self.T["float32"]), "float32"
        raise Untranslatable(f"call of {name}")

    def inline(self, helper: ast.FunctionDef, values):
        """A call of a helper of kernels/scalar.py (njit(inline="always"), as Numba inlines it): its statements
        translated here with its names made this call's own, typed by the arguments' types; one `return`, last."""
        params = [a.arg for a in helper.args.args]
        body = [st for st in helper.body if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))]
        _need(
            len(values) == len(params)
            and body
            and isinstance(body[-1], ast.Return)
            and body[-1].value is not None
            and self.inlined < MAX_INLINED,
            f"call of {helper.name}",
        )
        self.inlined += 1
        own = set(params) | {
            t.id for st in body for t in ast.walk(st) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)
        }
        prefix = f"{helper.name}.{self.inlined}."

        class Rename(ast.NodeTransformer):
            def visit_Name(self, node):
                return ast.copy_location(ast.Name(prefix + node.id, node.ctx), node) if node.id in own else node

        body = [Rename().visit(copy.deepcopy(st)) for st in body]
        try:
            for name, (value, ty) in zip(params, values):
                self.assign(prefix + name, value, ty)
            self.statements(body[:-1])
            last = body[-1]
            assert isinstance(last, ast.Return) and last.value is not None  # (checked above, on the helper's own)
            ret = last.value
            return [self.expr(v) for v in ret.elts] if isinstance(ret, ast.Tuple) else self.expr(ret)
        except Untranslatable as e:
            raise Untranslatable(f"call of {helper.name}: {e}") from None

    def convert(self, value, ty, to):
        """Numba's cast of a scalar from type `ty` to `to` (an array store or np.float32/np.float64)."""
        b = self.b
        if ty == to:
            return value
        if to in _FLOATS:
            if ty in _FLOATS:
                return b.fptrunc(value, self.T[to]) if to == "float32" else b.fpext(value, self.T[to])
            if ty in ("int64", "int32"):
                return b.sitofp(value, self.T[to])
            if ty == "bool":
                return b.uitofp(value, self.T[to])
        raise Untranslatable(f"conversion of {ty} to {to}")

    def element(self, sub: ast.Subscript):
        """(array, pointer to the element) of `a[i, j, ...]`, one index per dimension (row-major)."""
        ir, b = self.ir, self.b
        if not (isinstance(sub.value, ast.Name) and sub.value.id in self.arrays):
            raise Untranslatable("subscript of a non-array")
        arr = self.arrays[sub.value.id]
        index = sub.slice.elts if isinstance(sub.slice, ast.Tuple) else [sub.slice]
        _need(len(index) == len(arr.dims), "not one index per dimension")
        offset = None
        zero = ir.Constant(self.T["int64"], 0)
        for ix, dim in zip(index, arr.dims):
            value, ty = self.expr(ix)
            if ty == "int64":  # Numba's wraparound of a negative index (none for uint64)
                value = b.select(b.icmp_signed("<", value, zero), b.add(value, dim), value)
            else:
                _need(ty == "uint64", f"index of {ty}")
            offset = value if offset is None else b.add(b.mul(offset, dim), value)
        return arr, b.gep(arr.data, [offset])


_COMPARE = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


def _callee(call) -> str:
    if not isinstance(call, ast.Call):
        return "?"
    f = call.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        return f"{f.value.id}.{f.attr}"
    return "?"


_HELPERS: dict = {}
_CONSTANTS: dict = {}
_BITCAST_TYPES = {"f32": "float32", "i32": "int32", "u32": "uint32", "f64": "float64", "i64": "int64", "u64": "uint64"}


_ARITHMETIC = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}


def _numeric_value(e):
    """The value Python gives a constant expression of numbers (`2.0 ** -29`, a tuple of them); ValueError if
    it is anything else."""
    if isinstance(e, ast.Tuple):
        return tuple(_numeric_value(x) for x in e.elts)
    if isinstance(e, ast.Constant) and type(e.value) in (int, float):
        return e.value
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
        return -_numeric_value(e.operand)
    if isinstance(e, ast.BinOp) and type(e.op) in _ARITHMETIC:
        return _ARITHMETIC[type(e.op)](_numeric_value(e.left), _numeric_value(e.right))
    raise ValueError("not a constant expression of numbers")


def _constants() -> dict:
    """kernels/scalar.py's module constants with literal values (`_LOG2E = 1.44...`), by name."""
    if not _CONSTANTS:
        tree = ast.parse((Path(__file__).parent / "scalar.py").read_text())
        for st in tree.body:
            if isinstance(st, ast.Assign):
                try:
                    values = _numeric_value(st.value)
                except ValueError:
                    continue
                targets = st.targets[0].elts if isinstance(st.targets[0], ast.Tuple) else [st.targets[0]]
                values = values if isinstance(values, tuple) else (values,)
                _CONSTANTS.update(
                    {t.id: v for t, v in zip(targets, values) if isinstance(t, ast.Name) and type(v) in (int, float)}
                )
    return _CONSTANTS


def _helpers() -> dict:
    """The helpers generated kernels may call (kernels/scalar.py's njit functions; their own source is their
    meaning here too), by name, as ASTs."""
    if not _HELPERS:
        tree = ast.parse((Path(__file__).parent / "scalar.py").read_text())
        _HELPERS.update(
            {
                f.name: f
                for f in tree.body
                if isinstance(f, ast.FunctionDef) and any("njit" in ast.unparse(d) for d in f.decorator_list)
            }
        )
    return _HELPERS


def _callee_name(e) -> str:
    """`np.float32` of an attribute expression, else "?"."""
    return f"{e.value.id}.{e.attr}" if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) else "?"


def _int_literal(e):
    return e.value if isinstance(e, ast.Constant) and type(e.value) is int else None


def _float_literal(e):
    """A float literal, negated or not (`np.float32(-0.5)`), else None."""
    sign = 1.0
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
        sign, e = -1.0, e.operand
    if isinstance(e, ast.Constant) and type(e.value) is float:
        return sign * e.value
    if _callee_name(e) in ("np.inf", "math.inf", "np.nan", "math.nan"):
        return sign * float(e.attr)
    return None


def translate(source: str, signature, name: str) -> str:
    """The LLVM IR of generated `source`'s `kernel` for `signature` (kernels/cache.py's plain tuples), as
    function `name` (see the module's doc for how it is called); raises Untranslatable."""
    layout = object_layout()
    if layout is None:
        raise Untranslatable("this Python's or numpy's object layout is not the one probed")
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise Untranslatable(f"syntax: {e}") from None
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "kernel"]
    _need(len(fns) == 1, "no kernel function")
    return str(_Translator(fns[0], signature, name, layout).module)
