"""Engine processes run OpenMP with OMP_WAIT_POLICY=PASSIVE (sluice/openmp_wait.py): set unless
the user set it, before torch loads libgomp, which reads it once."""

from __future__ import annotations

import os
import subprocess
import sys

from sluice.openmp_wait import PASSIVE, VARIABLE, sleep_when_idle
from tests.openmp_display import gomp_spin_count


def test_passive_is_set_when_unset_and_a_users_choice_is_kept() -> None:
    env: dict[str, str] = {}
    assert sleep_when_idle(env, modules={}) and env == {VARIABLE: PASSIVE}
    env = {VARIABLE: "ACTIVE"}
    assert not sleep_when_idle(env, modules={}) and env == {VARIABLE: "ACTIVE"}
    env = {VARIABLE: "passive"}
    assert sleep_when_idle(env, modules={}) and env == {VARIABLE: "passive"}


def test_too_late_once_torch_is_loaded() -> None:
    """libgomp read its environment when torch loaded it: the variable is still set (children
    inherit it), but this process's threads keep the policy they started with."""
    env: dict[str, str] = {}
    assert not sleep_when_idle(env, modules={"torch": object()})
    assert env == {VARIABLE: PASSIVE}


def _spin_count(code: str) -> str:
    """libgomp's spin count in a fresh interpreter that runs `code`."""
    env = {k: v for k, v in os.environ.items() if k not in (VARIABLE, "GOMP_SPINCOUNT")}
    env.update(OMP_DISPLAY_ENV="verbose", PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    return gomp_spin_count(run.stderr)


def test_torchs_openmp_threads_do_not_spin_after_it():
    assert _spin_count("import torch") != "0"  # the default this changes
    assert _spin_count("from sluice.openmp_wait import sleep_when_idle; sleep_when_idle(); import torch") == "0"
