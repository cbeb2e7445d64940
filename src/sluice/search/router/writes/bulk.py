"""A bulk NDJSON body → documents per shard, with every bad line reported by its number.

One JSON object per line (`{"id": ..., fields...}`); blank lines are skipped, and a final
newline ends the last line (it does not start another: 100,000 newline-terminated lines are
100,000 lines). A line that is not JSON the service takes (strict_json.py: no NaN or Infinity,
no lone surrogate escapes, bounded numbers and nesting), not an object, or not a valid document
is reported (`{"line": N, "message": ...}`, lines counted from 1) and the rest of the batch is
still written. The same id twice in one
batch: the later line wins (as two requests would).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sluice.search import strict_json
from sluice.search.errors import DocumentError
from sluice.search.index.schema import MAX_DOCUMENT_BYTES, Schema, parse_document
from sluice.search.router.cluster.topology import Topology

MAX_LINES = 100_000
MAX_BULK_BYTES = 64 << 20  # a bulk body; refused as soon as it passes this, never read whole


@dataclasses.dataclass(slots=True)
class BulkPlan:
    batches: dict[int, list[dict[str, Any]]]
    accepted: int
    errors: list[dict[str, Any]]


def plan_bulk(body: bytes, topo: Topology, schema: Schema | None = None) -> BulkPlan:
    if not body:
        raise DocumentError("the body is empty: send one JSON document per line")
    errors: list[dict[str, Any]] = []
    latest: dict[str, tuple[int, dict[str, Any]]] = {}
    lines = body.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()  # the newline that ends the last line
    if len(lines) > MAX_LINES:
        raise DocumentError(f"a bulk request has at most {MAX_LINES} lines; split it")
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        if len(raw) > MAX_DOCUMENT_BYTES:
            errors.append({"line": n, "message": f"line is longer than {MAX_DOCUMENT_BYTES} bytes"})
            continue
        try:
            obj = strict_json.loads(raw)
        except strict_json.JsonError as exc:
            errors.append({"line": n, "message": str(exc)})
            continue
        try:
            doc = parse_document(obj)
            if schema is not None:
                schema.check_ranges(doc.fields)
        except DocumentError as exc:
            errors.append({"line": n, "message": str(exc)})
            continue
        shard = topo.shard_for(doc)
        if topo.shards[shard].cold_url is not None:
            errors.append({"line": n, "message": f"shard {topo.shards[shard].name} is a read-only cold shard"})
            continue
        latest[doc.doc_id] = (shard, {"op": "upsert", "id": doc.doc_id, "fields": doc.fields})
    batches: dict[int, list[dict[str, Any]]] = {i: [] for i in range(len(topo.shards))}
    for doc_id, (shard, op) in latest.items():
        batches[shard].append(op)
        if topo.moves_documents:
            for other in batches:
                if other != shard and topo.shards[other].cold_url is None:
                    batches[other].append({"op": "delete", "id": doc_id})
    return BulkPlan(batches, len(latest), errors)
