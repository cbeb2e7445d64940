"""LoRA adapter versions in the fleet file (docs/LORA.md): `adapter` + `base`, checked with the
file's `FILE:LINE: field.path: why` reports; adapters registered at run time laid over the file's
fleet, kept across reloads while their name is free and their base is there."""

from __future__ import annotations

import pytest

from sluice.routing.errors import FleetFileError
from sluice.routing.fleet_file.adapters import adapter_bases, adapter_ref, resolve_base, sole_base
from sluice.routing.fleet_file.loader import parse_fleet
from sluice.routing.fleet_file.registry import Registry
from sluice.types import AdapterRef

BASE = """\
[models.m.versions.v1]
weights = "bundled"
workers = ["10.0.0.1:1"]
traffic = 100
"""


def problems(text: str, **kw) -> list[str]:
    with pytest.raises(FleetFileError) as info:
        parse_fleet(text, source="fleet.toml", **kw)
    return info.value.problems


def adapter(base: str = "m/v1", extra: str = "") -> str:
    return (
        BASE
        + f"""
[models.s.versions.a1]
adapter = "s3://b/s/a1"
base = "{base}"
traffic = 100
{extra}"""
    )


def test_an_adapter_version_names_its_base():
    fleet = parse_fleet(adapter("m"), source="fleet.toml")  # MODEL alone: its one version
    assert adapter_bases(fleet) == {("s", "a1"): ("m", "v1")}
    assert adapter_ref("s", fleet.models["s"].versions["a1"]) == AdapterRef("s", "s3://b/s/a1")
    assert adapter_ref("m", fleet.models["m"].versions["v1"]) is None
    assert sole_base(fleet) == ("m", "v1")


def test_relative_adapter_folders_are_relative_to_the_file(tmp_path):
    folder = tmp_path / "adapters" / "a1"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    text = (
        BASE.replace('workers = ["10.0.0.1:1"]', "replicas = 1")
        + '[models.s.versions.a1]\nadapter = "adapters/a1"\nbase = "m/v1"\ntraffic = 1\n'
    )
    fleet = parse_fleet(text, source="fleet.toml", base_dir=tmp_path)
    assert fleet.models["s"].versions["a1"].adapter == str(folder)
    missing = problems(text.replace("adapters/a1", "adapters/gone"), base_dir=tmp_path)
    assert missing == [
        f"fleet.toml:6: models.s.versions.a1.adapter: {tmp_path}/adapters/gone is not a PEFT adapter "
        "folder (no adapter_config.json)"
    ]


@pytest.mark.parametrize(
    "base, why",
    [
        ("nope", "base 'nope' names no model of this fleet (MODEL/VERSION or MODEL)"),
        ("m/v9", "base 'm/v9': model 'm' has no version 'v9'"),
    ],
)
def test_a_base_that_is_not_there_is_reported_on_its_line(base, why):
    assert problems(adapter(base)) == [f"fleet.toml:8: models.s.versions.a1.base: {why}"]


def test_a_model_of_several_versions_needs_the_version_named_and_an_adapter_is_no_base():
    two = adapter("m") + '[models.m.versions.v2]\nweights = "bundled"\nworkers = ["10.0.0.2:1"]\n'
    assert "model 'm' has 2 versions; name one (MODEL/VERSION)" in problems(two)[0]
    chained = adapter() + '[models.t.versions.x]\nadapter = "s3://b/t"\nbase = "s"\ntraffic = 1\n'
    assert "is itself an adapter version" in problems(chained)[0]


@pytest.mark.parametrize(
    "extra, field",
    [
        ("replicas = 1", "replicas"),
        ('workers = ["10.0.0.9:1"]', "workers"),
        ('weights = "bundled"', "weights"),
        ("[models.s.versions.a1.engine]\nmax_num_seqs = 4", "engine"),
    ],
)
def test_an_adapter_version_has_no_workers_or_engine_of_its_own(extra, field):
    found = problems(adapter(extra=extra))
    assert len(found) == 1 and "runs on its base version's workers and engine" in found[0] and field in found[0]


def test_adapter_without_base_and_base_without_adapter_are_refused():
    no_base = BASE + '[models.s.versions.a1]\nadapter = "s3://b/s"\ntraffic = 1\n'
    assert "needs both adapter (its folder) and base" in problems(no_base)[0]


def test_run_time_adapters_lay_over_the_file_and_survive_a_reload():
    registry = Registry(parse_fleet(adapter(), source="fleet.toml"))
    registry.add_adapter("billing", "/a/billing", "m")
    assert registry.resolve("billing") == "billing"
    assert registry.version("billing", "default").base == "m/v1"
    for name, base, why in [
        ("s", "m", "already names a model"),
        ("x", "s/a1", "itself an adapter"),
        ("bad name!", "m", "letters, digits"),
    ]:
        with pytest.raises(ValueError, match=why):
            registry.add_adapter(name, "/p", base)
    result = registry.reload(parse_fleet(adapter(), source="fleet.toml"))
    assert result.applied and "billing" not in result.removed and "billing" in registry.served_names()
    taken = adapter() + '[models.billing.versions.v1]\nweights = "bundled"\nworkers = ["10.0.0.5:1"]\ntraffic = 1\n'
    registry.reload(parse_fleet(taken, source="fleet.toml"))  # the file takes the name: the file wins
    assert not registry.runtime_adapters() and registry.version("billing", "v1").weights == "bundled"
    with pytest.raises(ValueError, match="declared by the fleet file"):
        registry.remove_adapter("billing")
    with pytest.raises(KeyError):
        registry.remove_adapter("never")
    assert resolve_base(registry.fleet, "billing") == ("billing", "v1")
