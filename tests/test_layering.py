"""Dependencies point one way (DESIGN.md): a package may import only packages below it.

    cli → api → serving → gateway, safety → streaming → routing → observability → worker → engine → models
    types, config, errors: leaves anyone may import

Search (src/sluice/search) is its own tower beside serving: it may import observability, the
leaves and the small shared utilities in SEARCH_SHARED, and nothing else; no other package
imports it except the CLI.

Read from the source's own imports (top-level and inside functions alike), so a back edge
fails here the moment it is written."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "sluice"
ORDER = ["cli", "api", "serving", "gateway|safety", "streaming", "routing", "observability", "worker", "engine", "models"]
LEAVES = {"types", "config", "errors", "request_context", "trace_context", "__init__"}
RANK = {pkg: i for i, group in enumerate(ORDER) for pkg in group.split("|")}
TOWERS = {"search"}  # beside the serving order; only cli imports them
SEARCH_SHARED = {"observability", "routing.toml_lines"}  # package or package.module


def _imports(path: Path, depth: int = 1) -> set[str]:
    """The sluice packages a file imports (depth 2: "package.module" where there is one)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sluice.") and node.level == 0:
            out.add(".".join(node.module.split(".")[1 : 1 + depth]))
        elif isinstance(node, ast.Import):
            out.update(".".join(a.name.split(".")[1 : 1 + depth]) for a in node.names if a.name.startswith("sluice."))
    return out


def test_every_package_has_a_place_in_the_order():
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and not p.name.startswith("__")}
    assert packages <= set(RANK) | TOWERS, f"place these in ORDER: {sorted(packages - set(RANK) - TOWERS)}"


def test_no_import_points_up_or_sideways():
    back_edges = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        owner = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        if owner in LEAVES and owner != "__init__":  # a leaf imports only other leaves
            back_edges += [f"{rel} (a leaf) imports sluice.{t}" for t in _imports(path) if t not in LEAVES]
            continue
        if owner in TOWERS:
            for target in _imports(path, depth=2):
                pkg = target.split(".")[0]
                if pkg != owner and pkg not in LEAVES and pkg not in SEARCH_SHARED and target not in SEARCH_SHARED:
                    back_edges.append(f"{rel} (the {owner} tower) imports sluice.{target}")
            continue
        if owner not in RANK:
            continue
        for target in _imports(path):
            if target == owner or target in LEAVES:
                continue
            if target in TOWERS:
                if owner != "cli":
                    back_edges.append(f"{rel} imports the {target} tower")
                continue
            if RANK.get(target, -1) <= RANK[owner]:
                back_edges.append(f"{rel} imports sluice.{target}")
    assert not back_edges, "imports against the dependency order:\n" + "\n".join(sorted(back_edges))
