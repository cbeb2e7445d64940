"""Dependencies point one way (DESIGN.md): a package may import only packages below it.

    cli → api → serving → gateway, safety → streaming → routing → observability → worker → engine → models
    train: a tower beside serving; it imports models, observability and the leaves; only cli imports it
    types, config, errors: leaves anyone may import

Read from the source's own imports (top-level and inside functions alike), so a back edge
fails here the moment it is written."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "sluice"
ORDER = ["cli", "api", "serving", "gateway|safety", "streaming", "routing", "observability", "worker", "engine", "models"]
LEAVES = {"types", "config", "errors", "request_context", "trace_context", "__init__"}
RANK = {pkg: i for i, group in enumerate(ORDER) for pkg in group.split("|")}
# Towers beside serving (DESIGN.md, "Three systems, one house"): each may import the packages it
# names and the leaves; of serving's packages only cli imports a tower.
TOWERS = {"train": {"models", "observability"}}
# Pure helpers a tower may use without depending on the package they live in (no state, no
# imports of their own): the TOML key → line scanner behind every `FILE:LINE: field` message.
SHARED_MODULES = {"routing.toml_lines"}


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sluice.") and node.level == 0:
            out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("sluice."))
    return out


def _modules(path: Path) -> set[str]:
    """Imported sluice modules, dotted below `sluice.` (e.g. "models.tokenizer")."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sluice.") and node.level == 0:
            out.add(node.module.removeprefix("sluice."))
        elif isinstance(node, ast.Import):
            out.update(a.name.removeprefix("sluice.") for a in node.names if a.name.startswith("sluice."))
    return out


def test_every_package_has_a_place_in_the_order():
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and not p.name.startswith("__")}
    placed = set(RANK) | set(TOWERS)
    assert packages <= placed, f"place these in ORDER or TOWERS: {sorted(packages - placed)}"


def test_no_import_points_up_or_sideways():
    back_edges = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        owner = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        if owner in LEAVES and owner != "__init__":  # a leaf imports only other leaves
            back_edges += [f"{rel} (a leaf) imports sluice.{t}" for t in _imports(path) if t not in LEAVES]
            continue
        if owner in TOWERS:
            allowed = TOWERS[owner] | LEAVES | {owner}
            back_edges += [f"{rel} (tower {owner}) imports sluice.{m}" for m in _modules(path)
                           if m.split(".")[0] not in allowed and m not in SHARED_MODULES]
            continue
        if owner not in RANK:
            continue
        for target in _imports(path):
            if target == owner or target in LEAVES:
                continue
            if target in TOWERS:
                if owner != "cli":
                    back_edges.append(f"{rel} imports the {target} tower (only cli may)")
                continue
            if RANK.get(target, -1) <= RANK[owner]:
                back_edges.append(f"{rel} imports sluice.{target}")
    assert not back_edges, "imports against the dependency order:\n" + "\n".join(sorted(back_edges))
