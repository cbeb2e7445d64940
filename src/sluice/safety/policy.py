"""The safety policy: categories of banned content, actions, classifier settings (a TOML file).

A policy is data only; `PatternSet` compiles it and `SafetyPipeline` runs it. A deployment may
hold several: the serving runtime maps tiers to policy files (`safety_tier_policies`).
"""

from __future__ import annotations

import enum
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from sluice.errors import SluiceError
from sluice.safety.multipattern import PatternError, check_regex
from sluice.safety.normalize import Normalized
from sluice.safety.verdict import INPUT_ACTIONS, OUTPUT_ACTIONS, Action


class FailMode(str, enum.Enum):
    """When the classifier cannot answer (saturated, past its deadline, missing)."""

    OPEN = "open"  # allow
    CLOSED = "closed"  # refuse


# svguardian's classes (the classifier a category's threshold applies to)
CLASSIFIER_CLASSES = (
    "prompt_injection",
    "jailbreak",
    "data_exfiltration",
    "pii",
    "social_engineering",
    "harmful_content",
    "model_attack",
    "benign",
)


class PolicyError(SluiceError):
    """The policy file is missing or invalid; the message names the file, key and problem."""


@dataclass(slots=True, frozen=True)
class Category:
    name: str
    literals: tuple[str, ...] = ()  # normalized
    regexes: tuple[str, ...] = ()  # hyperscan syntax, matched on normalized text
    input_action: Action = Action.BLOCK_400
    output_action: Action = Action.REFUSE
    check_output: bool = True
    fail_mode: FailMode = FailMode.OPEN
    classifier_threshold: float | None = None
    classifier_classes: tuple[str, ...] = ()
    description: str = ""


@dataclass(slots=True, frozen=True)
class ClassifierSettings:
    enabled: bool = True
    deadline_ms: float = 30.0  # L2 gates the first content token at most this long
    window_chars: int = 600  # the stream window the periodic L3 check classifies
    check_every_chars: int = 400  # how often (released chars) it runs; 0 = never
    workers: int = 1
    max_pending: int = 32  # beyond this the pool is saturated and fail modes apply


@dataclass(slots=True, frozen=True)
class SafetyPolicy:
    name: str
    categories: tuple[Category, ...]
    classifier: ClassifierSettings = field(default_factory=ClassifierSettings)
    log_text: bool = False  # verdict logs carry offsets and rule ids, never text, unless set

    def category(self, name: str) -> Category | None:
        return next((c for c in self.categories if c.name == name), None)


_CATEGORY_KEYS = {
    "description",
    "literals",
    "regexes",
    "input_action",
    "output_action",
    "check_output",
    "fail_mode",
    "classifier_threshold",
    "classifier_classes",
}


def _strings(where: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PolicyError(f"{where} must be a list of strings")
    return value


def _choice(where: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise PolicyError(f"{where} must be one of {', '.join(allowed)} (got {value!r})")
    return value


def _action(where: str, value: Any, allowed: tuple[Action, ...]) -> Action:
    return Action(_choice(where, value, tuple(a.value for a in allowed)))


def _category(name: str, cname: str, spec: Any) -> Category:
    at = f"{name}: categories.{cname}"
    if not isinstance(spec, dict):
        raise PolicyError(f"{at} must be a table")
    bad = set(spec) - _CATEGORY_KEYS
    if bad:
        raise PolicyError(f"{at}: unknown keys {sorted(bad)}")
    literals = []
    for lit in _strings(f"{at}.literals", spec.get("literals", [])):
        norm = Normalized(lit).text.strip()
        if not norm:
            raise PolicyError(f"{at}.literals: {lit!r} is empty after normalization")
        literals.append(norm)
    regexes = _strings(f"{at}.regexes", spec.get("regexes", []))
    for rx in regexes:
        try:
            check_regex(rx)
        except PatternError as exc:
            raise PolicyError(f"{at}.regexes: {rx!r} does not compile: {exc}") from None
    threshold = spec.get("classifier_threshold")
    if threshold is not None and (not isinstance(threshold, (int, float)) or not 0 < threshold <= 1):
        raise PolicyError(f"{at}.classifier_threshold must be a number in (0, 1]")
    classes = _strings(f"{at}.classifier_classes", spec.get("classifier_classes", []))
    for c in classes:
        _choice(f"{at}.classifier_classes[]", c, CLASSIFIER_CLASSES)
    if threshold is not None and not classes:
        raise PolicyError(f"{at}: classifier_threshold needs classifier_classes")
    check_output = spec.get("check_output", True)
    if not isinstance(check_output, bool):
        raise PolicyError(f"{at}.check_output must be true or false")
    return Category(
        cname,
        tuple(literals),
        tuple(regexes),
        _action(f"{at}.input_action", spec.get("input_action", "block_400"), INPUT_ACTIONS),
        _action(f"{at}.output_action", spec.get("output_action", "refuse"), OUTPUT_ACTIONS),
        check_output,
        FailMode(_choice(f"{at}.fail_mode", spec.get("fail_mode", "open"), tuple(m.value for m in FailMode))),
        None if threshold is None else float(threshold),
        tuple(classes),
        str(spec.get("description", "")),
    )


def parse_policy(data: dict[str, Any], name: str) -> SafetyPolicy:
    unknown = set(data) - {"log_text", "classifier", "categories"}
    if unknown:
        raise PolicyError(f"{name}: unknown keys {sorted(unknown)}")
    cats_spec = data.get("categories") or {}
    if not isinstance(cats_spec, dict):
        raise PolicyError(f"{name}: categories must be a table of tables")
    cats = tuple(_category(name, cname, spec) for cname, spec in cats_spec.items())
    c = data.get("classifier") or {}
    bad = set(c) - set(ClassifierSettings.__dataclass_fields__)
    if bad:
        raise PolicyError(f"{name}: classifier: unknown keys {sorted(bad)}")
    try:
        settings = ClassifierSettings(**c)
    except TypeError as exc:
        raise PolicyError(f"{name}: classifier: {exc}") from None
    if not isinstance(data.get("log_text", False), bool):
        raise PolicyError(f"{name}: log_text must be true or false")
    return SafetyPolicy(name, cats, settings, data.get("log_text", False))


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
        name = str(p)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"safety policy {name} is not valid TOML: {exc}") from None
    return parse_policy(data, name)
