"""`sluice keys`: create, list, revoke and rotate API keys in the SQLite key store."""

from __future__ import annotations

import argparse
import sys


def _store(args: argparse.Namespace):
    from pathlib import Path

    from sluice.gateway.key_store import SQLiteKeyStore

    data_dir = args.data_dir
    if data_dir is None:
        from sluice.config import load_settings

        data_dir = load_settings().data_dir
    return SQLiteKeyStore(Path(data_dir).expanduser() / "keys.db")


def _create(args: argparse.Namespace) -> int:
    from sluice.gateway.limits import Limits
    from sluice.gateway.tiers import DEFAULT_TIERS

    if args.tier not in DEFAULT_TIERS and not args.allow_custom_tier:
        print(f"sluice keys: error: unknown tier {args.tier!r} ({', '.join(DEFAULT_TIERS)}); "
              "pass --allow-custom-tier for a tier defined in the settings file", file=sys.stderr)
        return 2
    key, rec = _store(args).create(args.tenant, args.tier, Limits(args.rpm, args.itpm, args.otpm, args.max_concurrent))
    print(f"key_id: {rec.key_id}  tenant: {rec.tenant}  tier: {rec.tier}", file=sys.stderr)
    print("the key is shown once; store it now:", file=sys.stderr)
    print(key)
    return 0


def _list(args: argparse.Namespace) -> int:
    import datetime

    rows = _store(args).list()
    print(f"{'key_id':<18}{'tenant':<16}{'tier':<10}{'hint':<16}{'limits (rpm/itpm/otpm/conc)':<30}{'created':<21}status")
    for r in rows:
        o = r.overrides
        limits = "/".join("-" if v is None else str(v) for v in (o.rpm, o.itpm, o.otpm, o.max_concurrent))
        created = datetime.datetime.fromtimestamp(r.created_at).strftime("%Y-%m-%d %H:%M:%S")
        status = "revoked" if r.revoked_at else "active"
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
        key, rec = _store(args).rotate(args.key_id)
    except KeyError as exc:
        print(f"sluice keys: error: {exc.args[0]}", file=sys.stderr)
        return 2
    print(f"revoked {args.key_id}; new key_id: {rec.key_id} (shown once):", file=sys.stderr)
    print(key)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keys", help="manage API keys (tenants, tiers, limits)")
    p.add_argument("--data-dir", default=None, metavar="DIR", help="where keys.db lives (default: settings data_dir)")
    ks = p.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    c = ks.add_parser("create", help="create a key and print it once")
    c.add_argument("--tenant", required=True, help="the tenant the key belongs to")
    c.add_argument("--tier", required=True, help="priority, standard, free, batch, or one from the settings file")
    c.add_argument("--rpm", type=int, default=None, help="requests per minute (default: the tier's)")
    c.add_argument("--itpm", type=int, default=None, help="input tokens per minute (default: the tier's)")
    c.add_argument("--otpm", type=int, default=None, help="output tokens per minute (default: the tier's)")
    c.add_argument("--max-concurrent", type=int, default=None, help="concurrent requests (default: the tier's)")
    c.add_argument("--allow-custom-tier", action="store_true", help="accept a tier name not built in")
    c.set_defaults(func=_create)
    lst = ks.add_parser("list", help="list keys (never the keys themselves)")
    lst.set_defaults(func=_list)
    r = ks.add_parser("revoke", help="revoke a key by its key_id")
    r.add_argument("key_id")
    r.set_defaults(func=_revoke)
    o = ks.add_parser("rotate", help="issue a new key with the same tenant and limits; revoke the old one")
    o.add_argument("key_id")
    o.set_defaults(func=_rotate)
    for parser in (c, lst, r, o):
        parser.add_argument("--data-dir", default=argparse.SUPPRESS, metavar="DIR", help="where keys.db lives")
