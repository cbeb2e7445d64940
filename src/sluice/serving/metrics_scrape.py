"""One /metrics scrape: refresh the gauges read at scrape time, then render the registry.

Engine gauges come from the engines' own statistics (per model version, every engine that
answered combined into one: engine/stats.py), worker, warm-pool and scaling gauges from the
fleet, gateway gauges from the gateway. Kept here, not in the API, so the HTTP layer needs
nothing below serving to answer a scrape.
"""

from __future__ import annotations

import time

from sluice.engine.stats import EngineStats, combined
from sluice.serving.runtime import ServingRuntime


async def scrape(rt: ServingRuntime) -> bytes:
    """The Prometheus exposition text, every scrape-time gauge fresh."""
    if rt.fleet is not None:
        # per version: engines that do not answer are left out; engine_up says when none does
        answered = await rt.fleet.fresh_stats()
        rt.metrics.observe_engines({key: combined(s) if s else None for key, s in answered.items()})
        if rt.settings.gaie_metrics:
            _observe_gaie(rt, combined([s for stats in answered.values() for s in stats]))
        rt.metrics.observe_workers(rt.fleet.worker_counts())
        rt.metrics.observe_warm_pool(rt.fleet.warm_pool_counts())
        rt.metrics.observe_scaling(rt.fleet.scaling_signals())
    if rt.gateway is not None:
        rt.metrics.observe_gateway(rt.gateway)
    return rt.metrics.render()


def _observe_gaie(rt: ServingRuntime, engines: EngineStats) -> None:
    """The Gateway API Inference Extension's names (observability/metrics.py GaieMetrics), for this
    server's engines together; waiting counts the admission queue too (not yet in an engine)."""
    rt.metrics.enable_gaie()
    assert rt.fleet is not None and rt.metrics.gaie is not None
    queued = rt.gateway.admission.depth if rt.gateway is not None else 0
    models = list(rt.fleet.registry.fleet.models)
    bases = [m for m in models if rt.fleet.parent_of(m) is None] or models
    rt.metrics.gaie.observe(bases[0] if bases else "", engines, queued, time.time())
