"""Failover's mid-stream migration over a real router and pool, with scripted workers: a stream
whose worker is lost while no other worker can take it yet waits (bounded) for one and goes on
with no gap or repeat; past the wait it ends with a clear error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

import pytest

from sluice.errors import EngineTimeoutError, EngineUnavailableError
from sluice.routing.dispatch.circuit_breaker import BreakerConfig
from sluice.routing.dispatch.failover import FailoverPolicy, generate_on_fleet
from sluice.routing.dispatch.health_poller import WorkerHandle
from sluice.routing.dispatch.router import FleetRouter, PlanRequest
from sluice.routing.dispatch.worker_pool import WorkerPool, WorkerStatus
from sluice.routing.fleet_file.loader import parse_fleet
from sluice.routing.fleet_file.registry import Registry
from sluice.routing.state.routing_state import RoutingSnapshot
from sluice.types import FinishReason, GenerationEvent, GenerationRequest, SamplingParams, Usage
from tests.fake_engine import FakeEngine

FLEET = """\
[models.main.versions.v1]
weights = "bundled"
traffic = 100
workers = ["h:1", "h:2"]
"""
OUTPUT = list(range(100, 110))


class Scripted(FakeEngine):
    """A worker that streams OUTPUT from where the request resumes; `lose_after` tokens in, it
    is lost (the connection breaks), and `lost` is set. The rest of the engine client is
    FakeEngine's (failover calls only `generate`)."""

    def __init__(self, lose_after: int | None = None, error: Exception | None = None) -> None:
        super().__init__()
        self.lose_after = lose_after
        self.error = error or EngineUnavailableError("connection lost")
        self.lost = asyncio.Event()

    async def generate(
        self, request: GenerationRequest, trace_metadata: Sequence[tuple[str, str]] = ()
    ) -> AsyncGenerator[GenerationEvent, None]:
        self.requests.append(request)
        start = len(request.resumed_output_ids)
        for i in range(start, len(OUTPUT)):
            if self.lose_after is not None and i == self.lose_after:
                self.lost.set()
                raise self.error
            last = i == len(OUTPUT) - 1
            yield GenerationEvent(
                request.request_id,
                f"<{OUTPUT[i]}>",
                [OUTPUT[i]],
                finished=last,
                finish_reason=FinishReason.LENGTH if last else None,
                usage=Usage(4, i + 1, 0),
            )
            await asyncio.sleep(0)


def setup(second_status: WorkerStatus, error: Exception | None = None):
    registry = Registry(parse_fleet(FLEET))
    pool = WorkerPool(BreakerConfig(consecutive_failures=5, cooldown_s=5))
    first, second = Scripted(lose_after=4, error=error), Scripted()
    handles = {}
    for wid, client, status in (("h:1", first, WorkerStatus.WARM), ("h:2", second, second_status)):
        pool.add(wid, "main", "v1", wid, status=status)
        handles[wid] = WorkerHandle(wid, "main", "v1", wid, client)
    router = FleetRouter(registry, pool, None, lambda: RoutingSnapshot())
    return router, pool, handles, first, second


async def collect(router, handles, policy) -> list[int]:
    async def cost(model_id: str, version: str) -> int:
        return 20

    plan = await router.plan(PlanRequest("main", "acme", "standard", "k"), cost)
    request = GenerationRequest("r1", [1, 2, 3, 4], SamplingParams(max_tokens=len(OUTPUT), temperature=0))

    async def replan(plan, tried):
        raise AssertionError("a migrated stream never changes version")

    tokens: list[int] = []
    async for event in generate_on_fleet(router, handles, plan, request, replan, policy):
        tokens += event.token_ids
    return tokens


@pytest.mark.asyncio
async def test_a_lost_stream_waits_for_a_worker_that_can_continue_it():
    router, pool, handles, first, second = setup(WorkerStatus.STARTING)  # h:2 not ready yet

    async def second_becomes_ready():
        await first.lost.wait()
        await asyncio.sleep(0.05)  # the stream is waiting now: nothing could take it
        pool.set_status("h:2", WorkerStatus.WARM)

    ready = asyncio.create_task(second_becomes_ready())
    tokens = await asyncio.wait_for(collect(router, handles, FailoverPolicy(migration_wait_s=120)), 120)
    await ready
    assert tokens == OUTPUT  # no gap, no repeat
    assert second.requests[0].resumed_output_ids == OUTPUT[:4]


@pytest.mark.asyncio
async def test_past_the_wait_the_stream_ends_with_a_clear_error():
    router, pool, handles, first, second = setup(WorkerStatus.STARTING)  # h:2 never becomes ready

    async def first_goes_down():  # as the health poller takes a lost worker out of routing
        await first.lost.wait()
        pool.set_status("h:1", WorkerStatus.STARTING)

    down = asyncio.create_task(first_goes_down())
    with pytest.raises(EngineUnavailableError, match="could continue the request within 0.3 s"):
        await collect(router, handles, FailoverPolicy(migration_wait_s=0.3))
    await down
    assert not second.requests


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "error, down",
    [
        (EngineUnavailableError("connection refused"), True),
        (EngineTimeoutError("no answer before the deadline"), False),
    ],
)
async def test_a_broken_call_takes_its_worker_out_of_routing_at_once_a_timeout_does_not(error, down):
    router, pool, handles, first, second = setup(WorkerStatus.WARM, error)
    tokens = await asyncio.wait_for(collect(router, handles, FailoverPolicy(migration_wait_s=120)), 120)
    assert tokens == OUTPUT  # continued on h:2
    # no health probe ran: the failed call itself is the evidence (a slow call is the probes' to judge)
    assert pool.get("h:1").status is (WorkerStatus.STARTING if down else WorkerStatus.WARM)
    assert handles["h:1"].warmed is False


@pytest.mark.asyncio
async def test_a_lost_stream_continues_on_its_worker_as_soon_as_it_is_back_up():
    """The only worker is lost and comes back (a restart at the same address: the poller warms
    it again): the stream goes on there at once, long before half of migration_wait_s."""
    router, pool, handles, first, second = setup(WorkerStatus.STOPPED)  # h:2 is gone: h:1 is all there is

    async def first_restarts():
        await first.lost.wait()
        await asyncio.sleep(0.05)  # the stream is waiting now: nothing could take it
        assert pool.get("h:1").status is WorkerStatus.STARTING  # taken down by the failed call
        first.lose_after = None  # the new process serves
        pool.set_status("h:1", WorkerStatus.WARM)  # as the health poller does after its warm-up

    back = asyncio.create_task(first_restarts())
    # half the wait is 300 s: done within 60 means the worker's return moved it, not the timer
    tokens = await asyncio.wait_for(collect(router, handles, FailoverPolicy(migration_wait_s=600)), 60)
    await back
    assert tokens == OUTPUT
    assert first.requests[1].resumed_output_ids == OUTPUT[:4]
    assert not second.requests
