"""sluice/heap.py: start-up's objects out of the cyclic collector's passes, and nothing else."""

from __future__ import annotations

import gc
import weakref

import pytest


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()  # the rest of the test session collects as before


def _cycle() -> weakref.ref:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_freeze_collects_startup_garbage_first_then_freezes_the_rest(unfrozen):
    from sluice.heap import freeze_startup_objects

    garbage = _cycle()  # unreachable already: collected before the freeze, not frozen with it
    kept = _Node()
    kept.other = kept
    frozen = freeze_startup_objects()
    assert garbage() is None
    assert frozen > 0 and gc.get_freeze_count() > 0  # (frozen objects freed since leave the count)
    assert all(kept is not o for o in gc.get_objects())  # out of the collector's generations
    later = _cycle()  # what the process builds afterwards is collected as ever
    gc.collect()
    assert later() is None
