"""The worker's fault-injection spec (a testing aid): every item parses, bad ones are named."""

import pytest

from sluice.worker.faults import FaultSpec


def test_every_item_parses():
    spec = FaultSpec.parse("fail_seed=7, exit_after_tokens=30,fail_all,delay_first_token_s=0.5,step_delay_s=0.05,load_delay_s=2")
    assert spec == FaultSpec(7, 30, True, 0.5, 0.05, 2.0)
    assert spec.active and not FaultSpec.parse("").active and not FaultSpec.parse(None).active


@pytest.mark.parametrize("bad", ["load_delay_s", "load_delay_s=soon", "fail_all=1", "explode"])
def test_a_bad_item_is_named(bad):
    with pytest.raises(ValueError, match=f"{bad!r} is not one of .*load_delay_s=S"):
        FaultSpec.parse(f"fail_all,{bad}" if bad != "fail_all=1" else bad)


def test_warmup_requests_are_exempt():
    assert FaultSpec.exempt("warmup-1") and not FaultSpec.exempt("msg_1")
