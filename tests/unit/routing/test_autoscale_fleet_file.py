"""The fleet file's autoscaling tables: mapped onto ScalingSettings, strict, line-numbered errors;
off by default; the default one-model fleet's `autoscale` setting; the Kubernetes fleet file
loads with the real loader."""

from __future__ import annotations

import pytest

from sluice.config import load_settings
from sluice.routing.errors import FleetFileError
from sluice.routing.fleet_file.default_fleet import fleet_from_settings
from sluice.routing.fleet_file.loader import load_fleet, parse_fleet
from sluice.routing.fleet_file.scaling_settings import ScalingSettings
from tests.paths import ROOT

BASE = """\
[autoscaling]
interval_s = 0.25
max_workers = 4
down_cooldown_s = 60
[autoscaling.warm_pool]
timezone = "Europe/Berlin"
windows = [{ start = "00:00", size = 1 }, { start = "09:00", size = 2 }]

[models.m.versions.v1]
weights = "bundled"
traffic = 100
replicas = 1
autoscale = true

[models.m.versions.v2]
weights = "bundled"
replicas = 2
[models.m.versions.v2.autoscale]
max_workers = 3
min_serving = 2
"""


def test_tables_map_onto_the_policy_settings_with_version_overrides():
    fleet = parse_fleet(BASE)
    v1, v2 = fleet.scaling("m", "v1"), fleet.scaling("m", "v2")
    assert isinstance(v1, ScalingSettings) and type(v1) is ScalingSettings
    assert (v1.max_workers, v1.min_serving, v1.down_cooldown_s) == (4, 1, 60.0)
    assert v1.warm_pool.timezone == "Europe/Berlin" and [w.size for w in v1.warm_pool.windows] == [1, 2]
    assert (v2.max_workers, v2.min_serving, v2.down_cooldown_s) == (3, 2, 60.0)  # the rest inherited
    assert v2.scale_up_at == ScalingSettings().scale_up_at
    assert fleet.autoscale_interval_s == 0.25
    assert fleet.autoscaled() == [("m", "v1"), ("m", "v2")]


def test_autoscaling_is_off_by_default():
    fleet = parse_fleet('[models.m.versions.v1]\nweights = "bundled"\ntraffic = 100\nreplicas = 1\n')
    assert fleet.autoscaled() == [] and fleet.scaling("m", "v1") is None and fleet.autoscaling is None


@pytest.mark.parametrize(
    "old, new, expect",
    [
        (
            "max_workers = 3",
            'max_workers = "3"',
            "<f>:19: models.m.versions.v2.autoscale.max_workers: Input should be a valid integer",
        ),
        ("interval_s = 0.25", "interval_s = 0", "<f>:2: autoscaling.interval_s: Input should be greater than 0"),
        (
            "autoscale = true",
            "autoscale = 2",
            "<f>:13: models.m.versions.v1.autoscale: Input should be a valid boolean",
        ),
        (
            "max_workers = 3",
            "scale_down_at = 0.9",
            "<f>:18: models.m.versions.v2.autoscale: scale_down_at (0.9) must be below",
        ),
        (
            "max_workers = 3",
            "max_workrs = 3",
            "<f>:19: models.m.versions.v2.autoscale.max_workrs: Extra inputs are not permitted",
        ),
        ('"Europe/Berlin"', '"Mars/Base"', "<f>:6: autoscaling.warm_pool.timezone: unknown timezone 'Mars/Base'"),
        (
            "replicas = 2",
            "replicas = 1",
            "<f>:17: models.m.versions.v2.replicas: with autoscale, replicas is the serving count",
        ),
        ("replicas = 1\nautoscale", "replicas = 5\nautoscale", "<f>:12: models.m.versions.v1.replicas: with autoscale"),
        (
            "replicas = 1\nautoscale",
            'workers = ["10.0.0.1:1"]\nautoscale',
            "<f>:13: models.m.versions.v1.autoscale: autoscale starts and stops local replicas",
        ),
    ],
)
def test_a_bad_autoscaling_entry_is_refused_naming_its_line_and_field(old, new, expect):
    assert old in BASE
    with pytest.raises(FleetFileError) as info:
        parse_fleet(BASE.replace(old, new, 1), source="<f>")
    assert expect in str(info.value), str(info.value)


def test_an_autoscaling_table_no_version_uses_is_an_error():
    text = BASE.replace("autoscale = true\n", "").split("[models.m.versions.v2]")[0]
    with pytest.raises(FleetFileError, match=r"<f>:1: autoscaling: no version has autoscale = true"):
        parse_fleet(text, source="<f>")


def test_the_default_fleet_autoscales_its_spawned_worker_when_asked():
    off = fleet_from_settings(load_settings(None))
    assert off.autoscaled() == []
    on = fleet_from_settings(load_settings(None, autoscale=True, autoscale_max_workers=3))
    ((model, version),) = on.autoscaled()
    s = on.scaling(model, version)
    assert s.max_workers == 3 and s.min_serving == 1 and s.warm_pool.smallest == 1
    with pytest.raises(FleetFileError, match="cannot scale"):
        fleet_from_settings(load_settings(None, autoscale=True, worker="127.0.0.1:5000"))


def test_the_kubernetes_fleet_file_loads_with_the_real_loader():
    fleet = load_fleet(ROOT / "deploy" / "k8s" / "base" / "fleet.toml")
    (model,) = fleet.models.values()
    (version,) = model.versions.values()
    assert version.traffic == 100 and version.workers and version.replicas == 0
    assert fleet.autoscaled() == []  # in Kubernetes, KEDA scales the workers (worker-scaledobject.yaml)
