"""L1, the input rules, before any response starts: a block is a 400 `invalid_request_error` (or
403 `permission_error`, per category) with a stable code — never a 529, never in-stream."""

from __future__ import annotations

from sluice.gateway.principal import Principal
from sluice.safety.pipeline import SafetyPipeline
from sluice.safety.verdict import Action
from sluice.safety.verdict_log import log_verdict
from sluice.serving.errors import ErrorKind, ServingError
from sluice.serving.runtime import ServingRuntime
from sluice.trace_context import tracer


def check_input(rt: ServingRuntime, principal: Principal, texts: list[str], request_id: str) -> SafetyPipeline | None:
    """Run L1 on the system prompt, user turns and tool results; returns the tier's safety
    pipeline (None when safety is off) for the stream layers."""
    safety = rt.safety_for(principal)
    if safety is None:
        return None
    with tracer().start_as_current_span("safety.input") as span:
        verdict = safety.check_input(texts)
        span.set_attribute("sluice.safety.blocked", verdict is not None)
    if verdict is None:
        return safety
    log_verdict(verdict, request_id)
    rt.metrics.safety_verdicts.labels(verdict.layer.value, verdict.category).inc()
    action = safety.input_action(verdict)
    if action is Action.ALLOW:
        return safety
    kind = ErrorKind.PERMISSION if action is Action.BLOCK_403 else ErrorKind.INVALID_REQUEST
    raise ServingError(kind, f"The request was blocked by the content policy ({verdict.code}).", code=verdict.code)
