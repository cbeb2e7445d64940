"""The output tokens one reply may spend, however many generations it takes.

A reply is usually one generation; with the search server tool it is several rounds
(serving/search_tool/tool_loop.py), each a request of its own through the pipeline. The client's
`max_tokens` bounds them all together: every round's request carries this one object, planning
sizes the round's generation by what is `left` (serving/planning.py), and the loop `spend`s each
round's output on it. Nothing recomputes the number along the way.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class OutputBudget:
    # the client's max_tokens: None = each generation may fill the rest of its context window;
    # 0 = prefill only (Anthropic's cache warm-up: the prompt is computed, nothing is returned)
    limit: int | None
    spent: int = 0  # output tokens of the generations that have ended

    @property
    def left(self) -> int | None:
        return None if self.limit is None else self.limit - self.spent

    @property
    def exhausted(self) -> bool:
        left = self.left
        return left is not None and left <= 0

    def spend(self, tokens: int) -> None:
        self.spent += tokens
