"""numba's `njit` where numba imports, the identity where it does not: one definition for every compiled kernel
(the simulator's event loop, sim/compiled_core.py; its router, sim/compiled_routing.py; the grader's naive-server
floor, core/grader.py). numba is a dependency (pyproject.toml); without it each kernel runs as plain Python."""

from __future__ import annotations

try:
    from numba import njit as _njit

    def njit(fn):
        try:  # cached on disk where numba finds a folder it may write (beside this file, NUMBA_CACHE_DIR, home)
            return _njit(cache=True, nogil=True)(fn)
        except RuntimeError:  # "no locator available": a read-only install with no writable home; compile per process
            return _njit(nogil=True)(fn)

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised where numba is not installed
    HAVE_NUMBA = False

    def njit(fn):
        return fn
