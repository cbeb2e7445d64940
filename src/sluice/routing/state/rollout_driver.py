"""Run rollouts against the shared routing state: start, tick, observe, abort — with CAS.

The gateway where `sluice fleet rollout` lands drives the rollout: it holds the Rollout (and
its health window) in memory, ticks it about once a second with the signals its worker pool
sees, and writes every change — weights, version states, the rollout itself — to the routing
state store with compare-and-set. Every other gateway follows through its StateFollower; any
gateway may `abort`, and the driver adopts an abort (or any newer rollout state another
gateway wrote) on its next tick instead of overwriting it. If the driving gateway dies, a
`start` elsewhere is refused while the stored rollout is unfinished; `adopt` takes it over
from the stored form (its health window starts empty).

Version states outside the rollout (a version an operator retired earlier) are kept as they
are; weights are written for every version of the model, so the fleet file's `traffic` no
longer applies to a model once a rollout has run (delete the model's state to return to it).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sluice.routing.errors import RolloutError, StateConflictError
from sluice.routing.fleet_file.registry import Registry
from sluice.routing.fleet_file.schema import ModelSpec, RolloutSpec
from sluice.routing.state.rollout import Rollout, RolloutPhase, RolloutSignals
from sluice.routing.state.routing_state import ModelRoutingState, RoutingStateStore, effective_weights


def current_weights(model: ModelSpec, state: ModelRoutingState) -> dict[str, float]:
    """Every version's weight now (0 for versions that are not ACTIVE)."""
    live = effective_weights(model, state)
    return {v: live.get(v, 0.0) for v in model.versions}


def state_for(rollout: Rollout, previous: ModelRoutingState) -> ModelRoutingState:
    return ModelRoutingState(
        weights=rollout.weights(), versions={**previous.versions, **rollout.version_states()}, rollout=rollout.to_dict()
    )


class RolloutDriver:
    def __init__(self, store: RoutingStateStore, registry: Registry, clock: Callable[[], float] = time.time):
        self.store = store
        self.registry = registry
        self._clock = clock
        self.rollouts: dict[str, Rollout] = {}  # model id → the rollout this gateway drives
        self._revisions: dict[str, int] = {}  # the revision each was last written at

    async def _current(self, model_id: str) -> ModelRoutingState:
        return (await self.store.load()).model(model_id)

    async def start(self, model_id: str, target: str, plan: RolloutSpec | None = None) -> Rollout:
        model = self.registry.model(model_id)
        state = await self._current(model_id)
        if state.rollout is not None and not RolloutPhase(state.rollout["phase"]).finished:
            raise RolloutError(f"a rollout of {model_id!r} to {state.rollout['target']!r} is still running")
        rollout = Rollout.start(
            model_id, target, current_weights(model, state), plan or self.registry.fleet.rollout, self._clock()
        )
        stored = await self.store.put(model_id, state_for(rollout, state), expect_revision=state.revision)
        self.rollouts[model_id], self._revisions[model_id] = rollout, stored.revision
        return rollout

    async def adopt(self, model_id: str) -> Rollout | None:
        """Take over the stored, unfinished rollout of `model_id` (its driver is gone)."""
        state = await self._current(model_id)
        if state.rollout is None or RolloutPhase(state.rollout["phase"]).finished:
            return None
        rollout = Rollout.from_dict(state.rollout)
        self.rollouts[model_id], self._revisions[model_id] = rollout, state.revision
        return rollout

    async def observe(self, model_id: str, version: str, ok: bool, ttft_s: float | None = None) -> None:
        """A finished request; counts only for the target of a rollout this gateway drives.
        A breach is written at once: every second of delay sends traffic to a bad version."""
        rollout = self.rollouts.get(model_id)
        if rollout is None or version != rollout.target:
            return
        before = rollout.to_dict()
        if rollout.observe(self._clock(), ok, ttft_s):
            await self._write(model_id, rollout, before, await self._current(model_id))

    async def tick(self, model_id: str, signals: RolloutSignals) -> Rollout | None:
        rollout = self.rollouts.get(model_id)
        if rollout is None:
            return None
        state = await self._current(model_id)
        if state.revision != self._revisions[model_id]:  # another gateway wrote: it wins
            if state.rollout is None:
                del self.rollouts[model_id]
                return None
            theirs = Rollout.from_dict(state.rollout)
            theirs.health = rollout.health
            self.rollouts[model_id] = rollout = theirs
            self._revisions[model_id] = state.revision
        before = rollout.to_dict()
        rollout.tick(self._clock(), signals)
        return await self._write(model_id, rollout, before, state)

    async def _write(self, model_id: str, rollout: Rollout, before: dict, state: ModelRoutingState) -> Rollout:
        if rollout.to_dict() != before:
            try:
                stored = await self.store.put(model_id, state_for(rollout, state), expect_revision=state.revision)
                self._revisions[model_id] = stored.revision
            except StateConflictError:  # lost a race: undo, reread and redo on the next tick
                undone = Rollout.from_dict(before)
                undone.health = rollout.health
                self.rollouts[model_id] = undone
                return undone
        if rollout.phase.finished:
            self.rollouts.pop(model_id, None)
        return rollout

    async def abort(self, model_id: str, reason: str = "rolled back by the operator") -> Rollout:
        """Roll back the model's rollout, whichever gateway drives it."""
        for _ in range(5):  # CAS retries: the driver may be writing a step right now
            state = await self._current(model_id)
            if state.rollout is None:
                raise RolloutError(f"no rollout of {model_id!r} to roll back")
            rollout = Rollout.from_dict(state.rollout)
            rollout.abort(self._clock(), reason)
            try:
                stored = await self.store.put(model_id, state_for(rollout, state), expect_revision=state.revision)
            except StateConflictError:
                continue
            if model_id in self.rollouts:
                rollout.health = self.rollouts[model_id].health
                self.rollouts[model_id], self._revisions[model_id] = rollout, stored.revision
            return rollout
        raise RolloutError(f"could not roll back {model_id!r}: the routing state kept changing")
