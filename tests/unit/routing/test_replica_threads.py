"""Local workers share the cores: each replica's torch thread count (routing/fleet/replica_launch.py)."""

import json

import pytest
import torch

from sluice.config import Settings
from sluice.engine.config import EngineConfig
from sluice.routing.fleet.replica_launch import auto_threads, local_replica_count, replica_launch
from sluice.routing.fleet_file.schema import FleetSpec


def fleet(*replicas: int, threads: int | None = None) -> FleetSpec:
    engine = {} if threads is None else {"threads": threads}
    return FleetSpec.model_validate(
        {
            "models": {
                "m": {
                    "versions": {
                        f"v{i}": {"weights": "bundled", "replicas": n, "traffic": 1, "engine": engine}
                        for i, n in enumerate(replicas)
                    }
                }
            }
        }
    )


def threads_of(launch) -> int:
    args = list(launch.engine_args)
    return json.loads(args[args.index("--engine-config") + 1])["threads"]


@pytest.mark.parametrize("replicas, cores, expected", [(1, 2, 0), (2, 2, 1), (3, 2, 1), (2, 8, 4), (3, 8, 2)])
def test_auto_threads_share_the_cores(replicas, cores, expected):
    assert auto_threads(replicas, cores) == expected  # 0: torch's default, a worker alone


def test_the_count_is_every_versions_replicas():
    assert local_replica_count(fleet(1)) == 1
    assert local_replica_count(fleet(2, 1)) == 3


def test_launch_carries_the_share_unless_the_version_sets_threads(monkeypatch):
    monkeypatch.setattr("sluice.routing.fleet.replica_launch.available_cores", lambda: 4)
    spec = fleet(2)
    version = spec.models["m"].versions["v0"]
    assert threads_of(replica_launch(Settings(), version, local_replica_count(spec))) == 2
    assert threads_of(replica_launch(Settings(), version, 1)) == 0  # alone: torch decides
    pinned = fleet(2, threads=3)
    assert threads_of(replica_launch(Settings(), pinned.models["m"].versions["v0"], 2)) == 3
    assert threads_of(replica_launch(Settings(threads=1), version, 2)) == 1  # the server setting


def test_negative_threads_are_refused():
    with pytest.raises(ValueError, match="threads must be >= 0"):
        EngineConfig(threads=-1)


def test_an_engine_sets_its_threads(bundled):
    from sluice.engine.engine import LLMEngine

    before = torch.get_num_threads()
    try:
        LLMEngine(bundled, EngineConfig(num_kv_blocks=16, threads=1))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
