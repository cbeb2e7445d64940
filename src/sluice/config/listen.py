"""Settings: where the server listens and the keys that guard it."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr, field_validator


class ListenSection(BaseModel):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_key: SecretStr | None = None  # single-key mode; unset = open (binds 127.0.0.1 only)
    admin_key: SecretStr | None = None  # guards the admin API (/admin/*); unset = no admin API

    @field_validator("api_key", "admin_key")
    @classmethod
    def _key_not_blank(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and not v.get_secret_value().strip():
            return None
        return v
