"""Give memory the C heap holds but no longer uses back to the operating system.

glibc's malloc keeps freed memory for reuse: the main heap shrinks only from its top, and the
memory of a thread's arena only on its own later frees. After a one-off peak (a model load, the
gateway's tokenizer build, a burst of 32 streams in the engine) tens of MiB sit resident unused.
`malloc_trim(0)` walks every arena and releases whole free pages (madvise) anywhere in them.
Callers do it at quiet moments only (after start-up; when the engine has sat idle), never per
step: the pages come back as page faults when used again. A no-op where malloc is not glibc's.

Also at start-up's end: what start-up built, taken out of Python's cyclic collector
(`freeze_startup_objects`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except AttributeError:  # musl and other C libraries without it
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_TRIM = _malloc_trim()


def trim_heap() -> bool:
    """Release the C heap's free pages; True if some memory was returned."""
    return bool(_TRIM(0)) if _TRIM is not None else False


def freeze_startup_objects() -> int:
    """Collect start-up's cyclic garbage once, then move every object still alive into the
    collector's permanent generation (gc.freeze), which later collections do not walk. Returns how
    many objects that froze.

    A process that has loaded its tokenizers, the safety pipelines or a model holds ~10^5 objects
    or more (the gateway froze ~94,000) that live as long as it does. A full collection walks them
    all: in the gateway, two in a 36 s 32-stream load took ~93 ms each, and every stream's delivery
    stopped for that long; frozen, the two took 3 and 9 ms (docs/BENCHMARKS.md, "The served
    32-stream step against the engine's own"). Called once, when the process is ready. Frozen
    objects are never collected, so start-up's garbage in cycles is collected first, as here."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
