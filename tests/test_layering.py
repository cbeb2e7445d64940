"""Dependencies point one way (DESIGN.md): a package may import only packages below it.

    cli → api → serving → gateway, safety → streaming → routing → observability → worker → engine → models
    types, config, errors, tool_types: leaves anyone may import

Downward edges may skip layers, except from the API: it reaches the engines only through serving
(it may use serving and the policy layers serving is built on, never routing, worker, engine or
models directly), so a wire format cannot come to depend on how a request is executed.

Read from the source's own imports (top-level and inside functions alike), so a back edge
fails here the moment it is written."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "sluice"
ORDER = ["cli", "api", "serving", "gateway|safety", "streaming", "routing", "observability", "worker", "engine", "models"]
LEAVES = {"types", "config", "errors", "tool_types", "request_context", "trace_context", "__init__"}
# what the API may import besides leaves and itself (DESIGN.md: api → serving → gateway/safety/streaming)
API_REACHES = {"serving", "gateway", "safety", "streaming", "observability"}
RANK = {pkg: i for i, group in enumerate(ORDER) for pkg in group.split("|")}


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sluice.") and node.level == 0:
            out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("sluice."))
    return out


def test_every_package_has_a_place_in_the_order():
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and not p.name.startswith("__")}
    assert packages <= set(RANK), f"place these in ORDER: {sorted(packages - set(RANK))}"


def skips(src: Path, owner: str, allowed: set[str]) -> list[str]:
    """`owner`'s imports of packages other than itself, the leaves and `allowed`."""
    return sorted(
        f"{path.relative_to(src)} imports sluice.{target}"
        for path in (src / owner).rglob("*.py")
        for target in _imports(path)
        if target != owner and target not in LEAVES and target not in allowed
    )


def test_the_api_reaches_below_serving_only_through_it():
    bad = skips(SRC, "api", API_REACHES)
    assert not bad, "the API imports below serving (go through serving, or move the type to a leaf):\n" + "\n".join(bad)


def test_a_skip_from_the_api_is_caught(tmp_path):
    (tmp_path / "api").mkdir()
    (tmp_path / "api" / "a.py").write_text("from sluice.serving.runtime import ServingRuntime\n")
    (tmp_path / "api" / "b.py").write_text("def f():\n    from sluice.engine.stats import combined\n")
    (tmp_path / "api" / "c.py").write_text("import sluice.models.tools.parser\n")
    assert skips(tmp_path, "api", API_REACHES) == ["api/b.py imports sluice.engine", "api/c.py imports sluice.models"]


def test_no_import_points_up_or_sideways():
    back_edges = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        owner = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        if owner in LEAVES and owner != "__init__":  # a leaf imports only other leaves
            back_edges += [f"{rel} (a leaf) imports sluice.{t}" for t in _imports(path) if t not in LEAVES]
            continue
        if owner not in RANK:
            continue
        for target in _imports(path):
            if target == owner or target in LEAVES:
                continue
            if RANK.get(target, -1) <= RANK[owner]:
                back_edges.append(f"{rel} imports sluice.{target}")
    assert not back_edges, "imports against the dependency order:\n" + "\n".join(sorted(back_edges))
