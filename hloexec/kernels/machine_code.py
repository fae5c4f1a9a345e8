"""Machine code for the direct compiler (kernels/direct.py): where CPython's and numpy's C structs keep an
array's fields (probed once on live objects), LLVM IR to an object file (O3, this CPU), and an object file
loaded into the process as a Python builtin function.

LLVM aborts the process, not raises, on an object file it cannot link (an external symbol it cannot resolve, a
damaged file): load_object checks every symbol the file needs resolves before handing it to LLVM, and raises
MachineCodeError otherwise -- as for any other failure of LLVM here -- so that the kernel goes through Numba.
Each kernel's IR is parsed into an LLVM context of its own, not the process's global one that Numba also uses.

Code is made for the large code model, as Numba makes its own: LLVM's linker puts an object file's code, constants
and data in separate mappings, which in a long-lived process (big arrays come and go, libraries, other JITs) can
land more than 2 GB apart; the small model's 32-bit PC-relative references between them would not reach (LLVM
asserts on that and aborts: "isInt<32>(RealOffset)" in RuntimeDyldELF).
"""

from __future__ import annotations

import ctypes
import struct
import threading
from typing import Any

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
        layout: dict[str, Any] = {
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


class MachineCodeError(Exception):
    """LLVM could not make or load a kernel's machine code (the kernel is compiled through Numba instead)."""


_OBJECTS = {"hloexec.TypeError": TypeError, "hloexec.None": None}  # Python objects the kernels refer to
_LLVM_LOCK = threading.RLock()  # llvmlite's engine and target machine are not shared across threads
_LLVM: dict = {}


def llvm_engine():
    """(llvmlite.binding, the host target machine, the execution engine), made once per process: for this
    CPU (name and features, as Numba targets it), O3."""
    with _LLVM_LOCK:  # (two threads making one each would leave the first's kernels without their engine)
        if not _LLVM:
            _LLVM.update(_make_engine())
        return _LLVM["llvm"], _LLVM["tm"], _LLVM["engine"]


def _make_engine() -> dict:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple()
    tm = target.create_target_machine(
        cpu=llvm.get_host_cpu_name(),
        features=llvm.get_host_cpu_features().flatten(),
        opt=3,
        reloc="default",
        codemodel="jitdefault",  # large: 64-bit addresses (see the module's doc)
        jit=True,
    )
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly("", llvm.create_context()), tm)
    engine.finalize_object()  # its own (empty) module compiled now: later finalizes only link object files
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
    return {"llvm": llvm, "tm": tm, "engine": engine}


def object_code(ir_text: str) -> bytes:
    """Machine code (an object file) of LLVM IR `ir_text`, optimised by LLVM's O3 pipeline with the loop and
    SLP vectorizers (no fast-math flags: the IEEE operations as written) but neither loop unrolling nor the
    vectorizer's interleaving: they cost ~18% of the compile and the warm kernels measured no slower without
    them (bench/README.md, "LLVM's pass settings"); MachineCodeError if LLVM fails."""
    with _LLVM_LOCK:
        llvm, tm, _ = llvm_engine()
        try:
            module = llvm.parse_assembly(ir_text, llvm.create_context())
            module.triple = tm.triple
            module.data_layout = str(tm.target_data)
            module.verify()
            pto = llvm.create_pipeline_tuning_options()
            pto.speed_level = 3
            pto.loop_vectorization = True
            pto.slp_vectorization = True
            pto.loop_unrolling = False
            pto.loop_interleaving = False
            pb = llvm.create_pass_builder(tm, pto)
            pb.getModulePassManager().run(module, pb)
            return tm.emit_object(module)
        except RuntimeError as e:  # llvmlite's errors from LLVM
            raise MachineCodeError(f"LLVM failed: {e}") from None


_SHT_SYMTAB = 2


def undefined_symbols(code: bytes) -> list[str]:
    """The names ELF object file `code` needs from elsewhere (its symbol table's undefined entries: ELF-64,
    little-endian, x86-64 as LLVM emits them here); MachineCodeError if `code` is not such a file or any table
    lies outside it -- a damaged cache entry, on which LLVM would abort."""

    def unpack(fmt, offset):
        if offset < 0 or offset + struct.calcsize(fmt) > len(code):
            raise MachineCodeError("a damaged object file (a table beyond its end)")
        return struct.unpack_from(fmt, code, offset)

    if code[:6] != b"\x7fELF\x02\x01" or unpack("<H", 18)[0] != 62:  # ELFCLASS64, little-endian, EM_X86_64
        raise MachineCodeError("not an x86-64 ELF-64 object file")
    shoff, shentsize, shnum = unpack("<Q", 40)[0], unpack("<H", 58)[0], unpack("<H", 60)[0]
    sections = [unpack("<IIQQQQIIQQ", shoff + i * shentsize) for i in range(shnum)]
    names = []
    for _, sh_type, _, _, offset, size, link, _, _, entsize in sections:
        if sh_type != _SHT_SYMTAB:
            continue
        if entsize != 24 or link >= shnum:
            raise MachineCodeError("a damaged object file (its symbol table)")
        strtab, strsize = sections[link][4], sections[link][5]
        for at in range(offset, offset + size, 24):
            st_name, _, _, st_shndx = unpack("<IBBH", at)
            if st_shndx == 0 and st_name != 0:  # SHN_UNDEF, named
                end = code.find(b"\0", strtab + st_name, strtab + strsize)
                if end < 0:
                    raise MachineCodeError("a damaged object file (its string table)")
                names.append(code[strtab + st_name : end].decode())
    return names


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
        missing = [sym for sym in undefined_symbols(code) if not llvm.address_of_symbol(sym)]
        if missing:
            raise MachineCodeError(f"kernel {name} calls {', '.join(missing)}, which this process does not define")
        engine.add_object_file(llvm.ObjectFileRef.from_data(code))
        engine.finalize_object()
        address = engine.get_function_address(name)
        slot = engine.get_global_value_address(ndarray_slot(name))
        if not address or not slot:
            raise MachineCodeError(f"the object file of kernel {name} does not define it")
        ctypes.c_void_p.from_address(slot).value = id(np.ndarray)
        method = _MethodDef(name.encode(), address, _METH_FASTCALL, None)
        _METHOD_DEFS.append(method)
        new = ctypes.pythonapi.PyCFunction_NewEx
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.py_object, ctypes.py_object]
        _LOADED[name] = new(ctypes.addressof(method), None, None)
        return _LOADED[name]


def loaded(name: str):
    """Kernel `name` if its object file is loaded in this process already, else None."""
    return _LOADED.get(name)
