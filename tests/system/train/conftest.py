"""Shared training runs: a tiny random Llama folder, a chat/text data file, and `sluice train run`
as a real torchrun group (2 processes), each run made once per test session and compared by the
tests.

Once per session, not once per xdist worker: `make test` spreads the files over two workers, and
most files compare against the same reference runs (ddp2_run, one_run, the LoRA runs and their
exports). A session fixture alone would have each worker train them again (a torchrun group
costs tens of seconds of start-up on a busy machine), so the workers share one folder and the
first to need a run makes it under a file lock while the other waits for it (xdist's documented
recipe for session fixtures that must run once)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from filelock import FileLock

from tests.tiny_models import write_tiny_model

# Small enough that a step takes well under a second on a busy core; 8 steps of 4 rows of 32
# tokens cross an epoch boundary of the ~40-row data file.
STEPS = 8
COMMON = ["--seq-len", "32", "--batch-size", "4", "--lr", "3e-3", "--max-steps", str(STEPS), "--threads", "1"]
RUN_TIMEOUT_S = 300  # generous: torchrun + torch + transformers imports on two busy cores
# how long a worker waits for another to make a shared run: the longest chain of them (a run and
# its export, or the three LoRA fixtures) under the same generous bound each
SHARED_WAIT_S = 3 * RUN_TIMEOUT_S


def train_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "sluice.cli", "train", *args]


def run_train(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(train_cmd("run", *args), env=full_env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, f"sluice train run failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return proc


def losses(run: Path) -> list[float]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == list(range(1, len(lines) + 1)), "one line per step, in order"
    return [m["loss"] for m in lines]


def run_in_process(*args: str) -> Path:
    """`sluice train run` as a world of one inside the test process (torch and transformers are
    already imported here, which saves a process start on busy cores): the launcher's checks
    and data preparation, then the very function every torchrun rank runs."""
    from sluice.cli import build_parser
    from sluice.cli.train import settings_from_args
    from sluice.train import launch, worker

    settings = settings_from_args(build_parser().parse_args(["train", "run", *args]))
    launch.prepare(settings)
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(launch.free_port()),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
    }
    saved_env = {k: os.environ.get(k) for k in env}
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    threads = torch.get_num_threads()
    os.environ.update(env)
    try:
        assert worker.run(settings.run_dir) == 0
    finally:
        for s, handler in saved_signals.items():
            signal.signal(s, handler)
        torch.set_num_threads(threads)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return settings.run_dir


@pytest.fixture(scope="session")
def train_dir(tmp_path_factory) -> Path:
    """The session's training folder: under xdist, one folder that every worker of this session
    shares (the workers' base folders sit side by side in the session's); the test files name
    their runs apart, and each file runs on one worker (--dist loadfile)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return tmp_path_factory.mktemp("train")
    shared = tmp_path_factory.getbasetemp().parent / "train"
    shared.mkdir(exist_ok=True)
    return shared


def made_once(train_dir: Path, name: str, make: Callable[[], Path]) -> Path:
    """`make()`'s path, made by the first worker that asks and read back by the others. A make
    that failed fails the others too (its folder is half made: making it again would resume it)."""
    with FileLock(str(train_dir / f".{name}.lock"), timeout=SHARED_WAIT_S):
        done, failed = train_dir / f".{name}.done", train_dir / f".{name}.failed"
        if failed.exists():
            pytest.fail(f"the shared {name} failed in another xdist worker: {failed.read_text()[-2000:]}")
        if done.exists():
            return Path(done.read_text())
        try:
            made = make()
        except BaseException as e:
            failed.write_text(f"{type(e).__name__}: {e}")
            raise
        done.write_text(str(made))
        return made


@pytest.fixture(scope="session")
def tiny_folder(train_dir: Path) -> Path:
    return made_once(train_dir, "tiny-llama", lambda: write_tiny_model(train_dir / "tiny-llama", "llama", seed=1))


@pytest.fixture(scope="session")
def chat_data(train_dir: Path) -> Path:
    return made_once(train_dir, "chat", lambda: _write_chat_data(train_dir / "chat.jsonl"))


def _write_chat_data(path: Path) -> Path:
    with path.open("w") as f:
        for i in range(24):
            f.write(
                json.dumps(
                    {
                        "system": "Answer with a number.",
                        "messages": [
                            {"role": "user", "content": f"What is {i} plus {i}?"},
                            {"role": "assistant", "content": f"{2 * i}"},
                        ],
                    }
                )
                + "\n"
            )
            f.write(json.dumps({"text": f"The number {i} is {'even' if i % 2 == 0 else 'odd'}."}) + "\n")
    return path


@pytest.fixture(scope="session")
def ddp2_run(train_dir: Path, tiny_folder: Path, chat_data: Path) -> Path:
    """The reference: 2 ranks, DDP, a checkpoint every 3 steps, uninterrupted; its metrics also go
    to a Prometheus textfile."""
    return made_once(train_dir, "ddp2", lambda: _ddp2_run(train_dir, tiny_folder, chat_data))


def _ddp2_run(train_dir: Path, tiny_folder: Path, chat_data: Path) -> Path:
    out = train_dir / "ddp2"
    run_train(
        "--data",
        str(chat_data),
        "--out",
        str(out),
        "--model",
        str(tiny_folder),
        "--nproc",
        "2",
        "--checkpoint-every",
        "3",
        "--prometheus-textfile",
        str(train_dir / "prom" / "ddp2.prom"),
        *COMMON,
    )
    return out


@pytest.fixture(scope="session")
def one_run(train_dir: Path, tiny_folder: Path, chat_data: Path) -> Path:
    """The same run in one process (world size 1): the reference for data parallelism."""
    args = ["--data", str(chat_data), "--out", str(train_dir / "one"), "--model", str(tiny_folder), "--nproc", "1"]
    return made_once(train_dir, "one", lambda: run_in_process(*args, *COMMON))


@pytest.fixture(scope="session")
def exported(train_dir: Path, ddp2_run: Path) -> Path:
    """`sluice train export` of the 2-rank DDP run (shared by the export and the fleet tests)."""
    return made_once(train_dir, "export-r1", lambda: _export(ddp2_run, train_dir / "exports" / "r1"))


def _export(ddp2_run: Path, out: Path) -> Path:
    proc = subprocess.run(
        train_cmd("export", str(ddp2_run), "--out", str(out)), capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"exported step {STEPS}" in proc.stderr
    return out


# `nonfinite = "stop"` halts the 2-rank run before step 5's update (train/faults.py's nan_loss)
NAN_STEP = 5
NAN_STOP_ARGS = ["--nproc", "2", "--checkpoint-every", "2", "--keep-checkpoints", "5", *COMMON]


@pytest.fixture(scope="session")
def nan_stopped(train_dir: Path, tiny_folder: Path, chat_data: Path) -> Path:
    """2 ranks stopped by a NaN loss at step 5 (checkpoints of steps 2 and 4; the launcher's
    terminal in nan-stop.stderr beside it): test_train_nonfinite.py checks the stop, and
    test_train_damaged.py resumes a copy of it past a damaged newest checkpoint to the losses of
    the uninterrupted run (one torchrun start fewer than a run of its own)."""
    return made_once(train_dir, "nan-stop", lambda: _nan_stopped(train_dir, tiny_folder, chat_data))


def _nan_stopped(train_dir: Path, tiny_folder: Path, chat_data: Path) -> Path:
    out = train_dir / "nan-stop"
    args = ["--data", str(chat_data), "--out", str(out), "--model", str(tiny_folder), *NAN_STOP_ARGS]
    env = {**os.environ, "SLUICE_TRAIN_FAULT": f"nan_loss:{NAN_STEP}"}
    proc = subprocess.run(train_cmd("run", *args), env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    (train_dir / "nan-stop.stderr").write_text(proc.stderr)
    assert proc.returncode == 2, proc.stderr[-3000:]
    return out


# --- LoRA (tests/system/train/test_train_lora.py, test_train_lora_replicas.py, the fleet test) ---
# rank 4 on every linear, alpha 8 (scale 2); the tiny folder's 3 layers
LORA = ["--lora-rank", "4", "--lora-alpha", "8"]
# their parameters: A [4, in] and B [out, 4] on q, k, v, o (hidden 64, kv 32), gate, up, down (mlp 160)
ADAPTER_PARAMS = (
    3 * 4 * sum(i + o for i, o in ((64, 64), (64, 32), (64, 32), (64, 64), (64, 160), (64, 160), (160, 64)))
)


@pytest.fixture(scope="session")
def lora_one(train_dir: Path, tiny_folder: Path, chat_data: Path) -> Path:
    """A LoRA run in one process, no dropout: the reference for the data-parallel LoRA runs."""
    return made_once(train_dir, "lora-one", lambda: _lora_one(train_dir, tiny_folder, chat_data))


def _lora_one(train_dir: Path, tiny_folder: Path, chat_data: Path) -> Path:
    return run_in_process(
        "--data",
        str(chat_data),
        "--out",
        str(train_dir / "lora-one"),
        "--model",
        str(tiny_folder),
        "--nproc",
        "1",
        *LORA,
        *COMMON,
    )


@pytest.fixture(scope="session")
def lora_ddp2(train_dir: Path, tiny_folder: Path, chat_data: Path) -> Path:
    """2 ranks, DDP, LoRA with dropout, a checkpoint every 3 steps, uninterrupted."""
    return made_once(train_dir, "lora-ddp2", lambda: _lora_ddp2(train_dir, tiny_folder, chat_data))


def _lora_ddp2(train_dir: Path, tiny_folder: Path, chat_data: Path) -> Path:
    out = train_dir / "lora-ddp2"
    run_train(
        "--data",
        str(chat_data),
        "--out",
        str(out),
        "--model",
        str(tiny_folder),
        "--nproc",
        "2",
        "--checkpoint-every",
        "3",
        *LORA,
        "--lora-dropout",
        "0.1",
        *COMMON,
    )
    return out


@pytest.fixture(scope="session")
def lora_export(train_dir: Path, lora_ddp2: Path) -> Path:
    """`sluice train export` of the 2-rank LoRA run: a PEFT adapter folder."""
    return made_once(train_dir, "export-lora-r1", lambda: _lora_export(lora_ddp2, train_dir / "exports" / "lora-r1"))


def _lora_export(lora_ddp2: Path, out: Path) -> Path:
    proc = subprocess.run(
        train_cmd("export", str(lora_ddp2), "--out", str(out)), capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"exported step {STEPS} of {lora_ddp2} to {out} (a PEFT LoRA adapter folder)" in proc.stderr
    return out


def base_sha256(folder: Path) -> str:
    """sha256 of a model folder's weights in transformers' parameter order, as sluice's LoRA
    runs digest their frozen base (each tensor's bytes, in turn)."""
    import hashlib

    from transformers import AutoModelForCausalLM

    module = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    h = hashlib.sha256()
    for p in module.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def events(run: Path, kind: str) -> list[dict]:
    lines = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    return [e for e in lines if e["event"] == kind]
