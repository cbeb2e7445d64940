"""One typed settings object for the server: defaults < settings file < env `SLUICE_*` < flags.

Validated at start-up; a bad value stops `sluice serve` with a message naming the setting,
before any model loads. `Settings` is flat (one env var, file key and attribute per setting),
declared by concern in this package's sections: where it listens (listen.py), the model and its
workers (model.py), the engine (engine.py), LoRA adapters (lora.py), the wire (wire.py), logs and traces
(observability.py), resume and retries (resume.py), safety (safety.py), the gateway
(gateway.py); the vocabularies they share are in device.py and stores.py.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from sluice.config.device import DEVICE_NAMES, is_device_name
from sluice.config.engine import EngineSection
from sluice.config.gateway import GatewaySection
from sluice.config.listen import ListenSection
from sluice.config.lora import LoraSection
from sluice.config.model import ModelSection
from sluice.config.observability import ObservabilitySection
from sluice.config.resume import ResumeSection
from sluice.config.safety import SafetySection
from sluice.config.stores import StoreFailMode, StoreKind, by_store_kind
from sluice.config.wire import MB, WireSection
from sluice.errors import SluiceError

__all__ = [
    "DEVICE_NAMES",
    "MB",
    "Settings",
    "SettingsError",
    "StoreFailMode",
    "StoreKind",
    "by_store_kind",
    "is_device_name",
    "load_settings",
]


class SettingsError(SluiceError):
    """A setting is invalid; the message names it."""


# The sections are listed last to first: pydantic collects fields from the bases in reverse, so
# the settings keep the order they are described in (listen, model, engine, wire, ...).
class Settings(
    GatewaySection,
    SafetySection,
    ResumeSection,
    ObservabilitySection,
    WireSection,
    LoraSection,
    EngineSection,
    ModelSection,
    ListenSection,
    BaseSettings,
):
    model_config = SettingsConfigDict(env_prefix="SLUICE_", extra="forbid", validate_default=True)


def load_settings(file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build settings from an optional TOML file, the environment and explicit overrides.

    `overrides` with value None are ignored, so unset CLI flags fall through to env and file.
    """
    data: dict[str, Any] = {}
    if file is not None:
        path = Path(file).expanduser()
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise SettingsError(f"settings file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"settings file {path} is not valid TOML: {exc}") from None
        data = _flatten_server_table(data, path)
    try:
        return _layered(data, overrides)
    except ValidationError as exc:
        raise SettingsError(_describe(exc)) from None


def _flatten_server_table(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """Settings may sit at the top level or in a `[server]` table — or both: a file with
    `[server]` plus top-level tables such as `[tiers.NAME]` applies all of them. A setting given
    in both places is an error (which one was meant?), never silently one of them."""
    server = data.get("server")
    if server is None:
        return data
    if not isinstance(server, dict):
        raise SettingsError(f"settings file {path}: server must be a table")
    merged = {k: v for k, v in data.items() if k != "server"}
    both = sorted(set(merged) & set(server))
    if both:
        raise SettingsError(f"settings file {path}: {', '.join(both)} given both at the top level and in [server]")
    merged.update(server)
    return merged


def _layered(file_data: dict[str, Any], overrides: dict[str, Any]) -> Settings:
    # pydantic-settings ranks init kwargs above env vars. File values must rank below env, so a
    # file value is dropped where the env sets the same setting; flags (overrides) stay on top.
    merged = dict(file_data)
    for name in Settings.model_fields:
        if "SLUICE_" + name.upper() in os.environ:
            merged.pop(name, None)
    merged.update({k: v for k, v in overrides.items() if v is not None})
    return Settings(**merged)


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "settings"
        parts.append(f"{loc}: {err['msg']}")
    return "invalid settings: " + "; ".join(parts)
