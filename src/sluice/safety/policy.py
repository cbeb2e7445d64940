"""The safety policy: categories of banned content, actions, classifier settings (TOML)."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from sluice.errors import SluiceError
from sluice.safety.normalize import normalize


class PolicyError(SluiceError):
    """The policy file is missing or invalid; the message names the problem."""


@dataclass(slots=True, frozen=True)
class Category:
    name: str
    literals: tuple[str, ...] = ()  # normalized
    regexes: tuple[re.Pattern, ...] = ()
    input_action: str = "block_400"  # block_400 | block_403 | allow
    check_output: bool = True
    fail_mode: str = "open"  # classifier saturated or down: open (allow) | closed (refuse)
    classifier_threshold: float | None = None
    classifier_classes: tuple[str, ...] = ()
    description: str = ""


@dataclass(slots=True, frozen=True)
class ClassifierSettings:
    enabled: bool = True
    deadline_ms: float = 30.0
    window_chars: int = 600
    check_every_chars: int = 400
    workers: int = 1
    max_pending: int = 32


@dataclass(slots=True, frozen=True)
class SafetyPolicy:
    name: str
    categories: tuple[Category, ...]
    classifier: ClassifierSettings = field(default_factory=ClassifierSettings)
    log_text: bool = False


_CATEGORY_KEYS = {"description", "literals", "regexes", "input_action", "check_output", "fail_mode",
                  "classifier_threshold", "classifier_classes"}


def parse_policy(data: dict[str, Any], name: str) -> SafetyPolicy:
    unknown = set(data) - {"log_text", "classifier", "categories"}
    if unknown:
        raise PolicyError(f"{name}: unknown keys {sorted(unknown)}")
    cats = []
    for cname, spec in (data.get("categories") or {}).items():
        bad = set(spec) - _CATEGORY_KEYS
        if bad:
            raise PolicyError(f"{name}: categories.{cname}: unknown keys {sorted(bad)}")
        if spec.get("input_action", "block_400") not in ("block_400", "block_403", "allow"):
            raise PolicyError(f"{name}: categories.{cname}.input_action must be block_400, block_403 or allow")
        if spec.get("fail_mode", "open") not in ("open", "closed"):
            raise PolicyError(f"{name}: categories.{cname}.fail_mode must be open or closed")
        literals = []
        for lit in spec.get("literals", []):
            norm = normalize(lit)[0].strip()
            if not norm:
                raise PolicyError(f"{name}: categories.{cname}: a literal is empty after normalization")
            literals.append(norm)
        regexes = []
        for rx in spec.get("regexes", []):
            try:
                regexes.append(re.compile(rx, re.IGNORECASE))
            except re.error as exc:
                raise PolicyError(f"{name}: categories.{cname}: bad regex {rx!r}: {exc}") from None
        cats.append(Category(cname, tuple(literals), tuple(regexes), spec.get("input_action", "block_400"),
                             bool(spec.get("check_output", True)), spec.get("fail_mode", "open"),
                             spec.get("classifier_threshold"), tuple(spec.get("classifier_classes", ())),
                             spec.get("description", "")))
    c = data.get("classifier") or {}
    bad = set(c) - set(ClassifierSettings.__dataclass_fields__)
    if bad:
        raise PolicyError(f"{name}: classifier: unknown keys {sorted(bad)}")
    return SafetyPolicy(name, tuple(cats), ClassifierSettings(**c), bool(data.get("log_text", False)))


def load_policy(path: str | Path | None = None) -> SafetyPolicy:
    """A policy file, or the built-in default policy when `path` is None."""
    if path is None:
        text = resources.files("sluice.safety").joinpath("default_policy.toml").read_text()
        name = "default"
    else:
        p = Path(path).expanduser()
        try:
            text = p.read_text()
        except OSError as exc:
            raise PolicyError(f"cannot read safety policy {p}: {exc.strerror}") from None
        name = p.name
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"safety policy {name} is not valid TOML: {exc}") from None
    return parse_policy(data, name)
