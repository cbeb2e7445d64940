"""One /metrics scrape: refresh the gauges read at scrape time, then render the registry.

Engine gauges come from the engines' own statistics (per model version, every engine that
answered combined into one: engine/stats.py), worker, warm-pool and scaling gauges from the
fleet, gateway gauges from the gateway. Kept here, not in the API, so the HTTP layer needs
nothing below serving to answer a scrape.
"""

from __future__ import annotations

from sluice.engine.stats import combined
from sluice.serving.runtime import ServingRuntime


async def scrape(rt: ServingRuntime) -> bytes:
    """The Prometheus exposition text, every scrape-time gauge fresh."""
    if rt.fleet is not None:
        # per version: engines that do not answer are left out; engine_up says when none does
        answered = await rt.fleet.fresh_stats()
        rt.metrics.observe_engines({key: combined(s) if s else None for key, s in answered.items()})
        rt.metrics.observe_workers(rt.fleet.worker_counts())
        rt.metrics.observe_warm_pool(rt.fleet.warm_pool_counts())
        rt.metrics.observe_scaling(rt.fleet.scaling_signals())
    if rt.gateway is not None:
        rt.metrics.observe_gateway(rt.gateway)
    return rt.metrics.render()
