"""Errors the search service raises on purpose; the HTTP layers map them to status codes."""

from __future__ import annotations

from sluice.errors import InvalidRequestError, SluiceError


class QuerySyntaxError(InvalidRequestError):
    """A query that does not parse; `position` is the 0-based character offset of the problem."""

    def __init__(self, position: int, message: str):
        super().__init__(f"query syntax error at position {position}: {message}")
        self.position = position
        self.reason = message


class DocumentError(InvalidRequestError):
    """A document that cannot be indexed (no id, a bad field name, too large)."""


class SearchConfigError(SluiceError):
    """A search config file with problems; each reads `FILE:LINE: field: problem`."""

    def __init__(self, problems: list[str]):
        super().__init__("invalid search config:\n  " + "\n  ".join(problems))
        self.problems = problems


class ShardUnavailableError(SluiceError):
    """No replica of a shard answered within its deadline."""
