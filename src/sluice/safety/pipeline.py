"""The safety facade the API uses: one per policy, shared by every request that uses it.

    pipeline = SafetyPipeline(load_policy(path))
    v = pipeline.check_input(texts)            # L1, sync, before the 200 → 400/403 on a Verdict
    task = pipeline.classify(text, Layer.L2)   # L2, async, alongside prefill → refusal
    guard = pipeline.stream_guard()            # L3, per stream: guard.feed(delta) / guard.flush()
    v = pipeline.post_check(reply)             # L4, the patterns over the finished reply

A check returns None when the text passes and a Verdict when it does not.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from sluice.safety.classifier import OK, TIMEOUT, Classifier, ClassifierResult
from sluice.safety.input_rules import check_texts
from sluice.safety.patterns import PatternSet
from sluice.safety.policy import FailMode, SafetyPolicy, load_policy
from sluice.safety.post_check import post_check_patterns
from sluice.safety.stream_guard import GuardStats, StreamGuard
from sluice.safety.verdict import Action, Layer, Verdict
from sluice.safety.verdict_log import log_verdict


@dataclass(slots=True)
class SafetyStats:
    l1_calls: int = 0
    l1_seconds: float = 0.0
    l4_calls: int = 0
    l4_seconds: float = 0.0
    stream: GuardStats = field(default_factory=GuardStats)


class SafetyPipeline:
    def __init__(self, policy: SafetyPolicy, classifier: Classifier | None = None):
        self.policy = policy
        self.input_patterns = PatternSet(policy, "input")
        self.stream_patterns = PatternSet(policy, "stream")
        self.log_patterns = PatternSet(policy, "log")
        self._input_action = {c.name: c.input_action for c in policy.categories}
        self._output_action = {c.name: c.output_action for c in policy.categories}
        cs = policy.classifier
        uses_classifier = cs.enabled and any(c.classifier_threshold for c in policy.categories)
        self.classifier = (
            classifier
            if classifier is not None
            else (Classifier(cs.workers, cs.max_pending) if uses_classifier else None)
        )
        self.stats = SafetyStats()

    @classmethod
    def from_file(cls, path: str | None = None) -> SafetyPipeline:
        return cls(load_policy(path))

    # -- L1 -------------------------------------------------------------------------------------
    def check_input(self, texts: Sequence[str]) -> Verdict | None:
        t0 = time.perf_counter()
        try:
            found = check_texts(self.input_patterns, texts)
            if found is None:
                return None
            m, part, start, end = found
            return Verdict(Layer.L1, m.category, m.rule, start, end, action=self._input_action[m.category], part=part)
        finally:
            self.stats.l1_calls += 1
            self.stats.l1_seconds += time.perf_counter() - t0

    def input_action(self, verdict: Verdict) -> Action:
        return self._input_action.get(verdict.category, verdict.action)

    # -- L2 and the periodic L3 window check ------------------------------------------------------
    async def classify(
        self, text: str, layer: Layer = Layer.L2, deadline_s: float | None = None, output: bool = False
    ) -> Verdict | None:
        """A verdict when a category's threshold is crossed, or when the classifier cannot
        answer (saturated, past `deadline_s`, unavailable) and that category fails closed."""
        if self.classifier is None:
            return None
        return self.judge(await self.classifier.classify(text, deadline_s), layer, output)

    def judge(self, result: ClassifierResult, layer: Layer, output: bool = False) -> Verdict | None:
        for cat in self.policy.categories:
            if cat.classifier_threshold is None:
                continue
            if (output and not cat.check_output) or (not output and cat.input_action is Action.ALLOW):
                continue
            action = cat.output_action if output else Action.REFUSE  # L2 runs after the 200: it can only refuse
            if result.status != OK:
                if cat.fail_mode is FailMode.CLOSED:
                    rule = "classifier:" + ("timeout" if result.status == TIMEOUT else result.status)
                    return Verdict(layer, cat.name, rule, action=action)
                continue
            assert result.scores is not None
            score = sum(result.scores.get(c, 0.0) for c in cat.classifier_classes)  # related classes pool
            if score >= cat.classifier_threshold:
                return Verdict(
                    layer,
                    cat.name,
                    "classifier:" + "+".join(cat.classifier_classes),
                    score=round(score, 4),
                    action=action,
                )
        return None

    # -- L3 ---------------------------------------------------------------------------------------
    def stream_guard(self) -> StreamGuard:
        return StreamGuard(self.stream_patterns, self._output_action, self.stats.stream)

    # -- L4 ---------------------------------------------------------------------------------------
    def post_check(self, text: str, request_id: str = "") -> Verdict | None:
        """The patterns over the finished reply. A refusing category returns its verdict; a
        log-only category's verdict is logged here and None returned."""
        t0 = time.perf_counter()
        try:
            v = post_check_patterns(self.stream_patterns, text, self._output_action)
            if v is None and self.log_patterns.rules:
                logged = post_check_patterns(self.log_patterns, text, self._output_action)
                if logged is not None:
                    log_verdict(logged, request_id, text if self.policy.log_text else None)
            return v
        finally:
            self.stats.l4_calls += 1
            self.stats.l4_seconds += time.perf_counter() - t0

    def timing_stats(self) -> dict[str, float]:
        s, c = self.stats, self.classifier
        return {
            "l1_calls": s.l1_calls,
            "l1_us_mean": s.l1_seconds / s.l1_calls * 1e6 if s.l1_calls else 0.0,
            "l3_feeds": s.stream.feeds,
            "l3_us_per_feed": s.stream.us_per_feed,
            "l3_mean_holdback_chars": s.stream.mean_holdback,
            "l4_us_mean": s.l4_seconds / s.l4_calls * 1e6 if s.l4_calls else 0.0,
            "classifier_p50_ms": c.stats.quantile(0.5) if c else 0.0,
            "classifier_p99_ms": c.stats.quantile(0.99) if c else 0.0,
        }
