"""The registry: ids and aliases resolve to one model; an invalid reload keeps the fleet."""

from __future__ import annotations

import pytest

from sluice.routing.errors import UnknownModelError, UnknownVersionError
from sluice.routing.fleet_file.loader import parse_fleet
from sluice.routing.fleet_file.registry import Registry

FLEET = """\
[models.big]
aliases = ["large", "claude-sonnet-4-5"]
fallbacks = ["small"]
[models.big.versions.v1]
weights = "bundled"
traffic = 100
replicas = 1

[models.small]
aliases = ["tiny"]
[models.small.versions.v1]
weights = "bundled"
traffic = 100
workers = ["127.0.0.1:50099"]
"""


def test_resolve_ids_and_aliases():
    reg = Registry(parse_fleet(FLEET))
    assert reg.resolve("big") == reg.resolve("large") == reg.resolve("claude-sonnet-4-5") == "big"
    assert reg.resolve("tiny") == "small"
    assert reg.served_names() == ["big", "small", "large", "claude-sonnet-4-5", "tiny"]
    assert reg.fallback_chain("big") == ["big", "small"] and reg.fallback_chain("small") == ["small"]
    with pytest.raises(UnknownModelError, match="'Big' not found; available: big, small, large"):
        reg.resolve("Big")  # ids are exact, as in both APIs
    with pytest.raises(UnknownVersionError, match="no version 'v9'; versions: v1"):
        reg.version("big", "v9")


def test_fallbacks_may_name_aliases():
    reg = Registry(parse_fleet(FLEET.replace('fallbacks = ["small"]', 'fallbacks = ["tiny"]')))
    assert reg.fallback_chain("big") == ["big", "small"]


def test_reload_valid_file_swaps_and_reports_the_diff(tmp_path):
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    reg = Registry.from_file(path)
    path.write_text(
        FLEET.replace('aliases = ["tiny"]', 'aliases = ["tiny", "mini"]')
        + '\n[models.third.versions.a]\nweights = "bundled"\ntraffic = 1\nreplicas = 1\n'
    )
    result = reg.reload()
    assert result.applied and result.error is None
    assert (result.added, result.removed, result.changed) == (("third",), (), ("small",))
    assert reg.resolve("mini") == "small" and reg.generation == 1


def test_invalid_reload_keeps_the_running_fleet(tmp_path):
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    reg = Registry.from_file(path)
    before = reg.fleet
    path.write_text(FLEET.replace("traffic = 100\nreplicas", "traffic = -5\nreplicas"))
    result = reg.reload()
    assert not result.applied and f"{path}:6: models.big.versions.v1.traffic" in result.error
    path.write_text(FLEET.replace('fallbacks = ["small"]', 'fallbacks = ["gone"]'))
    result = reg.reload()
    assert not result.applied and f"{path}:3: models.big.fallbacks[0]: fallback 'gone'" in result.error
    assert reg.fleet is before and reg.generation == 0 and reg.resolve("large") == "big"
    path.write_text("this is [not toml")
    assert "not valid TOML" in reg.reload().error and reg.fleet is before
    path.unlink()
    assert "cannot read the fleet file" in reg.reload().error and reg.fleet is before


def test_reload_of_a_built_fleet_is_cross_checked():
    reg = Registry(parse_fleet(FLEET))
    broken = parse_fleet(FLEET).model_copy(deep=True)
    broken.models["big"].fallbacks.append("nobody")  # bypasses the file loader's checks
    result = reg.reload(broken)
    assert not result.applied and "models.big.fallbacks[1]: fallback 'nobody'" in result.error
    assert not Registry(parse_fleet(FLEET)).reload().applied  # no file to reread
