"""Safety for one request: L1 before the response, then a `Guard` that wraps its stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from sluice.api.errors import ApiError
from sluice.serving.runtime import ServingRuntime
from sluice.serving.guarded_stream import Piece, guarded
from sluice.gateway.principal import Principal
from sluice.safety.pipeline import SafetyPipeline
from sluice.safety.verdict import Verdict, log_verdict
from sluice.types import GenerationEvent

L2_INPUT_CHARS = 4000  # the classifier reads the end of the conversation


@dataclass(slots=True)
class Guard:
    rt: ServingRuntime
    safety: SafetyPipeline | None
    input_text: str
    request_id: str

    def pieces(self, events: AsyncIterator[GenerationEvent]) -> AsyncIterator[Piece]:
        return guarded(self.safety, events, self.input_text, self.request_id, self._count)

    async def collect(self, events: AsyncIterator[GenerationEvent]) -> tuple[str, Piece | None]:
        """A non-streaming reply: all released text and the last piece (final or refusal),
        bounded by `request_timeout_s` (504 past it)."""
        parts: list[str] = []
        last: Piece | None = None

        async def run() -> None:
            nonlocal last
            async for piece in self.pieces(events):
                parts.append(piece.text)
                last = piece

        try:
            await asyncio.wait_for(run(), self.rt.settings.request_timeout_s)
        except TimeoutError:
            raise ApiError(504, "the request took longer than the server's request timeout", type="timeout_error") from None
        return "".join(parts), last

    def _count(self, v: Verdict) -> None:
        self.rt.metrics.safety_verdicts.labels(v.layer, v.category).inc()


def check_request_safety(rt: ServingRuntime, principal: Principal, texts: list[str], request_id: str) -> Guard:
    """L1 on the request's system prompt, user turns and tool results: a block is a 400
    `invalid_request_error` (or 403 `permission_error`) with a stable code — never a 529."""
    safety = rt.safety_for(principal)
    if safety is not None:
        verdict = safety.check_input(texts)
        if verdict is not None:
            log_verdict(verdict, request_id)
            rt.metrics.safety_verdicts.labels(verdict.layer, verdict.category).inc()
            action = safety.input_action(verdict)
            if action != "allow":
                status = 403 if action == "block_403" else 400
                raise ApiError(
                    status,
                    f"The request was blocked by the content policy ({verdict.code}).",
                    type="permission_error" if status == 403 else "invalid_request_error",
                    code=verdict.code,
                )
    return Guard(rt, safety, "\n".join(texts)[-L2_INPUT_CHARS:], request_id)
