"""Structured logs: every line a `sluice serve` (and its worker) writes is one JSON object; lines
written while serving a request carry its id; no prompt text, reply text or key ever appears."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from sluice.observability.logs import JsonFormatter
from sluice.request_context import request_id_var
from tests.server_process import start_server

CANARY = "zebra-canary-prompt-7781"
KEY = "sk-log-test-0123456789abcdef"


def test_the_formatter_writes_one_object_with_the_request_id():
    record = logging.LogRecord("sluice.x", logging.WARNING, __file__, 1, "worker %s is down", ("w1",), None)
    token = request_id_var.set("req_abc")
    try:
        line = json.loads(JsonFormatter().format(record))
    finally:
        request_id_var.reset(token)
    assert line["msg"] == "worker w1 is down" and line["level"] == "warning" and line["logger"] == "sluice.x"
    assert line["request_id"] == "req_abc" and "trace_id" in line and line["ts"].endswith("Z")


@pytest.mark.slow
def test_a_serve_logs_json_with_ids_and_never_prompts_or_keys(tiny_llama_dir):
    proc = start_server(
        ["--model", str(tiny_llama_dir), "--access-log"], env={"SLUICE_API_KEY": KEY, "SLUICE_LOG_LEVEL": "debug"}
    )
    try:
        model = httpx.get(proc.base_url + "/v1/models", headers={"x-api-key": KEY}).json()["data"][0]["id"]
        body = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": f"say {CANARY} back"}]}
        r = httpx.post(proc.base_url + "/v1/messages", json=body, headers={"x-api-key": KEY})
        assert r.status_code == 200
        stream = httpx.post(proc.base_url + "/v1/messages", json={**body, "stream": True}, headers={"x-api-key": KEY})
        assert stream.status_code == 200
        assert (
            httpx.post(proc.base_url + "/v1/messages", json=body, headers={"x-api-key": KEY + "x"}).status_code == 401
        )
        assert (
            httpx.post(proc.base_url + "/v1/messages", content=b"{bad json", headers={"x-api-key": KEY}).status_code
            == 400
        )
        reply = r.json()["content"][0]["text"]
    finally:
        proc.stop()
    log = proc.log()
    lines = [ln for ln in log.splitlines() if ln.strip()]
    records = []
    for ln in lines:
        if ln.startswith(("Writing model shards", "\r")):  # a test fixture's progress bar, not ours
            continue
        records.append(json.loads(ln))  # every line is one JSON object
    assert any(rec.get("request_id", "") and str(rec["request_id"]).startswith("req_") for rec in records)
    assert all({"ts", "level", "logger", "msg", "request_id", "trace_id"} <= set(rec) for rec in records)
    assert CANARY not in log and KEY not in log
    if len(reply) > 8:  # a reply long enough not to be a common word
        assert reply not in log
