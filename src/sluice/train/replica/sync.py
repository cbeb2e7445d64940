"""One replica group's link to the others, through torchft's Manager and the Lighthouse.

Every step (train/trainer.py in replica mode):

1. **quorum** (`begin`): the group's rank 0 asks the Lighthouse which groups take part in this
   step (synchronously: torchft's `use_async_quorum=False`). A group behind the others (restarted
   after a crash, or new) receives a live peer's weights and optimizer state over HTTP before the
   step (`heal`), rank r from rank r, and trains the step with them; nothing is read from disk.
   The step trained is the quorum's: the manager's committed steps + 1.
2. **exchange** (`exchange`): after the group's own backward pass (DDP or FSDP2 inside the group),
   each rank sums its gradients with the same rank of every other group present (torchft's
   fault-tolerant all-reduce), together with a small vector: its loss sum and which group it is.
   A peer that dies mid-step turns the all-reduce into an error the manager swallows.
3. **commit** (`commit`): every rank of the group agrees through the manager whether the step
   stands (no error anywhere in the group, enough groups); if not, nothing is applied and the
   same step runs again with the next quorum.

The gradient is each group's summed loss over the whole global batch's token count, so the sum
over groups is the global mean when all are present; with some missing it is rescaled to the
mean over the present groups' tokens (the global batch shrinks with the groups: docs/TRAINING.md).

LocalSGD and DiLoCo (`replica_sync`) exchange the parameters every `sync_every` steps instead of
the gradients every step; the quorum and the small vector still go every step (a few bytes), so
a group that dies or comes back is seen at the next step.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch
from torch.distributed import ReduceOp

from sluice.train.parallel.local import local_shard
from sluice.train.replica.state import load_local_state, local_state
from sluice.train.settings import ReplicaSync

GROUP_ENV = "SLUICE_REPLICA_GROUP"  # which replica group this torchrun is (0 .. replica_groups-1)
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"  # torchft's own variable: the Lighthouse's http://HOST:PORT
DEFAULT_SYNC_EVERY = 8
DILOCO_OUTER_LR, DILOCO_MOMENTUM = 0.7, 0.9  # DiLoCo's outer Nesterov SGD (Douillard et al., 2023)

# torchft logs every quorum and commit; a failed peer's errors come back through the manager
# (ReplicaLink.error) and sluice's own events. Its flight-recorder warning concerns NCCL only.
for _name in ("torchft", "torchft_quorums", "torchft_commits", "torchft_errors"):
    logging.getLogger(_name).setLevel(logging.ERROR)


def replica_group() -> int:
    return int(os.environ.get(GROUP_ENV, "0"))


@dataclass(slots=True)
class Exchanged:
    loss_sum: float  # this rank's loss sum plus the same rank's of every present group
    groups: list[int]  # the replica groups whose rank took part
    bytes: int  # what this rank handed to the cross-group all-reduces


class ReplicaLink:
    def __init__(
        self,
        group: int,
        groups: int,
        params: list[torch.nn.Parameter],
        optim: torch.optim.Optimizer,
        mode: ReplicaSync,
        sync_every: int,
        timeout_s: float,
        on_heal: Callable[[int], None],
    ):
        from torchft import Manager, ProcessGroupGloo

        self.group, self.groups = group, groups
        self.params, self.optim = params, optim
        self.mode, self.every = mode, sync_every or DEFAULT_SYNC_EVERY
        self.on_heal = on_heal
        self.outer: OuterSGD | None = OuterSGD(params) if mode is ReplicaSync.DILOCO else None
        timeout = timedelta(seconds=timeout_s)
        self.manager = Manager(
            pg=ProcessGroupGloo(timeout=timeout),
            load_state_dict=self._load,
            state_dict=self._state,
            min_replica_size=1,
            use_async_quorum=False,
            init_sync=False,
            replica_id=f"sluice_group_{group}",
            timeout=timeout,
            quorum_timeout=max(timeout, timedelta(seconds=120)),
            connect_timeout=timeout,
        )
        self.healed = False

    # --- what a recovering peer receives -------------------------------------------------------
    def _state(self) -> dict:
        state = local_state(self.params, self.optim)
        if self.outer is not None:
            state["outer"] = self.outer.state()
        return state

    def _load(self, state: dict) -> None:
        load_local_state(self.params, self.optim, state)
        if self.outer is not None and "outer" in state:
            self.outer.load(state["outer"])
        self.healed = True

    # --- one step ------------------------------------------------------------------------------
    def begin(self) -> int:
        """The quorum of the next step (healing from a peer if this group is behind); its number."""
        self.healed = False
        self.manager.start_quorum()
        step = self.manager.current_step() + 1
        if self.healed:
            self.on_heal(step - 1)
        return step

    def committed(self) -> int:
        return self.manager.current_step()

    def set_committed(self, step: int) -> None:
        """After a restore from the store: the quorum must know the group is at `step`."""
        self.manager.load_state_dict({"step": step, "batches_committed": 0})

    def syncs_at(self, step: int) -> bool:
        return self.mode is ReplicaSync.STEP or step % self.every == 0

    def exchange(self, step: int, loss_sum: float) -> Exchanged:
        """Sum gradients (every step) or average parameters (LocalSGD / DiLoCo, at sync steps)
        with the present groups; the loss sum and the groups present, summed likewise."""
        info = torch.zeros(1 + self.groups, dtype=torch.float64)
        info[0], info[1 + self.group] = loss_sum, 1.0
        sent = info.numel() * info.element_size()
        if self.mode is ReplicaSync.STEP:
            grads = [
                local_shard(p.grad) if p.grad is not None else torch.zeros_like(local_shard(p)) for p in self.params
            ]
            sent += self._all_reduce_into(grads, ReduceOp.SUM)
            for p, g in zip(self.params, grads):
                if p.grad is None:
                    p.grad = g  # a parameter another group had a gradient for (unused here)
        self.manager.allreduce(info, reduce_op=ReduceOp.SUM).wait()
        groups = [g for g in range(self.groups) if info[1 + g] > 0.5]
        return Exchanged(float(info[0]), groups, sent)

    def sync_parameters(self) -> int:
        """LocalSGD / DiLoCo at a sync step, after the local update: average the parameters (or
        their change since the last sync, for DiLoCo's outer step). The bytes sent."""
        if self.outer is not None:
            deltas = self.outer.deltas()
            sent = self._all_reduce_into(deltas, ReduceOp.AVG)
            if not self.manager.errored():
                self.outer.step(deltas)
            return sent
        with torch.no_grad():
            tensors = [local_shard(p) for p in self.params]
            return self._all_reduce_into(tensors, ReduceOp.AVG, only_if_ok=True)

    def _all_reduce_into(self, tensors: list[torch.Tensor], op: ReduceOp.RedOpType, only_if_ok: bool = False) -> int:
        """All-reduce `tensors` as one flat buffer and write the result back into them (with
        `only_if_ok`, not when a peer failed: an averaged parameter must not be half a sum)."""
        flat = torch.cat([t.reshape(-1).float() for t in tensors])
        self.manager.allreduce(flat, reduce_op=op).wait()
        if not (only_if_ok and self.manager.errored()):
            offset = 0
            for t in tensors:
                n = t.numel()
                t.copy_(flat[offset : offset + n].view_as(t))
                offset += n
        return flat.numel() * flat.element_size()

    def commit(self, ok: bool) -> bool:
        """Does the step stand? Every rank of the group gets the same answer."""
        if not ok:
            self.manager.report_error(RuntimeError("the step's loss or gradient is not usable"))
        return self.manager.should_commit()

    def error(self) -> str | None:
        err = self.manager.errored()
        return None if err is None else str(err.original_exception).splitlines()[0][:200]

    def close(self) -> None:
        self.manager.shutdown(wait=False)


class OuterSGD:
    """DiLoCo's outer optimizer: Nesterov SGD on the averaged change of the parameters since the
    last sync (the pseudo-gradient), applied to the copy all groups agreed on at that sync."""

    def __init__(self, params: list[torch.nn.Parameter]):
        self.params = params
        self.anchor = [local_shard(p).detach().clone() for p in params]
        self.momentum = [torch.zeros_like(a) for a in self.anchor]

    def deltas(self) -> list[torch.Tensor]:
        return [a - local_shard(p).detach() for a, p in zip(self.anchor, self.params)]

    @torch.no_grad()
    def step(self, deltas: list[torch.Tensor]) -> None:
        for a, m, d, p in zip(self.anchor, self.momentum, deltas, self.params):
            m.mul_(DILOCO_MOMENTUM).add_(d)
            a.sub_(d.add(m, alpha=DILOCO_MOMENTUM), alpha=DILOCO_OUTER_LR)
            local_shard(p).copy_(a)

    def state(self) -> dict:
        return {"anchor": self.anchor, "momentum": self.momentum}

    def load(self, state: dict) -> None:
        for mine, theirs in zip(self.anchor + self.momentum, state["anchor"] + state["momentum"]):
            mine.copy_(theirs)
