"""The adapters resident in one engine: LoRA weights loaded once per worker and shared by every
request and step that uses them, at most `max_cpu_loras` kept, least recently used evicted.

An adapter is keyed by its `AdapterRef` (name and source). `prefetch` loads one that is not
resident (reading and checking the folder: a damaged one raises AdapterError naming what is
wrong, and nothing else changes); the async front calls it off the engine thread before a
request is queued, so a step does not wait for a load. `get` is the step's: the adapter of a
running request is resident, unless it was evicted meanwhile, and then it is loaded again,
transparently. Adapters in use by running requests (`in_use`, the scheduler's) are never
evicted; the cap may be passed only while more adapters than that are in use.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sluice.errors import AdapterError
from sluice.models.lora.adapter_folder import read_adapter
from sluice.models.lora.source import adapter_files
from sluice.models.lora.weights import LoraWeights
from sluice.types import AdapterRef

if TYPE_CHECKING:
    from sluice.models.llama import LlamaModel

log = logging.getLogger(__name__)


def _in_use(read: Callable[[], Collection[AdapterRef]]) -> Collection[AdapterRef]:
    """The engine thread's set, read from a loading thread: a copy that raced a change is retried
    (a race costs nothing worse than keeping one adapter too many until the next load)."""
    for _ in range(3):
        try:
            return read()
        except RuntimeError:  # changed size during iteration
            continue
    return ()


@dataclass(slots=True)
class Resident:
    weights: LoraWeights
    fingerprint: str  # of the files it was loaded from (models/lora/source.py)


class AdapterCache:
    def __init__(
        self,
        model: LlamaModel,
        max_cpu_loras: int,
        max_rank: int,
        s3_endpoint: str | None = None,
        in_use: Callable[[], Collection[AdapterRef]] = tuple,
        cache_dir: Path | None = None,
    ):
        """`model`: the LlamaModel the adapters bind to; `in_use`: adapters not to evict."""
        self.model = model
        self.capacity = max_cpu_loras
        self.max_rank = max_rank
        self.s3_endpoint = s3_endpoint
        self.cache_dir = cache_dir
        self.in_use = in_use
        self._resident: OrderedDict[AdapterRef, Resident] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()
        self._loading: dict[AdapterRef, threading.Event] = {}
        self.loads = 0
        self.evictions = 0
        self.last_load_s = 0.0

    # -- lookups -------------------------------------------------------------------------------
    def resident(self) -> list[AdapterRef]:
        with self._lock:
            return list(self._resident)

    def resident_bytes(self) -> int:
        with self._lock:
            return sum(r.weights.nbytes for r in self._resident.values())

    def fingerprint(self, ref: AdapterRef) -> str:
        """The files' fingerprint of a resident adapter (prefetch first)."""
        with self._lock:
            return self._resident[ref].fingerprint

    # -- loading -------------------------------------------------------------------------------
    def prefetch(self, ref: AdapterRef) -> str:
        """Make `ref` resident (loading it if needed; thread-safe, one load per adapter at a
        time); its fingerprint. AdapterError when it cannot be served."""
        return self._ensure(ref).fingerprint

    def get(self, ref: AdapterRef) -> LoraWeights:
        """The adapter's weights for a step, reloaded if it was evicted."""
        return self._ensure(ref).weights

    def unload(self, name: str) -> int:
        """Drop every resident adapter of that name (in use or not: a request still running
        with it reloads it); how many were dropped."""
        with self._lock:
            gone = [ref for ref in self._resident if ref.name == name]
            for ref in gone:
                del self._resident[ref]
        return len(gone)

    def _ensure(self, ref: AdapterRef) -> Resident:
        while True:
            with self._lock:
                hit = self._resident.get(ref)
                if hit is not None:
                    self._resident.move_to_end(ref)
                    return hit
                pending = self._loading.get(ref)
                if pending is None:
                    self._loading[ref] = threading.Event()
                    break
            pending.wait()  # another thread loads it: use its result (or try ourselves if it failed)
        try:
            loaded = self._load(ref)
            with self._lock:
                self._resident[ref] = loaded
                self._evict(keep=ref)
            return loaded
        finally:
            with self._lock:
                self._loading.pop(ref).set()

    def _load(self, ref: AdapterRef) -> Resident:
        started = time.perf_counter()
        files = adapter_files(ref.source, self.s3_endpoint, self.cache_dir)
        tensors = read_adapter(files.folder, self.model.config, self.max_rank)
        try:
            weights = LoraWeights(ref.name, tensors, self.model.config, self.model.ops, self.model.device)
        except (RuntimeError, ValueError) as exc:  # the kernels refused a shape: still the adapter's fault
            raise AdapterError(f"adapter {ref.name!r}: {exc}") from None
        self.loads += 1
        self.last_load_s = time.perf_counter() - started
        log.info(
            "LoRA adapter %s loaded from %s in %.0f ms (rank %d, %.1f MiB)",
            ref.name,
            ref.source,
            self.last_load_s * 1000,
            weights.rank,
            weights.nbytes / 2**20,
        )
        return Resident(weights, files.fingerprint)

    def _evict(self, keep: AdapterRef) -> None:
        """Down to the capacity, least recently used first, never an adapter in use nor the one
        just loaded (lock held)."""
        if len(self._resident) <= self.capacity:
            return
        busy = {*_in_use(self.in_use), keep}
        for ref in list(self._resident):
            if len(self._resident) <= self.capacity:
                return
            if ref not in busy:
                del self._resident[ref]
                self.evictions += 1
                log.info("LoRA adapter %s evicted (max_cpu_loras %d)", ref.name, self.capacity)
