"""The fleet file's `[search]` table: the search service a fleet attaches (docs/FLEET.md).

A Messages request that declares the search server tool has its calls run by the gateway
against this service's `POST /v1/search` (docs/SEARCH.md "The Messages API search tool"). The
key is never written in the file: `api_key_env` names the environment variable that holds it
(the fleet file is shown by admin tools and copied into config maps), and every search uses
that key, never a client's. Without the table, a request declaring the tool is a 400.
"""

from __future__ import annotations

import os
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"


class SearchServiceSpec(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    url: str = Field(min_length=1)  # the search router's base URL, e.g. http://search:8500
    api_key_env: str | None = Field(None, pattern=ENV_NAME)  # None: the service is open (no key sent)
    timeout_s: float = Field(5.0, gt=0, le=60)  # one search, connect to answer; past it: `unavailable`
    top_k: int = Field(5, ge=1, le=50)  # hits per search fed to the model
    max_uses: int = Field(5, ge=1, le=20)  # searches per request (a request's own max_uses may only lower it)
    mode: Literal["lexical", "dense", "hybrid"] = (
        "hybrid"  # how the service ranks (hybrid: bench/search/search_dense_quality.py's winner)
    )
    max_result_chars: int = Field(
        500, ge=100, le=100_000
    )  # per hit, the snippet the model reads (at most 2,000: the search API's bound)

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{v!r} is not an http(s)://HOST[:PORT] URL")
        if parts.query or parts.fragment:
            raise ValueError(f"{v!r}: give the service's base URL, without a query or fragment")
        return v.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _key_is_set(cls, v: str | None) -> str | None:
        if v is not None and not os.environ.get(v, "").strip():
            raise ValueError(f"environment variable {v} (the search service's key) is not set")
        return v

    def api_key(self) -> str | None:
        """The key, read when a search runs (a rotated key needs no reload)."""
        if self.api_key_env is None:
            return None
        return os.environ.get(self.api_key_env, "").strip() or None
