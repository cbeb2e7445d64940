"""The Lighthouse: torchft's quorum service, which every replica group's manager asks at each step
which groups take part. `sluice train run --replica-groups G` starts one inside the launcher on a
free 127.0.0.1 port (its groups run on this machine); groups on several machines meet at one
given by `--lighthouse http://HOST:PORT` (torchft's `torchft_lighthouse --min_replicas 1`, as
deploy/k8s/train-replicas runs it).

- min_replicas 1: the run goes on while any group lives;
- join timeout = hang_timeout: a group that is alive (its manager heartbeats) but has not asked
  for the step's quorum within it is left out of that step (a straggler or a hung rank), as the
  watchdog would kill a rank silent that long;
- heartbeat timeout 5 s (torchft's default): a group whose manager died is left out after it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from sluice.train.settings import TrainSettings

HEARTBEAT_TIMEOUT_MS = 5000


@contextmanager
def lighthouse_for(settings: TrainSettings) -> Iterator[str | None]:
    """The Lighthouse address the groups use (None: no replica groups)."""
    if settings.replica_groups == 1:
        yield None
        return
    if settings.lighthouse:
        yield settings.lighthouse
        return
    os.environ.setdefault("RUST_LOG", "warn")  # torchft's Rust side logs every quorum at info
    from torchft._torchft import LighthouseServer

    server = LighthouseServer(
        bind="127.0.0.1:0",
        min_replicas=1,
        join_timeout_ms=int(settings.hang_timeout * 1000),
        heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS,
    )
    port = server.address().rpartition(":")[2]  # it names the host by its hostname; the groups are here
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
