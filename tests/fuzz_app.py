"""The real ASGI app on a scripted engine: every route, gateway, safety and replay log as served,
with tests/fake_engine.py in place of a model (the fleet serves it as `--worker inline`) — for
tests that drive the HTTP surface fast (the schema-driven fuzz test, the idempotency tests)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from sluice.api.app import create_app
from sluice.config import load_settings
from sluice.gateway.authenticator import Authenticator, OpenAccess
from sluice.routing.fleet.fleet import Fleet
from sluice.routing.fleet_file.default_fleet import fleet_from_settings
from sluice.routing.fleet_file.registry import Registry
from sluice.serving.runtime import ServingRuntime
from sluice.streaming.replay_log import ReplayLog
from tests.fake_engine import FakeEngine, Script

MODEL = "fake-model"


def unready_app(
    authenticator: Authenticator | None = None, replay: ReplayLog | None = None, **settings: Any
) -> tuple[FastAPI, ServingRuntime]:
    """The app before its engine is up (its OpenAPI document is already complete)."""
    rt = ServingRuntime(
        load_settings(None, **{"served_model_name": MODEL, **settings}),
        authenticator=authenticator or OpenAccess(),
        replay_log=replay,
    )
    return create_app(rt), rt


async def make_ready(
    rt: ServingRuntime, tiny_dir: Path, script: Script | None = None, max_model_len: int = 256
) -> FakeEngine:
    """Start a fleet of one scripted engine (the tiny model's tokenizer) and mark `rt` ready.
    Run it on the loop that serves the app: the fleet's tasks live there."""
    engine = FakeEngine(script, max_model_len)
    s = load_settings(None, safety=False, model=str(tiny_dir), served_model_name=MODEL, worker="inline")
    fleet = Fleet.build(s, Registry(fleet_from_settings(s)))
    await fleet.start(inline=engine)
    rt.mark_ready(fleet, 4096)
    return engine


async def scripted_app(
    tiny_dir: Path, script: Script | None = None, max_model_len: int = 256, **kw: Any
) -> tuple[FastAPI, ServingRuntime, FakeEngine]:
    app, rt = unready_app(**kw)
    return app, rt, await make_ready(rt, tiny_dir, script, max_model_len)


class ReadyOnFirstRequest:
    """An ASGI app that readies its runtime on its first request, on whatever loop serves it
    (schemathesis runs the app on a loop of its own)."""

    def __init__(self, app: FastAPI, rt: ServingRuntime):
        self.app, self.rt = app, rt
        self.ready: dict[str, Any] | None = None  # make_ready's arguments, set by the test
        self.engine: FakeEngine | None = None
        self._lock: asyncio.Lock | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.engine is None and self.ready is not None and scope["type"] == "http":
            self._lock = self._lock or asyncio.Lock()
            async with self._lock:
                if self.engine is None:
                    self.engine = await make_ready(self.rt, **self.ready)
        await self.app(scope, receive, send)
