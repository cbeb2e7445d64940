"""`sluice search shard --listen HOST:PORT --data DIR`: one shard replica process.

Opens (or creates) the replica's write log and Xapian database under DIR, replays log entries
the index has not applied, then serves the shard protocol (server.py) until SIGTERM / SIGINT.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from sluice.search.index.schema import Schema
from sluice.search.shard.replica import Replica


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--listen must be HOST:PORT, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def run_shard(
    listen: str, data_dir: str, schema_json: str | None = None, fsync: bool = True, memory: bool = False
) -> int:
    import uvicorn

    from sluice.search.shard.query_protocol import uvicorn_http_option
    from sluice.search.shard.server import create_shard_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    host, port = parse_listen(listen)
    schema = Schema.from_json(json.loads(schema_json)) if schema_json else Schema()
    replica = Replica(Path(data_dir), schema, fsync=fsync, memory=memory)
    print(
        f"sluice search shard: {data_dir} at entry {replica.applied_seq} "
        f"({replica.index.doc_count()} documents), listening on {host}:{port}",
        file=sys.stderr,
        flush=True,
    )
    app = create_shard_app(replica)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, **uvicorn_http_option(app))
    replica.index.close()
    return 0
