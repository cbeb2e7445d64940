"""Errors the routing layer raises. Each names the problem in words a client may read.

They subclass the leaf errors in `sluice.errors`, so a layer that only knows those (the API's
error mapping) already renders them with a sensible status; the suggested status of each is
in its docstring for the wiring that wants to be exact.
"""

from __future__ import annotations

from sluice.errors import EngineUnavailableError, InvalidRequestError, SluiceError


class FleetFileError(SluiceError):
    """A fleet file is unreadable or invalid. `problems` holds one line per fault, each naming
    the file, the line where it could be found, and the field path."""

    def __init__(self, problems: list[str]):
        super().__init__("invalid fleet file:\n  " + "\n  ".join(problems))
        self.problems = problems


class UnknownModelError(InvalidRequestError):
    """The requested model id is neither a model nor an alias (404 not_found_error)."""


class UnknownVersionError(InvalidRequestError):
    """A `sluice-model-version` pin names a version the model does not have (404)."""


class PinNotAllowedError(InvalidRequestError):
    """The caller's tier may not pin a version (403 permission_error)."""


class ModelUnavailableError(EngineUnavailableError):
    """No version of the model, nor of any fallback, can take the request now: no ready
    worker, every circuit open, every queue over its bound (529 overloaded_error)."""


class VersionUnavailableError(ModelUnavailableError):
    """The pinned version exists but cannot take requests now (draining, retired, no ready
    worker) (529; a pin never silently falls back to another version)."""


class QuotaExceededError(SluiceError):
    """The tenant used up a hard token quota for the model (429 rate_limit_error with
    retry-after = seconds until the quota period resets)."""

    def __init__(self, message: str, retry_after_s: float, model_id: str):
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.model_id = model_id


class RolloutError(SluiceError):
    """A rollout cannot start or continue as asked (unknown version, one already running)."""


class StateConflictError(SluiceError):
    """A compare-and-set write to the shared routing state lost to another writer; reread and
    try again."""
