"""Which model and version serve a request, and its prompt in that version's tokens.

The router plans (model, version — with fallback, pinning and the tenant's quota) before the
request is queued; each version it considers is priced by rendering the conversation with that
version's tokenizer (`cost`), which also checks the request against that version's context
window, so a fallback model with a smaller window refuses what it cannot take. Prompts are
rendered once per tokenizer and reused for retries on another version of the same weights.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Collection
from dataclasses import dataclass, field

from sluice.errors import InvalidRequestError
from sluice.models.tokenizer import Tokenizer
from sluice.routing.dispatch.router import PlanRequest, RoutePlan
from sluice.routing.dispatch.version_router import sticky_key
from sluice.routing.errors import (
    ModelUnavailableError,
    PinNotAllowedError,
    QuotaExceededError,
    UnknownModelError,
    UnknownVersionError,
)
from sluice.routing.fleet.fleet import Fleet
from sluice.serving.errors import ErrorKind, ServingError, invalid
from sluice.serving.guided import guided_for, resolve_tool_format
from sluice.serving.prompt import BuiltPrompt, build_prompt
from sluice.serving.request import ServingRequest
from sluice.trace_context import tracer
from sluice.types import GenerationRequest, SamplingParams


@dataclass(slots=True)
class Priced:
    prompt: BuiltPrompt
    generation: GenerationRequest


@dataclass
class Planner:
    fleet: Fleet
    request: ServingRequest
    _priced: dict[int, Priced] = field(default_factory=dict)  # id(tokenizer) -> priced request
    # the latest plan: a retry that found no worker left in its version is planned again
    # (another version, a fallback), and a response whose headers are not sent yet names that
    current: RoutePlan | None = None

    def plan_request(self, exclude: Collection[str] = ()) -> PlanRequest:
        r, p = self.request, self.request.principal
        key = sticky_key(p.tenant, user_id=r.affinity_user, api_key_id=p.key_id or None) or r.request_id
        return PlanRequest(r.model, p.tenant, p.tier, key, r.pin, exclude)

    async def plan(self, exclude: Collection[str] = ()) -> tuple[RoutePlan, Priced]:
        with tracer().start_as_current_span("routing.plan") as span:
            span.set_attribute("sluice.model.requested", self.request.model)
            plan, priced = await self._plan(exclude)
            span.set_attribute("sluice.model", plan.model_id)
            span.set_attribute("sluice.version", plan.version_header)
            if plan.fallback_from is not None:
                span.set_attribute("sluice.fallback_from", plan.fallback_from)
                span.set_attribute(
                    "sluice.fallback_reason", str(plan.fallback_reason.value if plan.fallback_reason else "")
                )
            span.set_attribute("sluice.prompt_tokens", len(priced.prompt.token_ids))
            return plan, priced

    async def _plan(self, exclude: Collection[str]) -> tuple[RoutePlan, Priced]:
        try:
            plan = await self.fleet.router.plan(self.plan_request(exclude), self.cost)
        except UnknownModelError as exc:
            raise ServingError(
                ErrorKind.NOT_FOUND, f"model: {self.request.model}", code="model_not_found", param="model"
            ) from exc
        except UnknownVersionError as exc:
            raise ServingError(ErrorKind.NOT_FOUND, str(exc), param="sluice-model-version") from None
        except PinNotAllowedError as exc:
            raise ServingError(ErrorKind.PERMISSION, str(exc), param="sluice-model-version") from None
        except QuotaExceededError as exc:
            raise ServingError(ErrorKind.RATE_LIMITED, str(exc), retry_after_s=exc.retry_after_s) from None
        except ModelUnavailableError as exc:
            raise ServingError(ErrorKind.OVERLOADED, str(exc), retry_after_s=2) from None
        self.current = plan
        priced = self._priced[id(self.fleet.version(plan.model_id, plan.version).tokenizer)]
        # a LoRA adapter version shares its base's tokenizer (so its priced prompt), not its adapter
        adapter = self.fleet.adapter_ref(plan.model_id, plan.version)
        if adapter != priced.generation.adapter:
            priced = Priced(priced.prompt, dataclasses.replace(priced.generation, adapter=adapter))
        return plan, priced

    async def replan(self, old: RoutePlan, tried: set[str]) -> tuple[RoutePlan, GenerationRequest]:
        """A retry that found no worker left in its version: plan again without the tried
        workers (the old plan's quota reservation is returned)."""
        await self.fleet.router.settle(old, 0)
        try:
            plan, priced = await self.plan(tried)
        except ServingError as exc:
            raise ModelUnavailableError(exc.message) from None
        return plan, priced.generation

    async def cost(self, model_id: str, version: str) -> int:
        """Render the request for this version (once per tokenizer) and check it fits; returns
        what it would cost there: prompt + max_tokens."""
        runtime = self.fleet.version(model_id, version)
        priced = self._priced.get(id(runtime.tokenizer))
        if priced is None:
            priced = await self._price(runtime.tokenizer, self.fleet.max_model_len(model_id, version))
            self._priced[id(runtime.tokenizer)] = priced
        return priced.generation.token_cost

    async def _price(self, tokenizer: Tokenizer, window: int) -> Priced:
        req = self.request
        left = req.budget.left  # the client's max_tokens, less what earlier rounds of the reply spent
        if left is not None and left > window - 1:  # the prompt takes >= 1 token
            raise invalid(
                f"max_tokens: {left} > {window - 1}, which is the maximum allowed number of output "
                f"tokens for {req.model}",
                param="max_tokens",
            )
        fmt = resolve_tool_format(self.fleet.settings.tool_format)
        prompt = (
            await asyncio.to_thread(_raw_prompt, req.raw_prompt, tokenizer)
            if req.raw_prompt is not None
            else (await asyncio.to_thread(build_prompt, req.conversation, tokenizer, fmt))
        )
        n = len(prompt.token_ids)
        if n >= window:
            raise invalid(f"prompt is too long: {n} tokens > {window - 1} maximum")
        # None: the rest of the context window; 0 (prefill only): compute the prompt, one token
        max_tokens = window - n if left is None else max(1, left)
        # the grammar is checked in full here (off the loop: a large schema compiles for a while)
        guided = await asyncio.to_thread(guided_for, req.conversation, req.tool_choice, req.output_format, fmt)
        sampling = SamplingParams.of(req.sampling, max_tokens=max_tokens, guided=guided)
        try:
            sampling.validate()  # what the engine would refuse later, refused now (before any stream)
        except InvalidRequestError as exc:
            raise invalid(str(exc)) from None
        gen = GenerationRequest(
            request_id=req.request_id,
            prompt_token_ids=prompt.token_ids,
            sampling=sampling,
            priority=req.principal.priority,
            tenant=req.principal.tenant,
        )
        return Priced(prompt, gen)


def _raw_prompt(raw: str | list[int], tokenizer: Tokenizer) -> BuiltPrompt:
    """A legacy completions prompt: text tokenized without a chat template, or token ids as
    given (checked against the vocabulary here, before anything is queued)."""
    ids = tokenizer.encode(raw) if isinstance(raw, str) else list(raw)
    if not ids:
        raise invalid("prompt: the prompt is empty: it must contain at least one token", param="prompt")
    bad = next((t for t in ids if not 0 <= t < tokenizer.vocab_size), None)
    if bad is not None:
        raise invalid(f"prompt: token id {bad} is outside the vocabulary (size {tokenizer.vocab_size})", param="prompt")
    return BuiltPrompt(ids, None)
