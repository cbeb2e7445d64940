"""`sluice keys`: create, list, revoke and rotate API keys in the SQLite key store.

The key itself goes to stdout, once, and nowhere else (no log line carries it); everything
else — key_id, tenant, tier — goes to stderr, so `KEY=$(sluice keys create ...)` works.
The data directory and the tiers come from `--data-dir` / `--config` (the server's settings
file), else from SLUICE_* env and the defaults, so the CLI and `sluice serve` agree.
"""

from __future__ import annotations

import argparse
import sys

from sluice.cli.common import add_options_either_side


def _settings(args: argparse.Namespace):
    from sluice.config import load_settings

    return load_settings(getattr(args, "config", None))


def _store(args: argparse.Namespace):
    from pathlib import Path

    from sluice.gateway.key_store import SQLiteKeyStore

    data_dir = args.data_dir if args.data_dir is not None else _settings(args).data_dir
    return SQLiteKeyStore(Path(data_dir).expanduser() / "keys.db")


def _create(args: argparse.Namespace) -> int:
    from sluice.gateway.limits import Limits
    from sluice.gateway.tiers import load_tiers

    for flag in ("rpm", "itpm", "otpm", "max_concurrent"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            print(f"sluice keys: error: --{flag.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    try:
        tiers = load_tiers(_settings(args).tiers)
    except ValueError as exc:
        print(f"sluice keys: error: {exc}", file=sys.stderr)
        return 2
    if args.tier not in tiers and not args.allow_custom_tier:
        print(
            f"sluice keys: error: unknown tier {args.tier!r} ({', '.join(tiers)}); "
            "define it under [tiers.NAME] in the settings file (--config)",
            file=sys.stderr,
        )
        return 2
    key, rec = _store(args).create(args.tenant, args.tier, Limits(args.rpm, args.itpm, args.otpm, args.max_concurrent))
    print(f"key_id: {rec.key_id}  tenant: {rec.tenant}  tier: {rec.tier}", file=sys.stderr)
    print("the key is shown once; store it now:", file=sys.stderr)
    print(key)
    return 0


def _list(args: argparse.Namespace) -> int:
    import datetime
    import time

    rows = _store(args).list()
    now = time.time()
    print(
        f"{'key_id':<18}{'tenant':<16}{'tier':<10}{'hint':<16}{'limits (rpm/itpm/otpm/conc)':<30}{'created':<21}status"
    )
    for r in rows:
        o = r.overrides
        limits = "/".join("-" if v is None else str(v) for v in (o.rpm, o.itpm, o.otpm, o.max_concurrent))
        created = datetime.datetime.fromtimestamp(r.created_at).strftime("%Y-%m-%d %H:%M:%S")
        status = "active" if r.revoked_at is None else ("revoked" if r.revoked_at <= now else "expiring")
        print(f"{r.key_id:<18}{r.tenant:<16}{r.tier:<10}{r.hint + '…':<16}{limits:<30}{created:<21}{status}")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    if not _store(args).revoke(args.key_id):
        print(f"sluice keys: error: no active key {args.key_id}", file=sys.stderr)
        return 2
    print(f"revoked {args.key_id}", file=sys.stderr)
    return 0


def _rotate(args: argparse.Namespace) -> int:
    try:
        key, rec = _store(args).rotate(args.key_id, grace_s=args.grace)
    except KeyError as exc:
        print(f"sluice keys: error: {exc.args[0]}", file=sys.stderr)
        return 2
    when = f"in {args.grace:g} s" if args.grace > 0 else "now"
    print(f"key_id: {rec.key_id}  tenant: {rec.tenant}  tier: {rec.tier}", file=sys.stderr)
    print(f"{args.key_id} stops working {when}; the new key is shown once; store it now:", file=sys.stderr)
    print(key)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keys", help="manage API keys (tenants, tiers, limits)")
    # where the key store is, before the action or after it
    common = add_options_either_side(
        p,
        (
            ("--data-dir", dict(default=None, metavar="DIR", help="where keys.db lives (default: settings data_dir)")),
            (
                "--config",
                dict(default=None, metavar="FILE", help="the server's TOML settings file (data_dir, [tiers.NAME])"),
            ),
        ),
    )
    ks = p.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    c = ks.add_parser("create", parents=[common], help="create a key and print it once")
    c.add_argument("--tenant", required=True, help="the tenant the key belongs to")
    c.add_argument("--tier", required=True, help="priority, standard, free, batch, or one from the settings file")
    c.add_argument("--rpm", type=int, default=None, help="requests per minute (default: the tier's)")
    c.add_argument("--itpm", type=int, default=None, help="input tokens per minute (default: the tier's)")
    c.add_argument("--otpm", type=int, default=None, help="output tokens per minute (default: the tier's)")
    c.add_argument("--max-concurrent", type=int, default=None, help="concurrent requests (default: the tier's)")
    c.add_argument("--allow-custom-tier", action="store_true", help="accept a tier name not built in")
    c.set_defaults(func=_create)
    lst = ks.add_parser("list", parents=[common], help="list keys (never the keys themselves)")
    lst.set_defaults(func=_list)
    r = ks.add_parser("revoke", parents=[common], help="revoke a key by its key_id")
    r.add_argument("key_id")
    r.set_defaults(func=_revoke)
    o = ks.add_parser(
        "rotate", parents=[common], help="issue a new key with the same tenant and limits; revoke the old one"
    )
    o.add_argument("key_id")
    o.add_argument(
        "--grace",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="keep the old key working this long (default: %(default)g)",
    )
    o.set_defaults(func=_rotate)
