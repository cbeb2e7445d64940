"""Fault injection for a worker — a testing aid, off by default, never for production.

Failover, partial batch failure and automatic rollback are only trustworthy if they are tested,
and killing processes at the right moment from a test is timing-dependent. A worker started with
`--fault-injection SPEC` (or `SLUICE_FAULT_INJECTION`) misbehaves deterministically instead.
SPEC is a comma-separated list of (parsed by common/fault_spec.py):

    fail_seed=N            a step containing a request with sampling seed N raises in the engine:
                           that request fails alone (FinishReason.ERROR), its batch goes on
    exit_after_tokens=N    the process exits (code 137, like SIGKILL) as soon as it has sent N
                           output tokens in total: a crash mid-stream, at a known point
    fail_all               every generation request fails before any output (UNAVAILABLE):
                           a broken version (the router retries elsewhere; a rollout rolls back)
    delay_first_token_s=S  every request waits S seconds before its first output: a slow version
    step_delay_s=S         every engine step sleeps S seconds first: a slow accelerator, so a
                           stream provably lasts long enough to be interrupted (drain tests)
    load_delay_s=S         the model load waits S seconds first (the worker listens and reports
                           "loading" meanwhile): a slow load, observable however fast the machine

Warm-up requests (worker/warmup.py: sent by the gateway before a worker takes traffic) are
exempt from the request faults, so a faulty worker still becomes ready and the fault hits real
traffic.

The faults are installed once, at start-up, and only when the spec names them: the engine's
runner is wrapped (`install_on_engine`: fail_seed, step_delay_s) and the servicer holds a
`RequestFaults` that wraps each request's batches (fail_all, delay_first_token_s,
exit_after_tokens). Without a spec the engine carries no fault code and the servicer's request
path meets one `is None` per request: no parsing, no per-step or per-batch work.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import grpc

from sluice.common.fault_spec import FaultGrammar, FaultKind
from sluice.types import GenerationEvent
from sluice.worker.status_codes import REFUSED_TRAILERS, RequestFailed
from sluice.worker.warmup import is_warmup

if TYPE_CHECKING:
    from sluice.engine.engine import LLMEngine
    from sluice.engine.request import Request
    from sluice.engine.scheduler import SchedulerOutput

    # the runner's execute (engine/runner.py): one step's scheduled chunks -> (request, token) pairs
    Execute = Callable[[SchedulerOutput], list[tuple[Request, int]]]

log = logging.getLogger("sluice.worker")

GRAMMAR = FaultGrammar(
    "fault injection",
    "=",
    (
        FaultKind("fail_seed", "fail_seed=N", (int,)),
        FaultKind("exit_after_tokens", "exit_after_tokens=N", (int,)),
        FaultKind("fail_all", "fail_all"),
        FaultKind("delay_first_token_s", "delay_first_token_s=S", (float,)),
        FaultKind("step_delay_s", "step_delay_s=S", (float,)),
        FaultKind("load_delay_s", "load_delay_s=S", (float,)),
    ),
)


@dataclass(slots=True, frozen=True)
class FaultSpec:
    fail_seed: int | None = None
    exit_after_tokens: int | None = None
    fail_all: bool = False
    delay_first_token_s: float = 0.0
    step_delay_s: float = 0.0
    load_delay_s: float = 0.0

    @property
    def active(self) -> bool:
        return self != FaultSpec()

    @classmethod
    def parse(cls, spec: str | None) -> FaultSpec:
        """Raises ValueError naming the bad item."""
        return cls(**{f.name: f.args[0] if f.args else True for f in GRAMMAR.parse(spec)})

    @staticmethod
    def exempt(request_id: str) -> bool:
        return is_warmup(request_id)

    def request_faults(self) -> RequestFaults | None:
        """What the servicer installs: None unless the spec names a request fault."""
        if self.fail_all or self.delay_first_token_s or self.exit_after_tokens is not None:
            return RequestFaults(self)
        return None

    def install_on_engine(self, engine: LLMEngine) -> None:
        """Wrap the engine's runner for fail_seed and step_delay_s (once, as it is built)."""
        execute: Execute = engine.runner.execute
        if self.fail_seed is not None:
            execute = _failing_on_seed(execute, self.fail_seed)
        if self.step_delay_s:
            execute = _slowed(execute, self.step_delay_s)
        # replacing the method is the point; mypy types the target as the unbound method (self first)
        engine.runner.execute = execute  # type: ignore[method-assign,assignment]

    def __str__(self) -> str:
        return ",".join(
            f.name if v is True else f"{f.name}={v}" for f in fields(self) if (v := getattr(self, f.name)) != f.default
        )


def _failing_on_seed(execute: Execute, seed: int) -> Execute:
    def step(out: SchedulerOutput) -> list[tuple[Request, int]]:
        if any(c.request.seed == seed for c in out.chunks):
            raise RuntimeError(f"injected fault (fail_seed={seed})")
        return execute(out)

    return step


def _slowed(execute: Execute, delay_s: float) -> Execute:
    def step(out: SchedulerOutput) -> list[tuple[Request, int]]:
        time.sleep(delay_s)  # on the engine thread: a slow accelerator
        return execute(out)

    return step


class RequestFaults:
    """The request faults of a spec, around each request's engine batches (grpc_server.py)."""

    def __init__(self, spec: FaultSpec) -> None:
        self.spec = spec
        self.tokens_sent = 0  # output tokens sent, all requests (for exit_after_tokens)

    async def around(
        self, request_id: str, batches: AsyncIterator[list[GenerationEvent]]
    ) -> AsyncIterator[list[GenerationEvent]]:
        spec = self.spec
        if FaultSpec.exempt(request_id):
            async for batch in batches:
                yield batch
            return
        if spec.fail_all:
            raise RequestFailed(grpc.StatusCode.UNAVAILABLE, "injected fault: fail_all", REFUSED_TRAILERS)
        if spec.delay_first_token_s:
            await asyncio.sleep(spec.delay_first_token_s)
        async for batch in batches:
            yield batch
            if spec.exit_after_tokens is not None:
                self.tokens_sent += sum(len(e.token_ids) for e in batch)
                if self.tokens_sent >= spec.exit_after_tokens:
                    log.error("injected fault: exiting after %d output tokens", self.tokens_sent)
                    await asyncio.sleep(0.05)  # let the last message leave
                    os._exit(137)
