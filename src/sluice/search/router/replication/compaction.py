"""When a shard's write logs may be compacted (the replicas do it: shard/replica.py).

An entry may leave the logs once every replica of the shard has applied it: until then a
lagging replica catches up by copying entries from a peer's log, which is cheap. The floor is
the smallest applied entry over all replicas — a replica that is down counts with the last entry
it was seen to apply, so a short outage costs it only the entries it missed. A replica that
stays behind must not pin the logs forever, though: no log keeps more than `keep_max` entries
behind the shard's head, and a replica further behind copies a peer's index snapshot instead.
A compaction rewrites the kept tail of the log, so it waits until `every` entries can go.
"""

from __future__ import annotations


def compaction_point(applied: list[int], head: int, keep_max: int) -> int:
    """The entry through which every replica's log may be dropped."""
    if not applied:
        return 0
    return max(min(applied), head - keep_max, 0)


def should_compact(point: int, log_base: int, every: int) -> bool:
    """Whether a replica whose log starts after `log_base` should compact through `point` now."""
    return every > 0 and point - log_base >= every
