"""Errors of the training tower, each naming what is wrong."""

from __future__ import annotations

from sluice.errors import SluiceError


class TrainConfigError(SluiceError):
    """A training settings file or flag is invalid; `problems` holds one line per fault, each
    `FILE:LINE: field: problem` when it comes from a file."""

    def __init__(self, problems: list[str]):
        super().__init__("invalid training settings:\n  " + "\n  ".join(problems))
        self.problems = problems


class TrainDataError(SluiceError):
    """The training data has bad lines; `problems` holds `FILE:LINE: problem` for each."""

    def __init__(self, problems: list[str], total: int | None = None):
        shown = problems[:20]
        more = (total or len(problems)) - len(shown)
        tail = [f"... and {more} more"] if more > 0 else []
        super().__init__("bad training data:\n  " + "\n  ".join(shown + tail))
        self.problems = problems


class CheckpointError(SluiceError):
    """A checkpoint cannot be read or does not match the run."""


class CheckpointDamaged(CheckpointError):
    """A checkpoint's file is missing, cut short or differs from its manifest: the run skips it
    for an older one. Carries strings only, so DCP can gather it from any rank (pickle)."""

    def __init__(self, where: str, problem: str):
        super().__init__(f"{where} is damaged: {problem}")
        self.where, self.problem = where, problem

    def __reduce__(self):
        return type(self), (self.where, self.problem)


class TrainHaltError(SluiceError):
    """The run cannot go on, and restarting the group would meet the same wall (every checkpoint
    damaged, a non-finite loss under `nonfinite = "stop"`, a run folder held by another group).
    The workers report it once and exit without being restarted (train/worker.py, train/trainer.py)."""


class CheckpointStoreError(CheckpointError):
    """A call to the checkpoint store failed: which store, which object, what was done and what
    went wrong. Carries strings only: DCP gathers a rank's error to every rank with pickle, and
    botocore's own (its request holds the open file being uploaded) cannot be pickled."""

    def __init__(self, store: str, key: str, action: str, cause: str):
        super().__init__(f"checkpoint store {store}: {action} {key} failed: {cause}")
        self.store, self.key, self.action, self.cause = store, key, action, cause

    def __reduce__(self):
        return type(self), (self.store, self.key, self.action, self.cause)
