"""The warm-up request: one token generated on a worker before it takes traffic.

The gateway's health poller sends it to a worker that answers ready for the first time, or
again after it was down (routing/dispatch/health_poller.py), so the first real request does not
pay for cold caches. It lives with the worker, not the poller, because the worker side must
tell it apart by its id: fault injection exempts it (worker/faults.py), so a faulty worker still
becomes ready and its fault hits real traffic.
"""

from __future__ import annotations

import uuid

from sluice.types import GenerationRequest, SamplingParams

WARMUP_PREFIX = "warmup-"
WARMUP_PROMPT = [1, 2, 3, 4]  # any valid ids: the warm-up runs a prefill and one decode
WARMUP_TENANT = "\0warmup"  # no API key can name it: its prefix cache is no tenant's


def warmup_request() -> GenerationRequest:
    return GenerationRequest(
        f"{WARMUP_PREFIX}{uuid.uuid4().hex[:12]}",
        list(WARMUP_PROMPT),
        SamplingParams(max_tokens=1, temperature=0.0),
        tenant=WARMUP_TENANT,
    )


def is_warmup(request_id: str) -> bool:
    return request_id.startswith(WARMUP_PREFIX)
