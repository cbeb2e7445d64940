"""`sluice search`: the distributed search service (docs/SEARCH.md).

sluice search serve [--host H] [--port P] [--config search.toml] [--data DIR]
sluice search shard --listen HOST:PORT --data DIR
sluice search ingest docs.jsonl [--url URL] [--batch N] [--key KEY]
sluice search archive --data DIR --to s3://BUCKET/KEY [--s3-endpoint URL]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8100
DEFAULT_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"


def _serve(args: argparse.Namespace) -> int:
    from sluice.search.router.config import embedded_default, load_config
    from sluice.search.router.main import run_router

    cfg = load_config(args.config) if args.config else embedded_default(args.data or "./search-data")
    if args.config and args.data:
        cfg = cfg.model_copy(update={"search": cfg.search.model_copy(update={"data_dir": args.data})})
    return run_router(cfg, args.host, args.port)


def _shard(args: argparse.Namespace) -> int:
    from sluice.search.shard.main import run_shard

    return run_shard(args.listen, args.data, args.schema, fsync=not args.no_fsync, memory=args.memory)


def _archive(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sluice.search.tiers.archive import S3Location, upload

    try:
        where = S3Location.parse(args.to)
    except ValueError as exc:
        print(f"sluice search archive: {exc}", file=sys.stderr)
        return 2
    index = Path(args.data) / "index"
    if not index.is_dir():
        print(f"sluice search archive: {index} is not a replica's index folder", file=sys.stderr)
        return 2
    size = upload(index, where, args.s3_endpoint)
    print(f"sluice search archive: {index} → {where} ({size} bytes)", file=sys.stderr)
    return 0


def _ingest(args: argparse.Namespace) -> int:
    import httpx
    from tqdm import tqdm

    key = args.key or os.environ.get("SLUICE_SEARCH_INGEST_KEY")
    headers = {"content-type": "application/x-ndjson", **({"authorization": f"Bearer {key}"} if key else {})}
    try:
        size = os.path.getsize(args.file)
        f = open(args.file, "rb")
    except OSError as exc:
        print(f"sluice search ingest: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 2
    accepted, bad, failed_batches = 0, 0, 0
    started = time.perf_counter()
    nodelay = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    with (
        f,
        httpx.Client(base_url=args.url.rstrip("/"), timeout=120, headers=headers, transport=nodelay) as http,
        tqdm(total=size, unit="B", unit_scale=True, desc="ingest", disable=args.quiet) as bar,
    ):
        line_base = 0
        while True:
            lines = [ln for ln in (f.readline() for _ in range(args.batch)) if ln]
            if not lines:
                break
            try:
                r = http.post("/v1/search/documents", content=b"".join(lines))
            except httpx.HTTPError as exc:
                print(f"\nsluice search ingest: cannot reach {args.url}: {exc}", file=sys.stderr)
                return 2
            if r.status_code in (401, 403):
                print(f"\nsluice search ingest: refused: {r.json().get('error', {}).get('message')}", file=sys.stderr)
                return 1
            data = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
            accepted += data.get("accepted", 0) if r.status_code == 200 else 0
            for e in data.get("errors", []):
                bad += 1
                print(f"{args.file}:{line_base + e['line']}: {e['message']}", file=sys.stderr)
            if r.status_code != 200:
                failed_batches += 1
                print(
                    f"\nsluice search ingest: lines {line_base + 1}-{line_base + len(lines)}: HTTP {r.status_code}: "
                    f"{json.dumps(data.get('failed') or data.get('error'))[:300]}",
                    file=sys.stderr,
                )
            line_base += len(lines)
            bar.update(sum(len(x) for x in lines))
    secs = time.perf_counter() - started
    print(
        f"sluice search ingest: {accepted} documents in {secs:.1f}s ({accepted / max(secs, 1e-9):.0f}/s); "
        f"{bad} bad lines; {failed_batches} failed batches",
        file=sys.stderr,
    )
    return 0 if not bad and not failed_batches else 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "search",
        help="the distributed search service: serve, shard, ingest, archive",
        description="Distributed full-text search: a router over shards × replicas of Xapian indexes, "
        "exact merged BM25 scores (docs/SEARCH.md).",
    )
    ss = p.add_subparsers(dest="search_command", required=True, metavar="SUBCOMMAND")
    _add_serve(ss)
    _add_shard(ss)
    _add_archive(ss)
    _add_ingest(ss)


def _add_serve(ss: argparse._SubParsersAction) -> None:
    serve = ss.add_parser(
        "serve",
        help="the router; with no --config: 2 local shards × 1 replica under ./search-data",
        description="Run the search router. Without --config: the embedded default, two local "
        "shards with one replica each (supervised child processes, restarted if they "
        "die), hash sharding, no keys, data under ./search-data.",
    )
    serve.add_argument("--host", default=DEFAULT_HOST, help="interface to bind (default: %(default)s)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on (default: %(default)s)")
    serve.add_argument(
        "--config",
        metavar="FILE",
        help="search.toml: shards, replicas (local / HOST:PORT), sharding, deadlines, keys (docs/SEARCH.md)",
    )
    serve.add_argument(
        "--data",
        metavar="DIR",
        help="where local replicas keep their data (default ./search-data, or the config's data_dir)",
    )
    serve.set_defaults(func=_serve)


def _add_shard(ss: argparse._SubParsersAction) -> None:
    shard = ss.add_parser(
        "shard",
        help="one shard replica process (a write log + a Xapian index over HTTP)",
        description="Run one shard replica: its write log and Xapian index under --data, "
        "served to the router at --listen. List it in the router's config as HOST:PORT.",
    )
    shard.add_argument("--listen", required=True, metavar="HOST:PORT")
    shard.add_argument("--data", required=True, metavar="DIR")
    shard.add_argument(
        "--schema",
        metavar="JSON",
        help='{"default_fields": ["title", "body"]} (the router passes its own to local replicas)',
    )
    shard.add_argument(
        "--no-fsync",
        action="store_true",
        help="do not fsync the write log (benchmarks only: an acknowledged write may be lost on power failure)",
    )
    shard.add_argument(
        "--memory",
        action="store_true",
        help="hot tier: keep the index in memory, rebuilt from the write log at start (the log stays on disk)",
    )
    shard.set_defaults(func=_shard)


def _add_archive(ss: argparse._SubParsersAction) -> None:
    arch = ss.add_parser(
        "archive",
        help="snapshot a replica's index into object storage (the cold tier)",
        description="Compact a replica's Xapian index (a consistent snapshot, even while it "
        "serves) and upload it as a .tar.gz; a config shard with archive = that URL "
        "then serves it read-only, fetched on its first query.",
    )
    arch.add_argument("--data", required=True, metavar="DIR", help="the replica's data folder (holds index/)")
    arch.add_argument("--to", required=True, metavar="s3://BUCKET/KEY")
    arch.add_argument(
        "--s3-endpoint",
        metavar="URL",
        help="an S3-compatible endpoint (default: AWS); credentials from AWS_* variables",
    )
    arch.set_defaults(func=_archive)


def _add_ingest(ss: argparse._SubParsersAction) -> None:
    ingest = ss.add_parser(
        "ingest",
        help="bulk-load an NDJSON file into a running router, with a progress bar",
        description='POST an NDJSON file (one {"id", fields...} per line) to the router in '
        "batches. Bad lines are printed as FILE:LINE: problem; exit 1 if any.",
    )
    ingest.add_argument("file", metavar="DOCS.jsonl")
    ingest.add_argument("--url", default=os.environ.get("SLUICE_SEARCH_URL", DEFAULT_URL))
    ingest.add_argument("--batch", type=int, default=500, help="lines per request (default: %(default)s)")
    ingest.add_argument("--key", help="ingest key (else env SLUICE_SEARCH_INGEST_KEY)")
    ingest.add_argument("--quiet", action="store_true", help="no progress bar")
    ingest.set_defaults(func=_ingest)
