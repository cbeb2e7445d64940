"""Save and restore the whole training state with torch.distributed.checkpoint (DCP).

The state is {model, optimizer, train: {step}}, taken with DCP's get_state_dict, so the same
code saves a plain module, a DDP replica or FSDP2 shards, and a checkpoint loads into any world
size and either wrapping (DCP reshards on load). Nothing else needs saving for an exact resume:
the data order is a function of (seed, step) (data/sampler.py), the learning rate of the step,
and the training forward uses no randomness (no dropout in the Llama family; a LoRA run's
dropout draws from a generator seeded by the step, train/model/lora.py).

Asynchronous saves (DCP async_save) copy the state to CPU memory at once and write it from a
background thread over a process group of their own (a gloo group: the training collectives
must not share one with a thread). The step goes on while the files are written; the next save,
the end of the run, or a shutdown waits for the previous one, and rank 0 then publishes it
(checkpoint/layout.py).

Restoring verifies what it loads against the checkpoint's manifest of checksums (checkpoint/
verified.py): a damaged checkpoint (a file overwritten, cut short or missing) is reported by
name and skipped for the next older one, and every rank skips the same ones (they agree on each
verdict, and DCP gathers a failure on any rank to all of them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from sluice.errors import SluiceError
from sluice.train.checkpoint.store import CheckpointStore, LocalStore
from sluice.train.errors import CheckpointDamaged, TrainHaltError
from sluice.train.parallel.expert import global_views, local_views

log = logging.getLogger("sluice.train.checkpoint")


# The optimizer's state keyed by parameter name (`state.<fqn>.exp_avg`, `param_groups.<fqn>.lr`),
# not by group index: a pipeline stage's ranks hold different parameters, and DCP keeps one copy
# of a key all ranks write, so an index-keyed `param_groups.0.params` saved by one stage would
# be read back by the other (a pipeline checkpoint would not resume as a pipeline).
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
# A LoRA run (train/model/lora.py) saves its trainable parameters only: the frozen base is the
# model it started from, rebuilt at every start, so its checkpoints hold the adapters and their
# AdamW state. Loading is then not strict about the frozen keys the checkpoint lacks (DCP itself
# still fails on any requested key the checkpoint does not hold).
_TRAINABLE_ONLY = StateDictOptions(flatten_optimizer_state_dict=True, ignore_frozen_params=True, strict=False)


def state_options(model: torch.nn.Module) -> StateDictOptions:
    """How `model`'s state is saved and loaded: whole, or (frozen parameters) the trainable part."""
    return _TRAINABLE_ONLY if any(not p.requires_grad for p in model.parameters()) else _OPTIONS


def model_state(model: torch.nn.Module, optim: torch.optim.Optimizer | None = None) -> tuple[dict, dict]:
    """(model, optimizer) state dicts as DCP saves and loads them, without any frozen tensor.

    `ignore_frozen_params` drops the names `named_parameters()` gives, which names a tied tensor
    once: the frozen embedding of a model whose head is tied to it (SmolLM2) stayed in a LoRA
    checkpoint as `lm_head.weight` (113 MB of the bundled model's 150 MB). Every name of a frozen
    tensor is dropped here (without DDP's `module.` prefix, which DCP's names lack too)."""
    options = state_options(model)
    optim_sd: dict[str, Any]
    if optim is None:
        model_sd, optim_sd = get_model_state_dict(model, options=options), {}
    else:
        model_sd, optim_sd = get_state_dict(model, optim, options=options)
    if options.ignore_frozen_params:
        frozen = {
            n.removeprefix("module.") for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad
        }
        model_sd = {k: v for k, v in model_sd.items() if k not in frozen}
    return model_sd, optim_sd


def damage_in(exc: CheckpointException) -> CheckpointDamaged | None:
    """The first damage any rank found during a DCP load (None: it failed for another reason)."""
    for _rank, (failure, _trace) in sorted(exc.failures.items()):
        if isinstance(failure, CheckpointDamaged):
            return failure
    return None


def first_failure(exc: CheckpointException, rank: int = 0) -> BaseException:
    """The exception inside DCP's CheckpointException (whose text is every rank's traceback) to
    report: `rank`'s own if it failed, else the lowest failed rank's."""
    failures = exc.failures
    return failures[rank][0] if rank in failures else min(failures.items())[1][0]


def _plainly(exc: CheckpointException, rank: int) -> BaseException:
    """What a failed save raises: sluice's own error (one line: the store, the object, the
    cause) where a rank failed with one, else DCP's exception as it is."""
    cause = first_failure(exc, rank)
    return cause if isinstance(cause, SluiceError) else exc


class Checkpointer:
    def __init__(
        self,
        root: Path | CheckpointStore,
        keep: int,
        use_async: bool,
        report: Callable[[str], None] | None = None,
        guard: Callable[[], bool] | None = None,
        writes: bool = True,
        on_publish: Callable[[int], None] | None = None,
    ):
        # a folder (RUN/checkpoints) or any store (checkpoint/store.py: a folder or S3)
        self.store: CheckpointStore = LocalStore(root) if isinstance(root, Path) else root
        self.keep = keep
        self.use_async = use_async
        self.report = report or log.warning  # rank 0's lines to the person at the terminal
        self.guard = guard  # rank 0: is the run's lease still this group's? (checkpoint/lease.py)
        # replica groups: one group writes (train/replica/); the others only restore
        self.writes = writes
        self.on_publish = on_publish  # rank 0: told each published step (the run's events)
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self._pending: tuple[int, Future] | None = None
        if self.rank == 0 and writes:
            self.store.prepare(keep)
        if dist.is_initialized():
            dist.barrier()

    def save(self, model: torch.nn.Module, optim: torch.optim.Optimizer, step: int, wait: bool = False) -> float:
        """Start saving the state after `step`; the seconds the training loop was held."""
        if not self.writes:
            return 0.0
        started = time.perf_counter()
        self.wait()
        model_sd, optim_sd = model_state(model, optim)
        global_views(model, model_sd, optim_sd)  # expert-parallel shards saved as parts of one tensor
        state = {"model": model_sd, "optim": optim_sd, "train": {"step": step}}
        writer = self.store.writer(step)
        if self.use_async and not wait:
            fut = dcp.async_save(state, storage_writer=writer, process_group=self.group)
            if not isinstance(fut, Future):  # an AsyncSaveResponse comes only with an async_stager
                raise TypeError(f"dcp.async_save answered a {type(fut).__name__}, not a Future")
            self._pending = (step, fut)
        else:
            try:
                dcp.save(state, storage_writer=writer, process_group=self.group)
            except CheckpointException as exc:
                raise _plainly(exc, self.rank) from None
            self._publish(step)
        return time.perf_counter() - started

    def poll(self) -> None:
        """Publish a background save that has finished (called once per step, never blocks)."""
        if self._pending is not None and self._pending[1].done():
            self.wait()

    def wait(self) -> None:
        if self._pending is None:
            return
        step, fut = self._pending
        self._pending = None
        try:
            fut.result()  # raises if the write failed: a run must not go on believing it is saved
        except CheckpointException as exc:
            raise _plainly(exc, self.rank) from None
        self._publish(step)

    def _publish(self, step: int) -> None:
        # DCP's coordinator (rank 0) writes the metadata after gathering every rank's write
        # results, so rank 0's save returning means every rank's files are complete
        if self.rank == 0:
            if self.guard is not None and not self.guard():  # another group holds the run now
                self.report(f"checkpoint of step {step} not published: the run's lease was lost")
                return
            log.info("checkpoint %s written", self.store.publish(step, self.keep))
            if self.on_publish is not None:
                self.on_publish(step)

    def restore(self, model: torch.nn.Module, optim: torch.optim.Optimizer) -> int:
        """Load the newest intact checkpoint into model and optimizer; its step (0 if none)."""
        if self.rank == 0:
            for step in self.store.incomplete_steps():
                self.report(f"checkpoint {self.store.step_name(step)} has no .metadata: not complete, skipped")
        steps = self.store.complete_steps()
        for step in reversed(steps):
            damage = self._load(model, optim, step)
            if damage is None:
                return step
            if self.rank == 0:
                self.report(f"checkpoint {damage}: skipped")
        if steps:
            raise TrainHaltError(
                f"no intact checkpoint in {self.store.describe()} (each is reported above); "
                "move the damaged ones away to start the run over"
            )
        return 0

    def _load(self, model: torch.nn.Module, optim: torch.optim.Optimizer, step: int) -> CheckpointDamaged | None:
        """Load `step`, checked against its manifest; the damage found instead (every rank the same)."""
        reader = self.store.reader(step)
        try:
            try:
                reader.check_metadata()
                found = None
            except CheckpointDamaged as exc:
                found = exc
            if (damage := self._agree(found)) is not None:
                return damage
            model_sd, optim_sd = model_state(model, optim)
            global_views(model, model_sd, optim_sd)
            state = {"model": model_sd, "optim": optim_sd, "train": {"step": -1}}
            try:
                dcp.load(state, storage_reader=reader, process_group=self.group)
            except CheckpointException as exc:
                if (damage := damage_in(exc)) is None:
                    raise _plainly(exc, self.rank) from None
                return damage  # what was read so far is overwritten by the next load
        finally:
            reader.close()
        state = local_views(state)
        set_state_dict(
            model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"], options=state_options(model)
        )
        if state["train"]["step"] != step:
            raise RuntimeError(f"{self.store.step_name(step)} holds step {state['train']['step']}, not {step}")
        return None

    def _agree(self, damage: CheckpointDamaged | None) -> CheckpointDamaged | None:
        """Any rank's verdict for all: the ranks read the same files, but one bad read must not
        send one rank to another checkpoint than its peers."""
        if self.group is None:
            return damage
        found: list[CheckpointDamaged | None] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(found, damage, group=self.group)
        return next((d for d in found if d is not None), None)
