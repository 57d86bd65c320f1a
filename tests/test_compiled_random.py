"""The compiled acceptance-rate draws (sim/compiled_random.py) against NumPy's: the same numbers, the same stream
after, on a copied Generator its own stream; the compiled engine's window draws equal the Python engine's."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from llmserve_env.shared.arrival_list import ArrivalColumns
from llmserve_env.shared.tasks import TASKS
from llmserve_env.shared.workloads import generate_arrivals
from llmserve_env.sim import compiled_core
from llmserve_env.sim.array_engine import ArrayEngine
from llmserve_env.sim.backend import _models_for
from llmserve_env.sim.compiled_random import HAVE_COMPILED_DRAWS, beta_draws
from llmserve_env.sim.engine import beta_table, tenant_acceptance_rates
from llmserve_env.sim.profiles import load_profile

pytestmark = pytest.mark.skipif(not HAVE_COMPILED_DRAWS, reason="numba is not installed")

# both of NumPy's Beta samplers: two gammas (a or b above 1: every profile's tenants) and Johnk's (both <= 1)
A = np.array([13.0, 15.0, 16.0, 0.5, 0.9, 2.0, 1.0])
B = np.array([7.0, 5.0, 4.0, 0.7, 0.3, 0.5, 1.0])


@pytest.mark.parametrize("kinds", [1, 3, len(A)])
def test_the_draws_are_numpys_row_by_row_and_leave_the_same_stream(kinds):
    picks = np.random.default_rng(kinds)
    compiled, numpy_ = np.random.default_rng([kinds, 0x5EED51]), np.random.default_rng([kinds, 0x5EED51])
    for n in (0, 1, 26, 500):
        code = picks.integers(0, kinds, n)
        assert beta_draws(compiled, A, B, code).tolist() == numpy_.beta(A[code], B[code]).tolist()
        assert compiled.bit_generator.state == numpy_.bit_generator.state
    assert compiled.random() == numpy_.random()  # and NumPy's own draws go on from where the kernel left


def test_a_copied_generator_draws_from_its_own_state():
    """An engine's fork copies its Generator: the kernel reads the copy's state address at each call, so the copy
    draws what the original would and the original's stream is untouched."""
    code = np.zeros(40, dtype=np.int64)
    original = np.random.default_rng(7)
    beta_draws(original, A, B, code)
    clone = copy.deepcopy(original)
    from_clone = beta_draws(clone, A, B, code)
    assert beta_draws(original, A, B, code).tolist() == from_clone.tolist()
    assert clone.bit_generator.state == original.bit_generator.state


@pytest.mark.parametrize("speculating", [True, False])
def test_the_compiled_engine_draws_a_windows_rates_as_numpy_does(speculating):
    """Speculating, each window's rates are drawn as it comes; at depth 0 they are owed, and drawn in turn (one
    call, the same numbers) once the engine speculates."""
    task = TASKS["adversarial_multitenant"]  # three tenants: NumPy's draw with a parameter per row
    profile = load_profile(task.profile)
    cols = ArrivalColumns.of(list(generate_arrivals(task, 3))[:300])
    names = tuple(t.name for t in task.tenants)
    known = ArrivalColumns(cols.request_id, cols.arrival_s, cols.prompt_tokens, cols.output_tokens, cols.tenant,
                           cols.priority, known_index=(names, cols.tenant_index(names)))
    assert len(set(cols.tenant.tolist())) == 3
    engine = ArrayEngine(profile, 11, _models_for(profile))
    speculate = (8, 0.9, 2, "FP16", False, False)  # batch cap, KV fraction, depth, tier, split, priority routing
    if speculating:
        engine.configure(*speculate)
    reference = np.random.default_rng([11, 0x5EED51])  # the engine's stream, drawn by NumPy
    a, b = beta_table(profile, names)
    expected = []
    for lo, hi in ((0, 26), (26, 27), (27, 27), (27, 300)):
        # a window's arrivals: their rows, with the rates drawn at once (one batch without the generator's
        # tenant index: the owed draws then look the names up)
        engine._add((cols if lo == 26 else known).slice(lo, hi))
        index = cols.tenant_index(names)[lo:hi]
        expected += reference.beta(a[index], b[index]).tolist() if hi > lo else []
    if not speculating:
        assert engine.rng.bit_generator.state != reference.bit_generator.state  # nothing drawn yet
        engine.configure(*speculate)
    assert engine.F[:300, compiled_core.F_ACC].tolist() == expected
    assert engine.rng.bit_generator.state == reference.bit_generator.state
    assert a.tolist() == [profile.acceptance_mean(n) * profile.spec_concentration for n in names]
    assert b.tolist() == [(1.0 - profile.acceptance_mean(n)) * profile.spec_concentration for n in names]


def test_without_the_kernel_the_engines_draw_the_same_numbers_with_numpy(monkeypatch):
    """Where numba's internals do not import (HAVE_COMPILED_DRAWS False), the engines keep NumPy's call: the
    same rates, so an episode does not depend on which path drew them."""
    from llmserve_env.sim import engine

    task = TASKS["bursty_workload"]
    profile = load_profile(task.profile)
    window = ArrivalColumns.of(list(generate_arrivals(task, 1))[:200])
    assert len(set(window.tenant.tolist())) == 2  # the kernel's case: a parameter per row
    names = tuple(t.name for t in task.tenants)
    index = window.tenant_index(names)
    compiled = tenant_acceptance_rates(profile, np.random.default_rng(4), window.tenant, names, index)
    monkeypatch.setattr(engine, "HAVE_COMPILED_DRAWS", False)
    assert tenant_acceptance_rates(profile, np.random.default_rng(4), window.tenant, names, index).tolist() == \
        compiled.tolist()
    assert tenant_acceptance_rates(profile, np.random.default_rng(4), window.tenant).tolist() == compiled.tolist()
