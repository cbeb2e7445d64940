"""sluice errors ⇄ gRPC status codes (one place, both directions).

INVALID_ARGUMENT carries every InvalidRequestError; a trailing-metadata key says which subclass,
so the client re-raises ContextWindowExceededError (the API answers it differently) without
parsing messages. Everything that means "no engine to serve this" maps to
EngineUnavailableError on the client. Torch-free, so a gateway-only process can import it.
"""

from __future__ import annotations

import grpc

from sluice.errors import (
    ContextWindowExceededError,
    EngineRefusedError,
    EngineTimeoutError,
    EngineUnavailableError,
    InvalidRequestError,
    SluiceError,
)

ERROR_KIND_KEY = "sluice-error-kind"
CONTEXT_WINDOW = "context_window"
# UNAVAILABLE for this request only: the worker is up (a failed call without it — refused
# connection, broken stream, a worker not ready or draining — says the worker cannot serve now)
REQUEST_REFUSED = "request_refused"
REFUSED_TRAILERS = ((ERROR_KIND_KEY, REQUEST_REFUSED),)


def status_for(exc: SluiceError) -> tuple[grpc.StatusCode, tuple[tuple[str, str], ...]]:
    """The status code and trailing metadata the server answers `exc` with."""
    if isinstance(exc, ContextWindowExceededError):
        return grpc.StatusCode.INVALID_ARGUMENT, ((ERROR_KIND_KEY, CONTEXT_WINDOW),)
    if isinstance(exc, InvalidRequestError):
        return grpc.StatusCode.INVALID_ARGUMENT, ()
    return grpc.StatusCode.UNAVAILABLE, ()


def error_from(exc: grpc.aio.AioRpcError) -> SluiceError:
    """The sluice error a client raises for a failed call."""
    code = exc.code()
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        kinds = dict(exc.trailing_metadata() or ())
        if kinds.get(ERROR_KIND_KEY) == CONTEXT_WINDOW:
            return ContextWindowExceededError(exc.details() or "prompt is too long")
        return InvalidRequestError(exc.details() or "invalid request")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return EngineTimeoutError("the engine did not finish before the deadline")
    if dict(exc.trailing_metadata() or ()).get(ERROR_KIND_KEY) == REQUEST_REFUSED:
        return EngineRefusedError(f"worker refused the request ({exc.details()})")
    return EngineUnavailableError(f"worker unavailable ({code.name}: {exc.details()})")
