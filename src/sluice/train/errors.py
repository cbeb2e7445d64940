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
