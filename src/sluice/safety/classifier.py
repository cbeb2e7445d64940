"""L2: a trained classifier off the event loop, with a deadline and a bounded pool.

The model is svguardian (securevector-guardian-model): TF-IDF n-grams + logistic regression,
8 classes (prompt_injection, jailbreak, data_exfiltration, pii, social_engineering,
harmful_content, model_attack, benign), trained by its vendor; its weights ship inside the
wheel and are loaded from there only — the package's download fallback is never called.
Measured here: ~0.2–0.8 ms per short text.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

log = logging.getLogger("sluice.safety")


@dataclass(slots=True, frozen=True)
class ClassifierResult:
    status: str  # ok | timeout | saturated | unavailable
    scores: dict[str, float] | None = None  # class -> probability


def _load_model():
    from svguardian import _bundle
    from svguardian.model.pure_infer import PureGuardian

    path = _bundle._runtime.bundled_path()  # the in-wheel bundle only: never a download
    if not path:
        raise RuntimeError("svguardian's bundled model is missing from its wheel")
    return PureGuardian.load(path)


class Classifier:
    def __init__(self, workers: int = 1, max_pending: int = 32):
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sluice-safety")
        self.max_pending = max_pending
        self.pending = 0
        try:
            self.model = _load_model()
            self.model.predict("warm up")
        except Exception as exc:  # a missing model: every call reports unavailable (fail modes apply)
            log.warning("safety classifier unavailable: %s", exc)
            self.model = None

    def _scores(self, text: str) -> dict[str, float]:
        assert self.model is not None
        proba = self.model._softmax(self.model._scores(text))
        return dict(zip(self.model.classes, (float(p) for p in proba)))

    def classify_sync(self, text: str) -> ClassifierResult:
        if self.model is None:
            return ClassifierResult("unavailable")
        return ClassifierResult("ok", self._scores(text))

    async def classify(self, text: str, deadline_s: float | None = None) -> ClassifierResult:
        if self.model is None:
            return ClassifierResult("unavailable")
        if self.pending >= self.max_pending:
            return ClassifierResult("saturated")
        self.pending += 1
        fut = asyncio.get_running_loop().run_in_executor(self._pool, self._scores, text)
        fut.add_done_callback(lambda _: self._done())
        try:
            scores = await asyncio.wait_for(asyncio.shield(fut), deadline_s) if deadline_s else await fut
        except TimeoutError:
            return ClassifierResult("timeout")
        return ClassifierResult("ok", scores)

    def _done(self) -> None:
        self.pending -= 1

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
