"""sluice's CPU kernels (a C++ torch extension) and the choice between them and plain torch.

What the extension provides (csrc/, described in docs/ENGINE.md): exact fp32 linears over
weights kept in their GGUF blocks (Q4_1, Q8_0), an int8-activation variant (the opt-in fast
numerics), paged decode attention that reads K/V in place, and fused RMSNorm / SiLU·mul / RoPE.

`kernel_ops(KernelChoice.AUTO)` returns the loaded extension, building it on first use (see
build.py), or None when it cannot be built or loaded or the CPU lacks AVX2: sluice then runs
its portable torch path and says so in one log line. `KernelChoice.TORCH` forces that path.
"""

from __future__ import annotations

import logging
import threading
from enum import StrEnum
from types import ModuleType

log = logging.getLogger(__name__)


class KernelChoice(StrEnum):
    AUTO = "auto"  # the extension when it builds and the CPU has AVX2, else torch
    TORCH = "torch"  # always the portable torch path (fp32 weights in memory)


class Numerics(StrEnum):
    EXACT = "exact"  # fp32 arithmetic on the exactly dequantized weights (the default)
    FAST = "fast"  # int8 activations x 4-bit weights, as llama.cpp computes (opt-in)


class KVCacheDtype(StrEnum):
    """How the KV cache stores K and V. AUTO: the model's dtype (fp32 on the CPU: exact).
    FLOAT16: IEEE half, as llama.cpp's default cache: half the memory and the attention's reads,
    not exact (each K/V value rounded to 11 significant bits); opt-in, meant with fast numerics."""

    AUTO = "auto"
    FLOAT16 = "float16"


_lock = threading.Lock()
_state: dict[str, ModuleType | None] = {}


def kernel_ops(choice: KernelChoice | str = KernelChoice.AUTO) -> ModuleType | None:
    """The extension module, or None for the torch path (logged once per process)."""
    if KernelChoice(choice) is KernelChoice.TORCH:
        return None
    with _lock:
        if "ops" not in _state:
            _state["ops"] = _load()
        return _state["ops"]


def loaded_ops() -> ModuleType | None:
    """The extension module if this process has loaded it already (never builds or loads it)."""
    return _state.get("ops")


# calls of at least this many multiply-adds split with decode_split_rows (csrc/ops.cpp split_call):
# every linear of one stream of the bundled model (the smallest, o, is 332K), not the glue. With the
# helpers spinning through a step (csrc/helper_pool.h set_hot), 64K beat 256K and 1M at one stream
# (one step 0.64x / 0.66-0.71x / 0.80-0.83x of serial: docs/BENCHMARKS.md, "The second core, by default")
DECODE_SPLIT_MIN_WORK = 1 << 16
# with decode_split_rows, decode attention calls of at least this many multiply-adds split too,
# at any batch size (csrc/ops.cpp set_attn_split_work): one stream from ~28 context tokens of the
# bundled model (9 heads x 64 x 2 per token); at 400 tokens a step took 0.63x of serial with it
# against 0.68x with the old 512K cut (helpers spinning through the step)
ATTN_SPLIT_MIN_WORK = 1 << 15
_NO_ATTN_SPLIT = (1 << 63) - 1


def set_decode_split(min_rows: int, choice: KernelChoice | str = KernelChoice.AUTO) -> None:
    """Decode calls of >= `min_rows` rows split over the helper pool, and decode attention of
    >= ATTN_SPLIT_MIN_WORK multiply-adds at any batch size; 0 = none. Process-wide
    (one engine per worker). Loads the extension only to turn the split on."""
    if min_rows:
        ops = kernel_ops(choice)
    else:
        with _lock:
            ops = _state.get("ops")  # off and never loaded: nothing to reset
    if ops is not None:
        # min_rows 0: a cut above every decode-sized call (csrc/ops.cpp DECODE_MAX_ROWS)
        ops.set_split_cut(min_rows or ops.DECODE_MAX_ROWS + 1, DECODE_SPLIT_MIN_WORK)
        ops.set_attn_split_work(ATTN_SPLIT_MIN_WORK if min_rows else _NO_ATTN_SPLIT)


def _load() -> ModuleType | None:
    try:
        from sluice.models.kernels.build import load_module

        ops = load_module()
    except Exception as exc:  # a missing compiler, a failed build, a bad cache: all fall back
        log.warning(
            "sluice kernels unavailable (%s: %s); using the torch path (fp32 weights)",
            type(exc).__name__,
            str(exc).splitlines()[0] if str(exc) else "",
        )
        return None
    if ops.isa() == "none":
        log.warning("sluice kernels unavailable (this CPU lacks AVX2/FMA/F16C); using the torch path (fp32 weights)")
        return None
    log.info("sluice kernels: %s", ops.isa())
    return ops
