"""What the person at the launcher's terminal sees while a run trains: step lines, throttled, and
one line per fault or recovery, printed by `sluice train run` itself (once, not once per rank),
from the files the ranks write anyway: metrics.jsonl (one line per step) and events.jsonl.

    step 120/200 | loss 2.3141 | 1,530 tok/s | ETA 0:01:47 | checkpoint 100 | groups 0,1
    [fault] replica group 1 left the quorum at step 121 (groups 0,1 -> 0)
    [recovery] replica group 1 rejoined at step 127: weights from a live peer

A step line at most every `interval` seconds (the first and the last always), like torchtitan's
step lines; the ETA is the mean wall time of the steps seen so far times the steps left.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from sluice.train.observe.events import Event, read_events


@dataclass(slots=True)
class _Tail:
    path: Path
    offset: int = 0
    keep_after: int = 0  # after a rewrite (a restart resumed at this step), lines up to it are old

    def lines(self) -> list[dict]:
        try:
            with self.path.open("rb") as f:
                if f.seek(0, 2) < self.offset:  # rewritten by a restarted run: read it again
                    self.offset = 0
                    rewritten = True
                else:
                    rewritten = False
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        out = []
        for line in data[:end].splitlines():
            try:
                m = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not rewritten or m.get("step", 0) > self.keep_after:
                out.append(m)
        return out


def _groups(groups: list[int] | None) -> str:
    return ",".join(map(str, groups)) if groups else "-"


def describe(event: dict, groups: int = 1) -> str | None:
    """The terminal line of one event (None: not worth a line); `groups`: the run's replica groups."""
    kind, g = event.get("event"), event.get("group", 0)
    step = event.get("step")
    who = f"replica group {g}" if groups > 1 else "the ranks"
    if kind == Event.STARTED.value and event.get("rank") == 0 and event.get("restart", 0) > 0:
        return f"[recovery] {who} restarted by torchrun (attempt {event['restart'] + 1})"
    if kind == Event.RESTORED.value and event.get("rank") == 0 and step:
        return f"[recovery] {who} resumed from the checkpoint of step {step}"
    if kind == Event.HEALED.value and event.get("rank") == 0:
        return f"[recovery] replica group {g} rejoined at step {step}: weights and optimizer state from a live peer"
    if kind == Event.GROUPS.value:
        before, now = event.get("before") or [], event.get("groups") or []
        gone, new = sorted(set(before) - set(now)), sorted(set(now) - set(before))
        what = "; ".join(
            ([f"replica group(s) {_groups(gone)} missing"] if gone else [])
            + ([f"replica group(s) {_groups(new)} back"] if new else [])
        )
        tag = "[fault]" if gone else "[recovery]"
        return f"{tag} step {step}: {what} (groups {_groups(before)} -> {_groups(now)})"
    if kind == Event.RETRY.value and event.get("rank") == 0:
        return (
            f"[fault] replica group {g}: step {step} not committed ({event.get('why', 'a peer failed')}): it runs again"
        )
    if kind == Event.LEFT.value and event.get("rank") == 0:
        return f"[fault] replica group {g} left after step {step} (stop signal); the others go on"
    if kind == Event.HANG.value:
        action = event.get("action", "")
        return (
            f"[fault] rank {event.get('rank')} of group {g} on host {event.get('host')} (pid {event.get('pid')}) "
            f"made no progress for {event.get('bound_s', 0):g} s (hang_timeout) at step {step} ({event.get('phase')}): "
            f"{action}"
        )
    return None


@dataclass(slots=True)
class Progress:
    run_dir: Path
    total: int
    interval: float
    say: Callable[[str], None]
    groups: int = 1  # replica groups
    clock: Callable[[], float] = time.monotonic
    _metrics: _Tail = field(init=False)
    _events_offset: int = 0
    _last_print: float | None = None
    _first: tuple[float, int] | None = None  # (clock, step) of the first step line seen
    _checkpoints: list[int] = field(default_factory=list)
    _pending: dict | None = None  # the newest step line not printed yet

    def __post_init__(self) -> None:
        self._metrics = _Tail(self.run_dir / "metrics.jsonl")
        # a resumed run: what is already in the files was said by the run before
        self._metrics.offset = self._size(self.run_dir / "metrics.jsonl")
        _, self._events_offset = read_events(self.run_dir, self._size(self.run_dir / "events.jsonl"))

    @staticmethod
    def _size(path: Path) -> int:
        try:
            return path.stat().st_size
        except FileNotFoundError:
            return 0

    def poll(self, final: bool = False) -> None:
        events, self._events_offset = read_events(self.run_dir, self._events_offset)
        for event in events:
            if event.get("event") == Event.CHECKPOINT.value:
                self._checkpoints.append(int(event["step"]))
                continue
            if event.get("event") == Event.RESTORED.value:
                self._metrics.keep_after = int(event.get("step") or 0)
            if (line := describe(event, self.groups)) is not None:
                self.say(line)
        for m in self._metrics.lines():
            now = self.clock()
            if self._first is None:
                self._first = (now, m["step"])
            due = self._last_print is None or now - self._last_print >= self.interval or m["step"] >= self.total
            self._pending = m
            if due:
                self._print(m, now)
        if final and self._pending is not None:
            self._print(self._pending, self.clock())

    def _print(self, m: dict, now: float) -> None:
        self._pending, self._last_print = None, now
        eta = "-"
        if self._first is not None and m["step"] > self._first[1]:
            per_step = (now - self._first[0]) / (m["step"] - self._first[1])
            eta = str(timedelta(seconds=round(per_step * max(0, self.total - m["step"]))))
        loss = "nan" if m.get("loss") is None else f"{m['loss']:.4f}"
        saved = max((c for c in self._checkpoints if c <= m["step"]), default=None)  # as of this step
        parts = [
            f"step {m['step']}/{self.total}",
            f"loss {loss}",
            f"{m.get('tokens_per_s', 0):,.0f} tok/s",
            f"ETA {eta}",
            f"checkpoint {saved if saved is not None else '-'}",
        ]
        if m.get("replica_groups") is not None:
            parts.append(f"groups {_groups(m['replica_groups'])}")
        if m.get("stragglers"):
            parts.append(f"stragglers {_groups(m['stragglers'])}")
        self.say(" | ".join(parts))
