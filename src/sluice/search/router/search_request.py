"""The body of POST /v1/search: its model and bounds, in one place.

app.py's route validates with the model; fast_http/search_path.py checks the same bounds by hand
(it answers the well-formed case without FastAPI) and imports them from here.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MAX_QUERY_CHARS = 2048
DEFAULT_TOP_K = 10
MIN_TOP_K = 0  # the upper bound is the config's search.max_top_k


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str = Field(..., description="Query text (docs/SEARCH.md: words, \"phrases\", +must -not, AND/OR/NOT, "
                                        "field:word)", max_length=MAX_QUERY_CHARS)
    top_k: int = Field(DEFAULT_TOP_K, ge=MIN_TOP_K, description="How many hits (at most the configured max_top_k)")


SEARCH_FIELDS = frozenset(SearchRequest.model_fields)  # extra="forbid": any other key is an error
