"""A child process that dies with the process that started it (Linux: PR_SET_PDEATHSIG).

Workers, search replicas and torchrun groups are started as `[*tied_to_this_process(), *argv]`:
a small Python program (this module's `main`) sets PR_SET_PDEATHSIG to SIGTERM, checks that
its parent is still the one that started it, and execs the real command, which keeps the
setting (it survives exec). So a parent killed by SIGKILL never leaves them running alone.

Why not `subprocess.Popen(preexec_fn=...)`, which this replaced: a `preexec_fn` forces a plain
fork of the whole parent and runs the at-fork handlers and Python code in the child before the
exec. In a parent with gRPC, torch and many threads that crashed a child once in CI (a
segfault between fork and exec during a fleet test). Without `preexec_fn`, subprocess can use
vfork and runs no Python in the child; the price is one small interpreter start (~20 ms) per
child, which starts a model or an index anyway.

The signal fires when the *thread* that started the child exits, not the process: start
children from a long-lived thread (the event loop's).
"""

from __future__ import annotations

import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def tied_to_this_process() -> list[str]:
    """The argv prefix that makes the command after it die with this process (empty where the
    platform has no PR_SET_PDEATHSIG: the caller's own stop handling is all there is)."""
    if not sys.platform.startswith("linux"):
        return []
    return [sys.executable, "-m", "sluice.parent_death", str(os.getpid()), "--"]


def main(argv: list[str]) -> None:
    """`python -m sluice.parent_death PARENT_PID -- COMMAND...`"""
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: python -m sluice.parent_death PARENT_PID -- COMMAND [ARG...]")
    parent, command = int(argv[0]), argv[2:]
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not glibc's prctl: run the command untied
    if os.getppid() != parent:  # the parent died before the setting took effect
        sys.exit(1)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
