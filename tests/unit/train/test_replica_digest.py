"""When the replica groups digest their weights (train/replica/driver.py): at a change of the groups
present, and at the step after a group healed from a peer even when the peers never saw it missing
(it restarted before their quorum left it out: a fresh-clone CI run once wrote no digest for the
live group at the rejoin). The link to torchft is a stand-in here: the exchange it answers is the
input; the real exchange is in tests/system/train/test_train_replicas.py and
test_train_lora_replicas.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from sluice.train.observe.events import Event
from sluice.train.replica import driver as driver_mod
from sluice.train.replica.driver import ReplicaDriver
from sluice.train.replica.sync import Exchanged
from sluice.train.settings import ReplicaSync


@dataclass
class _Link:
    answer: Exchanged
    step: int = 6

    def exchange(self, step: int, loss_sum: float) -> Exchanged:
        return self.answer

    def commit(self, ok: bool) -> bool:
        return ok

    def committed(self) -> int:
        return self.step


@dataclass
class _Events:
    seen: list[tuple[Event, dict[str, Any]]] = field(default_factory=list)

    def emit(self, kind: Event, **fields: Any) -> None:
        self.seen.append((kind, fields))


def _driver(answer: Exchanged, previous: list[int] | None, events: _Events) -> ReplicaDriver:
    d = object.__new__(ReplicaDriver)  # its parts set by hand: no model, no torchft manager
    settings = SimpleNamespace(replica_groups=2, replica_sync=ReplicaSync.STEP)
    d.t = SimpleNamespace(settings=settings, data=None, group=0, rank=0, events=events)
    d.params = [torch.nn.Parameter(torch.ones(3))]
    d.link = _Link(answer)  # type: ignore[assignment]  # the stand-in answers what torchft's link would
    d.previous, d._changed, d._joined = previous, None, False
    return d


@pytest.fixture(autouse=True)
def _equal_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver_mod, "group_tokens", lambda data, rows, groups: [4] * groups)


def _step(d: ReplicaDriver) -> None:
    d.exchange(6, 1.0, [0, 1], 8)
    assert d.commit(True)


def test_a_group_that_healed_unseen_makes_every_group_digest() -> None:
    events = _Events()
    _step(_driver(Exchanged(1.0, [0, 1], 0, healed=[1]), previous=[0, 1], events=events))
    assert [(k, f["step"]) for k, f in events.seen] == [(Event.DIGEST, 6)]  # no "groups changed" event


def test_unchanged_groups_without_a_heal_write_nothing() -> None:
    events = _Events()
    _step(_driver(Exchanged(1.0, [0, 1], 0), previous=[0, 1], events=events))
    assert events.seen == []


def test_a_change_of_groups_digests_and_says_so() -> None:
    events = _Events()
    _step(_driver(Exchanged(1.0, [0, 1], 0), previous=[0], events=events))
    assert [k for k, _ in events.seen] == [Event.DIGEST, Event.GROUPS]
