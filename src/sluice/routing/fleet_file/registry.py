"""The registry: which models the fleet serves, under which names, with which versions.

One `Registry` per gateway, holding one immutable FleetSpec at a time. Requests resolve the
model id or alias they name to the model's canonical id; the router asks it for versions and
the fallback chain. A reload (SIGHUP, the admin API) builds and checks a whole new fleet first
and swaps it in only if it is valid: an invalid reload leaves the running fleet untouched and
reports why, so a typo in the file never takes the fleet down.

LoRA adapters registered at run time (`/v1/load_lora_adapter`, the admin API, `--lora-modules`)
are models of one adapter version laid over the file's fleet (fleet_file/adapters.py): they
survive a reload unless the new file takes their name or drops their base.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sluice.routing.errors import FleetFileError, UnknownModelError, UnknownVersionError
from sluice.routing.fleet_file.adapters import adapter_model, names, resolve_base
from sluice.routing.fleet_file.loader import cross_check, dotted_path, load_fleet
from sluice.routing.fleet_file.schema import FleetSpec, ModelSpec, VersionSpec

_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}$")  # schema.ModelId


@dataclass(slots=True, frozen=True)
class ReloadResult:
    applied: bool
    error: str | None = None  # why a reload was refused (the file's problems, one per line)
    added: tuple[str, ...] = ()  # model ids new in this fleet
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()  # models whose spec differs (aliases, versions, tiers, ...)


class Registry:
    def __init__(self, fleet: FleetSpec, source: str | Path | None = None):
        self._file = fleet  # what the file (or the settings) declares
        self._runtime: dict[str, ModelSpec] = {}  # adapters registered at run time, by model id
        self._fleet = fleet  # the file's fleet with the run-time adapters laid over it
        self._names = names(fleet)
        self.source = Path(source) if source is not None else None  # the file reload() rereads
        self.generation = 0  # bumps on every applied reload

    @classmethod
    def from_file(cls, path: str | Path) -> Registry:
        return cls(load_fleet(path), path)

    @property
    def fleet(self) -> FleetSpec:
        return self._fleet

    # -- lookups ----------------------------------------------------------------------------
    def resolve(self, requested: str) -> str:
        """The canonical model id for a requested id or alias."""
        model_id = self._names.get(requested)
        if model_id is None:
            raise UnknownModelError(f"model {requested!r} not found; available: {', '.join(self.served_names())}")
        return model_id

    def model(self, model_id: str) -> ModelSpec:
        try:
            return self._fleet.models[model_id]
        except KeyError:
            raise UnknownModelError(f"model {model_id!r} not found") from None

    def version(self, model_id: str, version: str) -> VersionSpec:
        model = self.model(model_id)
        try:
            return model.versions[version]
        except KeyError:
            raise UnknownVersionError(
                f"model {model_id!r} has no version {version!r}; versions: {', '.join(model.versions)}"
            ) from None

    def served_names(self) -> list[str]:
        """Every id a client may send (ids, then aliases), for /v1/models."""
        return list(self._names)

    def fallback_chain(self, model_id: str) -> list[str]:
        """The model, then its fallbacks in order, as canonical ids."""
        return [model_id, *(self._names[fb] for fb in self.model(model_id).fallbacks)]

    # -- adapters registered at run time -----------------------------------------------------
    def add_adapter(self, name: str, source: str, base: str) -> ModelSpec:
        """Serve a LoRA adapter as model `name` on `base` (MODEL/VERSION or MODEL); ValueError
        saying why not (a taken name, an unknown base)."""
        if not _MODEL_ID.match(name):
            raise ValueError(f"adapter name {name!r}: letters, digits and . _ : / @ - (at most 128 characters)")
        if name in self._names:
            raise ValueError(f"{name!r} already names a model of this fleet")
        resolved = resolve_base(self._fleet, base)
        if isinstance(resolved, str):
            raise ValueError(resolved)
        model = adapter_model(source, "/".join(resolved))
        self._runtime[name] = model
        self._lay_over()
        return model

    def remove_adapter(self, name: str) -> ModelSpec:
        """Stop serving a run-time adapter; KeyError for an unknown name, ValueError for a model
        the fleet file declares (remove it there and reload)."""
        if name not in self._runtime:
            if name in self._names:
                raise ValueError(f"{name!r} is declared by the fleet file: remove it there and reload")
            raise KeyError(name)
        model = self._runtime.pop(name)
        self._lay_over()
        return model

    def runtime_adapters(self) -> dict[str, ModelSpec]:
        return dict(self._runtime)

    def _lay_over(self) -> None:
        """The file's fleet with the run-time adapters whose name is free and base still there."""
        taken = names(self._file)
        kept = {
            n: m
            for n, m in self._runtime.items()
            if n not in taken
            and isinstance(resolve_base(self._file, next(iter(m.versions.values())).base or ""), tuple)
        }
        self._runtime = kept
        self._fleet = self._file.model_copy(update={"models": {**self._file.models, **kept}}) if kept else self._file
        self._names = names(self._fleet)

    # -- reload -------------------------------------------------------------------------------
    def reload(self, new: FleetSpec | str | Path | None = None) -> ReloadResult:
        """Swap in a new fleet (a FleetSpec, a file, or the file this registry came from) if it
        is valid; otherwise keep the running one and say why."""
        try:
            if isinstance(new, FleetSpec):
                problems = cross_check(new, check_paths=False)
                if problems:
                    raise FleetFileError([f"{dotted_path(loc)}: {msg}" for loc, msg in problems])
                fleet = new
            else:
                path = Path(new) if new is not None else self.source
                if path is None:
                    return ReloadResult(False, "this fleet was not loaded from a file; nothing to reread")
                fleet = load_fleet(path)
        except FleetFileError as exc:
            return ReloadResult(False, str(exc))
        before = self._fleet.models
        self._file = fleet
        self._lay_over()
        after = self._fleet.models
        self.generation += 1
        return ReloadResult(
            True,
            added=tuple(m for m in after if m not in before),
            removed=tuple(m for m in before if m not in after),
            changed=tuple(m for m in after if m in before and before[m] != after[m]),
        )
