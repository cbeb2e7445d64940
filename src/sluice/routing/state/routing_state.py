"""Live routing state: what changes while the fleet runs, shared by every gateway replica.

The fleet file says what a model's versions and default traffic weights are; the live state
holds what operators and rollouts change on top of it, per model:
- `weights`: traffic weights that replace the file's (empty: the file's `traffic` values);
- `versions`: each version's state (missing: ACTIVE);
- `rollout`: the running or last rollout (Rollout.to_dict()), for status and for takeover.

Every write bumps a per-model revision (compare-and-set: `put(..., expect_revision=r)` fails
with StateConflictError if another writer got there first) and one global revision, which is
all a follower polls (state/follower.py). Two stores with the same semantics: this module's
memory store (one gateway) and state/redis_store.py (many gateways).

Circuit-breaker state is deliberately not shared: each gateway judges a worker by its own
requests, as Envoy's outlier detection does; a worker that is down for one is soon down for
all, and one gateway's network trouble does not eject a worker for everyone.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from sluice.routing.errors import StateConflictError
from sluice.routing.fleet_file.schema import ModelSpec


class VersionState(str, enum.Enum):
    ACTIVE = "active"  # takes traffic by its weight, and pins
    WARMING = "warming"  # starting for a rollout: no traffic, no pins yet
    DRAINING = "draining"  # finishing its in-flight requests; takes no new ones
    RETIRED = "retired"  # drained: its local workers may stop


@dataclass(slots=True, frozen=True)
class ModelRoutingState:
    weights: dict[str, float] = field(default_factory=dict)
    versions: dict[str, VersionState] = field(default_factory=dict)
    rollout: dict[str, Any] | None = None
    revision: int = 0  # set by the store
    updated_at: float = 0.0  # wall time of the write, for status

    def to_json(self) -> str:
        return json.dumps(
            {
                "weights": self.weights,
                "versions": {k: v.value for k, v in self.versions.items()},
                "rollout": self.rollout,
                "updated_at": self.updated_at,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str, revision: int) -> ModelRoutingState:
        d = json.loads(text)
        return cls(
            {k: float(v) for k, v in d.get("weights", {}).items()},
            {k: VersionState(v) for k, v in d.get("versions", {}).items()},
            d.get("rollout"),
            revision,
            float(d.get("updated_at", 0.0)),
        )

    def state_of(self, version: str) -> VersionState:
        return self.versions.get(version, VersionState.ACTIVE)


@dataclass(slots=True, frozen=True)
class RoutingSnapshot:
    revision: int = 0
    models: dict[str, ModelRoutingState] = field(default_factory=dict)

    def model(self, model_id: str) -> ModelRoutingState:
        return self.models.get(model_id) or ModelRoutingState()


def effective_weights(model: ModelSpec, state: ModelRoutingState) -> dict[str, float]:
    """The weights version choice uses: the live weights (else the file's), only for ACTIVE
    versions the fleet file still declares."""
    return {
        name: (state.weights.get(name, 0.0) if state.weights else spec.traffic)
        for name, spec in model.versions.items()
        if state.state_of(name) is VersionState.ACTIVE
    }


def leading_version(model: ModelSpec, state: ModelRoutingState) -> str:
    """The version that takes the most of the model's traffic now, by the weights generation
    chooses by (`effective_weights`): whose tokenizer counts and tokenizes for requests that
    generate nothing (count_tokens, /tokenize, /detokenize), so that during a rollout they
    follow the traffic, never a retired version. With no ACTIVE version weighted (a moment
    generation refuses anyway) the fleet file's heaviest, as before any live state."""
    weights = effective_weights(model, state)
    if any(w > 0 for w in weights.values()):
        return max(weights, key=lambda v: weights[v])
    return max(model.versions, key=lambda v: model.versions[v].traffic)


class RoutingStateStore(Protocol):
    """Where the live routing state lives. Writers use compare-and-set on a model's revision."""

    async def revision(self) -> int:
        """The global revision: changes whenever any model's state changes (cheap to poll)."""
        ...

    async def load(self) -> RoutingSnapshot:
        """Every model's state, read consistently."""
        ...

    async def put(
        self, model_id: str, state: ModelRoutingState, expect_revision: int | None = None
    ) -> ModelRoutingState:
        """Write a model's state; with `expect_revision`, only if it is still at that revision
        (else StateConflictError). Returns the state as stored, with its new revision."""
        ...

    async def delete(self, model_id: str) -> None:
        """Forget a model's live state (back to the fleet file's weights)."""
        ...

    async def restore(self, snapshot: RoutingSnapshot) -> bool:
        """Write a whole snapshot back, revisions included, only if the store holds no state at
        all (a Redis restarted empty); False when it does (another gateway restored it first,
        or someone wrote since)."""
        ...

    async def close(self) -> None: ...


class MemoryRoutingStateStore:
    def __init__(self, clock: Callable[[], float] = time.time):
        self._clock = clock
        self._models: dict[str, ModelRoutingState] = {}
        self._model_revs: dict[str, int] = {}  # survive delete, so CAS stays monotonic
        self._revision = 0

    async def revision(self) -> int:
        return self._revision

    async def load(self) -> RoutingSnapshot:
        return RoutingSnapshot(self._revision, dict(self._models))

    async def put(
        self, model_id: str, state: ModelRoutingState, expect_revision: int | None = None
    ) -> ModelRoutingState:
        current = self._model_revs.get(model_id, 0)
        if expect_revision is not None and expect_revision != current:
            raise StateConflictError(f"routing state of {model_id!r} is at revision {current}, not {expect_revision}")
        stored = replace(state, revision=current + 1, updated_at=self._clock())
        self._models[model_id] = stored
        self._model_revs[model_id] = current + 1
        self._revision += 1
        return stored

    async def delete(self, model_id: str) -> None:
        if self._models.pop(model_id, None) is not None:
            self._model_revs[model_id] = self._model_revs.get(model_id, 0) + 1
            self._revision += 1

    async def restore(self, snapshot: RoutingSnapshot) -> bool:
        if self._revision != 0:
            return False
        self._models = dict(snapshot.models)
        self._model_revs = {m: s.revision for m, s in snapshot.models.items()}
        self._revision = snapshot.revision
        return True

    async def close(self) -> None:
        return None
