"""One request's trace across both processes: `sluice serve` and its worker each write their
finished spans to a file (the `file` exporter); the worker's span is a child in the gateway's
trace, and the spans name what the request went through."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.server_process import start_server

pytestmark = pytest.mark.slow


def _spans(directory) -> list[dict]:
    return [
        json.loads(line) for path in sorted(directory.glob("trace.*.jsonl")) for line in path.read_text().splitlines()
    ]


def test_a_request_is_one_trace_from_http_to_the_worker(tiny_llama_dir, tmp_path):
    proc = start_server(
        ["--model", str(tiny_llama_dir)],
        env={"SLUICE_TRACE_EXPORTER": "file", "SLUICE_TRACE_FILE": str(tmp_path / "trace")},
    )
    try:
        model = httpx.get(proc.base_url + "/v1/models").json()["data"][0]["id"]
        body = {"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
        r = httpx.post(proc.base_url + "/v1/messages", json=body)
        assert r.status_code == 200
        request_id = r.headers["request-id"]
        deadline = time.monotonic() + 60  # spans are written when they end (the worker's too)
        while True:
            spans = _spans(tmp_path)
            http = [s for s in spans if s["attributes"].get("sluice.request_id") == request_id]
            if http and any(s["name"] == "worker.generate" and s["trace_id"] == http[0]["trace_id"] for s in spans):
                break
            assert time.monotonic() < deadline, f"spans: {[s['name'] for s in spans]}"
            time.sleep(0.2)
    finally:
        proc.stop()
    trace_id = http[0]["trace_id"]
    ours = {s["name"]: s for s in _spans(tmp_path) if s["trace_id"] == trace_id}
    assert {"POST /v1/messages", "auth", "routing.plan", "gateway.admission", "generate", "worker.generate"} <= set(
        ours
    )
    assert (
        ours["POST /v1/messages"]["service"] == "sluice-gateway"
        and ours["worker.generate"]["service"] == "sluice-worker"
    )
    assert ours["worker.generate"]["parent_id"] == ours["generate"]["span_id"]  # context crossed the gRPC hop
    assert ours["routing.plan"]["attributes"]["sluice.version"].endswith("/default")
    gen = ours["generate"]
    assert gen["attributes"]["sluice.output_tokens"] == 5 and gen["attributes"]["sluice.retries"] == 0
    assert any(e["name"] == "dispatch" for e in gen["events"])
    worker = ours["worker.generate"]["attributes"]
    assert worker["sluice.output_tokens"] == 5 and worker["sluice.prefill_s"] > 0 and "sluice.queue_time_s" in worker
