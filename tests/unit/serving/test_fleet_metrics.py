"""The fleet's Prometheus gauges per model and per version, in one process: a real Fleet,
admission queue, serving pipeline and /metrics (over ASGI), with scripted engines
(tests/fake_engine.py) as remote workers — no model, no worker processes.

- `sluice_scaling_signal{model}`: load on one model raises that model's series only (its queue
  must not scale another model's workers); a model's versions pool their capacity; for a fleet
  of one model the value is the admission queue's gateway-wide signal and the autoscaler's.
- `sluice_engine_*{model,version}`: each version's engines combined, `engine_up` 0 for a version
  none of whose workers answered, versions gone since the last scrape gone.

Requests are held in flight by engines that hang before their second token until released (an
event), so no assertion depends on the machine's speed."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluice.api.app import create_app
from sluice.config import load_settings
from sluice.engine.stats import EngineStats
from sluice.gateway.principal import Principal
from sluice.observability.metrics import ServingMetrics
from sluice.routing.dispatch.worker_pool import WorkerStatus
from sluice.routing.fleet.fleet import Fleet
from sluice.routing.fleet_file.registry import Registry
from sluice.routing.scaling.observation import observations, version_load
from sluice.serving.outcomes import Finished
from sluice.serving.output_budget import OutputBudget
from sluice.serving.pipeline import ServingPipeline
from sluice.serving.prompt import Conversation, Role, Turn
from sluice.serving.request import Route, ServingRequest
from sluice.serving.runtime import ServingRuntime
from sluice.worker.warmup import is_warmup
from tests.fake_engine import FakeEngine, Script

BLOCK = 8
WAIT_S = 60.0  # bound on waiting for a held request to reach its engine (events, not timing)
# KV blocks per worker: distinct, so a combined or mixed-up version shows in the numbers
BLOCKS = {"10.0.0.1:1": 100, "10.0.0.2:1": 60, "10.0.0.3:1": 40}


class HeldEngine(FakeEngine):
    """A scripted worker whose requests hang after their first token until `release` is set; its
    stats report its own KV size and the requests it holds, or fail while `down`."""

    def __init__(self, blocks: int):
        super().__init__(Script(texts=["a", "b"], hang_at=1))
        self.blocks = blocks
        self.down = False
        self.arrived = asyncio.Event()

    async def generate(self, request, trace_metadata=()):
        if not is_warmup(request.request_id):
            self.arrived.set()
        async for event in super().generate(request, trace_metadata):
            yield event

    async def stats(self) -> EngineStats:
        if self.down:
            raise ConnectionError("worker gone")
        held = len(set(self.started) - set(self.finished) - set(self.aborted))
        return EngineStats(block_size=BLOCK, kv_blocks_total=self.blocks, kv_blocks_used=held, num_running=held)


def two_models(weights: str) -> str:
    # model a: v1 takes the traffic, v2 (staged, its worker warm) adds capacity; model b: one worker
    return f"""
[models.a.versions.v1]
weights = "{weights}"
traffic = 100
workers = ["10.0.0.1:1"]
[models.a.versions.v2]
weights = "{weights}"
workers = ["10.0.0.2:1"]
[models.b.versions.v1]
weights = "{weights}"
traffic = 100
workers = ["10.0.0.3:1"]
"""


def one_model(weights: str) -> str:
    return f"""
[models.a.versions.v1]
weights = "{weights}"
traffic = 100
workers = ["10.0.0.1:1"]
"""


class Harness:
    def __init__(self, tmp_path, text: str, **settings):
        self.path = tmp_path / "fleet.toml"
        self.path.write_text(text)
        self.settings = load_settings(
            None, safety=False, fleet=str(self.path), health_check_interval_s=3600, **settings
        )
        self.engines: dict[str, HeldEngine] = {}

    async def __aenter__(self) -> Harness:
        self.fleet = Fleet.build(self.settings, Registry.from_file(self.path))
        self.fleet.tick_s = 3600  # nothing moves on its own
        await self.fleet.start(client_for=lambda addr: self.engines.setdefault(addr, HeldEngine(BLOCKS[addr])))
        self.rt = ServingRuntime(self.settings)
        self.rt.mark_ready(self.fleet, self.fleet.capacity()[0])
        self.pipeline = ServingPipeline(self.rt)
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(self.rt)), base_url="http://t")
        self.consumers: list[asyncio.Task] = []  # one per held request: reads it to its end
        return self

    async def __aexit__(self, *exc) -> None:
        await self.finish()
        await self.client.aclose()
        await self.fleet.close()

    async def hold(self, model: str, worker: str, n: int = 1) -> None:
        """Start `n` requests for `model`; wait until each is in flight on `worker`, or queued
        (the admission queue has no room)."""
        assert self.rt.gateway is not None
        q = self.rt.gateway.admission
        for _ in range(n):
            arrived = self.expect(worker)
            request = ServingRequest(
                request_id=f"msg_{len(self.consumers)}",
                route=Route.MESSAGES,
                principal=Principal(),
                model=model,
                conversation=Conversation([Turn(Role.USER, ["hello"])]),
                budget=OutputBudget(8),
            )
            depth = q.depth
            gen = await self.pipeline.start(request, wait_s=0.01)
            self.consumers.append(asyncio.ensure_future(_read(gen)))
            if q.depth == depth:  # admitted: it reaches the engine
                await asyncio.wait_for(arrived, WAIT_S)

    def expect(self, worker: str) -> asyncio.Future:
        """Done when the next request reaches `worker`'s engine."""
        engine = self.engines[worker]
        engine.arrived.clear()
        return asyncio.ensure_future(engine.arrived.wait())

    async def finish(self) -> list:
        """Let every held request finish; their last outcomes."""
        for engine in self.engines.values():
            engine.release.set()
        done = await asyncio.wait_for(asyncio.gather(*self.consumers), WAIT_S)
        self.consumers.clear()
        return done

    async def scrape(self) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
        """metric name -> {sorted labels: value} from /metrics."""
        r = await self.client.get("/metrics")
        assert r.status_code == 200
        out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        for family in text_string_to_metric_families(r.text):
            for sample in family.samples:
                out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
        return out


async def _read(gen) -> object:
    last = None
    async with aclosing(gen.outcomes()) as outcomes:
        async for outcome in outcomes:
            last = outcome
    return last


def signals(scraped) -> dict[str, float]:
    return {dict(labels)["model"]: v for labels, v in scraped["sluice_scaling_signal"].items()}


def dispatched(h: Harness, worker: str) -> int:
    entry = h.fleet.pool.get(worker)
    assert entry is not None, worker
    return entry.dispatched_tokens


def test_load_on_one_model_raises_only_that_models_scaling_signal(tmp_path, tiny_llama_dir):
    async def go():
        async with Harness(tmp_path, two_models(str(tiny_llama_dir)), max_inflight=1) as h:
            assert all(w.status is WorkerStatus.WARM for w in (h.fleet.pool.get(a) for a in BLOCKS))
            assert signals(await h.scrape()) == {"a": 0.0, "b": 0.0}  # every model has its series, idle at 0
            await h.hold("a", "10.0.0.1:1", n=2)  # one in flight on a/v1, one queued (max_inflight 1)
            q = h.rt.gateway.admission
            assert q.inflight == 1 and q.depth == 1
            inflight = dispatched(h, "10.0.0.1:1")
            assert inflight == q.inflight_tokens > 0  # the pool and the queue count the same estimate
            got = signals(await h.scrape())
            # all in-flight work is a's, so a's share of the queue is all of it; a's capacity is
            # both of its versions' workers (a ratio of sums), b's is untouched
            assert got["a"] == pytest.approx((q.queued_tokens + inflight) / ((100 + 60) * BLOCK))
            assert got["b"] == 0.0
            # the autoscaler's computation on the same numbers (scaling/signal.py reuses it)
            loads = [version_load("a", v, h.fleet.pool, h.fleet.handles.values(), 0) for v in ("v1", "v2")]
            per_version = observations(loads, h.fleet.demand())
            assert got["a"] == pytest.approx(
                sum(o.signal * v.capacity_tokens for o, v in zip(per_version.values(), loads))
                / sum(v.capacity_tokens for v in loads)
            )

            # now b gets load too: its series rises, a's keeps its in-flight part
            arrived = h.expect("10.0.0.1:1")
            h.rt.gateway.admission.set_capacity(max_inflight=3)  # the queued request for a goes
            await asyncio.wait_for(arrived, WAIT_S)
            await h.hold("b", "10.0.0.3:1")
            got = signals(await h.scrape())
            assert got["b"] == pytest.approx(dispatched(h, "10.0.0.3:1") / (40 * BLOCK)) and got["b"] > 0
            assert got["a"] == pytest.approx(dispatched(h, "10.0.0.1:1") / ((100 + 60) * BLOCK)) and got["a"] > 0

            assert all(isinstance(last, Finished) for last in await h.finish())
            assert signals(await h.scrape()) == {"a": 0.0, "b": 0.0}

    asyncio.run(go())


def test_for_one_model_the_signal_is_the_gateways_and_the_autoscalers(tmp_path, tiny_llama_dir):
    async def go():
        async with Harness(tmp_path, one_model(str(tiny_llama_dir)), max_inflight=2) as h:
            await h.hold("a", "10.0.0.1:1", n=3)  # two in flight, one queued
            q = h.rt.gateway.admission
            assert q.depth == 1
            got = signals(await h.scrape())
            assert got == {"a": pytest.approx(q.scaling_signal())}  # today's gateway-wide value
            loads = [version_load("a", "v1", h.fleet.pool, h.fleet.handles.values(), 0)]
            assert got["a"] == pytest.approx(observations(loads, h.fleet.demand())[("a", "v1")].signal)

    asyncio.run(go())


def test_engine_gauges_are_per_version_and_engine_up_says_which_answered(tmp_path, tiny_llama_dir):
    async def go():
        async with Harness(tmp_path, two_models(str(tiny_llama_dir))) as h:
            await h.hold("a", "10.0.0.1:1")
            m = await h.scrape()
            labels = {
                "a/v1": (("model", "a"), ("version", "a/v1")),
                "a/v2": (("model", "a"), ("version", "a/v2")),
                "b/v1": (("model", "b"), ("version", "b/v1")),
            }
            assert m["sluice_engine_kv_blocks_total"] == {labels["a/v1"]: 100, labels["a/v2"]: 60, labels["b/v1"]: 40}
            assert m["sluice_engine_running_requests"] == {labels["a/v1"]: 1, labels["a/v2"]: 0, labels["b/v1"]: 0}
            assert m["sluice_engine_up"] == {k: 1 for k in labels.values()}
            for name, series in m.items():  # bounded: model and version only, never a worker
                if name.startswith("sluice_engine_"):
                    assert {k for labelset in series for k, _ in labelset} == {"model", "version"}, name

            h.engines["10.0.0.3:1"].down = True  # b's only worker stops answering
            m = await h.scrape()
            assert m["sluice_engine_up"][labels["b/v1"]] == 0
            assert labels["b/v1"] not in m["sluice_engine_kv_blocks_total"]  # no stale numbers
            assert m["sluice_engine_kv_blocks_total"][labels["a/v1"]] == 100

    asyncio.run(go())


def test_engine_series_of_a_version_gone_since_the_last_scrape_disappear():
    metrics = ServingMetrics()
    metrics.observe_engines(
        {("a", "a/v1"): EngineStats(kv_blocks_total=10), ("a", "a/v2"): EngineStats(kv_blocks_total=20)}
    )
    metrics.observe_scaling({"a": 0.5, "b": 0.25})
    text = metrics.render().decode()
    assert 'sluice_engine_kv_blocks_total{model="a",version="a/v2"} 20.0' in text
    assert 'sluice_scaling_signal{model="b"} 0.25' in text
    metrics.observe_engines({("a", "a/v1"): EngineStats(kv_blocks_total=10)})  # v2 retired
    metrics.observe_scaling({"a": 0.5})  # model b removed from the fleet
    text = metrics.render().decode()
    assert 'version="a/v2"' not in text and 'model="b"' not in text
    assert 'sluice_engine_kv_blocks_total{model="a",version="a/v1"} 10.0' in text
