from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from sluice.thread_name import NAME_MAX_BYTES, name_this_thread

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_NAME and /proc are Linux's")


def _system_name(native_id: int) -> str:
    return Path(f"/proc/self/task/{native_id}/comm").read_text().strip()


def _named_in_a_thread(name: str) -> str:
    seen: list[str] = []

    def run() -> None:
        name_this_thread(name)
        seen.append(_system_name(threading.get_native_id()))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return seen[0]


def test_the_calling_thread_gets_the_name_and_no_other():
    before = _system_name(threading.get_native_id())
    assert _named_in_a_thread("sluice-test") == "sluice-test"
    assert _system_name(threading.get_native_id()) == before


def test_a_long_name_is_cut_to_what_the_kernel_keeps():
    assert _named_in_a_thread("sluice-a-very-long-thread-name") == "sluice-a-very-long-thread-name"[:NAME_MAX_BYTES]
