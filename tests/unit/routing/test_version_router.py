"""Version choice: the weighted split, stickiness, minimal movement, and pins."""

from __future__ import annotations

import math

import pytest

from sluice.errors import InvalidRequestError
from sluice.routing.dispatch.version_router import choose_version, resolve_pin, sticky_key
from sluice.routing.errors import ModelUnavailableError, PinNotAllowedError, UnknownVersionError
from sluice.routing.fleet_file.loader import parse_fleet
from sluice.routing.fleet_file.registry import Registry

KEYS = [sticky_key("acme", user_id=f"user-{i}") for i in range(10_000)]


def split(weights: dict[str, float], keys=KEYS) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {v: [] for v in weights}
    for k in keys:
        out[choose_version("m", weights, k)].append(k)
    return out


@pytest.mark.parametrize("n", [1_000, 10_000])
def test_split_follows_the_weights(n):
    # bound: 4 standard deviations of a binomial (90/10 over 1,000 keys: ±3.8 points; over
    # 10,000: ±1.2). The hash is deterministic, so this is a fixed check, not a flaky one.
    for weights in ({"stable": 90, "canary": 10}, {"a": 50, "b": 30, "c": 20}, {"a": 1, "b": 1}):
        got = split(weights, KEYS[:n])
        total = sum(weights.values())
        for v, w in weights.items():
            p = w / total
            assert abs(len(got[v]) / n - p) <= 4 * math.sqrt(p * (1 - p) / n), (weights, v, len(got[v]))


def test_sticky_keys_never_flap():
    weights = {"stable": 90, "canary": 10}
    first = {k: choose_version("m", weights, k) for k in KEYS[:1000]}
    for _ in range(3):
        for k in KEYS[:1000]:
            assert choose_version("m", weights, k) == first[k]
    reordered = {"canary": 10, "stable": 90}  # the order of the table does not matter
    assert all(choose_version("m", reordered, k) == v for k, v in first.items())
    scaled = {"stable": 9, "canary": 1}  # nor the scale of the weights
    assert all(choose_version("m", scaled, k) == v for k, v in first.items())


def test_growing_the_canary_moves_only_users_into_it():
    before = {k: choose_version("m", {"stable": 90, "canary": 10}, k) for k in KEYS}
    after = {k: choose_version("m", {"stable": 80, "canary": 20}, k) for k in KEYS}
    moved = [k for k in KEYS if before[k] != after[k]]
    assert all(before[k] == "stable" and after[k] == "canary" for k in moved)  # none leaves the canary
    assert abs(100 * len(moved) / len(KEYS) - 10) <= 1.5  # exactly the new 10 %, give or take noise
    # 20 % → 50 % → 100 %: each step again only adds users to the canary
    prev = after
    for w in (50, 100):
        cur = {k: choose_version("m", {"stable": 100 - w, "canary": w}, k) for k in KEYS}
        assert all(cur[k] == "canary" for k in KEYS if prev[k] == "canary")
        prev = cur


def test_adding_and_removing_versions_move_only_their_own_keys():
    two = {"a": 50, "b": 50}
    before = {k: choose_version("m", two, k) for k in KEYS}
    three = {"a": 50, "b": 50, "c": 50}
    after = {k: choose_version("m", three, k) for k in KEYS}
    assert all(after[k] in (before[k], "c") for k in KEYS)  # new version: keys only move into it
    without_b = {k: choose_version("m", {"a": 50, "c": 50}, k) for k in KEYS}  # b unavailable
    assert all(without_b[k] == after[k] for k in KEYS if after[k] != "b")
    assert all(choose_version("m", three, k) == after[k] for k in KEYS)  # b back: its keys return


def test_weight_zero_and_nothing_available():
    assert all(choose_version("m", {"a": 0, "b": 5}, k) == "b" for k in KEYS[:200])
    with pytest.raises(ModelUnavailableError):
        choose_version("m", {"a": 0}, "k")
    with pytest.raises(ModelUnavailableError):
        choose_version("m", {}, "k")


def test_models_draw_independently():
    # the same user is not always on the canary of every model
    a = [choose_version("m1", {"s": 50, "c": 50}, k) for k in KEYS[:2000]]
    b = [choose_version("m2", {"s": 50, "c": 50}, k) for k in KEYS[:2000]]
    same = sum(x == y for x, y in zip(a, b)) / 2000
    assert 0.45 < same < 0.55


def test_sticky_key_precedence_and_tenant_namespace():
    assert sticky_key("t", user_id="u", openai_user="o", api_key_id="k") == sticky_key("t", user_id="u")
    assert sticky_key("t", openai_user="o", api_key_id="k") == sticky_key("t", user_id="o")
    assert sticky_key("t", api_key_id="k") == sticky_key("t", user_id="k")
    assert sticky_key("t") is None and sticky_key("t", user_id="") is None
    assert sticky_key("t1", user_id="alice") != sticky_key("t2", user_id="alice")
    assert sticky_key("a:b", user_id="c") != sticky_key("a", user_id="b:c")


PIN_FLEET = """\
[models.m]
aliases = ["mm"]
[models.m.tiers.priority]
allow_pin = true
[models.m.versions.stable]
weights = "bundled"
traffic = 100
replicas = 1
[models.m.versions.next]
weights = "bundled"
replicas = 1
[models.other.versions.v]
weights = "bundled"
traffic = 1
replicas = 1
"""


def test_pins():
    reg = Registry(parse_fleet(PIN_FLEET))
    model = reg.model("m")
    pin = lambda value, tier="priority": resolve_pin(value, "m", model, tier, reg.resolve)  # noqa: E731
    assert pin("m/next") == "next" and pin("mm/next") == "next" and pin(" stable ") == "stable"
    with pytest.raises(PinNotAllowedError, match="tier 'free' may not pin"):
        pin("m/next", tier="free")
    with pytest.raises(UnknownVersionError, match="no version 'v9'; versions: stable, next"):
        pin("m/v9")
    with pytest.raises(InvalidRequestError, match="request is for model 'm'"):
        pin("other/v")
    with pytest.raises(InvalidRequestError, match="request is for model 'm'"):
        pin("nobody/next")
    with pytest.raises(InvalidRequestError, match="must be <model>/<version>"):
        pin("m/")
