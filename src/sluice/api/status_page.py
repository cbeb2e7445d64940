"""The status page: `GET /status` (HTML) and `GET /status/data` (the JSON it polls every second).

Models, versions and their live traffic weights, workers with state, breaker and load, the
admission queue, the scaling signal, and the last five minutes of TTFT / ITL plotted live. It is
an operator's view, so it sits behind the admin key like the admin API (a browser is asked for
it through HTTP Basic: any user name, the key as password); without an admin key it does not
exist. The page is one static file with its own small script: nothing loads from elsewhere.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from sluice.api.admin import AdminGuard
from sluice.serving.runtime import ServingRuntime

_PAGE = resources.files("sluice.api").joinpath("static/status.html")


def build_router(rt: ServingRuntime, guard: AdminGuard) -> APIRouter:
    router = APIRouter()
    page = _PAGE.read_text(encoding="utf-8")

    @router.get("/status", response_class=HTMLResponse, include_in_schema=False)
    async def status_page(request: Request) -> HTMLResponse:
        guard.check(request)
        return HTMLResponse(
            page,
            headers={
                "content-security-policy": "default-src 'self'; script-src 'unsafe-inline' 'self'; "
                "style-src 'unsafe-inline'"
            },
        )

    @router.get("/status/data", include_in_schema=False)
    async def status_data(request: Request) -> Any:
        guard.check(request)
        fleet = rt.require_fleet()
        gw = rt.gateway
        gateway: dict[str, object] = {"queue_depth": 0, "inflight": 0, "scaling_signal": 0.0}
        if gw is not None:
            q = gw.admission
            gateway = {"queue_depth": q.depth, "inflight": q.inflight, "scaling_signal": q.scaling_signal()}
        # the autoscaling input per model (sluice_scaling_signal{model}); the card shows these
        gateway["scaling_signals"] = fleet.scaling_signals()
        return {
            "fleet": fleet.status(),
            "gateway": gateway,
            "latency": rt.metrics.recent.series(),
            "ready": rt.ready,
            "draining": rt.draining,
        }

    return router
