"""A lane's share of the machine: "unified" (all of it), "prefill" or "decode" under a
prefill/decode split. Its own module, importing profiles only for annotations, so the step models
(step_table, measured_step) that profiles.py checks at load never import profiles.py back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmserve_env.sim.profiles import Profile


def lane_shares(p: Profile, lane: str) -> tuple[float, float]:
    """(compute share, bandwidth share) of a lane: "unified", "prefill" or "decode"."""
    if lane == "unified":
        return 1.0, 1.0
    if lane == "prefill":
        return p.split_prefill_compute_share, p.split_prefill_bandwidth_share
    return 1.0 - p.split_prefill_compute_share, 1.0 - p.split_prefill_bandwidth_share
