"""One training process of a torchrun group: `python -m sluice.train.worker RUN_DIR`.

Each rank runs the Trainer (train/trainer.py) on the run folder the launcher prepared. Errors
sluice raises on purpose are one line each, never a traceback: one that a restart would meet
again (TrainHaltError) halts every rank without torchrun restarting them; any other exits 1,
and torchrun restarts the group (a store that went away may be back).
"""

from __future__ import annotations

import atexit
import faulthandler
import logging
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import NoReturn

from sluice.errors import SluiceError
from sluice.train.errors import TrainHaltError
from sluice.train.launch import OUTCOME_ENV
from sluice.train.trainer import Trainer


def run(run_dir: Path) -> int:
    """Train the run in `run_dir` on this rank (the ranks meet through torchrun's environment)."""
    return Trainer(run_dir).run()


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


def exit_now(code: int) -> NoReturn:
    """End the rank without the interpreter's teardown. By the time main() returns, the Trainer
    has closed what it opened (checkpoints written, files closed, the lease released, the
    process group left: RankSetup.releases), and what is left is freeing torch's and
    transformers' thousands of modules and objects one by one: seconds of CPU per rank on a
    busy machine, which torchrun waits for before the run ends or the group restarts. The
    atexit handlers still run (logging's flush among them), then the buffered streams."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def _main_then_exit() -> NoReturn:
    """main(), and any error it did not expect printed as the interpreter would (the traceback,
    exit code 1, torchrun restarts the group), then exit_now: a rank that failed is waited for
    by torchrun before the restart too."""
    try:
        code = main()
    except Exception:
        traceback.print_exc()
        code = 1
    exit_now(code)


if __name__ == "__main__":
    _main_then_exit()
