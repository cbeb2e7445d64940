"""routing/ sits below the gateway: it imports engine/ hashing and config and the leaves only."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROUTING = Path(__file__).resolve().parents[1] / "src" / "sluice" / "routing"
ALLOWED = ("sluice.routing", "sluice.engine.hashing", "sluice.engine.config", "sluice.types", "sluice.config",
           "sluice.errors")


def test_routing_imports_point_down_only():
    bad = []
    for path in sorted(ROUTING.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if name.startswith("sluice") and not name.startswith(ALLOWED):
                    bad.append(f"{path.name}: {name}")
    assert bad == []


def test_routing_loads_without_torch():
    # a gateway replica that only routes must not pay for torch
    code = ("import sys, pkgutil, importlib, sluice.routing as r\n"
            "for m in pkgutil.iter_modules(r.__path__): importlib.import_module('sluice.routing.' + m.name)\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
