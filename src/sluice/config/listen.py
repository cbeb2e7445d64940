"""Settings: where the server listens and the keys that guard it."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator

from sluice.config.section import Section


class ListenSection(Section):
    host: str = "127.0.0.1"
    """interface to bind"""
    port: int = Field(8000, ge=0, le=65535)
    """port to listen on; 0 picks a free one"""
    api_key: SecretStr | None = None
    """require this API key (env SLUICE_API_KEY): single-key mode; unset = open, and bound to
    127.0.0.1 only"""
    admin_key: SecretStr | None = None
    """guards the admin API (/admin/*); unset = no admin API"""

    @field_validator("api_key", "admin_key")
    @classmethod
    def _key_not_blank(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and not v.get_secret_value().strip():
            return None
        return v
