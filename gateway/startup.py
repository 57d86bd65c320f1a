"""Everything real mode checks before the server takes its first request.

`check_real_mode` reads and validates every variable (gateway/config.py), loads the tier table,
refuses a step timeout that does not fit the longest window, and probes the endpoint: a dead
endpoint, a refused key, or tier models the endpoint does not list stop the server with a message
saying what to fix, instead of episodes that look normal and measure nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace

from llmserve_env.gateway.config import GatewayConfig, GatewayConfigError
from llmserve_env.gateway.pricing import TierTable, load_tier_table
from llmserve_env.gateway.probe import ProbeResult, probe_endpoint
from llmserve_env.gateway.service import SERVICE, GatewayService

logger = logging.getLogger("llmserve_env.gateway")
PROBE_RETRY_S = 0.25


def check_real_mode(window_lengths: Iterable[float], environ: Mapping[str, str] | None = None,
                    service: GatewayService | None = None) -> GatewayConfig:
    """The validated configuration, or GatewayConfigError naming what is wrong (never the key)."""
    config = GatewayConfig.from_env(environ)
    tiers = load_tier_table(config.tiers_path, config.model)
    longest = max(window_lengths, default=0.0)
    if longest > 0:
        config.check_window(longest)
    if not config.probe:
        logger.warning("LLMSERVE_REAL_PROBE=0: %s was not probed at start-up", config.base_url)
        return config
    for url in config.pool:  # every endpoint of LLMSERVE_REAL_ENDPOINTS, or OPENAI_BASE_URL alone
        one = config if url == config.base_url else replace(config, base_url=url, endpoints=())
        name = f"LLMSERVE_REAL_ENDPOINTS endpoint {url}" if config.endpoints else f"OPENAI_BASE_URL={url}"
        result = _probe(one, name, tiers)
        if url == config.base_url:  # /health reports the first endpoint
            (service or SERVICE).set_probe(config, result)
    return config


def _probe(config: GatewayConfig, name: str, tiers: TierTable) -> ProbeResult:
    # An endpoint started alongside the server may need a moment: retry refused connections until
    # the probe timeout has passed, then judge.
    deadline = time.monotonic() + config.probe_timeout_s
    result = probe_endpoint(config)
    while not result.reachable and time.monotonic() + PROBE_RETRY_S < deadline:
        time.sleep(PROBE_RETRY_S)
        result = probe_endpoint(config, max(0.1, deadline - time.monotonic()))
    skip = "set LLMSERVE_REAL_PROBE=0 to start without this check"
    if not result.reachable:
        raise GatewayConfigError(f"{name} is unreachable ({result.error}); "
                                 f"start that server or fix the address ({skip})")
    if result.key_refused:
        raise GatewayConfigError(f"{name} refused the key ({result.error}); "
                                 f"check OPENAI_API_KEY ({skip})")
    if result.models is not None:
        wanted = sorted({t.model for t in tiers.tiers.values()})
        missing = [m for m in wanted if m not in result.models]
        if missing:
            listed = ", ".join(result.models[:20]) + (" ..." if len(result.models) > 20 else "")
            raise GatewayConfigError(
                f"{name} does not serve {', '.join(missing)} (its /models lists: {listed}); set "
                f"LLMSERVE_REAL_MODEL to one model it serves, or LLMSERVE_REAL_TIERS to a table of its models ({skip})")
    else:
        logger.warning("%s/models gave no model list (%s): the served model is checked per response only",
                       config.base_url, result.error or "not an OpenAI list")
    logger.info("real mode: %s answered in %.0f ms", config.base_url, result.elapsed_ms)
    return result
