"""A child process that dies with the process that started it (Linux: PR_SET_PDEATHSIG).

Workers, search replicas and torchrun groups are started with `subprocess.Popen(...,
preexec_fn=die_with_parent())`, so a parent killed by SIGKILL never leaves them running on their
own. The function that runs in the child, between fork and exec, must not load a library,
import a module or take a lock another thread of the parent may have held at the fork: each did
happen (a child of a multi-threaded test process crashed in `ctypes.CDLL` there). So libc's
`prctl` is resolved here, once, in the parent, and the child only calls it.

The signal fires when the *thread* that forked exits, not the process: start children from a
long-lived thread (the event loop's).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Callable

_PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # the C library the interpreter runs on
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child get SIGTERM when this process dies (and exit at once
    if this process died before that took effect); None where the platform has no such call."""
    if _PRCTL is None:
        return None
    prctl, parent = _PRCTL, os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(1)

    return preexec
