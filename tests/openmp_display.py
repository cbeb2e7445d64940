"""libgomp's own report of its settings: with OMP_DISPLAY_ENV=verbose it prints them to stderr
when torch loads it. GOMP_SPINCOUNT is 0 when its threads sleep at once after a region
(OMP_WAIT_POLICY=PASSIVE), 300000 by default."""

from __future__ import annotations

import re


def gomp_spin_count(output: str) -> str:
    found = re.search(r"GOMP_SPINCOUNT = '(\d+)'", output)
    assert found, f"libgomp printed no settings:\n{output[-3000:]}"
    return found.group(1)
