"""Settings: the safety layers' policies (docs/SAFETY.md)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class SafetySection(BaseModel):
    safety: bool = True
    safety_policy: str | None = None  # a policy TOML file; None = the built-in default policy
    safety_tier_policies: dict[str, str] = Field(default_factory=dict)  # tier name -> policy file
