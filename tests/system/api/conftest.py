"""One `sluice serve` of the bundled model for the API tests that need nothing else of it.

The OpenAI chat, completions and logprobs tests, the lm-eval harness, the batches and the SDK
round trips each started the same server (the bundled model behind an API key, or behind none)
and stopped it again: a model load and a process start each, on busy cores. They share one per
session (per xdist worker) instead; each asks its own questions, and none reads the server's
counters or depends on what another module asked before it. The tests that need a setting of
their own (ping interval, safety policy, step delay, workers, adapters) keep their own servers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.server_process import Proc, start_server

SHARED_KEY = "sk-shared-test-key"


@pytest.fixture(scope="session")
def shared_server() -> Iterator[Proc]:
    proc = start_server(env={"SLUICE_API_KEY": SHARED_KEY})
    yield proc
    assert proc.stop() == 0
    assert SHARED_KEY not in proc.log()  # the key is never logged
