"""The trainer's side of replica groups (train/trainer.py calls these at its phases): joining,
each step's quorum, the exchange with the other groups and the rescaling to the groups present,
the commit, and the events the launcher prints (a group missing or back, a step run again, a
group healed from a peer), with a digest of each rank's weights whenever the groups change or a group heals.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from sluice.train.faults import FaultPoint
from sluice.train.model.build import trainable
from sluice.train.observe.events import Event
from sluice.train.observe.heartbeat import heartbeat_path
from sluice.train.replica.group_env import replica_group
from sluice.train.replica.rows import group_tokens
from sluice.train.replica.state import digest
from sluice.train.replica.sync import ReplicaLink
from sluice.train.settings import ReplicaSync, TrainSettings

START_WAIT_S = 120.0  # a fresh job's groups wait this long at most for each other's first quorum


class ReplicaDriver:
    def __init__(self, trainer: Any):  # the Trainer (train/trainer.py), which imports this module
        self.t = trainer
        s = trainer.settings
        # what the groups exchange, heal and digest: the trained parameters (a LoRA run's adapters;
        # its frozen base is the same model in every group, built from the same source)
        self.params = trainable(trainer.model.module)
        self.link = ReplicaLink(
            trainer.group,
            s.replica_groups,
            self.params,
            trainer.optim,
            s.replica_sync,
            s.sync_every,
            s.hang_timeout,
            self._healed,
        )
        self.previous: list[int] | None = None  # the groups of the last committed step
        self._changed: tuple[list[int], str] | None = None  # this step's new groups and the digest before it
        self._joined = False  # the join's quorum is the first step's: the peers train it with this group

    @staticmethod
    def group_of(settings: TrainSettings) -> int:
        return replica_group() if settings.replica_groups > 1 else 0

    def _emit(self, kind: Event, **fields: object) -> None:
        self.t.events.emit(kind, **fields)

    def _healed(self, step: int) -> None:
        if self.t.rank == 0:
            self._emit(Event.HEALED, step=step)

    # --- joining -------------------------------------------------------------------------------
    def join(self, restore: Callable[[], int]) -> int:
        """The first quorum, which is also the first step's: a group behind a live peer takes its
        state (no disk); a fresh job's groups (all at step 0) each restore the newest checkpoint
        from the store and train the step after it."""
        assert self.t.heartbeat is not None
        restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
        if self.link.local_mode:
            return self._join_local(restore, restarted)
        self.t.heartbeat.at(0, "join")
        if not restarted:
            self._await_first_quorum()
        self.link.begin()
        self._joined = True
        if self.link.healed:
            return self.link.committed()
        start = restore()
        self.link.set_committed(start)
        if start and self.t.rank == 0:
            self._emit(Event.RESTORED, step=start)
        return start

    def _join_local(self, restore: Callable[[], int], restarted: bool) -> int:
        """LocalSGD / DiLoCo (the quorum is torchft's, at the syncs): every group restores the
        newest checkpoint; a restarted one then syncs at once, healing from a live peer."""
        assert self.t.heartbeat is not None
        if not restarted:
            self.t.heartbeat.at(0, "join")
            self._await_first_quorum()
            # the manager's step counts syncs: a fresh group's start at 1 puts a restarted one (0)
            # behind every live group, even one that has not synced yet, so that it heals
            self.link.set_committed(1)
        self.link.trained = start = restore()
        if start and self.t.rank == 0:
            self._emit(Event.RESTORED, step=start)
        self.t.heartbeat.at(start, "join")  # a restarted group: at its quorum now (faults' await_group)
        self.link.start_local(restarted)
        if self.link.healed:
            self._healed(self.link.trained)
        return self.link.trained

    def _await_first_quorum(self) -> None:
        """A fresh job's groups start their first quorum together (bounded): a group still
        loading its model would otherwise miss the first steps and heal later."""
        deadline = time.monotonic() + START_WAIT_S
        groups = range(self.t.settings.replica_groups)
        while time.monotonic() < deadline:
            if all(_phase(heartbeat_path(self.t.run_dir, g, 0)) in ("join", "quorum", "step") for g in groups):
                return
            time.sleep(0.1)

    # --- each step -----------------------------------------------------------------------------
    def next_step(self) -> int:
        # LocalSGD / DiLoCo: no quorum between syncs, and the manager's step counts syncs
        upcoming = (self.link.trained if self.link.local_mode else self.link.committed()) + 1
        assert self.t.heartbeat is not None
        self.t.heartbeat.at(upcoming, "quorum")
        self.t._fault(FaultPoint.STEP_START, upcoming)
        if self.link.local_mode:
            self.link.healed, self.link.trained = False, upcoming
            return upcoming
        if self._joined:  # the quorum of the join, which the peers already train this step in
            self._joined = False
            return upcoming
        return self.link.begin()

    def exchange(
        self, step: int, loss_sum: float, rows: list[int], tokens: int
    ) -> tuple[float, list[int] | None, int, int]:
        """Sum with the groups present; rescale this group's gradients to the mean over the tokens
        they trained (every step's exchange) or its own (LocalSGD / DiLoCo, where nothing crosses
        between syncs and the groups present are not known: None).
        (loss sum over the groups present, the groups, their trained tokens, bytes sent)"""
        s = self.t.settings
        per_group = group_tokens(self.t.data, rows, s.replica_groups)
        ex = self.link.exchange(step, loss_sum)
        present = sum(per_group[g] for g in (ex.groups if ex.groups is not None else [self.t.group])) or tokens
        own = per_group[self.t.group] if s.replica_sync is not ReplicaSync.STEP else present
        if own != tokens:
            with torch.no_grad():
                for p in self.params:
                    if p.grad is not None:
                        p.grad.mul_(tokens / max(1, own))
        self._changed = None
        # the weights before this step's update, to compare across groups: when the groups present
        # change, or a group healed from a peer (it may have restarted before its peers' quorum
        # ever left it out, so the groups present look unchanged to them)
        if ex.groups is not None and (ex.groups != self.previous or ex.healed):
            self._changed = (ex.groups, digest(self.params))
        return ex.loss_sum, ex.groups, present, ex.bytes

    def commit(self, ok: bool) -> bool:
        committed = self.link.commit(ok)
        if committed and self._changed is not None:
            groups, sha = self._changed
            step = self.link.committed()
            self._emit(Event.DIGEST, step=step, sha256=sha, groups=groups)
            if self.previous not in (None, groups) and self.t.rank == 0 and self.t.group == min(groups):
                self._emit(Event.GROUPS, step=step, groups=groups, before=self.previous)
            self.previous = groups
        return committed

    def after_update(self, step: int) -> tuple[int, int]:
        """After the optimizer step, whose torchft hook syncs LocalSGD / DiLoCo every H updates:
        the bytes sent, and the step the group is at (a peer's, if this group healed at the sync)."""
        if not self.link.local_mode:
            return 0, step
        sent = self.link.after_update()
        if self.link.healed:
            self._healed(self.link.trained)
        return sent, self.link.trained

    def retried(self, step: int) -> None:
        if self.t.rank == 0:
            self._emit(Event.RETRY, step=step, why=self.link.error() or "a replica group failed during the step")

    # --- the end -------------------------------------------------------------------------------
    def finish(self, stopped_at: int | None) -> None:
        step = self.link.trained if self.link.local_mode else self.link.committed()
        if stopped_at is not None and self.t.rank == 0:
            self._emit(Event.LEFT, step=stopped_at)
        self._emit(Event.DIGEST, step=step, sha256=digest(self.params), end=True)
        if stopped_at is None and self.t.rank == 0:
            self._emit(Event.FINISHED, step=step)

    def close(self) -> None:
        self.link.close()


def _phase(path) -> str | None:
    try:
        return json.loads(path.read_text()).get("phase")
    except (OSError, ValueError):
        return None
