"""LoRA adapters while the server runs, wire-neutral: what `POST /v1/load_lora_adapter` and
`/v1/unload_lora_adapter` (vLLM's endpoints) and the admin API's `/admin/fleet/adapters` do,
behind the admin key (routing/fleet/adapters.py does the work).

Refusals are AdminErrors whose kind picks the status: a damaged adapter or a base that cannot
carry it 400 (the worker's own words: bad JSON, a truncated file, shapes or target modules that
do not fit, a rank mismatch; nothing else is harmed), a taken name or an adapter the fleet file
declares 409, an unknown adapter 404, no worker of the base able to load it now 529.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice.errors import AdapterError, EngineUnavailableError, InvalidRequestError
from sluice.routing.fleet.adapters import AdapterConflictError
from sluice.routing.fleet.fleet import Fleet
from sluice.serving.errors import ErrorKind
from sluice.serving.fleet_admin import AdminError


@dataclass
class AdapterAdmin:
    fleet: Fleet

    async def load(self, name: str, path: str, base: str | None = None) -> dict[str, Any]:
        try:
            return await self.fleet.adapters.load(name, path, base)
        except AdapterConflictError as exc:
            raise AdminError(ErrorKind.CONFLICT, str(exc)) from None
        except (AdapterError, InvalidRequestError, ValueError) as exc:
            raise AdminError(ErrorKind.INVALID_REQUEST, f"adapter {name!r} was not loaded: {exc}") from None
        except EngineUnavailableError as exc:
            raise AdminError(ErrorKind.OVERLOADED, str(exc)) from None

    async def unload(self, name: str) -> dict[str, Any]:
        try:
            return await self.fleet.adapters.unload(name)
        except KeyError:
            raise AdminError(ErrorKind.NOT_FOUND, f"LoRA adapter {name!r} not found") from None
        except ValueError as exc:
            raise AdminError(ErrorKind.CONFLICT, str(exc)) from None

    def listing(self) -> dict[str, Any]:
        return {"adapters": self.fleet.adapters.listing()}
