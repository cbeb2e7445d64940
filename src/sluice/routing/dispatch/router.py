"""The fleet router: requested model → (model, version, worker), with pinning and fallback.

One call per attempt (a retry passes the workers it already tried in `exclude_workers`):

1. Resolve the requested id or alias (UnknownModelError).
2. Pinned (`sluice-model-version` header): that version or an error — the tier must allow
   pins (PinNotAllowedError), the version must exist (UnknownVersionError) and be ACTIVE with
   a worker that takes requests (VersionUnavailableError). A pin never falls back.
3. Otherwise walk the model, then its fallbacks in order. A model is *unavailable* when none
   of its ACTIVE, weighted versions has a worker that takes requests (all STARTING, circuits
   open, queues over `max_outstanding_tokens`). For the first available model the tenant's
   quota is checked and reserved (quota/semantics.py): hard and over on the requested model → 429
   (QuotaExceededError); soft and over → the next fallback, remembered for the warning
   header. Then the version by sticky weighted choice (dispatch/version_router.py) and the worker by
   prefix affinity under the load bound (dispatch/worker_picker.py).
4. Nothing could serve: if some model was only soft-over-quota, the first of them serves
   anyway (a soft quota never refuses; the usage is still counted). Otherwise 529
   (ModelUnavailableError). A hard quota on a *fallback* does not turn the answer into 429:
   the requested model is merely down for now, and the client should retry soon, not at the
   period's reset.

A quota store that fails (Redis down) admits the request without a reservation — the same
fail-open default as the rate limiter — and logs once per 30 s.

Two phases, as the serving path uses them: `plan()` picks model and version (and takes the
quota) before the request is tokenized for good and queued — so the response can say which
version serves it, and a model that cannot serve falls back before anything waits; `dispatch()`
picks the worker inside that version when the request leaves the admission queue (late binding:
the freshest load), and again for each retry or migration. `route()` is both in one call.
Report each dispatch's outcome to `finish_dispatch` (the worker's breaker) and each plan's
actual tokens to `settle` (the quota), exactly once.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field

from sluice.engine.config import EngineConfig
from sluice.engine.kv_manager import prefix_namespace
from sluice.routing.dispatch.circuit_breaker import Outcome
from sluice.routing.dispatch.version_router import choose_version, resolve_pin, version_header
from sluice.routing.dispatch.worker_picker import Candidate, Pick, PickReason, WorkerPicker, affinity_key
from sluice.routing.dispatch.worker_pool import Dispatch, WorkerPool
from sluice.routing.errors import ModelUnavailableError, QuotaExceededError, VersionUnavailableError
from sluice.routing.fleet_file.registry import Registry
from sluice.routing.fleet_file.schema import TokenQuotaSpec, VersionSpec, WorkerChoice
from sluice.routing.quota.semantics import QuotaDecision, QuotaStatus, QuotaStore
from sluice.routing.state.routing_state import RoutingSnapshot, VersionState, effective_weights
from sluice.types import GenerationRequest

log = logging.getLogger("sluice.routing")
WARN_EVERY_S = 30.0


class FallbackReason(str, enum.Enum):
    UNAVAILABLE = "unavailable"
    QUOTA = "quota"


@dataclass(slots=True, frozen=True)
class PlanRequest:
    model: str  # as the client sent it (id or alias)
    tenant: str
    tier: str
    key: str  # sticky key (version_router.sticky_key), else the request id
    pin: str | None = None
    exclude_workers: Collection[str] = ()  # workers already tried: a version with none left is skipped


@dataclass(slots=True, frozen=True)
class RoutePlan:
    model_id: str
    version: str
    fallback_from: str | None = None
    fallback_reason: FallbackReason | None = None
    soft_exceeded: tuple[str, ...] = ()
    quota: QuotaDecision | None = field(default=None, repr=False)

    @property
    def version_header(self) -> str:
        return version_header(self.model_id, self.version)


# what the request would cost on a version (prompt + max_tokens, with that version's tokenizer)
Cost = Callable[[str, str], Awaitable[int]]


class FleetRouter:
    def __init__(
        self,
        registry: Registry,
        pool: WorkerPool,
        quota: QuotaStore | None = None,
        state: Callable[[], RoutingSnapshot] = RoutingSnapshot,
        engine_defaults: EngineConfig | None = None,
    ):
        self.registry = registry
        self.pool = pool
        self.quota = quota
        self.state = state  # the follower's latest snapshot (default: no live state)
        self.engine_defaults = engine_defaults or EngineConfig()
        self._engines: dict[tuple[str, str], tuple[VersionSpec, EngineConfig]] = {}
        self.quota_errors = 0
        self._last_warning = 0.0
        self._turns: dict[str, int] = {}  # version header -> next round-robin turn
        # (model, version) -> its picker: the prefix groups this gateway sent to its workers
        self._pickers: dict[tuple[str, str], WorkerPicker] = {}
        pool.on_cache_lost.append(self.forget_worker)

    async def plan(self, req: PlanRequest, cost: Cost) -> RoutePlan:
        primary = self.registry.resolve(req.model)
        if req.pin:
            return await self._plan_pinned(req, primary, cost)
        soft: list[str] = []
        for model_id in self.registry.fallback_chain(primary):
            weights = self._weights(model_id, req.exclude_workers)
            if not weights:
                continue
            version = choose_version(model_id, weights, req.key)
            quota = await self._take_quota(req, model_id, await cost(model_id, version), force=False)
            if quota is not None and quota.status is QuotaStatus.HARD_EXCEEDED:
                if model_id == primary:
                    raise QuotaExceededError(
                        f"the token quota for model {model_id!r} is used up until the period resets",
                        quota.retry_after_s,
                        model_id,
                    )
                continue
            if quota is not None and quota.status is QuotaStatus.SOFT_EXCEEDED:
                soft.append(model_id)
                continue
            return self._plan(model_id, version, primary, quota, soft)
        for model_id in soft:  # soft quotas never refuse: serve over quota, counted
            weights = self._weights(model_id, req.exclude_workers)
            if weights:
                version = choose_version(model_id, weights, req.key)
                quota = await self._take_quota(req, model_id, await cost(model_id, version), force=True)
                return self._plan(model_id, version, primary, quota, soft)
        raise ModelUnavailableError(f"model {primary!r} and its fallbacks cannot take requests now")

    def dispatch(
        self, plan: RoutePlan, request: GenerationRequest, exclude: Collection[str] = ()
    ) -> tuple[Dispatch, Pick] | None:
        """A worker of the plan's version (prefix affinity under the load bound), its breaker
        permit taken and its load counted at the request's token cost; None when no worker of
        the version can take it now."""
        fleet = self.registry.fleet.routing
        picker = self._picker(plan.model_id, plan.version)
        engine = self.engine_config(plan.model_id, plan.version)
        adapter = request.adapter
        namespace = "\0".join((adapter.name, adapter.source)) if adapter is not None else ""
        key = affinity_key(
            request.prompt_token_ids,
            engine.block_size,
            fleet.affinity_key_blocks,
            prefix_namespace(request.tenant, engine.share_prefix_across_tenants, namespace),
        )
        tried = set(exclude)
        while cands := self.pool.candidates(plan.model_id, plan.version, tried):
            if adapter is not None:
                cands = self._holding(cands, adapter.name)
            if fleet.worker_choice is WorkerChoice.ROUND_ROBIN:
                pick = self._next_in_turn(plan, cands)
            else:
                pick = picker.pick(cands, key)
            dispatch = self.pool.begin(
                pick.worker_id,
                request.token_cost,
                (plan.model_id, plan.version),
                adapter.name if adapter is not None else None,
            )
            if dispatch is not None:
                return dispatch, pick
            tried.add(pick.worker_id)  # its half-open probe slot was taken meanwhile
        return None

    def _holding(self, cands: list[Candidate], adapter: str) -> list[Candidate]:
        """The candidates that hold the LoRA adapter already, while one of them is within the
        load bound (the same bound prefix affinity keeps); otherwise all: a worker that lacks it
        loads it on the request's arrival (tens of milliseconds), which beats queueing behind
        an overloaded holder."""
        fleet = self.registry.fleet.routing
        bound = fleet.load_bound * min(c.load_tokens for c in cands) + fleet.load_slack_tokens
        holders = [
            c
            for c in cands
            if c.load_tokens <= bound and (w := self.pool.get(c.worker_id)) is not None and adapter in w.adapters
        ]
        return holders or cands

    def _picker(self, model_id: str, version: str) -> WorkerPicker:
        fleet = self.registry.fleet.routing
        picker = self._pickers.get((model_id, version))
        if picker is None:
            picker = self._pickers[(model_id, version)] = WorkerPicker(fleet.load_bound, fleet.load_slack_tokens)
        picker.load_bound, picker.slack_tokens = fleet.load_bound, fleet.load_slack_tokens  # a reload may change them
        return picker

    def forget_worker(self, worker_id: str) -> None:
        """The worker's KV cache is gone (removed, down, restarted): forget what was sent there."""
        for picker in self._pickers.values():
            picker.forget(worker_id)

    def prefix_groups(self) -> dict[str, int]:
        """Prefix groups per worker, as this gateway placed them (fleet status shows them)."""
        out: dict[str, int] = {}
        for picker in self._pickers.values():
            for w, n in picker.prefix_groups().items():
                out[w] = out.get(w, 0) + n
        return out

    def _next_in_turn(self, plan: RoutePlan, cands: Sequence[Candidate]) -> Pick:
        """Round robin over the version's candidates (by worker id, so the turn is stable while
        workers come and go); a per-gateway counter, deliberately blind to prefixes and load."""
        turn = self._turns.get(plan.version_header, 0)
        self._turns[plan.version_header] = turn + 1
        ordered = sorted(cands, key=lambda c: c.worker_id)
        return Pick(ordered[turn % len(ordered)].worker_id, PickReason.ROUND_ROBIN, 0)

    def finish_dispatch(self, dispatch: Dispatch, outcome: Outcome) -> None:
        self.pool.finish(dispatch, outcome)

    async def settle(self, plan: RoutePlan, actual_tokens: int) -> None:
        if plan.quota is not None and plan.quota.reservation is not None and self.quota is not None:
            try:
                await self.quota.settle(plan.quota.reservation, actual_tokens)
            except Exception as exc:  # a lost correction leaves the estimate counted
                self._warn(exc)

    # -- steps --------------------------------------------------------------------------------
    def _weights(self, model_id: str, exclude: Collection[str]) -> dict[str, float]:
        """The live weights of the model's versions that have a worker able to take a request."""
        spec = self.registry.model(model_id)
        weights = effective_weights(spec, self.state().model(model_id))
        return {v: w for v, w in weights.items() if w > 0 and self.pool.candidates(model_id, v, exclude)}

    def _plan(
        self, model_id: str, version: str, primary: str, quota: QuotaDecision | None, soft: list[str]
    ) -> RoutePlan:
        fallback = model_id != primary
        reason = (FallbackReason.QUOTA if primary in soft else FallbackReason.UNAVAILABLE) if fallback else None
        return RoutePlan(model_id, version, primary if fallback else None, reason, tuple(soft), quota)

    async def _plan_pinned(self, req: PlanRequest, model_id: str, cost: Cost) -> RoutePlan:
        assert req.pin is not None
        spec = self.registry.model(model_id)
        version = resolve_pin(req.pin, model_id, spec, req.tier, self.registry.resolve)
        state = self.state().model(model_id).state_of(version)
        if state is not VersionState.ACTIVE or not self.pool.candidates(model_id, version, req.exclude_workers):
            why = state.value if state is not VersionState.ACTIVE else "no worker can take requests now"
            raise VersionUnavailableError(f"version {version_header(model_id, version)} is unavailable ({why})")
        tokens = await cost(model_id, version)
        quota = await self._take_quota(req, model_id, tokens, force=False)
        soft: tuple[str, ...] = ()
        if quota is not None and quota.status is QuotaStatus.HARD_EXCEEDED:
            raise QuotaExceededError(
                f"the token quota for model {model_id!r} is used up until the period resets",
                quota.retry_after_s,
                model_id,
            )
        if quota is not None and quota.status is QuotaStatus.SOFT_EXCEEDED:
            soft = (model_id,)  # a pin cannot fall back: served, counted, warned
            quota = await self._take_quota(req, model_id, tokens, force=True)
        return RoutePlan(model_id, version, soft_exceeded=soft, quota=quota)

    # -- quota --------------------------------------------------------------------------------
    def _quota_spec(self, tier: str, model_id: str) -> TokenQuotaSpec | None:
        return self.registry.model(model_id).tier_policy(tier).quota

    async def _take_quota(self, req: PlanRequest, model_id: str, tokens: int, force: bool) -> QuotaDecision | None:
        spec = self._quota_spec(req.tier, model_id)
        if spec is None or self.quota is None:
            return None
        try:
            return await self.quota.acquire(req.tenant, model_id, spec, tokens, force=force)
        except Exception as exc:  # fail open: quotas are accounting, not protection
            self._warn(exc)
            return None

    async def _release(self, quota: QuotaDecision | None) -> None:
        if quota is not None and quota.reservation is not None and self.quota is not None:
            try:
                await self.quota.settle(quota.reservation, 0)
            except Exception as exc:
                self._warn(exc)

    def _warn(self, exc: Exception) -> None:
        self.quota_errors += 1
        now = time.monotonic()
        if now - self._last_warning > WARN_EVERY_S:
            self._last_warning = now
            log.warning("quota store unavailable (%s: %s); admitting without quota", type(exc).__name__, exc)

    # -- engine settings that shape the affinity key ------------------------------------------
    def engine_config(self, model_id: str, version: str) -> EngineConfig:
        """The version's engine settings as its workers run them (the fleet file's overrides on
        the server's defaults: `EngineSettings.apply`, the one place that merges them), kept
        until a reload gives the version a new spec (building one costs ~0.2 ms)."""
        model_id, version = self.pool.base_of(model_id, version)  # an adapter version runs its base's engine
        spec = self.registry.version(model_id, version)
        cached = self._engines.get((model_id, version))
        if cached is None or cached[0] is not spec:
            cached = (spec, spec.engine.apply(self.engine_defaults))
            self._engines[(model_id, version)] = cached
        return cached[1]
