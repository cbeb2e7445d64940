"""`sluice fleet` actions for LoRA adapters (docs/LORA.md), over the admin API:

    sluice fleet adapters                                  every adapter: name, version, source, base, where resident
    sluice fleet load-adapter NAME PATH [--base MODEL/VERSION]
    sluice fleet unload-adapter NAME

The client, flags and exit codes are `sluice fleet`'s (cli/fleet.py, which registers these).
"""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _adapters(client: Any, args: argparse.Namespace) -> dict[str, Any]:
    r = client.call("GET", "/admin/fleet/adapters")
    if not args.json:
        rows = [["NAME", "VERSION", "BASE", "SOURCE", "RUNTIME", "RESIDENT ON"]]
        rows += [
            [
                a["name"],
                a["version"],
                a["base"],
                a["source"],
                "yes" if a["runtime"] else "no",
                ", ".join(a["resident_on"]) or "-",
            ]
            for a in r["adapters"]
        ]
        print(_table(rows) if r["adapters"] else "no LoRA adapters")
    return r


def _load(client: Any, args: argparse.Namespace) -> dict[str, Any]:
    body = {"name": args.name, "path": args.path, **({"base": args.base} if args.base else {})}
    r = client.call("POST", "/admin/fleet/adapters", body)
    if not args.json:
        print(
            f"adapter {r['name']} serves on {r['base']} ({r['bytes'] / 2**20:.1f} MiB, checked and loaded by "
            f"{r['worker']} in {r['load_ms']:g} ms)"
        )
    return r


def _unload(client: Any, args: argparse.Namespace) -> dict[str, Any]:
    r = client.call("DELETE", "/admin/fleet/adapters/" + quote(args.name, safe="/:@"))
    if not args.json:
        print(f"adapter {r['name']} no longer served (dropped on {r['unloaded_on_workers']} worker(s))")
    return r


def register(acts: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    a = acts.add_parser("adapters", parents=[common], help="LoRA adapters: name, version, base, source, where resident")
    a.set_defaults(action=_adapters)
    ld = acts.add_parser(
        "load-adapter",
        parents=[common],
        help="serve a LoRA adapter as model NAME without a restart (checked by a worker first)",
    )
    ld.add_argument("name", help="the model id clients will send")
    ld.add_argument("path", help="a PEFT adapter folder on the workers' host, or s3://bucket/prefix")
    ld.add_argument("--base", default=None, metavar="MODEL/VERSION", help="its base (default: the fleet's only one)")
    ld.set_defaults(action=_load)
    ul = acts.add_parser("unload-adapter", parents=[common], help="stop serving a run-time LoRA adapter")
    ul.add_argument("name")
    ul.set_defaults(action=_unload)
