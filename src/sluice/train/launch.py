"""Start a training run: check everything that can be checked in one process, then torchrun.

Before any worker starts: the settings are validated, a run folder that already holds a run is
checked to be the same run (so `sluice train run` with the same flags resumes it, and a changed
model or data is refused instead of mixing two runs), and the data is tokenized and packed once
(bad lines stop here, with their line numbers). Then torchrun (torch.distributed.run) starts
`nproc` workers with a c10d rendezvous on a free 127.0.0.1 port and restarts the whole group up to
`max_restarts` times after a crash; the workers resume from the newest checkpoint. SIGTERM and
SIGINT are passed on to torchrun, whose agent passes them to the workers; the workers checkpoint
and exit, and the agent's own grace period (30 s) bounds the wait.

With replica groups (`replica_groups` G), nproc is split into G groups, each its own torchrun
(its own rendezvous and restarts), and the launcher runs the Lighthouse they meet at
(train/replica/lighthouse.py). While ranks train, one thread prints progress and watches for
hung ranks (train/monitor.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic_core import to_jsonable_python

from sluice.common.ports import free_port
from sluice.parent_death import tied_to_this_process
from sluice.train.data import dataset
from sluice.train.errors import TrainConfigError, TrainHaltError
from sluice.train.model.source import tokenizer_for
from sluice.train.monitor import Monitor
from sluice.train.parallel.fit import check_fits
from sluice.train.replica.group_env import GROUP_ENV, LIGHTHOUSE_ENV
from sluice.train.replica.lighthouse import lighthouse_for
from sluice.train.settings import TrainSettings, write_resolved

# A resumed run must read the same rows with the same model (and the same adapter's shape and scale); these decide that.
SAME_RUN_FIELDS = (
    "data",
    "model",
    "tokenizer",
    "seq_len",
    "batch_size",
    "seed",
    "moe_experts",
    "moe_top_k",
    "lora_rank",
    "lora_alpha",
    "lora_targets",
)
STOPPED_MARKER = "stopped"  # written by rank 0 (train/trainer.py) after a stop signal
# a file of this machine's launcher where its workers leave the error that halted the run
# (train/errors.py TrainHaltError): they exit 0 so that torchrun does not restart them
OUTCOME_ENV = "SLUICE_TRAIN_OUTCOME"


def check_run_folder(run_dir: Path) -> None:
    """`out` must be a folder or a path where one can be made (not a file, nor below one)."""
    for p in (run_dir, *run_dir.parents):
        if p.exists():
            if not p.is_dir():
                what = "is a file" if p == run_dir else f"is below {p}, a file"
                raise TrainConfigError([f"out: {run_dir} {what}; the run folder must be a folder"])
            return


def _field_defaults() -> dict[str, Any]:
    """TrainSettings' defaults as their JSON values (a required field has none)."""
    fields = TrainSettings.model_fields.items()
    return to_jsonable_python({n: f.get_default(call_default_factory=True) for n, f in fields if not f.is_required()})


def check_same_run(settings: TrainSettings, run_dir: Path) -> None:
    previous = run_dir / "resolved_config.json"
    if not previous.exists():
        return
    # a field added after the run was made counts as its default there
    old = {**_field_defaults(), **json.loads(previous.read_text())}
    new = json.loads(settings.model_dump_json())
    changed = [f for f in SAME_RUN_FIELDS if old.get(f) != new.get(f)]
    if changed:
        raise TrainConfigError(
            [
                f"{run_dir} holds a run with different {', '.join(changed)} "
                f"({'; '.join(f'{f}: {old.get(f)!r} -> {new.get(f)!r}' for f in changed)}); "
                "resume it with its own settings or choose another --out"
            ]
        )


def prepare(settings: TrainSettings) -> dict:
    """Validate the run folder and tokenize the data; the data's summary."""
    if importlib.util.find_spec("transformers") is None:
        raise TrainConfigError(["training needs transformers: pip install 'sluice[train]' (or the test extra)"])
    if settings.lora_rank and importlib.util.find_spec("peft") is None:
        raise TrainConfigError(["lora_rank needs PEFT: pip install 'sluice[train]' (or peft>=0.21.2 after torch)"])
    if settings.replica_groups > 1 and importlib.util.find_spec("torchft") is None:
        raise TrainConfigError(
            ["replica_groups needs torchft: pip install --no-deps torchft==0.2.0 (see the Makefile)"]
        )
    if settings.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise TrainConfigError(["tensorboard = true needs the tensorboard package: pip install 'sluice[train]'"])
    run_dir = settings.run_dir
    check_run_folder(run_dir)
    check_same_run(settings, run_dir)
    check_fits(settings)  # model-parallel modes: heads / layers / micro-batches against the ranks
    tok, tok_id = tokenizer_for(settings)
    meta = dataset.prepare(
        Path(settings.data), tok, tok_id, settings.seq_len, run_dir / "data", settings.skip_bad_lines
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    write_resolved(settings, run_dir / "resolved_config.json")
    return meta


# An elastic job (nnodes MIN:MAX) starts 3 s after MIN machines met (others may still come;
# torch's default waits 30 s), and counts a machine gone after torch's default 3 missed 5-second
# heartbeats (3 x 2 s before: little margin on a loaded host, where a live agent whose heartbeat
# falls that far behind is removed from the rendezvous as dead).
ELASTIC_RDZV_CONF = "last_call_timeout=3"


def torchrun_argv(settings: TrainSettings, port: int) -> list[str]:
    """torchrun for this machine's `nproc` ranks (one replica group's, with groups). With several
    machines (or an elastic range) every machine runs the same command with the same
    rdzv_endpoint; the first one there hosts the rendezvous store. Machines joining or leaving
    restart the group, which resumes from the newest checkpoint on the new world size (torchrun
    does not count that as a failure)."""
    endpoint = settings.rdzv_endpoint or f"127.0.0.1:{port}"
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        settings.nnodes,
        "--nproc-per-node",
        str(settings.group_size),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        f"sluice-{endpoint.rpartition(':')[2]}",
        *(["--rdzv-conf", ELASTIC_RDZV_CONF] if settings.elastic else []),
        "--max-restarts",
        str(settings.max_restarts),
        "-m",
        "sluice.train.worker",
        str(settings.run_dir),
    ]


def run(settings: TrainSettings, env: dict[str, str] | None = None) -> int:
    meta = prepare(settings)
    bad = meta.get("bad_lines") or []
    print(
        f"data: {meta['examples']} examples, {meta['rows']} rows of {meta['seq_len']} tokens, "
        f"{meta['loss_tokens']} trained tokens" + (f", {len(bad)} bad lines skipped" if bad else ""),
        file=sys.stderr,
    )
    for problem in bad[:20]:
        print(f"  skipped {problem}", file=sys.stderr)
    child_env = dict(os.environ if env is None else env)
    threads = settings.threads or max(1, (os.cpu_count() or 1) // settings.nproc)
    child_env.setdefault("OMP_NUM_THREADS", str(threads))
    # With the rendezvous store shared with the workers (torch's default), a group restarted
    # after a crash read the dead round's addresses and failed to connect (gloo: connection
    # refused); with a store of their own per round, restarts (and a growing group) work.
    child_env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    child_env.setdefault("RUST_LOG", "warn")  # torchft's managers log every quorum at info
    fd, outcome = tempfile.mkstemp(prefix="sluice-train-outcome-")
    os.close(fd)
    child_env[OUTCOME_ENV] = outcome
    try:
        with lighthouse_for(settings) as lighthouse:
            code, signalled = _torchruns(settings, child_env, lighthouse)
        halted = Path(outcome).read_text()
    finally:
        Path(outcome).unlink(missing_ok=True)
    if halted:
        raise TrainHaltError(halted)
    marker = settings.run_dir / STOPPED_MARKER
    if signalled and marker.exists():
        step = marker.read_text().strip()
        print(
            f"stopped: checkpoint at step {step} in {settings.run_dir}/checkpoints; "
            "run the same command again to resume",
            file=sys.stderr,
        )
        return 0
    if code != 0:
        print(f"training failed (torchrun exit code {code}); see the errors above", file=sys.stderr)
    return code


def group_envs(settings: TrainSettings, child_env: dict[str, str], lighthouse: str | None) -> list[dict[str, str]]:
    """Each replica group's torchrun environment (one, unchanged, without groups)."""
    if lighthouse is None:
        return [child_env]
    return [{**child_env, GROUP_ENV: str(g), LIGHTHOUSE_ENV: lighthouse} for g in range(settings.replica_groups)]


def _torchruns(settings: TrainSettings, child_env: dict[str, str], lighthouse: str | None) -> tuple[int, bool]:
    """One torchrun (per replica group); the exit code, and whether a signal was passed on."""
    procs = [
        subprocess.Popen(tied_to_this_process() + torchrun_argv(settings, free_port()), env=env)
        for env in group_envs(settings, child_env, lighthouse)
    ]
    signalled = False

    def forward(signum: int, _frame) -> None:
        nonlocal signalled
        signalled = True
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with Monitor(settings, lambda: {p.pid for p in procs}):
            codes = [proc.wait() for proc in procs]
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return _combined(settings, codes), signalled


def _combined(settings: TrainSettings, codes: list[int]) -> int:
    """The run's exit code: a replica group that failed for good does not fail a run that the
    others finished (that is what the groups are for), but it is reported."""
    failed = [(g, c) for g, c in enumerate(codes) if c != 0]
    if not failed or len(codes) == 1:
        return codes[0] if codes else 1
    for group, code in failed:
        print(f"replica group {group} failed (torchrun exit code {code})", file=sys.stderr)
    return 0 if len(failed) < len(codes) else failed[0][1]
