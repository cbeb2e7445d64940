"""The router's OpenAPI document: models of the bodies, for the document only.

What checks a body is the contract (search/contract.py: `SearchRequest.decode`); these models
describe the same shapes, with the same bounds imported from it, so the document and the
checks cannot drift apart (tests/system/search/test_openapi_fuzz.py holds the router to it).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sluice.search.contract import DEFAULT_SNIPPET_CHARS, DEFAULT_TOP_K, MAX_QUERY_CHARS, MAX_SNIPPET_CHARS, MIN_TOP_K


class SearchRequestModel(BaseModel):
    model_config = ConfigDict(extra="forbid", title="SearchRequest")
    query: str = Field(
        ...,
        description='Query text (docs/SEARCH.md: words, "phrases", +must -not, AND/OR/NOT, '
        "field:word, trailing wildcards word*)",
        max_length=MAX_QUERY_CHARS,
    )
    top_k: int = Field(DEFAULT_TOP_K, ge=MIN_TOP_K, description="How many hits (at most the configured max_top_k)")
    snippet_chars: int = Field(
        DEFAULT_SNIPPET_CHARS,
        ge=0,
        le=MAX_SNIPPET_CHARS,
        description="Each hit's snippet at most this many characters (0: no snippet)",
    )


def search_body_schema(max_top_k: int) -> dict[str, Any]:
    schema = SearchRequestModel.model_json_schema()
    schema["properties"]["top_k"]["maximum"] = max_top_k
    return schema


class ErrorDetail(BaseModel):
    type: str = Field(
        ...,
        description="a SearchErrorKind: invalid_request_error, query_syntax_error, "
        "authentication_error, request_too_large, ...",
    )
    message: str
    position: int | None = Field(None, description="query_syntax_error: the 0-based character offset")


class ErrorResponse(BaseModel):
    error: ErrorDetail


def errors(**described: str) -> dict[int | str, dict[str, Any]]:
    """`s400="why"` → the documented 400 with the error shape."""
    return {
        int(status.removeprefix("s")): {"model": ErrorResponse, "description": text}
        for status, text in described.items()
    }


class SearchHit(BaseModel):
    id: str
    score: float = Field(..., description="rounded to 12 significant digits; hits are ordered by it, then by id")
    fields: dict[str, Any]
    snippet: str = Field(
        ...,
        description="where the query matched: HTML-escaped text, matched words in <b></b>, "
        "at most snippet_chars characters (an escape counts as one, marks not)",
    )


class SearchResponseModel(BaseModel):
    model_config = ConfigDict(title="SearchResponse")
    hits: list[SearchHit]
    shards: int
    shards_answered: int
    partial: bool = Field(..., description="true when a shard missed its deadline or had no replica up")
    failed_shards: dict[str, str] = Field(..., description="shard → timeout | unavailable")
    took_ms: float
    cached: bool


class BulkError(BaseModel):
    line: int
    message: str


class BulkResponse(BaseModel):
    accepted: int
    errors: list[BulkError]
    written: dict[str, int] = Field(..., description="shard → the write-log entry holding this batch")
    failed: dict[str, str] = Field(..., description="shard → why its part was not written")
