"""The operating system's name for the calling thread (Linux: PR_SET_NAME), so `top -H`, `ps -L`,
py-spy and bench/serving/served_steps.py tell sluice's busy threads apart. Python 3.11's
`threading.Thread(name=...)` names the thread for Python only: every thread of a worker shows
as "python" to the system. The kernels' helper threads name themselves (csrc/helper_pool.h);
other threads a named thread starts inherit its name (torch's OpenMP team, which the engine
thread starts for its first prefill, shows as "sluice-engine" too)."""

from __future__ import annotations

import ctypes
import sys

_PR_SET_NAME = 15
NAME_MAX_BYTES = 15  # the kernel keeps 16 bytes, the last one a NUL


def name_this_thread(name: str) -> None:
    """Names the calling thread (cut to 15 bytes); does nothing where the platform cannot."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, name.encode()[:NAME_MAX_BYTES], 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not glibc's prctl: the thread keeps the process's name
