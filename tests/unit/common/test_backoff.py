"""Restart back-off (common/backoff.py) for serving's workers and search's replicas: doubling, the
bound, and forgetting old exits (injected clock)."""

from __future__ import annotations

from sluice.common.backoff import RestartBackoff


def test_backoff_doubles_up_to_the_cap_then_gives_up():
    p = RestartBackoff(max_restarts=6, window_s=600, base_s=1, max_s=10)
    delays = [p.on_exit(float(t)) for t in range(6)]
    assert delays == [1, 2, 4, 8, 10, 10]
    assert p.on_exit(6.0) is None  # the 7th exit within the window: give up


def test_exits_older_than_the_window_are_forgotten():
    p = RestartBackoff(max_restarts=2, window_s=100)
    assert p.on_exit(0.0) == 1 and p.on_exit(10.0) == 2
    assert p.on_exit(200.0) == 1  # the first two are outside the window now
    assert p.recent_exits == 1


def test_zero_restarts_gives_up_at_the_first_exit():
    assert RestartBackoff(max_restarts=0).on_exit(0.0) is None


def test_without_a_bound_it_never_gives_up_and_a_quiet_spell_resets_it():
    """Search's local replicas: 0.5 s doubling to 10 s while they keep exiting within 30 s of
    each other, back to 0.5 s after a quiet 30 s."""
    p = RestartBackoff(max_restarts=None, window_s=30, base_s=0.5, max_s=10)
    assert [p.on_exit(float(t)) for t in range(8)] == [0.5, 1, 2, 4, 8, 10, 10, 10]
    assert p.on_exit(100.0) == 0.5
