"""The fleet file: the example loads, every kind of mistake names its line and field."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from sluice.config import Settings
from sluice.engine.config import EngineConfig
from sluice.routing.errors import FleetFileError
from sluice.routing.fleet_file.default_fleet import DEFAULT_VERSION, default_model_id, fleet_from_settings
from sluice.routing.fleet_file.loader import load_fleet, parse_fleet
from sluice.routing.fleet_file.schema import EngineSettings, QuotaMode, QuotaPeriod, WeightsKind
from sluice.toml_lines import key_lines, line_of
from tests.paths import ROOT

EXAMPLE = ROOT / "examples" / "fleet.toml"

MINIMAL = """\
[models.m]
aliases = ["alias-m"]

[models.m.versions.v1]
weights = "bundled"
traffic = 100
replicas = 1
"""


def problems(text: str, **kw) -> list[str]:
    with pytest.raises(FleetFileError) as exc:
        parse_fleet(text, source="fleet.toml", **kw)
    return exc.value.problems


def test_example_fleet_loads():
    fleet = load_fleet(EXAMPLE)
    smol = fleet.models["smollm2-135m-instruct"]
    assert smol.aliases == ["smollm2", "claude-haiku-4-5"]
    assert smol.fallbacks == ["tinyllama"]
    assert {n: v.traffic for n, v in smol.versions.items()} == {"stable": 90, "canary": 10}
    assert smol.versions["stable"].replicas == 2 and smol.versions["stable"].weights_kind is WeightsKind.BUNDLED
    assert smol.versions["canary"].workers == ["127.0.0.1:50071"]
    assert smol.versions["canary"].engine.apply(EngineConfig()).scheduling_policy == "priority"
    free = smol.tier_policy("free")
    assert free.quota is not None and free.quota.period is QuotaPeriod.DAY and free.quota.mode is QuotaMode.SOFT
    assert smol.tier_policy("priority").allow_pin and not smol.tier_policy("batch").allow_pin
    tiny = fleet.models["tinyllama"]
    assert tiny.tier_policy("anything").allow_pin  # the "*" entry
    assert tiny.versions["q4"].weights_kind is WeightsKind.GGUF
    assert fleet.routing.load_bound == 1.25 and fleet.rollout.steps == [10, 25, 50, 100]


def test_engine_settings_track_engine_config():
    engine_fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
    assert set(EngineSettings.model_fields) <= set(engine_fields)
    cfg = EngineSettings(max_num_seqs=3, block_size=16).apply(EngineConfig(kv_cache_gib=0.5))
    assert (cfg.max_num_seqs, cfg.block_size, cfg.kv_cache_gib) == (3, 16, 0.5)


def test_breaker_settings_map_onto_the_breaker():
    from sluice.routing.dispatch.circuit_breaker import BreakerConfig

    fleet = parse_fleet("[routing.breaker]\ncooldown_s = 2.5\n" + MINIMAL)
    assert fleet.routing.breaker.config() == BreakerConfig(cooldown_s=2.5)
    assert BreakerConfig() == parse_fleet(MINIMAL).routing.breaker.config()  # same defaults


def test_unknown_key_and_wrong_type_name_their_lines():
    text = MINIMAL.replace("traffic = 100", "traffic = 100\ntrafic = 5").replace("replicas = 1", 'replicas = "two"')
    found = problems(text)
    assert "fleet.toml:7: models.m.versions.v1.trafic: Extra inputs are not permitted" in found
    assert any(p.startswith("fleet.toml:8: models.m.versions.v1.replicas:") and "integer" in p for p in found)


def test_missing_field_points_at_its_table():
    found = problems(MINIMAL.replace('weights = "bundled"\n', ""))
    # weights or, for a LoRA adapter version, adapter + base (docs/LORA.md)
    assert found == [
        "fleet.toml:4: models.m.versions.v1: weights is required (or adapter and base, for a LoRA adapter version)"
    ]


def test_value_rules():
    found = problems(MINIMAL.replace("traffic = 100", "traffic = 0"))
    assert len(found) == 1 and found[0].startswith("fleet.toml:1: models.m:") and "traffic > 0" in found[0]
    found = problems(MINIMAL.replace("replicas = 1", "replicas = 0"))
    assert "replicas >= 1 or at least one address" in found[0]
    found = problems(MINIMAL.replace("replicas = 1", 'workers = ["nohost"]'))
    assert found[0].startswith("fleet.toml:7: models.m.versions.v1.workers:") and "HOST:PORT" in found[0]
    found = problems(MINIMAL + "[models.m.versions.v1.engine]\nnum_kv_blocks = 1\n")
    assert found[0].startswith("fleet.toml:9: models.m.versions.v1.engine.num_kv_blocks:")
    found = problems(MINIMAL + '[models.m.versions.v1.engine]\nscheduling_policy = "lifo"\n')
    assert found[0].startswith("fleet.toml:9: models.m.versions.v1.engine.scheduling_policy:")
    found = problems("[rollout]\nsteps = [50, 20, 100]\n" + MINIMAL)
    assert found[0].startswith("fleet.toml:2: rollout.steps:") and "rise strictly" in found[0]
    found = problems(MINIMAL + '[models.m.tiers.free]\nquota = { tokens = 10, period = "week" }\n')
    assert found[0].startswith("fleet.toml:9: models.m.tiers.free.quota.period:")


def test_the_search_service_table(monkeypatch):
    monkeypatch.setenv("FLEET_SEARCH_KEY", "k1")
    fleet = parse_fleet(
        MINIMAL + '[search]\nurl = "http://search:8500/"\napi_key_env = "FLEET_SEARCH_KEY"\nmax_uses = 2\n'
    )
    assert fleet.search is not None and fleet.search.url == "http://search:8500" and fleet.search.api_key() == "k1"
    assert fleet.search.max_uses == 2 and fleet.search.timeout_s == 5.0 and parse_fleet(MINIMAL).search is None
    found = problems(
        MINIMAL + '[search]\nurl = "search:8500"\napi_key_env = "UNSET_SEARCH_KEY_VAR"\ntimeout_s = 0\nkey = "x"\n'
    )
    assert found[0].startswith("fleet.toml:9: search.url:") and "http(s)://HOST[:PORT]" in found[0]
    assert (
        found[1].startswith("fleet.toml:10: search.api_key_env:")
        and "UNSET_SEARCH_KEY_VAR" in found[1]
        and "not set" in found[1]
    )
    assert found[2].startswith("fleet.toml:11: search.timeout_s:") and "greater than 0" in found[2]
    assert found[3] == "fleet.toml:12: search.key: Extra inputs are not permitted"  # a key is never written in the file
    assert problems("[search]\ntop_k = 5\n" + MINIMAL)[0] == "fleet.toml:1: search.url: required field is missing"


def test_bad_names():
    found = problems(MINIMAL.replace("versions.v1]", 'versions."v 1"]'))
    assert found[0].startswith('fleet.toml:4: models.m.versions."v 1": invalid name')
    found = problems(MINIMAL.replace('aliases = ["alias-m"]', 'aliases = ["has space"]'))
    assert found[0].startswith("fleet.toml:2: models.m.aliases[0]:")


def test_cross_references():
    text = MINIMAL.replace('aliases = ["alias-m"]', 'aliases = ["alias-m", "n"]\nfallbacks = ["nope", "alias-m", "n"]')
    text += '\n[models.n]\nfallbacks = ["m", "m"]\n'
    text += '[models.n.versions.a]\nweights = "bundled"\ntraffic = 1\nworkers = ["h:1"]\n'
    text += '[models.n.versions.b]\nweights = "bundled"\ntraffic = 1\nworkers = ["h:1"]\n'
    found = problems(text)
    assert "fleet.toml:2: models.m.aliases[1]: alias 'n' already names model 'n'" in found
    assert "fleet.toml:3: models.m.fallbacks[0]: fallback 'nope' is not a model id or alias in this fleet" in found
    assert "fleet.toml:3: models.m.fallbacks[1]: fallback 'alias-m' is the model itself" in found
    assert "fleet.toml:11: models.n.fallbacks[1]: fallback 'm' is listed twice" in found
    assert any(
        p.startswith("fleet.toml:19: models.n.versions.b.workers[0]: worker h:1 is already listed at") for p in found
    )
    assert [int(p.split(":")[1]) for p in found] == sorted(int(p.split(":")[1]) for p in found)  # file order


def test_invalid_toml_and_missing_file(tmp_path):
    found = problems("[models.m\nweights = 1\n")
    assert found[0].startswith("fleet.toml: not valid TOML:") and "line 1" in found[0]
    with pytest.raises(FleetFileError, match="cannot read the fleet file"):
        load_fleet(tmp_path / "absent.toml")


def test_weights_paths_for_local_replicas(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.gguf").write_bytes(b"GGUF")
    hf = tmp_path / "models" / "hf"
    hf.mkdir()
    text = MINIMAL.replace('"bundled"', '"models/m.gguf"')
    fleet = parse_fleet(text, base_dir=tmp_path)  # relative to the fleet file's folder
    assert fleet.models["m"].versions["v1"].weights == str(tmp_path / "models" / "m.gguf")
    found = problems(MINIMAL.replace('"bundled"', '"models/hf"'), base_dir=tmp_path)
    assert found[0].startswith("fleet.toml:5: models.m.versions.v1.weights:") and "no config.json" in found[0]
    (hf / "config.json").write_text("{}")
    parse_fleet(MINIMAL.replace('"bundled"', '"models/hf"'), base_dir=tmp_path)
    found = problems(MINIMAL.replace('"bundled"', '"models/absent.gguf"'), base_dir=tmp_path)
    assert "is not a file" in found[0]
    # a remote-only version's weights live on the worker's host: not checked here
    remote = MINIMAL.replace('"bundled"', '"/elsewhere/x.gguf"').replace("replicas = 1", 'workers = ["w:1"]')
    parse_fleet(remote, base_dir=tmp_path)


def test_known_tiers():
    text = MINIMAL + '[models.m.tiers.gold]\nallow_pin = true\n[models.m.tiers."*"]\nallow_pin = false\n'
    found = problems(text, known_tiers={"free", "standard"})
    assert found == ["fleet.toml:8: models.m.tiers.gold: unknown tier 'gold' (known: free, standard)"]
    parse_fleet(text)  # without a tier list, any name goes


def test_toml_lines_scanner():
    text = '''\
# comment
[a]
x = 1
"quoted.key" = 2
dotted.inner = 3
s = """
not = "a key"
"""
arr = [
  1,
]
t = { y = 1 }
[[tbl]]
z = 1
[tbl.sub]
w = 2
[[tbl]]
z = 2
'''
    lines = key_lines(text)
    assert lines[("a", "x")] == 3 and lines[("a", "quoted.key")] == 4 and lines[("a", "dotted", "inner")] == 5
    assert ("a", "not") not in lines and lines[("a", "arr")] == 9 and lines[("a", "t")] == 12
    assert lines[("tbl", 0, "z")] == 14 and lines[("tbl", 0, "sub", "w")] == 16 and lines[("tbl", 1, "z")] == 18
    assert line_of(lines, ("a", "t", "y")) == 12  # inline tables: the key's own line
    assert line_of(lines, ("nowhere",)) is None


def test_fleet_of_one_from_settings():
    fleet = fleet_from_settings(Settings(model_aliases=["a", "smollm2-135m-instruct", "a"]))
    ((model_id, model),) = fleet.models.items()
    assert model_id == "smollm2-135m-instruct" and model.aliases == ["a"]
    ((name, version),) = model.versions.items()
    assert name == DEFAULT_VERSION and version.weights_kind is WeightsKind.BUNDLED
    assert version.replicas == 1 and version.workers == [] and version.traffic == 100
    assert version.engine.apply(EngineConfig()).max_num_seqs == Settings().max_num_seqs
    assert model.tier_policy("free").allow_pin  # the only version may be pinned by anyone

    remote = fleet_from_settings(Settings(worker="10.1.2.3:50051", served_model_name="prod"))
    version = remote.models["prod"].versions[DEFAULT_VERSION]
    assert version.replicas == 0 and version.workers == ["10.1.2.3:50051"]
    assert "reported" in fleet_from_settings(Settings(worker="h:1"), served_name="reported").models
    with pytest.raises(FleetFileError, match="settings"):
        fleet_from_settings(Settings(served_model_name="has space"))


def test_default_model_id_matches_the_worker(tmp_path):
    from sluice.worker.worker_main import served_name

    for p in [tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf", tmp_path / "other.Q8_0.gguf", tmp_path / "hf-folder"]:
        assert default_model_id(str(p)) == served_name(p)
    from sluice.models.bundled import BUNDLED_FILE

    assert re.fullmatch(r"[\w.-]+\.gguf", BUNDLED_FILE) and default_model_id(None) == served_name(Path(BUNDLED_FILE))


def test_a_version_sets_where_and_how_it_computes():
    """Per-version device, kernels, numerics and batching window reach the version's workers
    (the engine config a local replica is launched with); a bad spelling names its line."""
    from sluice.routing.fleet.replica_launch import replica_launch

    text = MINIMAL.replace(
        "replicas = 1",
        'replicas = 1\n[models.m.versions.v1.engine]\ndevice = "cpu"\nkernels = "torch"\nnumerics = "fast"\n'
        'batching_window = "adaptive"\nbatching_window_ms = 20.0',
    )
    spec = parse_fleet(text).models["m"].versions["v1"]
    launch = replica_launch(Settings(), spec)
    config = json.loads(launch.engine_args[launch.engine_args.index("--engine-config") + 1])
    assert (config["device"], config["kernels"], config["numerics"]) == ("cpu", "torch", "fast")
    assert (config["batching_window"], config["batching_window_ms"]) == ("adaptive", 20.0)
    bad = problems(text.replace('device = "cpu"', 'device = "tpu"'))
    assert len(bad) == 1 and bad[0].startswith("fleet.toml:") and "engine.device" in bad[0] and "tpu" in bad[0]
