"""OpenMP's idle threads sleep at once in a process that runs an engine (OMP_WAIT_POLICY=PASSIVE).

An engine splits its decode calls over the CPU kernels' own helper threads, never over OpenMP
(models/kernels/csrc/helper_pool.h). OpenMP regions still run between them: every prefill step's
calls, and torch ops on a whole vocabulary row (sampling at a temperature, log-softmax for
logprobs). After a region libgomp's threads by default spin for the next one for milliseconds,
and on a machine with a core per thread that spin takes the core the helper needs: the next
decode calls run as if on one core, and the helper pool, counting its helpers' missed chunks,
rests serially for hundreds of calls (docs/ENGINE.md, "Dispatch"). With PASSIVE they sleep at
once: a region then wakes its threads with a futex, microseconds against the milliseconds of a
prefill call (docs/BENCHMARKS.md, "No OpenMP spinning against the helper pool").

libgomp reads the variable once, when torch loads it, so this must run before `import torch`:
the commands that run an engine (`sluice worker`, `sluice serve`, `sluice generate`) call it
first. A value the user set is kept; a program that imports the engine as a library may set the
variable itself.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

VARIABLE = "OMP_WAIT_POLICY"
PASSIVE = "PASSIVE"


def sleep_when_idle(environ: MutableMapping[str, str] | None = None, modules: dict | None = None) -> bool:
    """Set OMP_WAIT_POLICY=PASSIVE unless it is set already. True if this process's OpenMP
    threads will sleep when idle: the variable is PASSIVE (set here or by the user) and torch,
    which loads libgomp and with it reads the variable, was not imported yet. Child processes
    inherit the variable either way."""
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    environ.setdefault(VARIABLE, PASSIVE)
    return environ[VARIABLE].upper() == PASSIVE and "torch" not in modules
