"""A stop asked for by a signal, acted on by all ranks together after the step in flight.

SIGTERM comes from torchrun's agent (a spot notice passed on, or a machine joining an elastic
job); SIGINT when Ctrl-C reaches the terminal's whole process group. Either only sets a flag:
the step's closing all-reduce tells every rank, and all of them checkpoint and exit after the
same step (train/trainer.py).
"""

from __future__ import annotations

import signal


class StopSignal:
    def __init__(self) -> None:
        self.set = False
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, _frame) -> None:
        self.set = True
