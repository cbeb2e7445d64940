"""One training process of a torchrun group: `python -m sluice.train.worker RUN_DIR`.

The launcher (train/launch.py) has already validated the settings, written them to
RUN_DIR/resolved_config.json and tokenized the data into RUN_DIR/data/. Each rank joins the
process group, builds the model, wraps it (parallel/wrap.py), restores the newest checkpoint if
there is one, and trains to max_steps. Every step ends with one small all-reduce (the loss sum
and a stop flag), so a SIGTERM seen by any rank stops all ranks after the same step, with a
checkpoint, and exit code 0.
"""

from __future__ import annotations

import faulthandler
import logging
import math
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from sluice.errors import SluiceError
from sluice.train import faults
from sluice.train.checkpoint.checkpointer import Checkpointer
from sluice.train.checkpoint.lease import Lease
from sluice.train.checkpoint.store import open_store
from sluice.train.data import dataset, sampler
from sluice.train.errors import TrainConfigError, TrainHaltError
from sluice.train.launch import OUTCOME_ENV, STOPPED_MARKER
from sluice.train.lr import lr_at
from sluice.train.metrics import MetricsWriter, StepMetrics
from sluice.train.model.build import build_model
from sluice.train.model.hf_files import write_tokenizer
from sluice.train.parallel.dims import ParallelDims
from sluice.train.parallel.modes import wrap_model
from sluice.train.parallel.wrap import clip_grad_norm
from sluice.train.observe.flops import matmul_params, measure_peak_flops, mfu, step_flops
from sluice.train.observe.sinks import open_sinks
from sluice.train.observe.step_split import split_step
from sluice.train.settings import NonFinite, TrainSettings, read_resolved
from sluice.train.step import forward_backward, gather_rows, trained_tokens

log = logging.getLogger("sluice.train")



class _StopFlag:
    def __init__(self) -> None:
        self.set = False
        # SIGTERM from torchrun's agent (a spot notice passed on); SIGINT when Ctrl-C reaches the
        # whole terminal process group: both stop after the step with a checkpoint
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, _frame) -> None:
        self.set = True  # acted on after the current step, by all ranks together


def _say(line: str) -> None:
    """A line for the person at the terminal, from rank 0."""
    print(f"[rank 0] {line}", file=sys.stderr, flush=True)


def _nonfinite_message(step: int, loss: float, norm: float, ckpt: Checkpointer) -> str:
    what = " and ".join(f"the {name} is {value}" for name, value in (("loss", loss), ("gradient norm", norm))
                        if not math.isfinite(value))
    saved = ckpt.store.complete_steps()
    return (f"step {step}: {what or 'a rank saw a value that is not finite'}: the run stopped before the step's "
            f"update, saving nothing; the newest checkpoint is {ckpt.store.step_name(saved[-1]) if saved else 'none'} "
            '(nonfinite = "skip", or --nonfinite skip, drops such steps and goes on)')


def _threads(settings: TrainSettings, local_world: int) -> int:
    return settings.threads or max(1, (os.cpu_count() or 1) // local_world)


def _progress(enabled: bool, total: int, start: int):
    """A tqdm bar on rank 0 when stderr is a terminal; logs and pipes get the start/stop lines only."""
    if not enabled or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=start, desc="train", unit="step", file=sys.stderr, dynamic_ncols=True)


def run(run_dir: Path) -> int:
    settings = read_resolved(run_dir / "resolved_config.json")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if settings.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, timeout=timedelta(minutes=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:  # an elastic job may come back with any number of ranks
        dims = settings.dims(world)
    except ValueError as exc:
        raise TrainConfigError([str(exc)]) from None
    if settings.batch_size % dims.dp:
        raise TrainConfigError([f"batch_size ({settings.batch_size}) must be a multiple of the data-parallel ranks "
                                f"({dims.dp} of a world of {world})"])
    torch.set_num_threads(_threads(settings, int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    lease = None
    try:
        store = open_store(run_dir, settings.checkpoint_store, settings.s3_endpoint)  # a folder or s3://
        lease = _take_lease(store, settings, rank)  # before anything in the run is read or written
        return _train(run_dir, settings, dims, device, store, lease)
    finally:
        if lease is not None:
            lease.release()
        if dist.is_initialized():  # a failed run (the normal end has destroyed it already)
            dist.destroy_process_group()


def _take_lease(store, settings: TrainSettings, rank: int) -> Lease | None:
    """Rank 0 takes the run's lease (checkpoint/lease.py) and tells the others whether it got it."""
    lease, refused = None, None
    if rank == 0:
        lease = Lease(store.lease_records(), settings.lease_timeout)
        try:
            lease.acquire(_say)
        except TrainHaltError as exc:
            refused = str(exc)
    verdict = [refused]
    dist.broadcast_object_list(verdict, src=0)
    if verdict[0] is not None:
        raise TrainHaltError(verdict[0])
    if lease is not None:
        lease.start()
    return lease


def _train(run_dir: Path, settings: TrainSettings, dims: ParallelDims, device: torch.device, store,
           lease: Lease | None) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    stop = _StopFlag()
    data = dataset.load(run_dir / "data")
    built = build_model(settings)
    if rank == 0:
        built.module.config.save_pretrained(str(run_dir / "model"))
        write_tokenizer(built.tokenizer, run_dir / "model")
    # -- observability: N of the 6·N·D rule (before FSDP2 shards the parameters), the peak --
    params = matmul_params(built.module)
    peak = settings.peak_flops or measure_peak_flops(device, getattr(torch, settings.dtype))
    if rank == 0:
        print(f"[rank 0] MFU: {params:,} matmul parameters, peak {peak / 1e12:.3g} TFLOP/s per rank "
              f"({'configured' if settings.peak_flops else 'measured'})", file=sys.stderr, flush=True)
    model = wrap_model(built.module.to(device), settings, dims, device)  # ddp, fsdp, tp, pp, fsdp_tp, ep
    del built  # a pipeline stage keeps only its own layers: let the rest go
    optim = torch.optim.AdamW(model.module.parameters(), lr=settings.lr, weight_decay=settings.weight_decay,
                              betas=(0.9, 0.95), foreach=True)
    ckpt = Checkpointer(store, settings.keep_checkpoints, settings.async_checkpoint, report=_say,
                        guard=lease.held if lease is not None else None)
    start = ckpt.restore(model.module, optim)
    dp_rank, dp_size = dims.data_rank(rank), dims.dp  # tensor / pipeline ranks share rows
    micro = dims.micro_batch(settings.batch_size, settings.micro_batch_size)
    if rank == 0:
        (run_dir / STOPPED_MARKER).unlink(missing_ok=True)
        print(f"[rank 0] world {world}, {settings.parallel.value}, "
              + (f"resumed from step {start}" if start else "starting at step 0")
              + f", {settings.batch_size // dp_size // micro} micro-batches per step", file=sys.stderr, flush=True)
    sinks = open_sinks(settings.tensorboard, settings.prometheus_textfile, run_dir, start) if rank == 0 else []
    metrics = MetricsWriter(run_dir / "metrics.jsonl", rank == 0, start, sinks)
    bar = _progress(rank == 0, settings.max_steps, start)
    stopped = False
    for step in range(start + 1, settings.max_steps + 1):
        faults.at_step_start(rank, step, ckpt.wait)
        faults.hold(step, world, lambda: stop.set, ckpt.wait)
        t0, cpu0 = time.perf_counter(), time.process_time()
        lr = lr_at(step, settings.lr, settings.warmup_steps, settings.max_steps, settings.lr_schedule)
        for group in optim.param_groups:
            group["lr"] = lr
        rows_all = sampler.global_batch(data.rows, settings.seed, step - 1, settings.batch_size)
        per = settings.batch_size // dp_size
        mine = rows_all[dp_rank * per : (dp_rank + 1) * per]
        batch = gather_rows(data, mine, device)
        global_tokens = trained_tokens(data, rows_all)
        t1 = time.perf_counter()
        if model.train_step is not None:  # a pipeline schedule
            loss_sum = model.train_step(batch, global_tokens)
        else:
            loss_sum = forward_backward(model.module, model.no_sync, batch, micro, global_tokens, dp_size)
        faults.after_backward(step, loss_sum, model.module.parameters())
        norm = clip_grad_norm(model, settings.grad_clip)  # sluice's own where parameters are split over ranks
        norm_value = norm.full_tensor().item() if hasattr(norm, "full_tensor") else float(norm)
        local_bad = not (math.isfinite(loss_sum.item()) and math.isfinite(norm_value))
        # the loss, the stop flag and a non-finite flag, agreed before the update: every rank
        # applies or drops the same step
        lost = lease is not None and lease.lost is not None  # another group took the run
        reduced = torch.tensor([loss_sum.item() / dims.loss_copies, float(stop.set), float(local_bad), float(lost)],
                               dtype=torch.float64)
        t_reduce = time.perf_counter()
        if world > 1:  # one process has nothing to agree with (a gloo call costs ~1-5 ms)
            dist.all_reduce(reduced)
        t_reduced = time.perf_counter()
        if reduced[3].item() > 0:  # write nothing more: the run belongs to the other group now
            metrics.close()
            raise TrainHaltError(f"the run's lease was taken by another group ({lease.lost if lease else 'see rank 0'}): "
                                 "this group stopped without writing")
        nonfinite = reduced[2].item() > 0
        if not nonfinite:
            optim.step()
        optim.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        comm_wait = model.stats.take_wait() + (t_reduced - t_reduce)
        ckpt.poll()
        stopped = reduced[1].item() > 0
        halt = nonfinite and settings.nonfinite is NonFinite.STOP
        ckpt_time = 0.0
        if halt:
            pass  # a non-finite step never becomes a checkpoint
        elif stopped or step == settings.max_steps:
            ckpt_time = ckpt.save(model.module, optim, step, wait=True)
        elif settings.checkpoint_every and step % settings.checkpoint_every == 0:
            ckpt_time = ckpt.save(model.module, optim, step)
        comm_bytes, comm_time = model.stats.take()
        if model.fsdp_bytes_per_micro:
            comm_bytes = model.fsdp_bytes_per_micro * max(1, per // micro)
        elapsed = time.perf_counter() - t0
        seen = len(rows_all) * settings.seq_len
        split = split_step(elapsed, data=t1 - t0, train=t2 - t1, comm_wait=comm_wait, checkpoint=ckpt_time)
        metrics.write(StepMetrics(
            step=step, loss=reduced[0].item() / max(1, global_tokens), tokens=global_tokens,
            tokens_seen=seen, lr=lr, grad_norm=norm_value, step_time=elapsed,
            data_time=split.data, compute_time=split.compute, comm_wait_time=split.comm,
            checkpoint_time=split.checkpoint, other_time=split.other, comm_bytes=comm_bytes, comm_time=comm_time,
            tokens_per_s=seen / elapsed, cpu_time=time.process_time() - cpu0,
            mfu=mfu(step_flops(params, seen), elapsed, peak, world),
            epoch=sampler.epoch_of(data.rows, step, settings.batch_size), world_size=world, skipped=nonfinite,
        ))
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{reduced[0].item() / max(1, global_tokens):.4f}")
        if halt:
            ckpt.wait()
            metrics.close()
            if bar is not None:
                bar.close()
            raise TrainHaltError(_nonfinite_message(step, reduced[0].item() / max(1, global_tokens), norm_value, ckpt))
        if nonfinite and rank == 0:
            _say(f"step {step}: the loss or the gradient norm is not finite: its update was skipped (nonfinite = skip)")
        if stopped:
            break
    ckpt.wait()
    if bar is not None:
        bar.close()
    metrics.close()
    if rank == 0 and stopped:
        (run_dir / STOPPED_MARKER).write_text(f"{step}\n")
        print(f"[rank 0] stop signal: checkpoint at step {step} written, exiting", file=sys.stderr, flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main() -> int:
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID` prints every thread's stack: a hang explains itself
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if len(sys.argv) != 2:
        print("usage: python -m sluice.train.worker RUN_DIR (started by `sluice train run`)", file=sys.stderr)
        return 2
    rank = os.environ.get("RANK", "0")
    try:
        return run(Path(sys.argv[1]))
    except TrainHaltError as exc:
        return _halt(exc, rank)
    except SluiceError as exc:  # one line, no traceback; torchrun restarts the group
        print(f"[rank {rank}] sluice: error: {exc}", file=sys.stderr, flush=True)
        return 1


def _halt(exc: TrainHaltError, rank: str) -> int:
    """Every rank halts together. Under `sluice train run` the launcher reports the error and
    the workers exit 0, so torchrun does not restart a group that would halt again; under a
    plain torchrun the exit code has to say it."""
    outcome = os.environ.get(OUTCOME_ENV)
    if rank == "0" and not outcome:
        print(f"[rank 0] sluice: error: {exc}", file=sys.stderr, flush=True)
    if outcome and os.environ.get("LOCAL_RANK", "0") == "0":
        Path(outcome).write_text(str(exc))
    return 0 if outcome else 1


if __name__ == "__main__":
    sys.exit(main())
