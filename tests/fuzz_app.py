"""The real ASGI app on a scripted engine: every route, gateway, safety and replay log as served,
with tests/fake_engine.py in place of a model — for tests that drive the HTTP surface fast
(the schema-driven fuzz test, the idempotency tests)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from sluice.api.app import create_app
from sluice.config import load_settings
from sluice.gateway.authenticator import Authenticator, OpenAccess
from sluice.models.tokenizer import Tokenizer
from sluice.serving.runtime import ServingRuntime
from sluice.streaming.replay_log import ReplayLog
from tests.fake_engine import FakeEngine, Script

MODEL = "fake-model"
BLOCK_SIZE = 8


def unready_app(authenticator: Authenticator | None = None, replay: ReplayLog | None = None,
                **settings: Any) -> tuple[FastAPI, ServingRuntime]:
    """The app before its engine is up (its OpenAPI document is already complete)."""
    rt = ServingRuntime(load_settings(None, **settings), authenticator=authenticator or OpenAccess(), replay_log=replay)
    return create_app(rt), rt


def make_ready(rt: ServingRuntime, tokenizer: Tokenizer, script: Script | None = None, max_model_len: int = 256) -> FakeEngine:
    """Mark `rt` ready on a scripted engine (no event loop needed: the app may then run on any loop)."""
    engine = FakeEngine(script, max_model_len)
    rt.mark_ready(engine, tokenizer, engine.info_, BLOCK_SIZE, 4096)
    return engine


def scripted_app(tokenizer: Tokenizer, script: Script | None = None, **kw: Any) -> tuple[FastAPI, ServingRuntime, FakeEngine]:
    app, rt = unready_app(**kw)
    return app, rt, make_ready(rt, tokenizer, script)
