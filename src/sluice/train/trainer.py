"""One rank of a training run, in named phases (as torchtitan's Trainer reads):

    setup       join the process group, take the run's lease (rank 0), build and wrap the model
                on the run's parallel degrees, restore the newest intact checkpoint
    train       for each step to max_steps:
      step        the step's rows, forward and backward, clip, agree, update
      checkpoint  publish a finished background save; save when due
      log         one metrics line (rank 0)
    close       wait for the last checkpoint, release the lease, leave the process group

With replica groups (train/replica/) each step begins with the quorum of the groups present
(a group behind heals from a live peer there), the gradients are summed across the groups after
the group's own backward pass, and the step stands only if the manager commits it.

Every step ends with one small all-reduce before the update (the loss sum, a stop signal, a
non-finite value, a lost lease): every rank applies or drops the same step, and a SIGTERM seen by
any rank stops all ranks after the same step, with a checkpoint, and exit code 0. The launcher
(train/launch.py) has already validated the settings, written them to RUN/resolved_config.json
and tokenized the data into RUN/data/.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist

from sluice.train import faults
from sluice.train.data import sampler
from sluice.train.errors import TrainHaltError
from sluice.train.faults import FaultPoint
from sluice.train.launch import STOPPED_MARKER
from sluice.train.lr import lr_at
from sluice.train.model.lora import seed_dropout
from sluice.train.observe.console import say
from sluice.train.outcome import StepOutcome, agree, nonfinite_message
from sluice.train.parallel.wrap import clip_grad_norm
from sluice.train.rank_setup import RankSetup
from sluice.train.settings import NonFinite
from sluice.train.step import forward_backward, gather_rows, trained_tokens


class Trainer(RankSetup):
    def __init__(self, run_dir: Path):
        super().__init__(run_dir)
        self.quorum_s = 0.0  # the current step's wait for its quorum (replica groups), counted as communication

    def run(self) -> int:
        try:
            self.setup()
            self.train()
            return 0
        finally:
            self.close()

    # --- the loop ----------------------------------------------------------------------------
    def train(self) -> None:
        s = self.settings
        stopped_at = None
        step = self.start
        while step < s.max_steps:
            quorum_started = time.perf_counter()
            step = self._next_step(step)
            self.quorum_s = time.perf_counter() - quorum_started  # replica groups: the quorum's wait
            if step > s.max_steps:  # healed from a peer that had finished
                break
            assert self.heartbeat is not None
            self.heartbeat.at(step, "step")
            outcome = self.step(step)
            step = outcome.step  # LocalSGD / DiLoCo: a peer's, if this group healed at the sync
            if outcome.retry:  # not committed: the next quorum runs the same step again
                assert self.replicas is not None
                self.replicas.retried(step)
                step -= 1
                continue
            if outcome.lease_lost:  # write nothing more: the run belongs to the other group now
                raise TrainHaltError(
                    f"the run's lease was taken by another group "
                    f"({self.lease.lost if self.lease else 'see rank 0'}): "
                    "this group stopped without writing"
                )
            halt = outcome.nonfinite and s.nonfinite is NonFinite.STOP
            saved = 0.0 if halt else self.checkpoint(step, final=outcome.stopped or step == s.max_steps)
            self.log(outcome, saved)
            if halt:  # a non-finite step never becomes a checkpoint
                self.ckpt.wait()
                raise TrainHaltError(nonfinite_message(outcome, self.store))
            if outcome.stopped:
                stopped_at = step
                break
        self._finish(stopped_at)

    def _next_step(self, done: int) -> int:
        """The step to train after `done`: the next, or with replica groups the quorum's."""
        if self.replicas is not None:
            return self.replicas.next_step()
        self._fault(FaultPoint.STEP_START, done + 1)
        return done + 1

    def step(self, step: int) -> StepOutcome:
        s, dims = self.settings, self.dims
        t0, cpu0 = time.perf_counter(), time.process_time()
        lr = lr_at(step, s.lr, s.warmup_steps, s.max_steps, s.lr_schedule)
        for group in self.optim.param_groups:
            group["lr"] = lr
        rows = sampler.global_batch(self.data.rows, s.seed, step - 1, s.batch_size)
        # this rank's share: its replica group's part of the batch, then its data-parallel part
        # (tensor / pipeline ranks share rows)
        per, share = s.group_batch // dims.dp, self.group * dims.dp + dims.data_rank(self.rank)
        seed_dropout(s, step, share)  # LoRA dropout's masks: a function of the step, as the rows are
        batch = gather_rows(self.data, rows[share * per : (share + 1) * per], self.device)
        tokens = trained_tokens(self.data, rows)
        t1 = time.perf_counter()
        if self.model.train_step is not None:  # a pipeline schedule
            loss_sum = self.model.train_step(batch, tokens)
        else:
            loss_sum = forward_backward(self.model.module, self.model.no_sync, batch, self.micro, tokens, dims.dp)
        self._fault(FaultPoint.AFTER_BACKWARD, step, loss_sum)
        compute = time.perf_counter() - t1 - self.model.stats.last_wait()
        total_loss, groups, present_tokens, sent = loss_sum.item(), None, tokens, 0
        if self.replicas is not None:  # sum with the other groups; the mean over those present
            total_loss, groups, present_tokens, sent = self.replicas.exchange(step, total_loss, rows, tokens)
        norm = clip_grad_norm(self.model, s.grad_clip).item()  # sluice's own, in every mode (parallel/clip.py)
        lost = self.lease is not None and self.lease.lost is not None
        agreed, reduce_time, times = agree(total_loss, norm, compute, self.stop.set, lost, self.dims, self.rank)
        loss, stopped, nonfinite, lost = agreed
        committed = self.replicas.commit(not (nonfinite or lost)) if self.replicas is not None else True
        if committed and not (nonfinite or lost):
            self.optim.step()
            if self.replicas is not None:
                synced, step = self.replicas.after_update(step)
                sent += synced
        self.optim.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        q = self.quorum_s  # the step began with its quorum (replica groups): communication waited for
        return StepOutcome(
            step,
            lr,
            rows,
            present_tokens,
            loss / max(1, present_tokens),
            norm,
            stopped,
            nonfinite,
            lost,
            not committed,
            groups,
            times,
            sent,
            t0 - q,
            cpu0,
            t1 - t0,
            t2 - t1 + q,
            self.model.stats.take_wait() + reduce_time + q,
        )

    def checkpoint(self, step: int, final: bool) -> float:
        """Publish a background save that finished; save this step if due. The seconds the step
        was held."""
        s = self.settings
        self.ckpt.poll()
        if final:  # the end of the run or a stop: written before the process exits
            return self.ckpt.save(self.model.module, self.optim, step, wait=True)
        if s.checkpoint_every and step % s.checkpoint_every == 0:
            return self.ckpt.save(self.model.module, self.optim, step)
        return 0.0

    def log(self, o: StepOutcome, checkpoint_time: float) -> None:
        s = self.settings
        comm_bytes, comm_time = self.model.stats.take()
        comm_bytes += o.extra_bytes
        if self.model.fsdp_bytes_per_micro:
            comm_bytes = (
                self.model.fsdp_bytes_per_micro * max(1, s.group_batch // self.dims.dp // self.micro) + o.extra_bytes
            )
        assert self.metrics is not None
        if self.group != 0 if o.groups is None else (not o.groups or self.group != min(o.groups)):
            return  # the lowest replica group present writes the step's line (LocalSGD / DiLoCo: group 0)
        self.metrics.write(self.line.metrics(o, comm_bytes, comm_time, checkpoint_time))
        if o.nonfinite and s.nonfinite is NonFinite.SKIP and self.rank == 0:
            say(
                f"step {o.step}: the loss or the gradient norm is not finite: its update was skipped (nonfinite = skip)"
            )

    def _fault(self, point: FaultPoint, step: int, loss_sum: torch.Tensor | None = None) -> None:
        """The trainer's one call into the deterministic test faults (train/faults.py): None,
        and nothing done, unless SLUICE_TRAIN_FAULT named some when the rank started."""
        if self.faults is None:
            return
        faults.fire(
            self.faults,
            point,
            faults.FaultSite(
                self.rank,
                self.dims.world,
                step,
                self.group,
                self.run_dir,
                lambda: self.stop.set,
                self.ckpt.wait,
                loss_sum,
                self.model.module.parameters(),
            ),
        )

    # --- the end -----------------------------------------------------------------------------
    def _finish(self, stopped_at: int | None) -> None:
        """The normal end: the last checkpoint on disk, every rank there."""
        self.ckpt.wait()
        if self.rank == 0 and stopped_at is not None and self.writes:
            (self.run_dir / STOPPED_MARKER).write_text(f"{stopped_at}\n")
            say(f"stop signal: checkpoint at step {stopped_at} written, exiting")
        if self.replicas is not None:
            self.replicas.finish(stopped_at)
        if self.base is not None:
            self.base.finish()
        dist.barrier()

    def close(self) -> None:
        """Whatever ran, on any exit: the open files, the replica groups, the lease, the process
        group — what setup took, in the reverse order (RankSetup.releases)."""
        self.releases.close()
