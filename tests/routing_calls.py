"""One routing decision as the serving path takes it (plan, then dispatch; settle at the end),
for tests that drive the router without the failover loop around it."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from sluice.routing.dispatch.circuit_breaker import Outcome
from sluice.routing.dispatch.router import FleetRouter, PlanRequest, RoutePlan
from sluice.routing.dispatch.version_router import sticky_key
from sluice.routing.dispatch.worker_picker import Pick
from sluice.routing.dispatch.worker_pool import Dispatch
from sluice.routing.errors import ModelUnavailableError, VersionUnavailableError
from sluice.types import GenerationRequest, SamplingParams


def user_key(tenant: str, user: str) -> str:
    """The sticky key of `user`'s requests (a non-empty user id always has one)."""
    key = sticky_key(tenant, user_id=user)
    assert key is not None, "an empty user id has no sticky key"
    return key


@dataclass(slots=True, frozen=True)
class RouteRequest:
    model: str
    tenant: str
    tier: str
    key: str
    prompt_token_ids: Sequence[int]
    cost_tokens: int
    pin: str | None = None
    exclude_workers: Collection[str] = ()


@dataclass(slots=True, frozen=True)
class Routed:
    plan: RoutePlan
    dispatch: Dispatch
    pick: Pick
    cost_tokens: int = field(default=0)

    def __getattr__(self, name: str):  # the plan's fields read through (model_id, version, ...)
        return getattr(self.plan, name)

    @property
    def worker_id(self) -> str:
        return self.dispatch.worker_id


def _generation(req: RouteRequest) -> GenerationRequest:
    """The engine-facing request whose token cost is `req.cost_tokens`."""
    prompt = list(req.prompt_token_ids)
    return GenerationRequest(
        req.key, prompt, SamplingParams(max_tokens=max(1, req.cost_tokens - len(prompt))), tenant=req.tenant
    )


async def route(router: FleetRouter, req: RouteRequest) -> Routed:
    async def cost(_model: str, _version: str) -> int:
        return req.cost_tokens

    exclude = set(req.exclude_workers)
    preq = PlanRequest(req.model, req.tenant, req.tier, req.key, req.pin, exclude)
    for _ in range(8):
        plan = await router.plan(preq, cost)
        placed = router.dispatch(plan, _generation(req), exclude)
        if placed is not None:
            return Routed(plan, *placed, req.cost_tokens)
        await router.settle(plan, 0)  # its workers went away while the quota was checked
        if req.pin:
            raise VersionUnavailableError(f"version {plan.version_header} has no worker that can take requests now")
    raise ModelUnavailableError(f"model {req.model!r} and its fallbacks cannot take requests now")


async def finish(router: FleetRouter, routed: Routed, outcome: Outcome, actual_tokens: int) -> None:
    router.finish_dispatch(routed.dispatch, outcome)
    await router.settle(routed.plan, actual_tokens)
