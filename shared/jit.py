"""numba's `njit` where numba imports, the identity where it does not: one definition for every compiled kernel
(the simulator's event loop, sim/compiled_core.py; its router, sim/compiled_routing.py; the grader's naive-server
floor, core/grader.py). numba is a dependency (pyproject.toml); without it each kernel runs as plain Python.

`njit_borrowing` compiles a kernel without numba's reference counting (NRT): for kernels that only borrow the
arrays they are given, allocating none and returning none (numba refuses to compile one that does). With
counting on, every call from one kernel to another increments and decrements each array argument's count
with an atomic instruction, and numba's pruning removes few of them: measured with `perf` on the engine's loop
(sim/compiled_core.py, 6-22 arrays per call), those two instructions were ~40 % of a simulated window. A
kernel's callees are compiled with its setting, so the kernels of one module that call each other share it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

try:
    from numba import njit as _njit

    def _compile(fn: F, **options: Any) -> F:
        try:  # cached on disk where numba finds a folder it may write (beside this file, NUMBA_CACHE_DIR, home)
            return _njit(cache=True, nogil=True, **options)(fn)
        except RuntimeError:  # "no locator available": a read-only install with no writable home; compile per process
            return _njit(nogil=True, **options)(fn)

    def njit(fn: F) -> F:
        return _compile(fn)

    def njit_borrowing(fn: F) -> F:
        return _compile(fn, _nrt=False)

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised where numba is not installed
    HAVE_NUMBA = False

    def njit(fn: F) -> F:
        return fn

    def njit_borrowing(fn: F) -> F:
        return fn
