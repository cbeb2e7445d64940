"""Several generations answered as one reply: OpenAI's `n` choices, and a legacy completions
request's list of prompts (each prompt × n).

All of them are started together, so they reach the engine together: a choice of the same
prompt finds the prompt's KV blocks in the prefix cache (a block is shared as soon as the first
request scheduling it has it allocated, engine/kv_manager.py), and the prompt is computed once.
Each choice draws with its own seed, derived from the request's seed (choice 0 keeps it, so
`n: 1` answers exactly as before). Every choice passes the gateway on its own: rate limits and
quotas count what is really generated.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator
from contextlib import aclosing

from anyio import CancelScope

from sluice.serving.admission import Disconnected
from sluice.serving.outcomes import Outcome
from sluice.serving.output_budget import OutputBudget
from sluice.serving.pipeline import Generation, ServingPipeline
from sluice.serving.request import ServingRequest
from sluice.types import INT64_MAX

_MASK64 = (1 << 64) - 1


def choice_seed(seed: int | None, index: int) -> int | None:
    """Choice `index`'s seed: the request's for choice 0, a splitmix64 step away for the others
    (decorrelated, reproducible, a signed 64-bit value); None stays None (the engine draws)."""
    if seed is None or index == 0:
        return seed
    z = (seed + index * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & INT64_MAX


def per_choice(req: ServingRequest, n: int, first_index: int = 0) -> list[ServingRequest]:
    """`n` copies of `req`, one per choice: their own request id, seed, coalescing key (two
    choices must never be merged into one generation) and output budget (each choice spends
    its own max_tokens)."""
    if n == 1 and first_index == 0:
        return [req]
    out = []
    for i in range(n):
        index = first_index + i
        out.append(
            dataclasses.replace(
                req,
                request_id=f"{req.request_id}-{index}",
                sampling=dataclasses.replace(req.sampling, seed=choice_seed(req.sampling.seed, i)),
                dedup_body=None if req.dedup_body is None else {**req.dedup_body, "_choice": index},
                budget=OutputBudget(req.budget.limit),
            )
        )
    return out


async def start_all(
    pipeline: ServingPipeline, reqs: list[ServingRequest], wait_s: float | None, disconnected: Disconnected | None
) -> list[Generation]:
    """Start every request at once; if one is refused, the others are closed and its error raised."""
    results = await asyncio.gather(*(pipeline.start(r, wait_s, disconnected) for r in reqs), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        with CancelScope(shield=True):
            for r in results:
                if isinstance(r, Generation):
                    await r.close()
        raise errors[0]
    return results  # type: ignore[return-value]


_DONE = object()


async def merged(gens: list[Generation]) -> AsyncGenerator[tuple[int, Outcome], None]:
    """Every generation's outcomes, tagged with its index, in the order they come; each
    generation's own order is kept. Leaving early closes them all."""
    if len(gens) == 1:
        async with aclosing(gens[0].outcomes()) as outcomes:
            async for outcome in outcomes:
                yield 0, outcome
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, gen: Generation) -> None:
        try:
            async with aclosing(gen.outcomes()) as outcomes:
                async for outcome in outcomes:
                    await queue.put((i, outcome))
        finally:
            await queue.put((i, _DONE))

    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens)]
    running = len(tasks)
    try:
        while running:
            i, outcome = await queue.get()
            if outcome is _DONE:
                running -= 1
                continue
            yield i, outcome
    finally:
        for t in tasks:
            t.cancel()
        with CancelScope(shield=True):
            await asyncio.gather(*tasks, return_exceptions=True)
            for g in gens:
                await g.close()
