"""A safety decision. A check returns None when it passes and a Verdict when it does not; what
happens next is the verdict's `action` (from the policy)."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.safety.verdict_log import log_verdict  # re-exported: callers import it from here

__all__ = ["Verdict", "log_verdict"]


@dataclass(slots=True, frozen=True)
class Verdict:
    layer: str  # L1 input rules | L2 input classifier | L3 stream guard | L4 post-check
    category: str  # the policy category
    rule: str  # "literal:<n>", "regex:<n>" (+ ":base64"), "classifier:<classes>", "classifier:saturated"
    start: int = -1  # offsets in the original text checked (-1 when not positional)
    end: int = -1
    score: float | None = None  # the classifier's score, for classifier verdicts
    action: str = "block_400"  # block_400 | block_403 (input), refuse | log (output)
    part: int = -1  # which of the input texts matched (L1), else -1

    @property
    def code(self) -> str:
        """Stable machine-readable code for clients and logs: safety.input.<cat> / safety.output.<cat>."""
        return f"safety.{'input' if self.layer in ('L1', 'L2') else 'output'}.{self.category}"

    @property
    def blocked(self) -> bool:
        return self.action not in ("log", "allow")

    @property
    def status(self) -> int:
        """The HTTP status an input block maps to (400 invalid_request_error / 403 permission_error)."""
        return 403 if self.action == "block_403" else 400
