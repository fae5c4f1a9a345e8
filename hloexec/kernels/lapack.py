"""LAPACK and BLAS routines called the way jaxlib calls them: the Fortran routines scipy ships (jaxlib takes its
LAPACK from scipy.linalg.cython_lapack too), found through the capsules of scipy.linalg.cython_lapack /
cython_blas and called through ctypes with Fortran's by-reference arguments. Same library, same arguments,
same workspace sizes: the same bits as jax on XLA:CPU.

    fn = routine("sgetrf")
    fn(m, n, a, lda, ipiv, info)      # ints and one-letter strings by reference, arrays by their data

Arguments: a Python int becomes a 32-bit int passed by reference (LP64 LAPACK), a one-character str a
char by reference, a numpy array its data pointer (Fortran-ordered data is the caller's business), None a
null pointer. Calls run with BLAS on one thread (kernels/blas.py): results do not depend on the thread count.
"""

from __future__ import annotations

import ctypes
import functools
import re

import numpy as np

from . import blas


@functools.cache
def _capsules():
    from scipy.linalg import cython_blas, cython_lapack

    blas.find_new_libraries()  # scipy's OpenBLAS is held at one thread too from now on
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    out = {}
    for module in (cython_lapack, cython_blas):
        for name, capsule in module.__pyx_capi__.items():
            signature = get_name(capsule)
            out[name] = (get_pointer(capsule, signature), signature.decode())
    return out


def available() -> bool:
    try:
        _capsules()
        return True
    except ImportError:
        return False


@functools.cache
def routine(name: str):
    """The LAPACK/BLAS routine `name` (e.g. 'sgetrf', 'ztrsm') as a Python callable."""
    pointer, signature = _capsules()[name]
    nargs = len(re.findall(r"\*", signature))
    fn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nargs))(pointer)

    def call(*args):
        if len(args) != nargs:
            raise TypeError(f"{name} takes {nargs} arguments, got {len(args)}")
        keep = []
        pointers = []
        for a in args:
            if a is None:
                pointers.append(None)
                continue
            if isinstance(a, str):
                a = np.frombuffer(a.encode("ascii"), np.uint8).copy()
            elif isinstance(a, (int, np.integer)):
                a = np.array([a], np.int32)
            keep.append(a)
            pointers.append(a.ctypes.data)
        with blas.one_thread():
            fn(*pointers)

    return call


def workspace(query) -> int:
    """The optimal workspace size LAPACK wrote into work[0] during a query (lwork = -1)."""
    return max(1, int(np.real(query[0])))
