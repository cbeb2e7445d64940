"""The serving pipeline on its own: a scripted engine (tests/fake_engine.py), the real gateway,
safety, tokenizer (the tiny test model's) and replay log — no HTTP server, no model."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import pytest

from sluice.config import load_settings
from sluice.errors import EngineUnavailableError
from sluice.gateway.principal import Principal
from sluice.routing.fleet.fleet import Fleet
from sluice.routing.fleet_file.default_fleet import fleet_from_settings
from sluice.routing.fleet_file.registry import Registry
from sluice.serving.admission import ClientGone
from sluice.serving.errors import ErrorKind, ServingError
from sluice.serving.outcomes import Failed, Finished, Refused, TextDelta
from sluice.serving.output_budget import OutputBudget
from sluice.serving.pipeline import ServingPipeline
from sluice.serving.prompt import Conversation, Role, Turn
from sluice.serving.request import Route, ServingRequest
from sluice.serving.runtime import ServingRuntime
from sluice.types import FinishReason, Sampling
from tests.fake_engine import FakeEngine, Script

MODEL = "fake-model"


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    return tiny_llama_dir  # the fleet loads the tiny model's tokenizer from its folder


def make(tiny_dir, script: Script | None = None, **settings):
    """A runtime whose fleet is one version served by the scripted engine (as `--worker inline`)."""

    async def build():
        engine = FakeEngine(script)
        s = load_settings(
            None,
            **{"safety": False, "model": str(tiny_dir), "served_model_name": MODEL, "worker": "inline", **settings},
        )
        fleet = Fleet.build(s, Registry(fleet_from_settings(s)))
        await fleet.start(inline=engine)
        rt = ServingRuntime(s)
        rt.mark_ready(fleet, 4096)
        return rt, engine, ServingPipeline(rt)

    return build()


def request(text: str = "hi", max_tokens: int | None = 8, **kw) -> ServingRequest:
    return ServingRequest(
        request_id=kw.pop("request_id", "msg_1"),
        route=Route.MESSAGES,
        principal=kw.pop("principal", Principal()),
        model=MODEL,
        conversation=Conversation([Turn(Role.USER, [text])]),
        budget=OutputBudget(max_tokens),
        sampling=Sampling(temperature=kw.pop("temperature", 1.0)),
        **kw,
    )


async def drain(gen) -> list:
    async with aclosing(gen.outcomes()) as outcomes:
        return [o async for o in outcomes]


def test_outcomes_are_text_then_one_final(tokenizer):
    async def run():
        rt, engine, pipeline = await make(tokenizer)
        out = await drain(await pipeline.start(request()))
        assert [type(o) for o in out] == [TextDelta, TextDelta, TextDelta, Finished]
        assert "".join(o.text for o in out[:-1]) == "Hello world."
        assert out[-1].reason is FinishReason.EOS and out[-1].usage.output_tokens == 3
        assert rt.gateway.admission.inflight == 0  # the lease is back
        collected = await (await pipeline.start(request(request_id="msg_2"))).collect()
        assert collected.text == "Hello world." and isinstance(collected.final, Finished)

    asyncio.run(run())


@pytest.mark.parametrize(
    "finish, kind", [(FinishReason.ABORT, ErrorKind.OVERLOADED), (FinishReason.ERROR, ErrorKind.INTERNAL)]
)
def test_engine_abort_and_error_are_wire_neutral_failures(tokenizer, finish, kind):
    """One mapping for both wire formats: an engine abort is OVERLOADED (529 everywhere)."""

    async def run():
        _, _, pipeline = await make(tokenizer, Script(texts=["x"], finish=finish))
        out = await drain(await pipeline.start(request()))
        assert isinstance(out[-1], Failed) and out[-1].kind is kind

    asyncio.run(run())


def test_a_vanished_engine_fails_the_stream_and_refuses_the_next_request_before_it_opens(tokenizer):
    async def run():
        rt, engine, pipeline = await make(tokenizer, Script(raise_at=0, error=EngineUnavailableError("gone")))
        out = await drain(await pipeline.start(request()))
        assert isinstance(out[-1], Failed) and out[-1].kind is ErrorKind.OVERLOADED  # its only worker failed it
        engine.up = False
        for _ in range(2):  # the health checks notice: the worker is out of routing
            await rt.fleet.poller.poll_once()
        assert not rt.ready
        with pytest.raises(ServingError) as info:  # refused before any stream opens
            await pipeline.start(request(request_id="msg_2"))
        assert info.value.kind is ErrorKind.OVERLOADED and info.value.retry_after_s

    asyncio.run(run())


def test_closing_the_stream_aborts_the_engine_request_and_settles_everything(tokenizer):
    async def run():
        rt, engine, pipeline = await make(tokenizer, Script(texts=["a"] * 50, hang_at=2))
        gen = await pipeline.start(request())
        outcomes = gen.outcomes()
        first = [await anext(outcomes), await anext(outcomes)]
        assert all(isinstance(o, TextDelta) for o in first)
        assert rt.gateway.admission.inflight == 1
        await outcomes.aclose()  # the client left
        assert engine.aborted == ["msg_1"]
        assert rt.gateway.admission.inflight == 0

    asyncio.run(run())


def test_a_slow_consumer_gets_every_event(tokenizer):
    async def run():
        texts = [f"t{i} " for i in range(200)]
        _, _, pipeline = await make(tokenizer, Script(texts=texts))
        got = []
        async with aclosing((await pipeline.start(request(max_tokens=200))).outcomes()) as outcomes:
            async for o in outcomes:
                got.append(o)
                await asyncio.sleep(0)  # the engine runs ahead meanwhile
        assert "".join(o.text for o in got[:-1]) == "".join(texts) and isinstance(got[-1], Finished)

    asyncio.run(run())


def test_refusals_before_the_stream_are_serving_errors(tokenizer):
    async def run():
        rt, _, pipeline = await make(tokenizer)
        with pytest.raises(ServingError) as info:
            await pipeline.start(request(max_tokens=10_000))
        assert info.value.kind is ErrorKind.INVALID_REQUEST and "max_tokens" in info.value.message
        with pytest.raises(ServingError) as info:
            await pipeline.start(request(text="x" * 2000))  # over the fake's 256-token window
        assert "prompt is too long" in info.value.message
        bad = request()
        bad.sampling = Sampling(top_k=2**31)  # what the worker protocol cannot carry
        with pytest.raises(ServingError, match="top_k"):
            await pipeline.start(bad)
        other = request()
        other.model = "nope"
        with pytest.raises(ServingError) as info:
            await pipeline.start(other)
        assert info.value.kind is ErrorKind.NOT_FOUND
        assert rt.gateway.admission.inflight == 0

    asyncio.run(run())


def test_a_stream_still_queued_is_handed_back_and_then_served(tokenizer):
    """With `wait_s`, a request still queued comes back (so a stream can open and ping) and runs
    when a slot frees; a caller that leaves while waiting leaves the queue."""

    async def run():
        rt, engine, pipeline = await make(tokenizer, Script(texts=["a", "b"], hang_at=1), max_inflight=1)
        first = await pipeline.start(request(request_id="msg_1"))
        it = first.outcomes()
        await anext(it)  # the first holds the only slot
        queued = await pipeline.start(request(request_id="msg_2"), wait_s=0.05)
        assert queued.headers == {"sluice-model-version": f"{MODEL}/default"}  # no rate-limit headers yet
        assert rt.gateway.admission.depth == 1
        gone = asyncio.ensure_future(pipeline.start(request(request_id="msg_3"), disconnected=_true))
        with pytest.raises(ClientGone):
            await gone
        assert rt.gateway.admission.depth == 1  # msg_3 left the queue
        engine.release.set()
        async for _ in it:
            pass
        out = await drain(queued)
        assert isinstance(out[-1], Finished) and "msg_2" in engine.finished

    asyncio.run(run())


async def _true() -> bool:
    return True


def test_a_queue_deadline_that_passes_after_the_stream_opened_is_a_failed_outcome(tokenizer):
    async def run():
        rt, engine, pipeline = await make(tokenizer, Script(texts=["a", "b"], hang_at=1), max_inflight=1)
        holder = (await pipeline.start(request(request_id="msg_1"))).outcomes()
        await anext(holder)
        queued = await pipeline.start(request(request_id="msg_2", queue_timeout_s=0.2), wait_s=0.01)
        out = await drain(queued)
        assert len(out) == 1 and isinstance(out[0], Failed) and out[0].kind is ErrorKind.OVERLOADED
        await holder.aclose()

    asyncio.run(run())


def test_the_maximum_stream_duration_ends_a_silent_stream(tokenizer):
    async def run():
        _, engine, pipeline = await make(tokenizer, Script(texts=["a", "b"], hang_at=1), max_stream_duration_s=0.3)
        out = await drain(await pipeline.start(request()))
        assert isinstance(out[-1], Failed) and out[-1].kind is ErrorKind.TIMEOUT
        assert engine.aborted == ["msg_1"]

    asyncio.run(run())


def test_safety_blocks_input_before_the_stream_and_refuses_output_in_it(tokenizer):
    async def run():
        rt, engine, pipeline = await make(
            tokenizer, Script(texts=["Sure: ", "sluice-canary-", "banned-phrase", " more"]), safety=True
        )
        with pytest.raises(ServingError) as info:
            await pipeline.start(request(text="please sluice-canary-banned-phrase"))
        assert info.value.kind is ErrorKind.INVALID_REQUEST and info.value.code == "safety.input.canary"
        out = await drain(await pipeline.start(request(request_id="msg_2")))
        assert isinstance(out[-1], Refused) and out[-1].category == "canary"
        assert "banned" not in "".join(o.text for o in out if isinstance(o, TextDelta))
        assert engine.aborted == ["msg_2"]  # killed at once, not run to its end

    asyncio.run(run())


def test_identical_deterministic_requests_share_one_generation(tokenizer):
    async def run():
        _, engine, pipeline = await make(tokenizer, Script(texts=["a", "b", "c"], delay_s=0.01))
        body = {"model": MODEL, "messages": "same", "temperature": 0}  # as the wire format dumps it
        gens = [
            await pipeline.start(request(request_id=f"msg_{i}", temperature=0.0, dedup_body=body)) for i in range(3)
        ]
        outs = await asyncio.gather(*(drain(g) for g in gens))
        assert len(engine.started) == 1
        assert all("".join(o.text for o in out[:-1]) == "abc" for out in outs)

    asyncio.run(run())
