"""The fleet's operations, wire-neutral: what `sluice fleet …` (through the admin API) and SIGHUP do.

- `set_weights(model, {version: weight})`: live traffic weights, written to the routing state
  store with compare-and-set (every gateway follows). Versions not named keep their weight; a
  version given weight > 0 becomes ACTIVE (a retired one comes back, and its local replicas
  start; until one is warm its share goes to the others). Refused while a rollout runs: the
  rollout owns the weights until it ends or is rolled back.
- `start_rollout(model, to, overrides)`: `RolloutDriver.start` with the fleet file's
  `[rollout]` plan and the request's overrides; the ticker starts the target's local replicas
  and moves the rollout on. This gateway drives it; the others follow.
- `rollback(model)`: `RolloutDriver.abort`, from any gateway; this gateway also adopts the
  rollback, so it finishes even when the gateway that drove the rollout is gone.
- `reload()`: reread the fleet file (the tiers checked against the gateway's), check it
  against the running fleet (routing/fleet/reload.py), swap it in and apply it — or change
  nothing and report every problem. One reload at a time.

Refusals are `AdminError`s (a ServingError with the kind that picks the status: NOT_FOUND,
INVALID_REQUEST, CONFLICT) carrying the problem lines of an invalid reload.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from sluice.gateway.tiers import load_tiers
from sluice.routing.errors import FleetFileError, RolloutError, StateConflictError, UnknownModelError
from sluice.routing.fleet.fleet import Fleet
from sluice.routing.fleet_file.loader import load_fleet
from sluice.routing.fleet_file.schema import RolloutSpec
from sluice.routing.state.rollout import RolloutPhase
from sluice.routing.state.rollout_driver import current_weights
from sluice.routing.state.routing_state import ModelRoutingState, VersionState
from sluice.serving.errors import ErrorKind, ServingError

log = logging.getLogger("sluice.fleet")
CAS_ATTEMPTS = 5  # compare-and-set retries before a write reports the conflict (409)
MAX_WEIGHT = 1e6


class AdminError(ServingError):
    def __init__(self, kind: ErrorKind, message: str, problems: list[str] | None = None):
        super().__init__(kind, message)
        self.problems = problems or []


def _running(state: ModelRoutingState) -> bool:
    return state.rollout is not None and not RolloutPhase(state.rollout["phase"]).finished


@dataclass
class FleetAdmin:
    fleet: Fleet
    settings_tiers: dict[str, Any] | None = None  # the settings' [tiers.NAME] tables

    def _model(self, model: str) -> str:
        try:
            return self.fleet.registry.resolve(model)
        except UnknownModelError as exc:
            raise AdminError(ErrorKind.NOT_FOUND, str(exc)) from None

    def status(self) -> dict[str, Any]:
        return self.fleet.status()

    async def _refresh(self) -> None:
        """Take our own write into the snapshot now (not on the follower's next poll), so the
        answer and the next request already see it."""
        await self.fleet.follower.poll_once()

    # -- weights ------------------------------------------------------------------------------
    async def set_weights(self, model: str, weights: Mapping[str, float]) -> dict[str, Any]:
        model_id = self._model(model)
        spec = self.fleet.registry.model(model_id)
        if not weights:
            raise AdminError(ErrorKind.INVALID_REQUEST, "no weights given: name at least one version")
        unknown = [v for v in weights if v not in spec.versions]
        if unknown:
            raise AdminError(
                ErrorKind.INVALID_REQUEST,
                f"model {model_id!r} has no version {', '.join(map(repr, unknown))}; "
                f"versions: {', '.join(spec.versions)}",
            )
        bad = [
            v
            for v, w in weights.items()
            if not (isinstance(w, (int, float)) and math.isfinite(w) and 0 <= w <= MAX_WEIGHT)
        ]
        if bad:
            raise AdminError(
                ErrorKind.INVALID_REQUEST, f"weights must be numbers from 0 to {MAX_WEIGHT:g}: {', '.join(bad)}"
            )
        store = self.fleet.state_store
        for _ in range(CAS_ATTEMPTS):
            state = (await store.load()).model(model_id)
            if _running(state):
                assert state.rollout is not None
                raise AdminError(
                    ErrorKind.CONFLICT,
                    f"a rollout of {model_id!r} to {state.rollout['target']!r} is "
                    "running; it owns the weights until it ends (or roll it back)",
                )
            new = {**current_weights(spec, state), **{v: float(w) for v, w in weights.items()}}
            versions = dict(state.versions)
            versions.update({v: VersionState.ACTIVE for v, w in weights.items() if w > 0})
            if not any(w > 0 and versions.get(v, VersionState.ACTIVE) is VersionState.ACTIVE for v, w in new.items()):
                raise AdminError(
                    ErrorKind.INVALID_REQUEST,
                    f"model {model_id!r} would have no traffic: give an active version a weight > 0",
                )
            try:
                await store.put(
                    model_id, ModelRoutingState(new, versions, state.rollout), expect_revision=state.revision
                )
            except StateConflictError:
                continue  # another gateway wrote meanwhile: reread and apply ours on top
            await self._refresh()
            starting, _ = self.fleet.replicas.reconcile()
            log.info("weights of %s set to %s", model_id, new)
            return {"model": model_id, "weights": new, "replicas_starting": starting}
        raise AdminError(ErrorKind.CONFLICT, f"the routing state of {model_id!r} kept changing; try again")

    # -- rollouts -----------------------------------------------------------------------------
    async def start_rollout(self, model: str, to: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
        model_id = self._model(model)
        spec = self.fleet.registry.model(model_id)
        if to not in spec.versions:
            raise AdminError(
                ErrorKind.NOT_FOUND, f"model {model_id!r} has no version {to!r}; versions: {', '.join(spec.versions)}"
            )
        try:
            plan = RolloutSpec.model_validate({**self.fleet.registry.fleet.rollout.model_dump(), **overrides})
        except ValidationError as exc:
            problems = [
                f"{'.'.join(map(str, e['loc'])) or 'plan'}: {e['msg'].removeprefix('Value error, ')}"
                for e in exc.errors(include_url=False)
            ]
            raise AdminError(
                ErrorKind.INVALID_REQUEST, "invalid rollout plan: " + "; ".join(problems), problems
            ) from None
        try:
            rollout = await self.fleet.driver.start(model_id, to, plan)
        except (RolloutError, StateConflictError) as exc:  # one is running, or the target has all traffic already
            raise AdminError(ErrorKind.CONFLICT, str(exc)) from None
        await self._refresh()
        self.fleet.replicas.reconcile()  # the target's local replicas begin starting now
        log.info("rollout of %s to %s started (steps %s, %g s each)", model_id, to, rollout.steps, plan.step_interval_s)
        return {"model": model_id, "rollout": rollout.to_dict()}

    async def rollback(self, model: str) -> dict[str, Any]:
        model_id = self._model(model)
        state = (await self.fleet.state_store.load()).model(model_id)
        if not _running(state):
            raise AdminError(ErrorKind.CONFLICT, f"no rollout of {model_id!r} is running")
        try:
            rollout = await self.fleet.driver.abort(model_id)
            if model_id not in self.fleet.driver.rollouts:
                await self.fleet.driver.adopt(model_id)  # finish the rollback here too (its driver may be gone)
        except (RolloutError, StateConflictError) as exc:
            raise AdminError(ErrorKind.CONFLICT, str(exc)) from None
        await self._refresh()
        log.info("rollout of %s to %s rolled back by the operator", model_id, rollout.target)
        return {"model": model_id, "rollout": rollout.to_dict()}

    # -- reload -------------------------------------------------------------------------------
    async def reload(self) -> dict[str, Any]:
        registry = self.fleet.registry
        if registry.source is None:
            raise AdminError(
                ErrorKind.CONFLICT, "this server runs without a fleet file (--fleet / SLUICE_FLEET): nothing to reload"
            )
        async with self.fleet.reload_lock:
            try:
                tiers = list(load_tiers(self.settings_tiers))
                new = await asyncio.to_thread(load_fleet, registry.source, known_tiers=tiers)
            except FleetFileError as exc:
                raise AdminError(ErrorKind.INVALID_REQUEST, str(exc), exc.problems) from None
            problems = await self.fleet.check_reload(new)
            if problems:
                raise AdminError(ErrorKind.INVALID_REQUEST, "invalid fleet file:\n  " + "\n  ".join(problems), problems)
            result = registry.reload(new)
            if not result.applied:  # cross-checks the loader already ran; kept for completeness
                raise AdminError(
                    ErrorKind.INVALID_REQUEST, result.error or "invalid fleet file", (result.error or "").splitlines()
                )
            changes = await self.fleet.apply_reload()
        return {
            "applied": True,
            "added": list(result.added),
            "removed": list(result.removed),
            "changed": list(result.changed),
            **changes,
        }
