"""L2: a trained classifier off the event loop, with a deadline and a bounded pool.

The model is svguardian (securevector-guardian-model, Apache-2.0): word and char n-gram TF-IDF
with logistic regression over 8 classes (prompt_injection, jailbreak, data_exfiltration, pii,
social_engineering, harmful_content, model_attack, benign), trained by its vendor. Its weights
ship inside the wheel and are loaded from there only: `_runtime.bundled_path()` is the in-wheel
file; `resolve_runtime()` is not called, because its fallbacks read an environment override and
then download from GitHub — network code we never want reachable from a server.

Pure Python (it holds the GIL), so the pool is small: it keeps the event loop free between
calls rather than adding parallelism. A bounded number of pending calls; beyond it the pool is
SATURATED and the policy's per-category fail mode decides. Long texts are classified in
overlapping word windows, max-pooled per class (a short injection hidden in a long benign text
would otherwise be diluted).
"""

from __future__ import annotations

import asyncio
import logging
import time
from array import array
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported at run time by load_bundled_model, where the model loads
    from svguardian.model.pure_infer import PureGuardian

log = logging.getLogger("sluice.safety")

OK, TIMEOUT, SATURATED, UNAVAILABLE = "ok", "timeout", "saturated", "unavailable"
WINDOW_WORDS = 24  # the vendor's own windowing uses 24 words, stride 12: short enough not to dilute
WINDOW_STRIDE = 12
MAX_WINDOWS = 64  # bounds one call's cost (~0.15 ms a window here, ~700 words); the end is kept


@dataclass(slots=True, frozen=True)
class ClassifierResult:
    status: str  # ok | timeout | saturated | unavailable
    scores: dict[str, float] | None = None  # class -> probability (max over windows)
    elapsed_ms: float = 0.0


@dataclass(slots=True)
class LatencyStats:
    samples: deque[float] = field(default_factory=lambda: deque(maxlen=4096))  # ms, compute only
    timeouts: int = 0
    saturated: int = 0

    def quantile(self, q: float) -> float:
        if not self.samples:
            return 0.0
        xs = sorted(self.samples)
        return xs[min(len(xs) - 1, int(q * len(xs)))]


def load_bundled_model() -> PureGuardian:
    """svguardian's model from inside its wheel, or RuntimeError; never downloads."""
    from svguardian._runtime import bundled_path
    from svguardian.model.pure_infer import PureGuardian

    path = bundled_path()
    if not path:
        raise RuntimeError("svguardian's bundled model is missing from its wheel")
    return compact(PureGuardian.load(path))


def compact(model: PureGuardian) -> PureGuardian:
    """Hold the model's weights as arrays of doubles rather than lists of float objects: 8 bytes
    a value instead of 32 (the 8 x 43k coefficients were ~11 MiB of the gateway's memory). The
    model only indexes them, and array('d') gives back the very doubles the JSON held, so the
    scores are bit-identical."""
    model.coef = [array("d", row) for row in model.coef]
    for block in (model.word, model.char):
        block["idf"] = array("d", block["idf"])
    return model


def windows(text: str) -> list[str]:
    words = text.split()
    if len(words) <= WINDOW_WORDS:
        return [text]
    starts = list(range(0, len(words) - WINDOW_WORDS + WINDOW_STRIDE, WINDOW_STRIDE))[-MAX_WINDOWS:]
    return [" ".join(words[s : s + WINDOW_WORDS]) for s in starts]


class Classifier:
    def __init__(self, workers: int = 1, max_pending: int = 32, model=None):
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sluice-safety")
        self.max_pending = max_pending
        self.pending = 0
        self.stats = LatencyStats()
        try:
            self.model = model if model is not None else load_bundled_model()
            self.model.predict("warm up")  # first call builds caches; keep it off a request
        except Exception as exc:  # a missing model: every call reports unavailable (fail modes apply)
            log.warning("safety classifier unavailable: %s", exc)
            self.model = None

    def scores(self, text: str) -> dict[str, float]:
        """Per-class probability, max-pooled over windows (benign: min-pooled)."""
        m = self.model
        assert m is not None
        t0 = time.perf_counter()
        pooled: dict[str, float] = {}
        for w in windows(text):
            for cls, p in zip(m.classes, m._softmax(m._scores(w))):
                prev = pooled.get(cls)
                if prev is None:
                    pooled[cls] = float(p)
                else:
                    pooled[cls] = min(prev, float(p)) if cls == "benign" else max(prev, float(p))
        self.stats.samples.append((time.perf_counter() - t0) * 1000)
        return pooled

    async def classify(self, text: str, deadline_s: float | None = None) -> ClassifierResult:
        """Scores, or TIMEOUT when `deadline_s` passes first (the call finishes in the pool and
        is dropped), or SATURATED when `max_pending` calls are already queued."""
        if self.model is None:
            return ClassifierResult(UNAVAILABLE)
        if self.pending >= self.max_pending:
            self.stats.saturated += 1
            return ClassifierResult(SATURATED)
        self.pending += 1
        t0 = time.perf_counter()
        fut = asyncio.get_running_loop().run_in_executor(self._pool, self.scores, text)
        fut.add_done_callback(self._done)
        try:
            scores = await (asyncio.wait_for(asyncio.shield(fut), deadline_s) if deadline_s else fut)
        except TimeoutError:
            self.stats.timeouts += 1
            return ClassifierResult(TIMEOUT, elapsed_ms=(time.perf_counter() - t0) * 1000)
        return ClassifierResult(OK, scores, (time.perf_counter() - t0) * 1000)

    def _done(self, _fut: object) -> None:
        self.pending -= 1

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
