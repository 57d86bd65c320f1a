"""Every numba kernel compiled, or loaded from numba's disk cache, before the first episode needs it.

The grader's naive-server floor (core/grader.py), the metrics' settlement (core/settlement.py) and
weighted percentiles (shared/percentiles.py) run in both modes; the simulator's engine and router (sim/array_engine.py
`warm`) in sim mode. The server calls `warm` at start-up; the Docker image calls it at build time, as
the user that serves, so that every container start loads the kernels from the cache instead of
compiling them (~45 s on this project's 2-core machine from nothing).
"""

from __future__ import annotations


def warm(sim: bool = True) -> None:
    """Compile or load every kernel (`sim`: the simulator's too). Each piece runs once per process."""
    from llmserve_env.core.grader import warm as warm_grader
    from llmserve_env.core.settlement import warm as warm_settlement
    from llmserve_env.shared.percentiles import warm as warm_percentiles

    warm_grader()
    warm_settlement()
    warm_percentiles()
    if sim:
        from llmserve_env.sim.array_engine import warm as warm_engine

        warm_engine()
