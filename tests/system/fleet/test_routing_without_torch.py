"""routing/ loads without torch: a gateway replica that only routes must not pay for it (the
import direction itself is tests/unit/test_layering.py's)."""

from __future__ import annotations

import subprocess
import sys


def test_routing_loads_without_torch():
    # a gateway replica that only routes must not pay for torch
    code = (
        "import sys, pkgutil, importlib, sluice.routing as r\n"
        "for m in pkgutil.walk_packages(r.__path__, 'sluice.routing.'): importlib.import_module(m.name)\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
