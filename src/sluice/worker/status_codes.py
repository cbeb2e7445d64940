"""sluice errors ⇄ gRPC status codes (one place, both directions).

INVALID_ARGUMENT carries every InvalidRequestError; a trailing-metadata key says which subclass,
so the client re-raises ContextWindowExceededError (the API answers it differently) without
parsing messages. Everything that means "no engine to serve this" maps to
EngineUnavailableError on the client. Torch-free, so a gateway-only process can import it.
"""

from __future__ import annotations

import grpc

from sluice.errors import (
    AdapterError,
    ContextWindowExceededError,
    EngineRefusedError,
    EngineTimeoutError,
    EngineUnavailableError,
    InvalidRequestError,
    SluiceError,
)

ERROR_KIND_KEY = "sluice-error-kind"
CONTEXT_WINDOW = "context_window"
ADAPTER = "adapter"  # a LoRA adapter that cannot be served (AdapterError)
# UNAVAILABLE for this request only: the worker is up (a failed call without it — refused
# connection, broken stream, a worker not ready or draining — says the worker cannot serve now)
REQUEST_REFUSED = "request_refused"
REFUSED_TRAILERS = ((ERROR_KIND_KEY, REQUEST_REFUSED),)


class RequestFailed(Exception):
    """A worker's answer to one request that failed: the status a Generate call ends with, or a
    Stream call's RequestStatus for that request."""

    def __init__(self, code: grpc.StatusCode, details: str, trailers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(details)
        self.code, self.details, self.trailers = code, details, trailers

    @property
    def kind(self) -> str:
        """The sluice-error-kind trailer's value, or ""."""
        return dict(self.trailers).get(ERROR_KIND_KEY, "")


def status_for(exc: SluiceError) -> tuple[grpc.StatusCode, tuple[tuple[str, str], ...]]:
    """The status code and trailing metadata the server answers `exc` with."""
    if isinstance(exc, ContextWindowExceededError):
        return grpc.StatusCode.INVALID_ARGUMENT, ((ERROR_KIND_KEY, CONTEXT_WINDOW),)
    if isinstance(exc, AdapterError):
        return grpc.StatusCode.INVALID_ARGUMENT, ((ERROR_KIND_KEY, ADAPTER),)
    if isinstance(exc, InvalidRequestError):
        return grpc.StatusCode.INVALID_ARGUMENT, ()
    return grpc.StatusCode.UNAVAILABLE, ()


# grpc.StatusCode by its wire number (a Stream call's per-request status carries the number)
_CODES = {c.value[0]: c for c in grpc.StatusCode}


def error_from(exc: grpc.aio.AioRpcError) -> SluiceError:
    """The sluice error a client raises for a failed call."""
    kind = dict(exc.trailing_metadata() or ()).get(ERROR_KIND_KEY, "")
    return error_for(exc.code(), exc.details() or "", str(kind))


def error_for(code: grpc.StatusCode | int, details: str, kind: str = "") -> SluiceError:
    """The sluice error for a failed request's status: a call's, or one request's of a Stream
    call (`code` as its number; `kind`: the sluice-error-kind trailer's value, or "")."""
    if isinstance(code, int):
        code = _CODES.get(code, grpc.StatusCode.UNKNOWN)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        if kind == CONTEXT_WINDOW:
            return ContextWindowExceededError(details or "prompt is too long")
        if kind == ADAPTER:
            return AdapterError(details or "the LoRA adapter cannot be served")
        return InvalidRequestError(details or "invalid request")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return EngineTimeoutError("the engine did not finish before the deadline")
    if kind == REQUEST_REFUSED:
        return EngineRefusedError(f"worker refused the request ({details})")
    return EngineUnavailableError(f"worker unavailable ({code.name}: {details})")
