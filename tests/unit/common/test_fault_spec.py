"""One parser for the testing aids' fault specs (common/fault_spec.py), each system with its own
syntax: the worker's `name=value` items, training's `kind:a:b`; and the seams that only a spec
given at start-up fills (worker/faults.py, train/faults.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sluice.common.fault_spec import Fault, FaultGrammar, FaultKind
from sluice.train import faults as train_faults
from sluice.train.faults import FaultPoint

GRAMMAR = FaultGrammar(
    "SPEC", ":", (FaultKind("kill", "kill:RANK:STEP[:GROUP]", (int, int, int), optional=1), FaultKind("stop", "stop"))
)


def test_items_convert_in_order_and_optional_arguments_may_be_left_out():
    assert GRAMMAR.parse(" kill:1:6 ,stop,kill:0:2:1,") == [
        Fault("kill", (1, 6)),
        Fault("stop", ()),
        Fault("kill", (0, 2, 1)),
    ]
    assert GRAMMAR.parse(None) == GRAMMAR.parse("") == []


@pytest.mark.parametrize("bad", ["kill:1", "kill:1:2:3:4", "kill:a:2", "stop:1", "explode"])
def test_a_bad_item_is_named_with_every_usage(bad):
    with pytest.raises(ValueError, match=rf"SPEC: '{bad}' is not one of kill:RANK:STEP\[:GROUP\], stop"):
        GRAMMAR.parse(f"stop,{bad}")


def test_training_keeps_its_syntax_and_variable():
    faults = train_faults.parse("kill:1:6,delay:0.3,hold:2:4,hold:1:7,nan_loss:5,inf_grad:3,await_group:1:4")
    assert faults == train_faults.Faults((1, 6, 0), 0.3, ((2, 4), (1, 7)), 5, 3, (1, 4))
    assert train_faults.parse("kill:1:6:2").kill == (1, 6, 2)  # of replica group 2
    with pytest.raises(ValueError, match="SLUICE_TRAIN_FAULT: 'kill=1' is not one of kill:RANK:STEP"):
        train_faults.parse("kill=1")


def test_a_trainer_reads_the_variable_once_and_without_it_a_step_does_nothing(monkeypatch):
    from sluice.train.trainer import Trainer

    monkeypatch.delenv("SLUICE_TRAIN_FAULT", raising=False)
    assert train_faults.from_env() is None
    monkeypatch.setenv("SLUICE_TRAIN_FAULT", "delay:0.5")
    assert train_faults.from_env() == train_faults.Faults(delay_s=0.5)

    fired = []
    monkeypatch.setattr(train_faults, "fire", lambda *a: fired.append(a))
    trainer = SimpleNamespace(faults=None)  # started without SLUICE_TRAIN_FAULT: the variable set later is not read
    Trainer._fault(trainer, FaultPoint.STEP_START, 1)
    assert fired == []
    trainer = SimpleNamespace(
        faults=train_faults.Faults(delay_s=0.5),
        rank=0,
        dims=SimpleNamespace(world=1),
        group=0,
        run_dir=".",
        stop=SimpleNamespace(set=False),
        ckpt=SimpleNamespace(wait=lambda: None),
        model=SimpleNamespace(module=SimpleNamespace(parameters=lambda: [])),
    )
    Trainer._fault(trainer, FaultPoint.STEP_START, 1)
    assert len(fired) == 1 and fired[0][0] == train_faults.Faults(delay_s=0.5)
