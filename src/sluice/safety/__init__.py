"""Safety layers: L1 input rules, L2 classifier, L3 streaming guard, L4 post-check.

The API uses `SafetyPipeline` (pipeline.py); everything else is its parts."""

from sluice.safety.pipeline import SafetyPipeline, texts_from_messages
from sluice.safety.policy import PolicyError, PolicyRegistry, SafetyPolicy, load_policy
from sluice.safety.stream_guard import StreamGuard
from sluice.safety.verdict import Verdict, log_verdict

__all__ = ["SafetyPipeline", "texts_from_messages", "PolicyError", "PolicyRegistry", "SafetyPolicy", "load_policy",
           "StreamGuard", "Verdict", "log_verdict"]
