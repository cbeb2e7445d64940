"""Dependencies point one way (docs/ARCHITECTURE.md): a package may import only packages below
it, and no files import each other in a loop.

    serving:   cli → api → serving → gateway, safety → streaming → routing → observability → worker → engine → models
    inside routing/:  fleet → scaling → dispatch → state, quota → fleet_file
    types, config, errors, tool_types, request_context, trace_context, redis_client, aio, toml_lines,
    toml_config, heap, openmp_wait, thread_name,
    common (what the three systems share: API keys, S3, restart back-off, uvicorn's protocol, fault specs, free ports):
    leaves anyone may import

Training (train/) and search (search/) are towers of their own beside serving: each may import
what TOWERS lists for it (training: the model loaders and tokenizer it trains; both:
observability) and the leaves; nothing imports a tower but the CLI.

Downward edges may skip layers, except from the API: it reaches the engines only through serving
(it may use serving and the policy layers serving is built on, never routing, worker, engine or
models directly), so a wire format cannot come to depend on how a request is executed.

Read from the source's own imports (top-level, inside functions and under TYPE_CHECKING alike),
so a back edge or a cycle fails here the moment it is written."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.paths import ROOT

SRC = ROOT / "src" / "sluice"
ORDER = [
    "cli",
    "api",
    "serving",
    "gateway|safety",
    "streaming",
    "routing",
    "observability",
    "worker",
    "engine",
    "models",
]
LEAVES = {
    "types",
    "config",
    "common",
    "errors",
    "tool_types",
    "request_context",
    "trace_context",
    "redis_client",
    "aio",
    "toml_lines",
    "toml_config",
    "parent_death",
    "heap",
    "openmp_wait",
    "thread_name",
    "__init__",
}
# common/: what the systems share, one leaf module per concept (docs/ARCHITECTURE.md lists them)
COMMON_LEAVES = {"api_keys", "s3", "backoff", "uvicorn_protocol", "fault_spec", "ports", "__init__"}
RANK = {pkg: i for i, group in enumerate(ORDER) for pkg in group.split("|")}
TOWERS = {"train": {"models", "observability"}, "search": {"observability"}}  # what each may import
# the fleet layer's own floors; `errors` is routing's leaf
ROUTING_ORDER = ["fleet", "scaling", "dispatch", "state|quota", "fleet_file"]
ROUTING_RANK = {pkg: i for i, group in enumerate(ROUTING_ORDER) for pkg in group.split("|")}
# the search tower's own floors (docs/ARCHITECTURE.md): the router over the tiers over the shard
# over the service and the contract over the index over dense retrieval's vectors; errors and
# strict_json are the tower's leaves. Inside the router: main → http → runtime → query | writes |
# replication → cluster → config | search_metrics | auth.
SEARCH_ORDER = ["router", "tiers", "shard", "service", "contract", "retrieval", "index", "dense"]
SEARCH_LEAVES = {"errors", "strict_json", "__init__"}
ROUTER_ORDER = ["main", "http", "runtime", "query|writes|replication", "cluster", "config|search_metrics|auth"]
# what the API may import besides leaves and itself (docs/ARCHITECTURE.md: api → serving → gateway/safety/streaming)
API_REACHES = {"serving", "gateway", "safety", "streaming", "observability"}


def _modules(path: Path) -> set[str]:
    """The sluice modules `path` imports, dotted (`sluice.routing.fleet.fleet`)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("sluice."):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)  # `from pkg import module`
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("sluice."))
    return out


def _imports(path: Path) -> set[str]:
    return {m.split(".")[1] for m in _modules(path)}


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def test_every_package_has_a_place_in_the_order():
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and not p.name.startswith("__")}
    placed = set(RANK) | set(TOWERS) | LEAVES  # a leaf may be a package (config/: the settings' sections)
    assert packages <= placed, f"place these in ORDER: {sorted(packages - placed)}"
    routing = {p.name for p in (SRC / "routing").iterdir() if p.is_dir() and not p.name.startswith("__")}
    assert routing <= set(ROUTING_RANK), f"place these in ROUTING_ORDER: {sorted(routing - set(ROUTING_RANK))}"


def test_every_shared_leaf_is_declared():
    found = {p.stem for p in (SRC / "common").glob("*.py")}
    assert found == COMMON_LEAVES, (
        f"declare the modules of common/ in COMMON_LEAVES (and docs/ARCHITECTURE.md): {found ^ COMMON_LEAVES}"
    )


def test_no_import_points_up_or_sideways():
    back_edges = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        owner = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        if owner in LEAVES and owner != "__init__":  # a leaf imports only other leaves
            back_edges += [f"{rel} (a leaf) imports sluice.{t}" for t in _imports(path) if t not in LEAVES]
            continue
        if owner in TOWERS:
            back_edges += [
                f"{rel} (the {owner} tower) imports sluice.{t}"
                for t in _imports(path)
                if t != owner and t not in LEAVES and t not in TOWERS[owner]
            ]
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


def test_routing_floors_point_down():
    back_edges = []
    for path in (SRC / "routing").rglob("*.py"):
        rel = path.relative_to(SRC / "routing")
        if len(rel.parts) < 2:
            continue  # routing/__init__.py, routing/errors.py: the leaf every floor may use
        owner = rel.parts[0]
        for module in _modules(path):
            parts = module.split(".")
            if parts[:2] != ["sluice", "routing"] or len(parts) < 3 or parts[2] in ("errors", owner):
                continue
            target = parts[2]
            if ROUTING_RANK.get(target, -1) <= ROUTING_RANK[owner]:
                back_edges.append(f"routing/{rel} imports {module}")
    assert not back_edges, "routing/ imports against its floors:\n" + "\n".join(sorted(back_edges))


def floor_violations(pkg: str, order: list[str], leaves: set[str]) -> list[str]:
    """Imports inside sluice.<pkg> that point up (or sideways) against `order`; a part is a
    sub-package or a module directly under it, leaves may be imported by any part."""
    rank = {part: i for i, group in enumerate(order) for part in group.split("|")}
    root = SRC.joinpath(*pkg.split("."))
    prefix = ["sluice", *pkg.split(".")]
    found = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        owner = rel.parts[0].removesuffix(".py")
        if owner in leaves:
            continue
        for module in _modules(path):
            parts = module.split(".")
            if parts[: len(prefix)] != prefix or len(parts) <= len(prefix):
                continue
            target = parts[len(prefix)]
            if target in leaves or target == owner or target not in rank:
                continue
            if rank[target] <= rank.get(owner, len(order)):
                found.append(f"{pkg.replace('.', '/')}/{rel} imports {module}")
    return sorted(found)


def test_search_floors_point_down():
    parts = {p.name.removesuffix(".py") for p in (SRC / "search").iterdir() if not p.name.startswith("__")}
    unplaced = parts - set(SEARCH_ORDER) - SEARCH_LEAVES
    assert not unplaced, f"place these in SEARCH_ORDER: {unplaced}"
    router = {p.name.removesuffix(".py") for p in (SRC / "search" / "router").iterdir() if not p.name.startswith("__")}
    placed = {x for g in ROUTER_ORDER for x in g.split("|")}
    assert router <= placed, f"place these in ROUTER_ORDER: {router - placed}"
    bad = floor_violations("search", SEARCH_ORDER, SEARCH_LEAVES) + floor_violations(
        "search.router", ROUTER_ORDER, {"__init__"}
    )
    assert not bad, "search imports against its floors:\n" + "\n".join(bad)


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


def test_no_import_cycles_between_files() -> None:
    files = {_module_name(p): p for p in SRC.rglob("*.py") if "proto" not in p.parts}
    graph = {m: {t for t in _modules(p) if t in files and t != m} for m, p in files.items()}
    # Tarjan's strongly connected components: a component of two or more files is a cycle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    # a package's __init__ that re-exports its modules is not a cycle of concepts
    cycles = [
        c for c in cycles if not all(m.endswith("__init__") or any(m == o.rsplit(".", 1)[0] for o in c) for m in c)
    ]
    assert not cycles, "files that import each other in a loop:\n" + "\n".join(" ↔ ".join(c) for c in cycles)


def test_no_folder_holds_more_than_twenty_modules():
    crowded = {
        str(d.relative_to(SRC)): n
        for d in [SRC, *SRC.rglob("*")]
        if d.is_dir()
        and "__pycache__" not in d.parts
        and "proto" not in d.parts
        and (n := len([f for f in d.glob("*.py") if f.name != "__init__.py"])) > 20
    }
    assert not crowded, f"split these folders by concept: {crowded}"
