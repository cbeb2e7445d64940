"""The dynamic batching window: admit new prompts now, or hold them to prefill several at once.

A prompt admitted while decodes run lengthens that step for every decoding stream (its prefill
shares the forward). Admitting each arrival at once (flush) gives the best time to first token;
holding arrivals for a while and prefilling them together (hold) makes fewer steps carry a
prefill, so most inter-token gaps stay short, at the cost of first-token latency and of longer
gaps in the steps that do carry the batch. docs/ENGINE.md has the measured trade-off.

The scheduler asks `WindowGate.opens` once per step, before it admits anything. The gate only
ever delays *new* arrivals (requests never scheduled) and only while decodes run; it opens when:
- nothing decodes this step (no stream to protect), or
- this step prefills anyway: a preempted request waits, or a running prompt continues its chunk
  (newcomers ride along at no extra interruption), or
- the waiting newcomers would fill the step (its token budget or the free seats), or
- the oldest newcomer has waited `batching_window_ms` (the cap: nothing starves), or
- adaptive only: at least `batching_window_ratio` newcomers per decoding stream are waiting
  (few streams running → one arrival suffices; many → it waits for a batch worth interrupting
  them), or no further arrival is expected before the cap: at the arrival rate of the last ten
  windows, the next one is due after the oldest newcomer's window ends. Holding then
  gathers nobody and only delays, so the hold adapts to load both ways: it happens only while
  many streams decode and prompts arrive faster than the window.
Time comes from the scheduler's injected clock, so every rule is testable without sleeping.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class BatchingWindow(enum.StrEnum):
    FLUSH = "flush"  # admit every arrival in the next step
    HOLD = "hold"  # hold arrivals up to the window while decodes run
    ADAPTIVE = "adaptive"  # hold only while load makes it pay, up to the window


@dataclass(slots=True)
class WindowView:
    """What the gate sees at one step boundary, after the running requests were scheduled."""

    oldest_wait_s: float  # how long the oldest new arrival has waited
    num_new: int  # new arrivals waiting (never scheduled)
    new_tokens: int  # their prompt tokens
    num_restarting: int  # preempted requests waiting (they started already: never held)
    num_decodes: int  # running requests decoding in this step
    step_has_prefill: bool  # a running prompt continues its chunk in this step
    room_tokens: int  # token budget left in this step
    free_seats: int  # max_num_seqs - running
    next_arrival_s: float = float("inf")  # when the next arrival is due, from now, at the recent rate


class WindowGate:
    def __init__(self, mode: BatchingWindow, window_ms: float, ratio: float):
        self.mode = BatchingWindow(mode)
        self.window_s = window_ms / 1000.0
        self.ratio = ratio

    def opens(self, v: WindowView) -> bool:
        """True: admit waiting requests in this step; False: hold the newcomers one more step."""
        if self.mode is BatchingWindow.FLUSH or v.num_new == 0 or v.num_decodes == 0:
            return True
        if v.num_restarting > 0 or v.step_has_prefill:
            return True
        if v.new_tokens >= v.room_tokens or v.num_new >= v.free_seats:
            return True
        if v.oldest_wait_s >= self.window_s:
            return True
        if self.mode is not BatchingWindow.ADAPTIVE:
            return False
        return v.num_new >= self.ratio * v.num_decodes or v.oldest_wait_s + v.next_arrival_s > self.window_s
