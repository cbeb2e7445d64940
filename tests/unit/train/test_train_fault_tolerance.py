"""The pieces of per-step fault tolerance that need no torchrun: the launcher's progress lines
(throttled by an injected clock, a line per fault), the watchdog (an injected clock, a real child
process it kills), stragglers, metrics.jsonl's writer under replica groups, the settings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.train.errors import TrainConfigError
from sluice.train.metrics import MetricsWriter, read_metrics
from sluice.train.observe.events import Event, EventLog, read_events
from sluice.train.observe.heartbeat import heartbeat_path
from sluice.train.observe.progress import Progress, describe
from sluice.train.observe.stragglers import spread
from sluice.train.settings import load_settings
from sluice.train.watchdog import Watchdog
from tests.unit.train.test_train_observe import _metrics


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _line(run: Path, step: int, **kw) -> None:
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": step, "loss": 2.0, "tokens_per_s": 1000.0, **kw}) + "\n")


def test_progress_lines_are_throttled_and_faults_get_a_line_each(tmp_path):
    clock, said = Clock(), []
    progress = Progress(tmp_path, total=10, interval=5.0, say=said.append, groups=2, clock=clock)
    events = EventLog(tmp_path, group=0, rank=0)
    for step in range(1, 5):
        _line(tmp_path, step, replica_groups=[0, 1])
        clock.now += 1.0
        progress.poll()
    assert [s.split(" |")[0] for s in said] == ["step 1/10"]  # the first, then at most one per 5 s
    clock.now += 5.0
    events.emit(Event.CHECKPOINT, step=4)
    EventLog(tmp_path, group=1, rank=0).emit(Event.HEALED, step=4)
    events.emit(Event.GROUPS, step=5, groups=[0], before=[0, 1])
    _line(tmp_path, 5, replica_groups=[0])
    progress.poll()
    assert said[1:3] == [
        "[recovery] replica group 1 rejoined at step 4: weights and optimizer state from a live peer",
        "[fault] step 5: replica group(s) 1 missing (groups 0,1 -> 0)",
    ]
    assert said[3].startswith("step 5/10 | loss 2.0000 | 1,000 tok/s | ETA 0:00:")
    assert said[3].endswith("| checkpoint 4 | groups 0")
    _line(tmp_path, 6)
    progress.poll(final=True)  # the last step seen is always said
    assert said[-1].startswith("step 6/10")


def test_progress_after_a_restart_skips_what_the_restarted_run_kept(tmp_path: Path) -> None:
    said: list[str] = []
    for step in (1, 2, 3):
        _line(tmp_path, step)
    progress = Progress(tmp_path, total=5, interval=0.0, say=said.append)
    assert said == []  # a resumed run's old lines were said by the run before
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")  # cut back to step 1
    EventLog(tmp_path).emit(Event.RESTORED, step=1)
    _line(tmp_path, 2)
    progress.poll()
    assert [s.split(" |")[0] for s in said] == [
        "[recovery] the ranks resumed from the checkpoint of step 1",
        "step 2/5",
    ]


def test_events_are_whole_lines_from_any_process(tmp_path):
    EventLog(tmp_path, group=1, rank=0).emit(Event.RETRY, step=3, why="peer gone")
    with (tmp_path / "events.jsonl").open("a") as f:
        f.write('{"event": "cut')  # a line being written
    events, offset = read_events(tmp_path)
    assert [(e["event"], e["group"], e["rank"], e["step"]) for e in events] == [("retry", 1, 0, 3)]
    assert describe(events[0], groups=2) == "[fault] replica group 1: step 3 not committed (peer gone): it runs again"
    assert read_events(tmp_path, offset) == ([], offset)


def _beat(run: Path, pid: int, beat: int, host: str, group: int = 0) -> None:
    path = heartbeat_path(run, group, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "group": group,
                "rank": 1,
                "host": host,
                "pid": pid,
                "restart": 0,
                "beat": beat,
                "step": 7,
                "phase": "step",
            }
        )
    )


def test_the_watchdog_kills_a_silent_rank_after_the_bound_and_spares_a_beating_one(tmp_path):
    import socket

    host = socket.gethostname()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        clock = Clock()
        dog = Watchdog(tmp_path, hang_timeout=10.0, ancestors=lambda: {child.pid}, clock=clock)
        _beat(tmp_path, child.pid, 1, host)
        assert dog.poll() == []
        for beat in range(2, 5):  # beating: never hung, however long
            clock.now += 9.0
            _beat(tmp_path, child.pid, beat, host)
            assert dog.poll() == []
        clock.now += 9.0
        assert dog.poll() == []  # silent, but not for 10 s yet
        _beat(tmp_path, 999_999, 1, "another-host", group=1)  # another machine's rank is its launcher's
        clock.now += 2.0
        (hang,) = dog.poll()
        assert (hang.group, hang.rank, hang.host, hang.pid, hang.step) == (0, 1, host, child.pid, 7)
        assert child.wait(timeout=60) == -9
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_the_watchdog_kills_only_what_this_launcher_started(tmp_path):
    import socket

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        clock = Clock()
        dog = Watchdog(tmp_path, hang_timeout=1.0, ancestors=lambda: {1_000_000_000}, clock=clock)
        _beat(tmp_path, child.pid, 1, socket.gethostname())
        dog.poll()
        clock.now += 5.0
        assert dog.poll() == [] and child.poll() is None
    finally:
        child.kill()
        child.wait()


def test_stragglers_are_ranks_above_the_factor_times_the_median():
    s = spread([1.0, 1.1, 0.9, 2.5], factor=1.5)
    assert (s.slowest, s.median, s.stragglers) == (2.5, 1.05, [3])
    assert spread([0.5], 1.5).stragglers == [] and spread([], 1.5).slowest == 0.0


def test_metrics_under_replica_groups_are_cut_only_from_the_first_line_this_process_writes(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 6)))
    writer = MetricsWriter(path, True, None)  # a group joining mid-run: leaves the others' lines
    assert [m["step"] for m in read_metrics(path)] == [1, 2, 3, 4, 5]
    writer.write(_metrics(step=4))  # a whole-job restart resumed at 3: its old future goes
    writer.close()
    assert [m["step"] for m in read_metrics(path)] == [1, 2, 3, 4]
    assert read_metrics(path)[-1]["replica_groups"] is None


def _settings(**kw):
    return load_settings(None, {"data": "d.jsonl", "out": "runs/r", "max_steps": 4, **kw})


def test_replica_group_settings_are_checked():
    s = _settings(nproc=4, replica_groups=2, batch_size=8)
    assert (s.group_size, s.group_batch, s.dims().world) == (2, 4, 2)
    for bad, needle in [
        ({"nproc": 3, "replica_groups": 2}, "multiple of replica_groups"),
        ({"nproc": 2, "replica_groups": 2, "parallel": "tp"}, "ddp or fsdp"),
        ({"nproc": 2, "replica_groups": 2, "batch_size": 3}, "multiple of nproc"),
        ({"nproc": 2, "replica_sync": "diloco"}, "replica_groups >= 2"),
        ({"nproc": 2, "replica_groups": 2, "sync_every": 4}, "local_sgd or diloco"),
        ({"nproc": 2, "replica_groups": 2, "replica_sync": "diloco", "nonfinite": "skip"}, "need stop"),
        ({"lighthouse": "lighthouse:29510"}, "lighthouse"),
    ]:
        with pytest.raises(TrainConfigError) as exc:
            _settings(**bad)
        assert needle in str(exc.value), (bad, str(exc.value))
    assert _settings(nproc=2, replica_groups=2, replica_sync="local_sgd", sync_every=4).sync_every == 4


def test_diloco_outer_step_is_nesterov_on_the_averaged_change():
    import torch

    from sluice.train.replica.sync import DILOCO_MOMENTUM, DILOCO_OUTER_LR, outer_optimizer

    # torchft's DiLoCo sets the averaged change since the last sync (the pseudo-gradient) as the
    # gradient of the parameters restored to that sync's values, then steps this optimizer
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    outer = outer_optimizer([p])
    d = torch.tensor([0.1, -0.2])
    p.grad = d.clone()
    outer.step()  # the first step: the momentum buffer is the change itself
    expected = torch.tensor([1.0, 2.0]) - DILOCO_OUTER_LR * (1 + DILOCO_MOMENTUM) * d
    assert torch.allclose(p.detach(), expected)


def test_a_peer_state_loads_into_an_optimizer_that_has_not_stepped_yet():
    import torch

    from sluice.train.replica.state import digest, load_local_state, local_state

    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    opt_a, opt_b = torch.optim.AdamW(a.parameters()), torch.optim.AdamW(b.parameters())
    a(torch.randn(2, 4)).sum().backward()
    opt_a.step()
    assert digest(list(a.parameters())) != digest(list(b.parameters()))
    load_local_state(list(b.parameters()), opt_b, local_state(list(a.parameters()), opt_a))
    assert digest(list(a.parameters())) == digest(list(b.parameters()))
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(opt_a.state[pa]["exp_avg"], opt_b.state[pb]["exp_avg"])


def test_await_group_holds_a_fast_restart_until_the_others_wait_at_the_step(tmp_path):
    """CI once saw a restarted group rejoin a step early on a busy machine: the restarted group of
    `await_group:1:6` must wait, before its torchft manager exists, until every other group waits
    at step 6 (rank_setup.py calls this before the replica driver is built)."""
    import threading

    from sluice.train import faults as train_faults

    faults = train_faults.parse("await_group:1:6")
    beat = heartbeat_path(tmp_path, 0, 0)
    beat.parent.mkdir(parents=True)
    beat.write_text(json.dumps({"restart": 0, "step": 5, "phase": "step"}))
    heartbeat_path(tmp_path, 1, 0).write_text(json.dumps({"restart": 0, "step": 3, "phase": "step"}))  # its old self
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (train_faults.at_rejoin(faults, tmp_path, 1), done.set()))
    waiter.start()
    assert not done.wait(0.5)  # group 0 is at step 5: the restarted group waits
    beat.write_text(json.dumps({"restart": 0, "step": 6, "phase": "quorum"}))
    assert done.wait(60)
    waiter.join()
    # group 0 itself is not held at a rejoin
    beat.write_text(json.dumps({"restart": 0, "step": 1, "phase": "step"}))
    train_faults.at_rejoin(faults, tmp_path, 0)
