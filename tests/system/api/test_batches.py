"""Message Batches end to end with the official SDK (reference §11 check 14)."""

from __future__ import annotations

import time

import anthropic
import pytest

from tests.server_process import MODEL
from tests.system.api.conftest import SHARED_KEY

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(shared_server):
    return shared_server  # tests/system/api/conftest.py: the bundled model behind SHARED_KEY


def wait_ended(client: anthropic.Anthropic, batch_id: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        time.sleep(0.2)
    raise AssertionError("batch did not end")


def test_batch_lifecycle(server):
    client = anthropic.Anthropic(base_url=server.base_url, api_key=SHARED_KEY, max_retries=0)
    requests = [
        {
            "custom_id": f"q{i}",
            "params": {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": f"Say {i}"}]},
        }
        for i in range(3)
    ] + [
        {
            "custom_id": "bad",
            "params": {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi " * 9000}]},
        }
    ]
    batch = client.messages.batches.create(requests=requests)
    assert batch.id.startswith("msgbatch_") and batch.processing_status == "in_progress"
    assert batch.request_counts.processing == 4 and batch.results_url is None
    with pytest.raises(anthropic.BadRequestError):
        client.messages.batches.delete(batch.id)  # refused before the batch ended
    ended = wait_ended(client, batch.id)
    assert ended.request_counts.succeeded == 3 and ended.request_counts.errored == 1
    assert ended.results_url.startswith(server.base_url)  # our own host, never another
    results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    assert set(results) == {"q0", "q1", "q2", "bad"}
    assert results["q0"].type == "succeeded" and results["q0"].message.usage.service_tier == "batch"
    assert results["bad"].type == "errored" and "too long" in results["bad"].error.error.message
    assert batch.id in [b.id for b in client.messages.batches.list(limit=1)]
    assert client.messages.batches.delete(batch.id).type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(batch.id)


def test_batch_cancel(server):
    client = anthropic.Anthropic(base_url=server.base_url, api_key=SHARED_KEY, max_retries=0)
    requests = [
        {
            "custom_id": f"c{i}",
            "params": {"model": MODEL, "max_tokens": 30, "messages": [{"role": "user", "content": "Tell a story"}]},
        }
        for i in range(20)
    ]
    batch = client.messages.batches.create(requests=requests)
    canceling = client.messages.batches.cancel(batch.id)
    assert canceling.processing_status in ("canceling", "ended")
    ended = wait_ended(client, batch.id)
    counts = ended.request_counts
    assert counts.canceled > 0 and counts.succeeded + counts.canceled + counts.errored == 20
    with pytest.raises(anthropic.BadRequestError):
        client.messages.batches.create(requests=[requests[0], requests[0]])  # duplicate custom_id
