"""Machine code for the direct compiler (kernels/direct.py): where CPython's and numpy's C structs keep an
array's fields (probed once on live objects), LLVM IR to an object file (O3, this CPU), and an object file
loaded into the process as a Python builtin function.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np


def type_nums(dtype: str) -> list[int]:
    """numpy's type numbers of `dtype` (int64 is two: C long and long long on LP64)."""
    return sorted(
        {np.dtype(c).num for c in np.typecodes["All"] if c not in "OMmVSUa" and np.dtype(c) == np.dtype(dtype)}
    )


_LAYOUT: list = []


def object_layout() -> dict | None:
    """Where an object's type and an ndarray's fields are in memory (CPython's and numpy's C structs: the public
    ABI of numpy's PyArrayObject_fields and PyArray_Descr), probed on live objects once; None if any probe
    fails (a free-threaded or unusual build): nothing is translated then."""
    if not _LAYOUT:
        import sys

        head = object.__basicsize__
        layout = {
            "ob_type": head - 8,
            "data": head,
            "nd": head + 8,
            "dims": head + 16,
            "descr": head + 40,
            "flags": head + 48,
            "byteorder": head + 10,
            "type_num": head + 12,
            "c_contiguous": 0x1,
            "writeable": 0x400,
            "swapped": ">" if sys.byteorder == "little" else "<",
        }
        a = np.zeros((2, 3), np.float32)
        t = (a, a[:, ::2])

        def word(address, ty=ctypes.c_void_p):
            return ty.from_address(address).value

        try:
            ok = (
                word(id(a) + layout["ob_type"]) == id(np.ndarray)
                and word(id(a) + layout["data"]) == a.ctypes.data
                and word(id(a) + layout["nd"], ctypes.c_int) == 2
                and [word(word(id(a) + layout["dims"]) + 8 * d, ctypes.c_int64) for d in range(2)] == [2, 3]
                and word(id(a) + layout["descr"]) == id(a.dtype)
                and word(id(a.dtype) + layout["type_num"], ctypes.c_int) == a.dtype.num
                and word(id(a.dtype) + layout["byteorder"], ctypes.c_char) == a.dtype.byteorder.encode()
                and word(id(a) + layout["flags"], ctypes.c_int) & 0x401 == 0x401
                and word(id(t[1]) + layout["flags"], ctypes.c_int) & 0x1 == 0
            )
        except (OSError, ValueError):
            ok = False
        _LAYOUT.append(layout if ok else None)
    return _LAYOUT[0]


_OBJECTS = {"hloexec.TypeError": TypeError, "hloexec.None": None}  # Python objects the kernels refer to
_LLVM_LOCK = threading.Lock()  # llvmlite's engine and target machine are not shared across threads
_LLVM: dict = {}


def llvm_engine():
    """(llvmlite.binding, the host target machine, the execution engine), made once per process: for this
    CPU (name and features, as Numba targets it), O3."""
    if not _LLVM:
        import llvmlite.binding as llvm

        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        target = llvm.Target.from_default_triple()
        tm = target.create_target_machine(
            cpu=llvm.get_host_cpu_name(),
            features=llvm.get_host_cpu_features().flatten(),
            opt=3,
            reloc="pic",
            codemodel="default",
            jit=True,
        )
        engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), tm)
        api = ctypes.pythonapi
        for sym in (
            "PyErr_SetString",
            "PyType_IsSubtype",
            "PyLong_AsLongLong",
            "PyErr_Occurred",
            "Py_IncRef",
            "PyEval_SaveThread",
            "PyEval_RestoreThread",
            "PyErr_NoMemory",
            "malloc",
            "free",
        ):
            llvm.add_symbol(sym, ctypes.cast(getattr(api, sym), ctypes.c_void_p).value)  # (libc's through Python's)
        # objects by address under names of our own (LLVM's symbol table is the process's: Numba's meaning of
        # "PyExc_TypeError" is the object itself, not the C variable pointing to it)
        for sym, obj in _OBJECTS.items():
            llvm.add_symbol(sym, id(obj))
        _LLVM.update(llvm=llvm, tm=tm, engine=engine)
    return _LLVM["llvm"], _LLVM["tm"], _LLVM["engine"]


def object_code(ir_text: str) -> bytes:
    """Machine code (an object file) of LLVM IR `ir_text`, optimised by LLVM's O3 pipeline with the loop and
    SLP vectorizers (no fast-math flags: the IEEE operations as written)."""
    with _LLVM_LOCK:
        llvm, tm, _ = llvm_engine()
        module = llvm.parse_assembly(ir_text)
        module.triple = tm.triple
        module.data_layout = str(tm.target_data)
        module.verify()
        pto = llvm.create_pipeline_tuning_options()
        pto.speed_level = 3
        pto.loop_vectorization = True
        pto.slp_vectorization = True
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(module, pb)
        return tm.emit_object(module)


def ndarray_slot(name: str) -> str:
    """The global variable of kernel `name` that holds numpy.ndarray's address (set by load_object)."""
    return f"{name}.ndarray"


class _MethodDef(ctypes.Structure):
    _fields_ = [
        ("ml_name", ctypes.c_char_p),
        ("ml_meth", ctypes.c_void_p),
        ("ml_flags", ctypes.c_int),
        ("ml_doc", ctypes.c_char_p),
    ]


_METH_FASTCALL = 0x80
_METHOD_DEFS: list = []  # the functions' definitions live as long as their machine code: the process
_LOADED: dict = {}  # name -> the function, for every object file loaded into the engine


def load_object(code: bytes, name: str):
    """Kernel `name` of object file `code`, loaded into this process's engine, as a Python builtin function
    (called like the Numba dispatcher it replaces: `kernel(*arrays, *int64s)`; TypeError if an argument is not
    what the signature says)."""
    with _LLVM_LOCK:
        if name in _LOADED:  # (the same name is the same code: an engine holds one definition of a symbol)
            return _LOADED[name]
        llvm, _, engine = llvm_engine()
        engine.add_object_file(llvm.ObjectFileRef.from_data(code))
        engine.finalize_object()
        address = engine.get_function_address(name)
        ctypes.c_void_p.from_address(engine.get_global_value_address(ndarray_slot(name))).value = id(np.ndarray)
        method = _MethodDef(name.encode(), address, _METH_FASTCALL, None)
        _METHOD_DEFS.append(method)
        new = ctypes.pythonapi.PyCFunction_NewEx
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.py_object, ctypes.py_object]
        _LOADED[name] = new(ctypes.addressof(method), None, None)
        return _LOADED[name]


def loaded(name: str):
    """Kernel `name` if its object file is loaded in this process already, else None."""
    return _LOADED.get(name)
