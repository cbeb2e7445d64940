"""LoRA adapters registered while the fleet runs (`POST /v1/load_lora_adapter`, the admin API,
`sluice fleet load-adapter`, and `--lora-modules` at start): each becomes a model of one adapter
version on a base version (routing/fleet_file/adapters.py), after a worker of that base has
loaded it. So a damaged adapter is refused with the worker's own words (AdapterError: bad JSON,
a truncated file, shapes that do not fit the base) before any client can name it, and the
worker that checked it holds it: routing prefers it for the adapter's first requests.
Unloading takes the model away and asks the base's workers to drop the weights.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from sluice.errors import EngineUnavailableError
from sluice.routing.dispatch.worker_pool import WorkerPool
from sluice.routing.fleet.members import FleetMembers
from sluice.routing.fleet.versions import VersionRuntimes
from sluice.routing.fleet_file.adapters import RUNTIME_VERSION, adapter_bases, resolve_base, sole_base
from sluice.routing.fleet_file.registry import Registry
from sluice.types import AdapterRef

log = logging.getLogger("sluice.routing")


class AdapterConflictError(ValueError):
    """The name is taken by another model (409 upstream; a base that cannot be used is a plain
    ValueError, 400)."""


@dataclass
class FleetAdapters:
    registry: Registry
    pool: WorkerPool
    members: FleetMembers
    runtimes: VersionRuntimes

    def sync_bases(self) -> None:
        """The pool borrows each adapter version's base workers (after any change of the fleet)."""
        self.pool.set_adapter_bases(adapter_bases(self.registry.fleet))

    def base_for(self, base: str | None) -> tuple[str, str]:
        if base is None:
            found = sole_base(self.registry.fleet)
            if found is None:
                raise ValueError("this fleet has several base models: name the adapter's base (MODEL/VERSION)")
            return found
        resolved = resolve_base(self.registry.fleet, base)
        if isinstance(resolved, str):
            raise ValueError(resolved)
        return resolved

    async def load(self, name: str, source: str, base: str | None = None) -> dict[str, Any]:
        """Check and load the adapter on a worker of its base, then serve it as model `name`.
        AdapterError (the worker's words), AdapterConflictError (the name is taken), ValueError
        (the base), EngineUnavailableError (no worker of the base can load it now)."""
        base_model, base_version = self.base_for(base)
        if name in self.registry.served_names():
            raise AdapterConflictError(f"{name!r} already names a model of this fleet")
        handles = [h for h in self.members.serving_handles() if (h.model_id, h.version) == (base_model, base_version)]
        if not handles:
            raise EngineUnavailableError(f"no worker of {base_model}/{base_version} can load an adapter now")
        target = min(handles, key=lambda h: w.load_tokens if (w := self.pool.get(h.worker_id)) else 0)
        loaded = await target.client.load_adapter(AdapterRef(name, source))
        try:
            self.registry.add_adapter(name, source, f"{base_model}/{base_version}")
        except ValueError as exc:  # taken meanwhile (another load of the same name)
            raise AdapterConflictError(str(exc)) from None
        if (entry := self.pool.get(target.worker_id)) is not None:
            self.pool.report_adapters(target.worker_id, {*entry.adapters, name})
        self.sync_bases()
        spec = self.registry.version(base_model, base_version)
        await asyncio.to_thread(self.runtimes.add, name, RUNTIME_VERSION, spec)
        log.info(
            "LoRA adapter %s (%s) serves on %s/%s, checked by %s in %.0f ms",
            name,
            source,
            base_model,
            base_version,
            target.worker_id,
            loaded.load_s * 1000,
        )
        return {
            "name": name,
            "source": source,
            "base": f"{base_model}/{base_version}",
            "worker": target.worker_id,
            "bytes": loaded.bytes,
            "load_ms": round(loaded.load_s * 1000, 1),
        }

    async def unload(self, name: str) -> dict[str, Any]:
        """Stop serving a run-time adapter and drop its weights on the base's workers. KeyError:
        unknown; ValueError: declared by the fleet file."""
        model = self.registry.remove_adapter(name)
        base = self.pool.base_of(name, RUNTIME_VERSION)
        self.sync_bases()
        self.runtimes.versions.pop((name, RUNTIME_VERSION), None)
        version = next(iter(model.versions.values()))
        dropped = 0
        for h in list(self.members.handles.values()):
            if (h.model_id, h.version) == base:
                try:
                    dropped += await h.client.unload_adapter(name)
                except Exception as exc:  # best effort: an unused adapter ages out of the LRU anyway
                    log.warning("worker %s did not drop adapter %s: %s", h.worker_id, name, exc)
        log.info("LoRA adapter %s (%s) no longer served", name, version.adapter)
        return {"name": name, "source": version.adapter, "unloaded_on_workers": dropped}

    def listing(self) -> list[dict[str, Any]]:
        """Every adapter version of the fleet: model, version, source, base, and whether it was
        registered at run time (only those can be unloaded; the file's are the file's)."""
        runtime = self.registry.runtime_adapters()
        out = []
        for (model_id, version), (bm, bv) in sorted(adapter_bases(self.registry.fleet).items()):
            spec = self.registry.version(model_id, version)
            holders = [w.worker_id for w in self.pool.workers(bm, bv) if model_id in w.adapters]
            out.append(
                {
                    "name": model_id,
                    "version": version,
                    "source": spec.adapter,
                    "base": f"{bm}/{bv}",
                    "runtime": model_id in runtime,
                    "resident_on": holders,
                }
            )
        return out
