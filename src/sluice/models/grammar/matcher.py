"""One request's grammar state: which tokens may come next, advanced on every accepted token.

The state is a function of the request's output tokens alone, so it can always be rebuilt from
them: a preempted request drops its parser state (`release`, it may wait a long time and the
state holds the parser's stacks) and `sync` replays its outputs when it is next sampled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch only for the annotation: engine/request.py (and so routing) imports this
    import torch


class GrammarMatcher:
    __slots__ = ("_template", "_state", "consumed", "rebuilds")

    def __init__(self, template: Any):
        self._template = template  # the compiled, never-advanced matcher shared through the cache
        self._state: Any | None = template.deep_copy()
        self.consumed = 0  # output tokens the state has accepted
        self.rebuilds = 0

    @property
    def state(self) -> Any:
        assert self._state is not None, "sync() the matcher before using it"
        return self._state

    def release(self) -> None:
        """Drop the parser state (the request was preempted); `sync` rebuilds it."""
        self._state = None

    def sync(self, output_token_ids: list[int]) -> bool:
        """Make the state match `output_token_ids`, replaying them if it was released or is
        behind. False if the tokens do not parse (cannot happen for tokens it chose)."""
        if self._state is not None and self.consumed == len(output_token_ids):
            return True
        self._state = self._template.deep_copy()
        self.rebuilds += 1
        self.consumed = len(output_token_ids)
        return not output_token_ids or bool(self._state.consume_tokens(output_token_ids))

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed-next-token bits into `bitmask[row]` (int32, CPU, contiguous)."""
        view = bitmask[row]
        self.state.unsafe_compute_mask_ptr(view.data_ptr(), view.numel() * view.element_size())

    def accept(self, token_id: int) -> bool:
        """Advance by one sampled token; False (and an error state) if the grammar forbids it."""
        self.consumed += 1
        return bool(self.state.consume_token(token_id))

    @property
    def is_stopped(self) -> bool:
        """Nothing but end-of-sequence can follow: the reply is complete."""
        return bool(self.state.is_stopped())

    @property
    def error(self) -> str:
        return self.state.get_error() if self.state.is_error() else ""
