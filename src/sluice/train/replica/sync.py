"""One replica group's link to the others, through torchft's Manager and the Lighthouse.

Every step (train/trainer.py in replica mode):

1. **quorum** (`begin`): the group's rank 0 asks the Lighthouse which groups take part in this
   step (synchronously: torchft's `use_async_quorum=False`). A group behind the others (restarted
   after a crash, or new) receives a live peer's weights and optimizer state over HTTP before the
   step (`heal`), rank r from rank r, and trains the step with them; nothing is read from disk.
   The step trained is the quorum's: the manager's committed steps + 1.
2. **exchange** (`exchange`): after the group's own backward pass (DDP or FSDP2 inside the group),
   each rank sums its gradients with the same rank of every other group present (torchft's
   fault-tolerant all-reduce), together with a small vector: its loss sum, which group it is and
   whether it healed at this step's quorum (so every group digests its weights then).
   A peer that dies mid-step turns the all-reduce into an error the manager swallows.
3. **commit** (`commit`): every rank of the group agrees through the manager whether the step
   stands (no error anywhere in the group, enough groups); if not, nothing is applied and the
   same step runs again with the next quorum.

The gradient is each group's summed loss over the whole global batch's token count, so the sum
over groups is the global mean when all are present; with some missing it is rescaled to the
mean over the present groups' tokens (the global batch shrinks with the groups: docs/TRAINING.md).

LocalSGD and DiLoCo (`replica_sync`) are torchft's own classes (`torchft.local_sgd.LocalSGD` and
`DiLoCo`, the latter with `torch.optim.SGD(lr=0.7, momentum=0.9, nesterov=True)` as its outer
optimizer), hooked on the group's optimizer: every `sync_every` optimizer steps they take the
quorum, average the parameters (or their change since the last sync, for DiLoCo's outer step)
across the groups present, and commit. In these modes the quorum is torchft's, at each sync, and
nothing crosses between syncs (no per-step quorum, vector or commit): the manager's step counts
syncs, not training steps, and each group's step counter is its own. So:
- a group that dies is left out of the next sync's quorum (the others wait for it at most the
  Lighthouse's join timeout, `hang_timeout`); the steps a group trains are local, so "which groups
  took part" is known only at a sync, and metrics.jsonl's lines are group 0's (its own loss);
- a group that comes back restores the newest checkpoint, trains to its first sync, and heals
  there from a live peer inside torchft's quorum: the peer's parameters, optimizer state, step
  (sluice's state) and DiLoCo's backup and outer optimizer (registered by torchft's DiLoCo with the
  manager), then joins that sync's average; its steps since the restore are dropped;
- torchft counts optimizer steps to find the sync, so `nonfinite = skip` (a dropped update) is
  refused with these modes (train/settings.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
from torch.distributed import ReduceOp

from sluice.train.parallel.local import local_shard
from sluice.train.replica.state import load_local_state, local_state
from sluice.train.settings import ReplicaSync

if TYPE_CHECKING:
    from torchft.local_sgd import DiLoCo, LocalSGD

DEFAULT_SYNC_EVERY = 8
DILOCO_OUTER_LR, DILOCO_MOMENTUM = 0.7, 0.9  # DiLoCo's outer Nesterov SGD (Douillard et al., 2023)

# torchft logs every quorum and commit; a failed peer's errors come back through the manager
# (ReplicaLink.error) and sluice's own events. Its flight-recorder warning concerns NCCL only.
for _name in ("torchft", "torchft_quorums", "torchft_commits", "torchft_errors", "torchft.local_sgd"):
    logging.getLogger(_name).setLevel(logging.ERROR)


def outer_optimizer(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """DiLoCo's outer optimizer: Nesterov SGD on the averaged change since the last sync."""
    return torch.optim.SGD(params, lr=DILOCO_OUTER_LR, momentum=DILOCO_MOMENTUM, nesterov=True)


@dataclass(slots=True)
class Exchanged:
    loss_sum: float  # this rank's loss sum plus the same rank's of every present group
    groups: list[int] | None  # the replica groups whose rank took part (None: not known, LocalSGD / DiLoCo)
    bytes: int  # what this rank handed to the cross-group all-reduces
    # the groups that healed from a peer at this step's quorum: a peer that never saw them missing
    # (they restarted before its quorum left them out) still learns that the weights were sent
    healed: list[int] = field(default_factory=list)


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
        self.trained = 0  # LocalSGD / DiLoCo: the step this group trains (a healing peer takes it)
        self.updates = 0  # LocalSGD / DiLoCo: optimizer steps since the last sync (torchft counts them too)
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
        self.local_mode = mode is not ReplicaSync.STEP
        self.local: LocalSGD | DiLoCo | None = None  # torchft's, once the group has its weights

    def start_local(self, restarted: bool) -> None:
        """LocalSGD / DiLoCo: torchft's class on the trained parameters, hooked on the optimizer;
        built once the group restored its weights (DiLoCo keeps them as the last sync's). A
        restarted group syncs at once: its quorum waits for the others' next sync (the Lighthouse
        forms none with half the live groups) and heals it from a live peer there."""
        from torchft.local_sgd import DiLoCo, LocalSGD

        trained = torch.nn.ParameterList(self.params)  # the same Parameter objects (a LoRA run's adapters)
        if self.mode is ReplicaSync.LOCAL_SGD:
            self.local = LocalSGD(self.manager, trained, self.optim, self.every)
        else:
            outer = outer_optimizer(list(trained.parameters()))
            self.local = DiLoCo(self.manager, [trained], self.optim, outer, self.every)
        self.local.__enter__()
        if not restarted:
            return
        if isinstance(self.local, LocalSGD):
            self.local.sync()
        else:  # torchft's DiLoCo syncs from its optimizer hook only: as after the H-th update
            self.local._local_step = self.every - 1
            self.local._step_post_hook(self.optim, (), {})

    # --- what a recovering peer receives -------------------------------------------------------
    def _state(self) -> dict:
        state = local_state(self.params, self.optim)
        state["step"] = self.trained
        return state

    def _load(self, state: dict) -> None:
        load_local_state(self.params, self.optim, state)
        self.trained = int(state.get("step", self.trained))
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

    def exchange(self, step: int, loss_sum: float) -> Exchanged:
        """Every step's exchange: sum the gradients with the present groups, and the loss sum and
        the groups present likewise. LocalSGD / DiLoCo: nothing crosses between syncs."""
        if self.local_mode:
            return Exchanged(loss_sum, None, 0)
        info = torch.zeros(1 + self.groups, dtype=torch.float64)
        # a group's slot: 1 present, 2 present and healed from a peer at this step's quorum (the
        # same 8 bytes: the peers learn of a heal they could not see in the groups present)
        info[0], info[1 + self.group] = loss_sum, 2.0 if self.healed else 1.0
        grads = [local_shard(p.grad) if p.grad is not None else torch.zeros_like(local_shard(p)) for p in self.params]
        sent = info.numel() * info.element_size() + self._all_reduce_into(grads)
        for p, g in zip(self.params, grads):
            if p.grad is None:
                p.grad = g  # a parameter another group had a gradient for (unused here)
        self.manager.allreduce(info, reduce_op=ReduceOp.SUM).wait()
        groups = [g for g in range(self.groups) if info[1 + g] > 0.5]
        healed = [g for g in range(self.groups) if info[1 + g] > 1.5]
        return Exchanged(float(info[0]), groups, sent, healed)

    def after_update(self) -> int:
        """LocalSGD / DiLoCo, after the optimizer step (whose torchft hook synced every `every`
        updates): the bytes this rank sent, the parameters or their change at a sync, else 0."""
        self.updates += 1
        if not self.local_mode or self.updates < self.every:
            return 0
        self.updates = 0
        return sum(local_shard(p).numel() * local_shard(p).element_size() for p in self.params)

    def _all_reduce_into(self, tensors: list[torch.Tensor]) -> int:
        """Sum `tensors` across the groups as one flat buffer, written back into them."""
        flat = torch.cat([t.reshape(-1).float() for t in tensors])
        self.manager.allreduce(flat, reduce_op=ReduceOp.SUM).wait()
        offset = 0
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n
        return flat.numel() * flat.element_size()

    def commit(self, ok: bool) -> bool:
        """Does the step stand? Every rank of the group gets the same answer. LocalSGD / DiLoCo:
        the group's own agreement (`ok`); torchft commits at the sync."""
        if self.local_mode:
            return ok
        if not ok:
            self.manager.report_error(RuntimeError("the step's loss or gradient is not usable"))
        return self.manager.should_commit()

    def error(self) -> str | None:
        err = self.manager.errored()
        return None if err is None else str(err.original_exception).splitlines()[0][:200]

    def close(self) -> None:
        if self.local is not None:
            self.local.__exit__(None, None, None)
        self.manager.shutdown(wait=False)
