"""LoRA adapters in the fleet: an adapter is a version of a model whose `adapter` names a PEFT
folder and whose `base` names the version whose workers serve it (docs/LORA.md). So sticky
weights, canaries, pins, rollouts and rollbacks of adapters are the versions' own machinery;
what is adapter-specific is only where its requests run (the base's workers, with the adapter
named on each request) and which worker is preferred (one holding it already).

Helpers over a FleetSpec: resolve a version's base, the (model, version) -> base map the worker
pool borrows workers by, the AdapterRef a request of the version carries, and the model spec of
an adapter registered at run time (`/v1/load_lora_adapter`, `--lora-modules`).
"""

from __future__ import annotations

from sluice.routing.fleet_file.schema import FleetSpec, ModelSpec, VersionSpec
from sluice.types import AdapterRef

# the version name of an adapter registered at run time or with --lora-modules (one version)
RUNTIME_VERSION = "default"


def names(fleet: FleetSpec) -> dict[str, str]:
    """Every id and alias -> its model id."""
    out = {m: m for m in fleet.models}
    for model_id, model in fleet.models.items():
        for alias in model.aliases:
            out.setdefault(alias, model_id)
    return out


def resolve_base(fleet: FleetSpec, base: str) -> tuple[str, str] | str:
    """`MODEL/VERSION` (or `MODEL` with one version) -> (model id, version), or why not."""
    known = names(fleet)
    model_part, version = (base, None) if base in known else base.rpartition("/")[::2]
    model_id = known.get(model_part)
    if model_id is None:
        return f"base {base!r} names no model of this fleet (MODEL/VERSION or MODEL)"
    model = fleet.models[model_id]
    if version is None:
        if len(model.versions) != 1:
            return f"base {base!r}: model {model_id!r} has {len(model.versions)} versions; name one (MODEL/VERSION)"
        version = next(iter(model.versions))
    spec = model.versions.get(version)
    if spec is None:
        return f"base {base!r}: model {model_id!r} has no version {version!r}"
    if spec.is_adapter:
        return f"base {base!r} is itself an adapter version: an adapter runs on a version with weights"
    return model_id, version


def adapter_bases(fleet: FleetSpec) -> dict[tuple[str, str], tuple[str, str]]:
    """(model, version) of every adapter version -> (model, version) of its base (resolvable
    ones; the loader refuses a fleet with any other)."""
    out: dict[tuple[str, str], tuple[str, str]] = {}
    for model_id, model in fleet.models.items():
        for name, spec in model.versions.items():
            if spec.base is not None and isinstance(base := resolve_base(fleet, spec.base), tuple):
                out[(model_id, name)] = base
    return out


def adapter_ref(model_id: str, spec: VersionSpec) -> AdapterRef | None:
    """What a request of this version carries to the worker: the adapter named by its model id
    (the name a client sends, as vLLM and the Gateway API Inference Extension list adapters)
    and its source; None for a version with weights."""
    return AdapterRef(model_id, spec.adapter) if spec.adapter is not None else None


def adapter_model(source: str, base: str) -> ModelSpec:
    """A model of one adapter version (`default`, all the traffic) on `base` (MODEL/VERSION)."""
    version = VersionSpec.model_validate({"adapter": source, "base": base, "traffic": 100.0}, strict=False)
    return ModelSpec(versions={RUNTIME_VERSION: version})


def sole_base(fleet: FleetSpec) -> tuple[str, str] | None:
    """The fleet's one version with weights (where --lora-modules and runtime loads attach when no
    base is named), or None when there are several or none."""
    bases = [(m, v) for m, model in fleet.models.items() for v, spec in model.versions.items() if not spec.is_adapter]
    return bases[0] if len(bases) == 1 else None
