"""Errors every layer may raise. The API layer maps them onto wire error shapes.

Each carries a short, user-safe message that names the problem; none wraps a stack trace.
"""

from __future__ import annotations


class SluiceError(Exception):
    """Base class for errors sluice raises on purpose."""


class InvalidRequestError(SluiceError):
    """The request itself is wrong (empty prompt, too long, bad sampling values)."""


class ModelLoadError(SluiceError):
    """A model path is missing, unreadable, corrupt or of an unsupported architecture."""


class EngineDeadError(SluiceError):
    """The engine loop stopped; no further requests can be served by it."""


class EngineUnavailableError(SluiceError):
    """No engine could take the request (worker unreachable, not ready, or shut down)."""


class EngineRefusedError(EngineUnavailableError):
    """The worker is up and answered, but refused this request (an injected fault): retried
    elsewhere and counted by its breaker, but no sign that the worker is gone."""


class EngineTimeoutError(EngineUnavailableError):
    """A call's deadline passed with no answer: the engine is slow or hung, not known to be gone
    (the health probes judge that; a refused or broken call marks its worker down at once)."""


class ContextWindowExceededError(InvalidRequestError):
    """The prompt (plus room for at least one output token) does not fit the context window."""


class AdapterError(InvalidRequestError):
    """A LoRA adapter cannot be served: its folder is missing, damaged (bad JSON, a truncated
    or missing safetensors file) or does not fit the base model (shapes, target modules, rank)."""
