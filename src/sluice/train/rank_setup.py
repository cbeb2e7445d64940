"""One rank's setup phase (the Trainer's first, train/trainer.py): join the process group, take
the run's lease (rank 0), build and wrap the model on the run's parallel degrees, restore the
newest intact checkpoint (with replica groups: the first quorum's state), open the metrics."""

from __future__ import annotations

import os
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from sluice.train import faults
from sluice.train.checkpoint.checkpointer import Checkpointer
from sluice.train.checkpoint.lease import Lease
from sluice.train.checkpoint.store import open_store
from sluice.train.data import dataset
from sluice.train.errors import TrainConfigError, TrainHaltError
from sluice.train.launch import STOPPED_MARKER
from sluice.train.metrics import MetricsWriter
from sluice.train.model.build import build_model, trainable
from sluice.train.model.causal_lm import pretrained
from sluice.train.model.hf_files import write_tokenizer
from sluice.train.model.lora import FrozenBase
from sluice.train.observe.console import say
from sluice.train.observe.events import Event, EventLog
from sluice.train.observe.flops import matmul_params, measure_peak_flops
from sluice.train.observe.heartbeat import Heartbeat
from sluice.train.observe.sinks import open_sinks
from sluice.train.parallel.modes import wrap_model
from sluice.train.replica.driver import ReplicaDriver
from sluice.train.settings import read_resolved
from sluice.train.step_metrics import StepLine
from sluice.train.stop_signal import StopSignal


class RankSetup:
    """The state a rank trains with, and the phase that builds it; the Trainer runs the loop."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.settings = read_resolved(run_dir / "resolved_config.json")
        self.lease: Lease | None = None
        self.metrics: MetricsWriter | None = None
        self.start = 0  # the step restored from (0: none)
        self.replicas: ReplicaDriver | None = None  # replica groups (train/replica/driver.py)
        self.group = ReplicaDriver.group_of(self.settings)
        self.writes = self.group == 0  # with replica groups, group 0 writes the checkpoints
        self.heartbeat: Heartbeat | None = None
        self.faults = faults.from_env()  # the tests' faults (train/faults.py), read once; None in production
        # what a rank holds, each release registered as it is taken: close() gives them back in
        # the reverse order (metrics, replica groups, lease, heartbeat, process group)
        self.releases = ExitStack()

    def setup(self) -> None:
        self._join_group()
        self.events = EventLog(self.run_dir, self.group, self.rank)
        self.events.emit(Event.STARTED, pid=os.getpid(), restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
        self.heartbeat = Heartbeat(self.run_dir, self.group, self.rank, self.settings.hang_timeout)
        self.releases.callback(self.heartbeat.close)
        self.store = open_store(self.run_dir, self.settings.checkpoint_store, self.settings.s3_endpoint)
        self._take_lease()  # before anything in the run is read or written
        self._build()
        self._restore()

    def _join_group(self) -> None:
        s = self.settings
        local = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = torch.device("cuda", local) if s.device == "cuda" else torch.device("cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        backend = "cpu:gloo,cuda:nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=timedelta(minutes=10))
        self.releases.callback(dist.destroy_process_group)
        self.rank, world = dist.get_rank(), dist.get_world_size()
        try:  # an elastic job may come back with any number of ranks
            self.dims = s.dims(world)
        except ValueError as exc:
            raise TrainConfigError([str(exc)]) from None
        if s.batch_size % self.dims.dp:
            raise TrainConfigError(
                [
                    f"batch_size ({s.batch_size}) must be a multiple of the data-parallel ranks "
                    f"({self.dims.dp} of a world of {world})"
                ]
            )
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        torch.set_num_threads(s.threads or max(1, (os.cpu_count() or 1) // (local_world * s.replica_groups)))
        self.stop = StopSignal()

    def _take_lease(self) -> None:
        """Rank 0 takes the run's lease (checkpoint/lease.py) and tells the others whether it did."""
        refused = None
        if self.rank == 0 and self.writes:
            self.lease = Lease(self.store.lease_records(), self.settings.lease_timeout)
            try:
                self.lease.acquire(say)
            except TrainHaltError as exc:
                self.lease, refused = None, str(exc)
        verdict = [refused]
        dist.broadcast_object_list(verdict, src=0)
        if verdict[0] is not None:
            raise TrainHaltError(verdict[0])
        if self.lease is not None:
            self.releases.callback(self.lease.release)
            self.lease.start()

    def _build(self) -> None:
        s = self.settings
        self.data = dataset.load(self.run_dir / "data")
        built = build_model(s)
        # a LoRA run: the base checked against the run's record, then watched (model/lora.py)
        self.base = FrozenBase(built.module, s, self.run_dir, self.rank == 0 and self.writes) if s.lora_rank else None
        if self.rank == 0:
            pretrained(built.module).config.save_pretrained(str(self.run_dir / "model"))
            write_tokenizer(built.tokenizer, self.run_dir / "model")
        # observability: N of the 6·N·D rule (before FSDP2 shards the parameters), the peak
        if s.activation_checkpointing:  # recompute each layer's activations in backward (transformers')
            pretrained(built.module).activation_checkpointing_enable(
                activation_checkpointing_kwargs={"use_reentrant": False}
            )
            built.module.train()  # transformers checkpoints only in training mode
        params = matmul_params(built.module)
        peak = s.peak_flops or measure_peak_flops(self.device, getattr(torch, s.dtype))
        self.line = StepLine(s, self.dims.world, self.data.rows, params, peak)
        if self.rank == 0:
            say(
                f"MFU: {params:,} matmul parameters, peak {peak / 1e12:.3g} TFLOP/s per rank "
                f"({'configured' if s.peak_flops else 'measured'})"
            )
        self.model = wrap_model(built.module.to(self.device), s, self.dims, self.device)
        del built  # a pipeline stage keeps only its own layers: let the rest go
        if self.base is not None:
            self.base.watch(self.model.module, self.events)
        self.optim = torch.optim.AdamW(
            trainable(self.model.module), lr=s.lr, weight_decay=s.weight_decay, betas=(0.9, 0.95), foreach=True
        )
        self.micro = self.dims.micro_batch(s.group_batch, s.micro_batch_size)

    def _restore(self) -> None:
        s = self.settings
        self.ckpt = Checkpointer(
            self.store,
            s.keep_checkpoints,
            s.async_checkpoint,
            report=say,
            guard=self.lease.held if self.lease is not None else None,
            writes=self.writes,
            on_publish=lambda step: self.events.emit(Event.CHECKPOINT, step=step),
        )
        restore = lambda: self.ckpt.restore(self.model.module, self.optim)  # noqa: E731
        if s.replica_groups > 1:  # the first quorum: a live peer's state, or the store's
            if self.faults is not None and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
                faults.at_rejoin(self.faults, self.run_dir, self.group)  # the tests' await_group
            self.replicas = ReplicaDriver(self)
            self.releases.callback(self.replicas.close)
            self.start = self.replicas.join(restore)
        else:
            self.start = restore()
            if self.start and self.rank == 0:
                self.events.emit(Event.RESTORED, step=self.start)
        main = self.rank == 0
        if main and self.writes:
            (self.run_dir / STOPPED_MARKER).unlink(missing_ok=True)
            say(
                f"world {self.dims.world}, {s.parallel.value}, "
                + (f"resumed from step {self.start}" if self.start else "starting at step 0")
                + f", {s.group_batch // self.dims.dp // self.micro} micro-batches per step"
            )
        sinks = open_sinks(s.tensorboard, s.prometheus_textfile, self.run_dir, self.start) if main else []
        self.metrics = MetricsWriter(
            self.run_dir / "metrics.jsonl", main, None if self.replicas is not None else self.start, sinks
        )
        self.releases.callback(self.metrics.close)
