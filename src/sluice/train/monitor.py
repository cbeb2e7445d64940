"""The launcher's two background threads while ranks train: progress lines for the terminal
(train/observe/progress.py) and the watchdog that finds a rank that stopped (train/watchdog.py),
each polled every half second. What the watchdog finds goes to RUN/events.jsonl, and from there
to the terminal, like every other event. Two threads: a terminal that does not read (a full
pipe, a paused tty) blocks the progress lines, never the watchdog."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path

from sluice.train.observe.events import Event, EventLog
from sluice.train.observe.progress import Progress
from sluice.train.settings import TrainSettings
from sluice.train.watchdog import Watchdog

POLL_S = 0.5


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Monitor:
    def __init__(self, settings: TrainSettings, torchrun_pids: Callable[[], set[int]]):
        run_dir: Path = settings.run_dir
        self.run_dir = run_dir
        self.groups = settings.replica_groups
        self.progress = Progress(run_dir, settings.max_steps, settings.progress_interval, _say, settings.replica_groups)
        self.watchdog = Watchdog(run_dir, settings.hang_timeout, torchrun_pids)
        self.watchdog.clear()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._every, args=(f,), name=f"sluice-train-{f.__name__}", daemon=True)
            for f in (self.watch, self.progress.poll)
        ]

    def __enter__(self) -> Monitor:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        self.progress.poll(final=True)

    def _every(self, poll) -> None:
        while not self._stop.wait(POLL_S):
            try:
                poll()
            except Exception as exc:  # the terminal's lines and the watchdog must never stop the run
                _say(f"(train monitor: {type(exc).__name__}: {exc})")

    def watch(self) -> None:
        for hang in self.watchdog.poll():
            action = (
                f"killed; replica group {hang.group} is evicted, its torchrun restarts it and it "
                "recovers from a live peer"
                if self.groups > 1
                else "killed; torchrun restarts the job from the newest checkpoint"
            )
            EventLog(self.run_dir, hang.group, hang.rank).emit(
                Event.HANG,
                pid=hang.pid,
                step=hang.step,
                phase=hang.phase,
                silent_s=round(hang.silent_s, 1),
                bound_s=self.watchdog.timeout,
                action=action,
            )
