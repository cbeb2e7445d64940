"""LoRA adapters in the fleet, in one process: a real Fleet, router, rollout driver, serving
pipeline and admin operations, scripted engines (tests/fake_engine.py) as the base version's
remote workers. An adapter is a version of a model on its base's workers, so requests carry it
to those workers, sticky weights and pins pick among its versions, a rollout of an adapter
version warms, shifts and rolls back like any other; adapters load and unload at run time
(checked by a worker first); routing prefers a worker holding the adapter; the base's scaling
signal carries the adapters' work."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest

from sluice.config import load_settings
from sluice.gateway.principal import Principal
from sluice.routing.fleet.fleet import Fleet
from sluice.routing.fleet_file.registry import Registry
from sluice.serving.adapter_admin import AdapterAdmin
from sluice.serving.errors import ErrorKind
from sluice.serving.fleet_admin import AdminError, FleetAdmin
from sluice.serving.outcomes import Finished
from sluice.serving.output_budget import OutputBudget
from sluice.serving.pipeline import ServingPipeline
from sluice.serving.prompt import Conversation, Role, Turn
from sluice.serving.request import Route, ServingRequest
from sluice.serving.runtime import ServingRuntime
from sluice.types import AdapterRef
from tests.fake_engine import FakeEngine

ADMIN = "admin-key-for-tests-0123"
W1, W2 = "10.0.0.1:1", "10.0.0.3:1"


def fleet_text(weights: str) -> str:
    return f"""
[rollout]
steps = [50, 100]
step_interval_s = 3600
min_requests = 3
[models.m.versions.v1]
weights = "{weights}"
traffic = 100
workers = ["{W1}", "{W2}"]
[models.support]
aliases = ["helpdesk"]
[models.support.tiers."*"]
allow_pin = true
[models.support.versions.v1]
adapter = "s3://adapters/support/v1"
base = "m/v1"
traffic = 100
[models.support.versions.v2]
adapter = "s3://adapters/support/v2"
base = "m"
"""


class Harness:
    def __init__(self, tmp_path, tiny_dir):
        self.path = tmp_path / "fleet.toml"
        self.path.write_text(fleet_text(str(tiny_dir)))
        self.engines: dict[str, FakeEngine] = {}
        self.settings = load_settings(
            None, safety=False, fleet=str(self.path), admin_key=ADMIN, health_check_interval_s=3600
        )

    async def __aenter__(self) -> Harness:
        self.fleet = Fleet.build(self.settings, Registry.from_file(self.path))
        self.fleet.tick_s = 3600  # the tests tick by hand
        await self.fleet.start(client_for=lambda addr: self.engines.setdefault(addr, FakeEngine()))
        self.rt = ServingRuntime(self.settings)
        self.rt.mark_ready(self.fleet, 4096)
        self.pipeline = ServingPipeline(self.rt)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.fleet.close()

    async def ask(self, model: str, user: str, i: int = 0, pin: str | None = None):
        req = ServingRequest(
            request_id=f"msg_{user}_{i}",
            route=Route.MESSAGES,
            principal=Principal(),
            model=model,
            conversation=Conversation([Turn(Role.USER, ["hello"])]),
            budget=OutputBudget(4),
            affinity_user=user,
            pin=pin,
        )
        gen = await self.pipeline.start(req)
        collected = await gen.collect()
        assert isinstance(collected.final, Finished)
        sent = next(r for e in self.engines.values() for r in e.requests if r.request_id == req.request_id)
        return gen.headers["sluice-model-version"], sent


def run(coro):
    return asyncio.run(coro)


def test_an_adapter_version_runs_on_its_base_workers_with_its_adapter(tmp_path, tiny_llama_dir):
    async def go():
        async with Harness(tmp_path, tiny_llama_dir) as h:
            version, sent = await h.ask("support", "u1")
            assert version == "support/v1" and sent.adapter == AdapterRef("support", "s3://adapters/support/v1")
            version, sent = await h.ask("helpdesk", "u1", 1)  # an alias names the adapter model too
            assert version == "support/v1" and sent.adapter is not None
            version, sent = await h.ask("m", "u1", 2)
            assert version == "m/v1" and sent.adapter is None
            assert h.fleet.parent_of("support") == "m" and h.fleet.parent_of("m") is None
            assert "support" not in h.fleet.scaling_signals(), "an adapter has no workers of its own to scale"
            status = h.fleet.status()["models"]["support"]["versions"]["v2"]
            assert status["adapter"] == "s3://adapters/support/v2" and status["base"] == "m"
            from sluice.cli.fleet import render_status

            assert "adapter on m/v1" in render_status(h.fleet.status())  # `sluice fleet status`

    run(go())


def test_sticky_canary_pins_and_rollback_of_adapter_versions(tmp_path, tiny_llama_dir):
    """Weights split an adapter's users between its versions, each user staying on one; a pin
    picks a version; a rollout of v2 is warm at once (its base is) and shifts; a rollback puts
    the old weights back."""

    async def go():
        async with Harness(tmp_path, tiny_llama_dir) as h:
            admin = FleetAdmin(h.fleet)
            await admin.set_weights("support", {"v1": 50, "v2": 50})
            seen: dict[str, str] = {}
            for i in range(40):
                user = f"user-{i % 10}"
                version, sent = await h.ask("support", user, i)
                assert sent.adapter is not None and sent.adapter.source.endswith(version.rsplit("/", 1)[1])
                assert seen.setdefault(user, version) == version, "a user stays on one version"
            assert set(Counter(seen.values())) == {"support/v1", "support/v2"}
            version, sent = await h.ask("support", "user-0", 99, pin="support/v2")  # user-0 may sit on v1: pinned
            assert version == "support/v2" and sent.adapter == AdapterRef("support", "s3://adapters/support/v2")
            await admin.set_weights("support", {"v1": 100, "v2": 0})
            await admin.start_rollout("support", "v2", {})
            await h.fleet.tick()  # the target's workers are its base's, warm: shifting at once
            rollout = h.fleet.status()["models"]["support"]["rollout"]
            assert rollout["phase"] == "shifting"
            await admin.rollback("support")
            assert h.fleet.status()["models"]["support"]["versions"]["v1"]["share"] == 100.0

    run(go())


def test_requests_in_flight_are_counted_per_adapter_version(tmp_path, tiny_llama_dir):
    async def go():
        async with Harness(tmp_path, tiny_llama_dir) as h:
            pool = h.fleet.pool
            assert {w.worker_id for w in pool.workers("support", "v2")} == {W1, W2}
            plan = await h.fleet.router.plan(_plan_request("support"), _cost)
            from sluice.types import GenerationRequest

            req = GenerationRequest("r", [1, 2, 3], adapter=AdapterRef("support", "s3://adapters/support/v1"))
            dispatch, _ = h.fleet.router.dispatch(plan, req)
            assert pool.inflight("support", "v1") == 1 and pool.inflight("support", "v2") == 0
            assert pool.inflight("m", "v1") == 1, "the base's drain waits for the adapter requests on its workers"
            assert h.fleet.scaling_signals()["m"] > 0, "the adapter's work is the base's load"
            h.fleet.router.finish_dispatch(dispatch, _ok())
            assert pool.inflight("support", "v1") == 0 and pool.inflight("m", "v1") == 0

    run(go())


def test_routing_prefers_a_worker_holding_the_adapter_within_the_load_bound(tmp_path, tiny_llama_dir):
    async def go():
        async with Harness(tmp_path, tiny_llama_dir) as h:
            pool = h.fleet.pool
            pool.report_adapters(W2, ["support"])
            for i in range(6):  # distinct prompts: prefix affinity alone would spread them
                _, sent = await h.ask("support", f"someone-{i}", i)
            assert all(r.adapter is not None for r in h.engines[W2].requests)
            assert len(h.engines[W2].requests) == 6 and not h.engines[W1].requests
            pool.report_load(W2, 10_000)  # the holder is past the bound: the other worker takes it (and loads it)
            await h.ask("support", "late", 99)
            assert h.engines[W1].requests and "support" in pool.get(W1).adapters

    run(go())


def test_adapters_load_and_unload_at_run_time(tmp_path, tiny_llama_dir):
    async def go():
        async with Harness(tmp_path, tiny_llama_dir) as h:
            ops = AdapterAdmin(h.fleet)
            h.engines[W1].damaged["/adapters/broken"] = "adapter_model.safetensors: truncated"
            h.engines[W2].damaged["/adapters/broken"] = "adapter_model.safetensors: truncated"
            for name, path, base, kind in [
                ("support", "/a", None, ErrorKind.CONFLICT),
                ("x", "/adapters/broken", None, ErrorKind.INVALID_REQUEST),
                ("x", "/a", "nope/v1", ErrorKind.INVALID_REQUEST),
                ("x", "/a", "support/v1", ErrorKind.INVALID_REQUEST),
            ]:
                with pytest.raises(AdminError) as info:
                    await ops.load(name, path, base)
                assert info.value.kind is kind, (name, path, base)
            assert "x" not in h.fleet.registry.served_names(), "a refused adapter is not served"
            loaded = await ops.load("billing", "/adapters/billing")
            assert loaded["base"] == "m/v1" and loaded["bytes"] == 1 << 20
            version, sent = await h.ask("billing", "u")
            assert version == "billing/default" and sent.adapter == AdapterRef("billing", "/adapters/billing")
            assert sent.request_id in [r.request_id for r in h.engines[loaded["worker"]].requests], (
                "the worker that checked it holds it: routing sends the first request there"
            )
            names = {a["name"]: a for a in ops.listing()["adapters"]}
            assert names["billing"]["runtime"] and not names["support"]["runtime"]
            h.path.write_text(fleet_text(str(tiny_llama_dir)) + "\n")  # a reload keeps run-time adapters
            assert (await FleetAdmin(h.fleet).reload())["applied"]
            assert "billing" in h.fleet.registry.served_names()
            assert (await ops.unload("billing"))["unloaded_on_workers"] >= 1
            assert "billing" not in h.fleet.registry.served_names()
            for name, kind in [("billing", ErrorKind.NOT_FOUND), ("support", ErrorKind.CONFLICT)]:
                with pytest.raises(AdminError) as info:
                    await ops.unload(name)
                assert info.value.kind is kind

    run(go())


def test_vllm_endpoints_and_models_list_over_http(tmp_path, tiny_llama_dir):
    """The wire: /v1/load_lora_adapter and /v1/unload_lora_adapter behind the admin key with
    OpenAI-shaped errors (unknown: 404 not_found_error), /v1/models listing an adapter's parent."""
    from sluice.api.app import create_app

    async def go():
        async with Harness(tmp_path, tiny_llama_dir) as h:
            app = create_app(h.rt)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
                admin = {"authorization": f"Bearer {ADMIN}"}
                r = await c.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/p"})
                assert r.status_code == 401
                r = await c.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/p"}, headers=admin)
                assert r.status_code == 200, r.text
                models = {m["id"]: m for m in (await c.get("/v1/models")).json()["data"]}
                assert models["x"]["parent"] == "m" and models["m"]["parent"] is None
                assert models["support"]["parent"] == "m" and models["x"]["object"] == "model"
                r = await c.post("/v1/unload_lora_adapter", json={"lora_name": "nope"}, headers=admin)
                assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
                r = await c.post("/v1/unload_lora_adapter", json={"lora_name": "x", "bogus": 1}, headers=admin)
                assert r.status_code == 400 and "bogus" in r.json()["error"]["message"]
                r = await c.post("/v1/unload_lora_adapter", json={"lora_name": "x"}, headers=admin)
                assert r.status_code == 200
                r = await c.post(
                    "/v1/messages",
                    json={"model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
                )
                assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"

    run(go())


def _plan_request(model: str):
    from sluice.routing.dispatch.router import PlanRequest

    return PlanRequest(model, "", "default", "key")


async def _cost(model_id: str, version: str) -> int:
    return 10


def _ok():
    from sluice.routing.dispatch.circuit_breaker import Outcome

    return Outcome.SUCCESS
