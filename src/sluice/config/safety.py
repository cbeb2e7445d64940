"""Settings: the safety layers' policies (docs/SAFETY.md)."""

from __future__ import annotations

from pydantic import Field

from sluice.config.section import Section


class SafetySection(Section):
    safety: bool = True
    """the input and output safety layers"""
    safety_policy: str | None = None
    """a policy TOML file (default: the built-in policy)"""
    safety_tier_policies: dict[str, str] = Field(default_factory=dict)
    """a tier's name -> its policy file"""
