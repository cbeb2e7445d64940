"""Who waits first and who is preempted first: the scheduling policies.

One heap serves both policies; only the sort key differs:
- fcfs:     (arrival_time, seq_no)
- priority: (priority, arrival_time, seq_no)  — lower priority value = more urgent
A preempted request is pushed back with its original key, so it keeps its place in line
(vLLM #41951 starves preempted requests by re-queueing them as new arrivals; we do not).
The victim of a preemption is the opposite end: lowest priority, then newest arrival.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Iterable, Iterator

from sluice.engine.request import Request


class SchedulingPolicy(str, enum.Enum):
    """The waiting queue's order (and the preemption victim's)."""

    FCFS = "fcfs"
    PRIORITY = "priority"


class AdmissionPolicy(str, enum.Enum):
    """What a request must fit in the KV pool to be admitted."""

    OPTIMISTIC = "optimistic"  # its prompt (plus the watermark); decodes may preempt later
    RESERVE = "reserve"  # its prompt + max_tokens: never preempted for memory


POLICIES = tuple(p.value for p in SchedulingPolicy)
ADMISSION_POLICIES = tuple(p.value for p in AdmissionPolicy)


class WaitingQueue:
    def __init__(self, policy: SchedulingPolicy | str = SchedulingPolicy.FCFS):
        try:
            self.policy = SchedulingPolicy(policy)
        except ValueError:
            raise ValueError(f"unknown scheduling policy {policy!r}; choose one of {', '.join(POLICIES)}") from None
        # heap entries are [key, request, alive]; removal flips `alive` (heapq's lazy deletion)
        self._heap: list[list] = []
        self._entries: dict[str, list] = {}

    def key(self, request: Request) -> tuple:
        if self.policy is SchedulingPolicy.PRIORITY:
            return (request.priority, request.arrival_time, request.seq_no)
        return (request.arrival_time, request.seq_no)

    def victim_key(self, request: Request) -> tuple:
        """Larger = preempted first: lowest priority (fcfs: all equal), then newest."""
        return (
            request.priority if self.policy is SchedulingPolicy.PRIORITY else 0,
            request.arrival_time,
            request.seq_no,
        )

    def push(self, request: Request) -> None:
        if request.request_id in self._entries:
            raise ValueError(f"request {request.request_id!r} is already waiting")
        entry = [self.key(request), request, True]
        self._entries[request.request_id] = entry
        heapq.heappush(self._heap, entry)

    def _skip_removed(self) -> None:
        while self._heap and not self._heap[0][2]:
            heapq.heappop(self._heap)

    def peek(self) -> Request | None:
        self._skip_removed()
        return self._heap[0][1] if self._heap else None

    def pop(self) -> Request:
        self._skip_removed()
        _, request, _ = heapq.heappop(self._heap)
        del self._entries[request.request_id]
        return request

    def remove(self, request_id: str) -> Request | None:
        """Lazy removal (abort of a waiting request): O(1) now, dropped when it surfaces."""
        entry = self._entries.pop(request_id, None)
        if entry is None:
            return None
        entry[2] = False
        return entry[1]

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Request]:
        """Requests in service order (for stats and tests; O(n log n))."""
        return iter(e[1] for e in sorted(self._entries.values(), key=lambda e: e[0]))


def pick_victim(queue: WaitingQueue, running: Iterable[Request]) -> Request:
    return max(running, key=queue.victim_key)
