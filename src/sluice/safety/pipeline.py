"""The safety facade the API uses: one per policy, shared by all requests that use it."""

from __future__ import annotations

import time
from dataclasses import dataclass

from sluice.safety.classifier import Classifier, ClassifierResult
from sluice.safety.input_rules import check_input
from sluice.safety.patterns import PatternSet
from sluice.safety.policy import SafetyPolicy, load_policy
from sluice.safety.stream_guard import StreamGuard
from sluice.safety.verdict import Verdict


@dataclass(slots=True)
class SafetyTimings:
    l1_calls: int = 0
    l1_seconds: float = 0.0


class SafetyPipeline:
    def __init__(self, policy: SafetyPolicy, classifier: Classifier | None = None):
        self.policy = policy
        self.input_patterns = PatternSet(policy)
        self.output_patterns = PatternSet(policy, output=True)
        cs = policy.classifier
        self.classifier = classifier if classifier is not None else (
            Classifier(cs.workers, cs.max_pending) if cs.enabled else None
        )
        self.timings = SafetyTimings()

    @classmethod
    def from_file(cls, path: str | None = None) -> "SafetyPipeline":
        return cls(load_policy(path))

    # -- L1 ---------------------------------------------------------------------------------------
    def check_input(self, texts: list[str]) -> Verdict | None:
        t0 = time.perf_counter()
        try:
            return check_input(self.input_patterns, texts)
        finally:
            self.timings.l1_calls += 1
            self.timings.l1_seconds += time.perf_counter() - t0

    def input_action(self, verdict: Verdict) -> str:
        return next((c.input_action for c in self.policy.categories if c.name == verdict.category), "block_400")

    # -- L2 / periodic checks ------------------------------------------------------------------------
    async def classify(self, text: str, layer: str, deadline_s: float | None = None, output: bool = False) -> Verdict | None:
        """A verdict when a category's classifier threshold is crossed, or when the pool cannot
        answer and that category fails closed."""
        if self.classifier is None:
            return None
        result = await self.classifier.classify(text, deadline_s)
        return self.judge(result, layer, output)

    def judge(self, result: ClassifierResult, layer: str, output: bool = False) -> Verdict | None:
        for cat in self.policy.categories:
            if cat.classifier_threshold is None or (output and not cat.check_output):
                continue
            if result.status != "ok":
                if result.status in ("saturated", "unavailable") and cat.fail_mode == "closed":
                    return Verdict(layer, cat.name, f"classifier:{result.status}")
                continue
            assert result.scores is not None
            score = sum(result.scores.get(c, 0.0) for c in cat.classifier_classes)
            if score >= cat.classifier_threshold:
                return Verdict(layer, cat.name, "classifier:" + "+".join(cat.classifier_classes), score=score)
        return None

    # -- L3 / L4 ----------------------------------------------------------------------------------
    def stream_guard(self) -> StreamGuard:
        return StreamGuard(self.output_patterns)

    def post_check(self, text: str) -> Verdict | None:
        """L4 on the finished text: the patterns over the whole reply (the classifier window
        checks run during the stream)."""
        from sluice.safety.normalize import normalize

        norm, src = normalize(text)
        m = self.output_patterns.scan(norm)
        if m is None:
            return None
        return Verdict("L4", m.category, m.rule, src[m.start], src[m.end - 1] + 1)
