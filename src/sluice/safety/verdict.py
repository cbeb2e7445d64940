"""A safety decision. A check returns None when it passes and a Verdict when it does not; what
happens next is the verdict's `action` (from the policy)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Layer(str, enum.Enum):
    L1 = "L1"  # input rules, before the response starts
    L2 = "L2"  # the classifier on the input, alongside prefill
    L3 = "L3"  # the stream guard (and the periodic classifier window)
    L4 = "L4"  # the post-check on the finished text

    @property
    def on_input(self) -> bool:
        return self in (Layer.L1, Layer.L2)


class Action(str, enum.Enum):
    """What a category's match does. Input: BLOCK_400 / BLOCK_403 / ALLOW. Output: REFUSE (kill
    the stream: stop_reason "refusal") / LOG (record only)."""

    BLOCK_400 = "block_400"
    BLOCK_403 = "block_403"
    ALLOW = "allow"
    REFUSE = "refuse"
    LOG = "log"


INPUT_ACTIONS = (Action.BLOCK_400, Action.BLOCK_403, Action.ALLOW)
OUTPUT_ACTIONS = (Action.REFUSE, Action.LOG)


@dataclass(slots=True, frozen=True)
class Verdict:
    layer: Layer
    category: str  # the policy category
    rule: str  # "literal:<n>", "regex:<n>" (+ ":base64"), "classifier:<classes>", "classifier:saturated"
    start: int = -1  # offsets in the original text checked (-1 when not positional)
    end: int = -1
    score: float | None = None  # the classifier's score, for classifier verdicts
    action: Action = Action.BLOCK_400
    part: int = -1  # which of the input texts matched (L1), else -1

    @property
    def code(self) -> str:
        """Stable machine-readable code for clients and logs: safety.input.<cat> / safety.output.<cat>."""
        return f"safety.{'input' if self.layer.on_input else 'output'}.{self.category}"

    @property
    def blocked(self) -> bool:
        return self.action not in (Action.LOG, Action.ALLOW)
