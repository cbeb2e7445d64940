"""The body of `POST /v1/messages/batches`: here, apart from the routes, so the OpenAPI document
(api/openapi_doc.py) can list it without importing the routes that import the document."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MAX_REQUESTS = 100_000  # Anthropic's limit per batch


class BatchItem(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    custom_id: str
    params: dict[str, Any]


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    requests: list[BatchItem] = Field(min_length=1, max_length=MAX_REQUESTS)
