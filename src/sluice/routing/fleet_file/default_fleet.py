"""The fleet of one: what `sluice serve` runs without a fleet file, expressed as a fleet.

One model (the id today's settings give it, with its aliases), one version named `default`
that carries the whole traffic, served by one local worker or by the `--worker` address. Every
tier may pin that version, so a client that echoes the `sluice-model-version` header it was
sent keeps working. With `autoscale` on, the version is autoscaled (one serving worker, a warm
pool of one, at most `autoscale_max_workers`; the other numbers are ScalingSettings'
defaults). Building it through the same schema as a fleet file means the request path has one
shape to handle whether a fleet file exists or not.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from sluice.config import Settings
from sluice.routing.errors import FleetFileError
from sluice.routing.fleet_file.schema import BUNDLED, FleetSpec

DEFAULT_VERSION = "default"
INLINE = "inline"  # `--worker inline`: the engine runs in the gateway process (debugging)

# The id the bundled model is served under; must equal worker_main.served_name (a test checks
# it: importing the worker here would load torch into every gateway that only routes).
BUNDLED_NAME = "smollm2-135m-instruct"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_id(model: str | None) -> str:
    """The id a model path is served under when served_model_name is unset."""
    if model is None:
        return BUNDLED_NAME
    path = Path(model).expanduser()
    return BUNDLED_NAME if path.name == BUNDLED_FILE else path.stem


def fleet_from_settings(settings: Settings, served_name: str | None = None) -> FleetSpec:
    """The fleet today's settings describe. `served_name`: the name the engine reported (a
    remote worker knows its model; the gateway does not) when served_model_name is unset."""
    model_id = settings.served_model_name or served_name or default_model_id(settings.model)
    aliases = [a for a in dict.fromkeys(settings.model_aliases) if a != model_id]
    remote = settings.worker not in (None, INLINE)
    version = {
        "weights": settings.model or BUNDLED,
        "dtype": settings.dtype,
        # engine settings come from `settings` for every version (EngineConfig.from_settings);
        # the version adds no overrides of its own
        "replicas": 0 if remote else 1,  # inline: the one "replica" is the in-process engine
        "workers": [settings.worker] if remote else [],
        "traffic": 100.0,
    }
    data: dict = {
        "models": {
            model_id: {
                "aliases": aliases,
                "tiers": {"*": {"allow_pin": True}},
                "versions": {DEFAULT_VERSION: version},
            }
        }
    }
    if settings.autoscale:
        if remote or settings.worker == INLINE:
            raise FleetFileError(
                [f"settings: autoscale starts and stops local workers; it cannot scale --worker {settings.worker}"]
            )
        version["autoscale"] = True
        data["autoscaling"] = {
            "max_workers": settings.autoscale_max_workers,
            "warm_pool": {"windows": [{"start": "00:00", "size": 1}]},
        }
    try:
        return FleetSpec.model_validate(data)
    except ValidationError as exc:  # e.g. a served_model_name with spaces
        raise FleetFileError([f"settings: {e['msg']} ({'.'.join(map(str, e['loc']))})" for e in exc.errors()]) from None
