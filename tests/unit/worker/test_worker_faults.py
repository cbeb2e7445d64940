"""The worker's fault-injection spec (a testing aid): every item parses, bad ones are named, and
only a spec that names a fault installs anything (worker/faults.py)."""

import pytest

from sluice.worker.faults import FaultSpec


def test_every_item_parses():
    spec = FaultSpec.parse(
        "fail_seed=7, exit_after_tokens=30,fail_all,delay_first_token_s=0.5,step_delay_s=0.05,load_delay_s=2"
    )
    assert spec == FaultSpec(7, 30, True, 0.5, 0.05, 2.0)
    assert spec.active and not FaultSpec.parse("").active and not FaultSpec.parse(None).active
    assert str(FaultSpec.parse("fail_all,step_delay_s=0.05")) == "fail_all,step_delay_s=0.05"


@pytest.mark.parametrize("bad", ["load_delay_s", "load_delay_s=soon", "fail_all=1", "explode", "fail_seed=1=2"])
def test_a_bad_item_is_named(bad):
    with pytest.raises(ValueError, match=f"fault injection: {bad!r} is not one of .*load_delay_s=S"):
        FaultSpec.parse(f"fail_all,{bad}" if bad != "fail_all=1" else bad)


def test_warmup_requests_are_exempt():
    assert FaultSpec.exempt("warmup-1") and not FaultSpec.exempt("msg_1")


def test_only_request_faults_install_a_request_hook():
    assert FaultSpec().request_faults() is None
    assert FaultSpec(step_delay_s=0.1, fail_seed=3, load_delay_s=1).request_faults() is None  # engine / load only
    for spec in (FaultSpec(fail_all=True), FaultSpec(delay_first_token_s=0.5), FaultSpec(exit_after_tokens=0)):
        assert spec.request_faults() is not None


def test_request_faults_wrap_a_requests_batches(monkeypatch):
    import asyncio

    from sluice.types import GenerationEvent
    from sluice.worker import faults as worker_faults
    from sluice.worker.status_codes import REQUEST_REFUSED, RequestFailed

    async def batches(n: int):
        for i in range(n):
            yield [GenerationEvent("r", token_ids=[i, i])]

    async def drain(hook, request_id: str, n: int = 3) -> int:
        return sum([len(b) async for b in hook.around(request_id, batches(n))])

    broken = FaultSpec(fail_all=True).request_faults()
    with pytest.raises(RequestFailed) as refused:
        asyncio.run(drain(broken, "msg_1"))
    assert refused.value.kind == REQUEST_REFUSED
    assert asyncio.run(drain(broken, "warmup-1")) == 3  # exempt: the worker still becomes ready

    exits: list[int] = []
    monkeypatch.setattr(worker_faults.os, "_exit", lambda code: exits.append(code))
    crashing = FaultSpec(exit_after_tokens=5).request_faults()
    asyncio.run(drain(crashing, "msg_1", 2))  # 4 tokens sent: not yet
    assert exits == [] and crashing.tokens_sent == 4
    asyncio.run(drain(crashing, "msg_2", 1))  # the 5th and 6th: exit, after the batch was sent
    assert exits == [137]
