"""`sluice fleet`: the fleet's state and operations, over a running server's admin API.

    sluice fleet status
    sluice fleet weights MODEL VERSION=WEIGHT [VERSION=WEIGHT ...]
    sluice fleet rollout MODEL --to VERSION [--steps 10,25,50,100] [--interval S] [--wait]
    sluice fleet rollback MODEL
    sluice fleet reload
    sluice fleet adapters | load-adapter NAME PATH [--base MODEL/VERSION] | unload-adapter NAME   (fleet_adapters.py)

`--url` (default http://127.0.0.1:8000, env SLUICE_URL) and the admin key (`--admin-key`, else
env SLUICE_ADMIN_KEY) say where and as whom; `--json` prints the server's answer as it came.
Exit codes: 0 done; 1 the server refused (its message is printed: 400 invalid, 404 unknown,
409 conflict, …); 2 a usage error, no admin key, or no server at the URL; 3 `rollout --wait`
ended rolled back.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any
from urllib.parse import quote

from sluice.cli.common import add_options_either_side

EXIT_REFUSED, EXIT_USAGE, EXIT_ROLLED_BACK = 1, 2, 3
DEFAULT_URL = "http://127.0.0.1:8000"
# `rollout` flags → the rollout plan's fields (docs/FLEET.md, [rollout])
PLAN_FLAGS = {
    "interval": "step_interval_s",
    "max_error_rate": "max_error_rate",
    "max_ttft_p95": "max_ttft_p95_s",
    "min_requests": "min_requests",
    "warm_timeout": "warm_timeout_s",
    "drain_timeout": "drain_timeout_s",
}


# where and as whom, before the action or after it (`sluice fleet status --json`)
_OPTIONS = (
    ("--url", dict(default=None, help=f"the server (default: env SLUICE_URL, else {DEFAULT_URL})")),
    ("--admin-key", dict(default=None, metavar="KEY", help="the server's admin_key (default: env SLUICE_ADMIN_KEY)")),
    ("--json", dict(action="store_true", help="print the server's JSON answer")),
    ("--timeout", dict(type=float, default=30.0, metavar="S", help="HTTP timeout in seconds (default: %(default)g)")),
)


class Refused(Exception):
    def __init__(self, status: int, message: str, problems: list[str]):
        super().__init__(message)
        self.status, self.message, self.problems = status, message, problems


class Unreachable(Exception):
    pass


def _say(message: str) -> None:
    print(f"sluice fleet: {message}", file=sys.stderr)


class AdminClient:
    def __init__(self, url: str, key: str, timeout_s: float):
        import httpx

        self._http = httpx.Client(
            base_url=url.rstrip("/"), timeout=timeout_s, headers={"authorization": f"Bearer {key}"}
        )
        self.url = url

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        import httpx

        try:
            r = self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise Unreachable(f"cannot reach {self.url}: {exc}") from None
        try:
            data = r.json()
        except ValueError:
            data = {}
        if r.status_code >= 400:
            err = data.get("error", {}) if isinstance(data, dict) else {}
            raise Refused(
                r.status_code, err.get("message") or r.text[:500] or r.reason_phrase, err.get("problems") or []
            )
        return data


def _model_path(model: str) -> str:
    return "/admin/fleet/models/" + quote(model, safe="/:@")


# -- rendering ---------------------------------------------------------------------------------
def _table(rows: list[list[str]], indent: str = "  ") -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _rollout_line(r: dict[str, Any], now: float) -> str:
    phase, target = r["phase"], r["target"]
    line = f"rollout to {target}: {phase.replace('_', ' ')}"
    if phase == "shifting":
        line += f", step {r['step'] + 1} of {len(r['steps'])} ({r['steps'][r['step']]:g} %)"
    if not phase.startswith(("done", "rolled_back")):
        line += f", {now - r['phase_since']:.0f} s in this phase"
    if r.get("reason"):
        line += f" — {r['reason']}"
    if "driven_here" in r and not phase.startswith(("done", "rolled_back")):
        line += " (driven by this gateway)" if r["driven_here"] else " (driven by another gateway)"
    return line


def render_status(s: dict[str, Any], now: float | None = None) -> str:
    now = time.time() if now is None else now
    workers = s.get("workers", [])
    out = []
    for model_id, m in s["models"].items():
        extra = []
        if m["aliases"]:
            extra.append("aliases: " + ", ".join(m["aliases"]))
        if m["fallbacks"]:
            extra.append("fallbacks: " + ", ".join(m["fallbacks"]))
        out.append(f"model {model_id}" + (f"  ({'; '.join(extra)})" if extra else ""))
        rows = [["VERSION", "STATE", "WEIGHT", "SHARE", "WORKERS"]]
        for name, v in m["versions"].items():
            mine = [w for w in workers if w["model"] == model_id and w["version"] == name]
            warm = sum(1 for w in mine if w["status"] == "warm")
            # a LoRA adapter version runs on its base's workers (docs/LORA.md)
            where = f"adapter on {v['base']}" if v.get("adapter") else f"{warm}/{len(mine)} warm"
            rows.append([name, v["state"], f"{v['traffic']:g}", f"{v['share']:.1f} %", where])
        out.append(_table(rows))
        if m.get("rollout"):
            out.append("  " + _rollout_line(m["rollout"], now))
    if workers:
        out.append("workers")
        rows = [["ID", "VERSION", "STATUS", "BREAKER", "INFLIGHT", "LOAD", "PID"]]
        for w in workers:
            rows.append(
                [
                    w["id"],
                    f"{w['model']}/{w['version']}",
                    w["status"],
                    w["breaker"],
                    str(w["inflight"]),
                    str(w["load_tokens"]),
                    str(w["pid"] or "-"),
                ]
            )
        out.append(_table(rows))
    return "\n".join(out)


# -- actions -----------------------------------------------------------------------------------
def _status(client: AdminClient, args: argparse.Namespace) -> dict[str, Any]:
    s = client.call("GET", "/admin/fleet")
    if not args.json:
        print(render_status(s))
    return s


def _weights(client: AdminClient, args: argparse.Namespace) -> dict[str, Any]:
    weights: dict[str, float] = {}
    for item in args.assignments:
        name, sep, raw = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            weights[name] = float(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r}: expected VERSION=WEIGHT, e.g. canary=20") from None
    r = client.call("PUT", _model_path(args.model) + "/weights", {"weights": weights})
    if not args.json:
        total = sum(w for w in r["weights"].values() if w > 0) or 1.0
        print(
            f"weights of {r['model']}: "
            + ", ".join(f"{v}={w:g} ({100 * w / total:.1f} %)" for v, w in r["weights"].items())
        )
        if r.get("replicas_starting"):
            print("starting local replicas of: " + ", ".join(r["replicas_starting"]))
    return r


def _rollout(client: AdminClient, args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"to": args.to}
    if args.steps is not None:
        try:
            body["steps"] = [float(x) for x in args.steps.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--steps {args.steps!r}: expected percentages like 10,25,50,100"
            ) from None
    body.update({field: getattr(args, flag) for flag, field in PLAN_FLAGS.items() if getattr(args, flag) is not None})
    r = client.call("POST", _model_path(args.model) + "/rollout", body)
    rollout = r["rollout"]
    if not args.json:
        steps = ", ".join(f"{s:g}" for s in rollout["steps"]) or "none below 100"
        print(
            f"rollout of {r['model']} to {rollout['target']} started: warming, then steps {steps} % "
            f"(each {rollout['plan']['step_interval_s']:g} s), then drain"
        )
    return _follow(client, r["model"], args.json) if args.wait else r


def _follow(client: AdminClient, model_id: str, quiet: bool) -> dict[str, Any]:
    last = None
    while True:
        rollout = client.call("GET", "/admin/fleet")["models"][model_id]["rollout"]
        key = (rollout["phase"], rollout["step"])
        if key != last and not quiet:
            print(_rollout_line(rollout, time.time()), flush=True)
        last = key
        if rollout["phase"] in ("done", "rolled_back"):
            if quiet:
                print(json.dumps(rollout, indent=2))
            return rollout
        time.sleep(1.0)


def _rollback(client: AdminClient, args: argparse.Namespace) -> dict[str, Any]:
    r = client.call("POST", _model_path(args.model) + "/rollback")
    if not args.json:
        print(f"rollout of {r['model']} to {r['rollout']['target']}: rolling back (the old weights apply now)")
    return r


def _reload(client: AdminClient, args: argparse.Namespace) -> dict[str, Any]:
    r = client.call("POST", "/admin/fleet/reload")
    if not args.json:
        parts = [
            f"{label} {', '.join(r[k])}"
            for k, label in (
                ("added", "models added:"),
                ("removed", "models removed:"),
                ("changed", "models changed:"),
                ("workers_added", "workers added:"),
                ("workers_removed", "workers removed:"),
                ("replicas_starting", "replicas starting:"),
                ("replicas_stopping", "replicas stopping:"),
            )
            if r.get(k)
        ]
        print("fleet file reloaded" + ("; " + "; ".join(parts) if parts else " (no changes)"))
    return r


def _run(args: argparse.Namespace) -> int:
    key = args.admin_key or os.environ.get("SLUICE_ADMIN_KEY")
    if not key:
        _say("error: no admin key: pass --admin-key or set SLUICE_ADMIN_KEY (the server's admin_key)")
        return EXIT_USAGE
    client = AdminClient(args.url or os.environ.get("SLUICE_URL") or DEFAULT_URL, key, args.timeout)
    try:
        result = args.action(client, args)
    except argparse.ArgumentTypeError as exc:
        _say(f"error: {exc}")
        return EXIT_USAGE
    except Unreachable as exc:
        _say(f"error: {exc}")
        return EXIT_USAGE
    except Refused as exc:
        _say(f"error ({exc.status}): {exc.message.splitlines()[0] if exc.problems else exc.message}")
        for line in exc.problems:
            print(f"  {line}", file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        _say("stopped following; the rollout goes on on the server (`sluice fleet status`)")
        return 130
    following = args.action is _rollout and args.wait
    if args.json and not following:
        print(json.dumps(result, indent=2))
    return EXIT_ROLLED_BACK if following and result["phase"] == "rolled_back" else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fleet",
        help="fleet status, traffic weights, rollouts, rollback, reload, LoRA adapters (admin API)",
        description="Operate a running server's fleet over its admin API (docs/FLEET.md). Exit codes: "
        "0 done, 1 refused by the server, 2 usage / no admin key / no server, 3 rollout --wait rolled back.",
    )
    common = add_options_either_side(p, _OPTIONS)
    acts = p.add_subparsers(dest="fleet_command", required=True, metavar="ACTION")
    st = acts.add_parser("status", parents=[common], help="models, versions (state, weight, share), rollouts, workers")
    st.set_defaults(action=_status)
    w = acts.add_parser("weights", parents=[common], help="set live traffic weights (versions not named keep theirs)")
    w.add_argument("model")
    w.add_argument("assignments", nargs="+", metavar="VERSION=WEIGHT")
    w.set_defaults(action=_weights)
    r = acts.add_parser(
        "rollout", parents=[common], help="shift a model's traffic to a version step by step, with automatic rollback"
    )
    r.add_argument("model")
    r.add_argument("--to", required=True, metavar="VERSION", help="the version to roll out")
    r.add_argument(
        "--steps",
        default=None,
        metavar="P,P,...",
        help="percent of traffic per step, rising, ending at 100 (default: the fleet file's)",
    )
    r.add_argument(
        "--interval",
        type=float,
        default=None,
        metavar="S",
        help="seconds each step is held and judged (step_interval_s)",
    )
    r.add_argument(
        "--max-error-rate", type=float, default=None, metavar="X", help="roll back above this failure fraction"
    )
    r.add_argument("--max-ttft-p95", type=float, default=None, metavar="S", help="roll back above this TTFT p95")
    r.add_argument(
        "--min-requests", type=int, default=None, metavar="N", help="outcomes needed before the thresholds judge"
    )
    r.add_argument(
        "--warm-timeout", type=float, default=None, metavar="S", help="roll back if the target is not warm by then"
    )
    r.add_argument(
        "--drain-timeout", type=float, default=None, metavar="S", help="longest wait for the old version to drain"
    )
    r.add_argument(
        "--wait", action="store_true", help="follow the rollout until it is done (exit 0) or rolled back (exit 3)"
    )
    r.set_defaults(action=_rollout)
    b = acts.add_parser("rollback", parents=[common], help="roll back a model's running rollout (from any gateway)")
    b.add_argument("model")
    b.set_defaults(action=_rollback)
    rl = acts.add_parser("reload", parents=[common], help="reread the fleet file (an invalid one changes nothing)")
    rl.set_defaults(action=_reload)
    from sluice.cli import fleet_adapters

    fleet_adapters.register(acts, common)
    p.set_defaults(func=_run)
