"""The engines' acceptance-rate draws for arrivals of several tenants (sim/engine.py `tenant_acceptance_rates`)
compiled: one call draws a window's Beta variates, row by row, from the engine's own numpy Generator.

NumPy's `Generator.beta` with a parameter per row (a window's arrivals from several tenants) spends ~12-15 µs a
call before its first draw, checking the parameter arrays with Python-level ufunc calls: ~19 µs for a bursty
window's 26 draws, a fifth of the window. numba ports NumPy's samplers (`numba.np.random.distributions`: the
same Marsaglia-Tsang gamma over the same ziggurat normal, Johnk's algorithm where both parameters are <= 1,
the same operations), so on the same bit generator they draw the same numbers and leave the same state
(tests/test_compiled_random.py draws both ways). Handing numba the Generator itself costs ~12 µs to unbox
(three `ctypes.cast` calls a call), so the kernel takes the bit generator's addresses instead and rebuilds
numba's bit-generator struct from them: ~1.5 µs a call plus ~0.08 µs a draw. The state's address is read
from the Generator at every call (~0.1 µs: a fork's copy has its own), the functions' once per bit-generator
class (every instance's are the same).

Where numba, or the numba internals used here, do not import, `HAVE_COMPILED_DRAWS` is False and the engines
keep NumPy's call (the same numbers).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

try:
    from llmserve_env.shared.jit import HAVE_NUMBA, njit_borrowing
    from numba import types
    from numba.core import cgutils
    from numba.core.registry import cpu_target
    from numba.extending import intrinsic
    from numba.np.random.distributions import random_beta

    _BITGEN = types.NumPyRandomBitGeneratorType("bit_generator")
    # the struct's members written below (numba's own unboxing writes them too): a numba that renamed them is
    # treated as one without these internals (NumPy's call), rather than failing at the first draw
    _MEMBERS = ("state_address", "state", "fnptr_next_uint64", "fnptr_next_uint32", "fnptr_next_double")
    if not set(_MEMBERS) <= set(getattr(cpu_target.target_context.data_model_manager.lookup(_BITGEN), "_fields", ())):
        raise ImportError("numba's bit-generator struct does not have the members this module writes")

    @intrinsic
    def _bit_generator(typingctx, state_address, state, next_uint64, next_uint32, next_double):
        """numba's bit-generator struct (what its unboxing of a Generator builds) from the five addresses."""
        sig = _BITGEN(types.int64, types.int64, types.int64, types.int64, types.int64)

        def codegen(context, builder, signature, args):
            s = cgutils.create_struct_proxy(_BITGEN)(context, builder)
            s.state_address, s.state, s.fnptr_next_uint64, s.fnptr_next_uint32, s.fnptr_next_double = args
            return s._getvalue()

        return sig, codegen

    @njit_borrowing
    def _beta_draws(state: int, next_uint64: int, next_uint32: int, next_double: int, a: np.ndarray, b: np.ndarray,
                    code: np.ndarray, out: np.ndarray) -> None:
        bitgen: Any = _bit_generator(state, state, next_uint64, next_uint32, next_double)  # type: ignore[call-arg]
        for i in range(code.shape[0]):
            k = code[i]
            out[i] = random_beta(bitgen, a[k], b[k])

    HAVE_COMPILED_DRAWS = HAVE_NUMBA
except ImportError:  # pragma: no cover - without numba (or with a numba whose internals moved)
    HAVE_COMPILED_DRAWS = False


_FUNCTIONS: dict[type, tuple[int, int, int]] = {}  # a bit generator class's next_uint64, next_uint32, next_double


def beta_draws(rng: np.random.Generator, a: np.ndarray, b: np.ndarray, code: np.ndarray) -> np.ndarray:
    """Row i's draw Beta(a[code[i]], b[code[i]]), the rows in order, from `rng`: NumPy's `rng.beta(a[code],
    b[code])`, the same numbers and the same state after (`code`: int64, contiguous)."""
    bg = rng.bit_generator
    functions = _FUNCTIONS.get(type(bg))
    ct = bg.ctypes  # built once per bit generator; its state's address is the instance's own (a fork's too)
    if functions is None:  # the class's functions (every instance's): read once per process
        found = [ctypes.cast(f, ctypes.c_void_p).value for f in (ct.next_uint64, ct.next_uint32, ct.next_double)]
        if not all(found):
            raise RuntimeError(f"{type(bg).__name__} exposes no next_uint64/next_uint32/next_double functions")
        functions = _FUNCTIONS[type(bg)] = (int(found[0] or 0), int(found[1] or 0), int(found[2] or 0))
    out = np.empty(code.shape[0])
    _beta_draws(ct.state_address, *functions, a, b, code, out)
    return out
