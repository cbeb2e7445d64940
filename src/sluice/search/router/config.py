"""The search config file (`sluice search serve --config search.toml`), typed and strict.

    [search]
    sharding = "hash"            # or "content": a document goes to the shard listing its
    content_field = "section"    #   content_field value (the `default` shard takes the rest)
    shard_deadline_ms = 1000     # a shard that has not answered by then is left out: partial
    hedge = true                 # ask a second replica after the shard's p95 latency
    stats = "global"             # "global": exact scores (two phases); "local": per-shard stats
    cache_entries = 10000        # result cache (0: off)
    max_top_k = 100
    data_dir = "./search-data"   # local replicas keep their data under it
    api_keys = ["..."]           # searches need one of these (none: open)
    ingest_keys = ["..."]        # writes and deletes need one of these (none: open)
    default_fields = ["title", "body"]
    snippet_fields = ["body"]    # a hit's snippet is taken from these (default: default_fields but title)
    range_fields = { year = "number", published = "date" }   # fields a filter may bound (gte / lte)
    vectors = true               # embed documents at ingest (wordllama): modes dense and hybrid
    vector_search = "auto"       # "exact" (brute force), "approximate" (HNSW); auto: exact ≤ 20,000 per shard
    local_reads = false          # true: queries read local replicas' indexes in the router's process (no hop)
    accept_writes = true         # false: query-only (only one router per deployment sequences writes)
    hot_shards = false           # add a local replica to a shard whose replicas are ≥ 70 % busy
    hot_interval_s = 2.0
    hot_at = 0.7                 # index utilization per replica that adds a replica ...
    cool_at = 0.3                # ... and that removes an added one (must be < hot_at)
    hot_for = 3                  # consecutive hot evaluations before a replica is added
    cool_for = 10                # consecutive cool evaluations before an added one is removed
    hot_max_added = 2            # added replicas per shard at most
    log_compact_every = 10000    # compact a replica's write log once this many entries can go (0: never)
    log_keep_max = 1000000       # entries kept for a lagging replica; one further behind copies an index

    [[shards]]
    name = "s0"
    replicas = ["local", "10.0.0.7:8200"]   # "local": a supervised process; else HOST:PORT
    values = ["libs", "python"]             # content sharding only
    default = false                         # content sharding: exactly one shard is the default

    [[shards]]                              # cold tier: a read-only archive in object storage,
    name = "y2019"                          #   fetched on first query (s3_endpoint, cold_cache_mb)
    replicas = []
    archive = "s3://search-archive/y2019.tar.gz"
    values = ["2019"]

Every problem is reported at once as `FILE:LINE: field: problem` (lines from the TOML text,
as the fleet file does), and serve refuses to start.
"""

from __future__ import annotations

import enum
import re
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationInfo, field_validator

from sluice.search.contract import MAX_TOP_K
from sluice.search.errors import SearchConfigError
from sluice.search.index.filters import range_slot
from sluice.search.index.ranking import Ranking
from sluice.search.index.schema import FIELD_NAME, RangeKind
from sluice.search.retrieval import VectorSearch
from sluice.toml_config import parse_toml, read_text, report, validate
from sluice.toml_lines import KeyPath

LOCAL = "local"
_ADDRESS = re.compile(r"^(https?://)?[A-Za-z0-9.\-\[\]:]+:\d{1,5}$")
ShardName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")]


class Sharding(str, enum.Enum):
    HASH = "hash"
    CONTENT = "content"


class StatsMode(str, enum.Enum):
    GLOBAL = "global"  # exact: phase 1 gathers every shard's statistics
    LOCAL = "local"  # one phase; each shard scores with its own statistics


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class ShardSpec(_Strict):
    name: ShardName
    replicas: list[str] = Field(default_factory=lambda: [LOCAL], max_length=16)
    values: list[str] = Field(default_factory=list)
    default: bool = False
    archive: str | None = None  # cold tier: s3://BUCKET/KEY of `sluice search archive`; read-only, no replicas

    @field_validator("archive")
    @classmethod
    def _archive(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^s3://[^/]+/.+[^/]$", v):
            raise ValueError("must be s3://BUCKET/KEY")
        return v

    @field_validator("replicas")
    @classmethod
    def _addresses(cls, v: list[str]) -> list[str]:
        for r in v:
            if r != LOCAL and not _ADDRESS.match(r):
                raise ValueError(f'{r!r} is neither "local" nor HOST:PORT')
        return v


_ENUM_FIELDS: dict[str, type[enum.Enum]] = {
    "sharding": Sharding,
    "stats": StatsMode,
    "vector_search": VectorSearch,
    "ranking": Ranking,
}


class SearchSettings(_Strict):
    sharding: Sharding = Sharding.HASH
    content_field: str | None = None
    shard_deadline_ms: int = Field(1000, ge=10, le=60000)
    hedge: bool = True
    hedge_min_ms: float = Field(1.0, ge=0)
    stats: StatsMode = StatsMode.GLOBAL
    ranking: Ranking = Ranking.EXACT  # every match scored; "pruned": Xapian's early termination (index/ranking.py)
    cache_entries: int = Field(10000, ge=0, le=10_000_000)
    max_top_k: int = Field(100, ge=1, le=MAX_TOP_K)
    data_dir: str = "./search-data"
    api_keys: list[Annotated[str, StringConstraints(min_length=8)]] = Field(default_factory=list)
    ingest_keys: list[Annotated[str, StringConstraints(min_length=8)]] = Field(default_factory=list)
    default_fields: list[str] = Field(default_factory=lambda: ["title", "body"], min_length=1)
    snippet_fields: list[str] | None = Field(
        None, min_length=1
    )  # a hit's snippet text (None: default_fields but title)
    range_fields: dict[str, RangeKind] = Field(default_factory=dict)  # fields a filter may bound (gte / lte)
    vectors: bool = True  # embed every document at ingest (dense and hybrid modes); false: lexical only
    vector_search: VectorSearch = VectorSearch.AUTO  # how shards search their vectors (retrieval.py)
    local_reads: bool = False  # answer queries from local replicas' indexes in this process (tiers/local_reads.py)
    accept_writes: bool = True  # false: a query-only router (scale these freely; one router sequences writes)
    s3_endpoint: str | None = None  # the cold tier's S3-compatible endpoint (None: AWS)
    cold_cache_mb: int = Field(1024, ge=1)  # disk budget for fetched cold shards (LRU)
    hot_shards: bool = False  # add local replicas to a hot shard, remove them when cool (hot_shards.py)
    hot_interval_s: float = Field(2.0, gt=0)
    hot_at: float = Field(0.7, gt=0, le=1)  # utilization per replica that adds one (hot_shards.py)
    cool_at: float = Field(0.3, ge=0, lt=1)  # ... that removes an added one
    hot_for: int = Field(3, ge=1, le=1000)  # consecutive evaluations (hysteresis: hot_shards.py)
    cool_for: int = Field(10, ge=1, le=1000)
    hot_max_added: int = Field(2, ge=1, le=16)
    log_compact_every: int = Field(10_000, ge=0)  # droppable entries before a compaction (0: never)
    log_keep_max: int = Field(1_000_000, ge=1)  # a replica further behind copies a peer's index

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, use_enum_values=False)

    @field_validator(*_ENUM_FIELDS, mode="before")
    @classmethod
    def _enum(cls, v: object, info: ValidationInfo) -> object:  # TOML gives strings; strict mode wants the enum
        enum_type = _ENUM_FIELDS[str(info.field_name)]  # a field validator's: always named
        try:
            return enum_type(v)
        except ValueError:
            raise ValueError(f"must be one of {', '.join(e.value for e in enum_type)}") from None

    @field_validator("range_fields", mode="before")
    @classmethod
    def _range_kinds(cls, v: object) -> object:
        if not isinstance(v, dict):
            return v
        out = {}
        for name, kind in v.items():
            if not isinstance(name, str) or not FIELD_NAME.match(name):
                raise ValueError(f"{str(name)[:80]!r} is not a field name")
            try:
                out[name] = RangeKind(kind)
            except ValueError:
                raise ValueError(f"{name}: must be one of {', '.join(k.value for k in RangeKind)}") from None
        return out

    @field_validator("default_fields", "snippet_fields")
    @classmethod
    def _fields(cls, v: list[str] | None) -> list[str] | None:
        bad = [f for f in v or () if not FIELD_NAME.match(f)]
        if bad:
            raise ValueError(f"not field names: {bad}")
        return v


class SearchConfig(_Strict):
    search: SearchSettings = Field(default_factory=SearchSettings)
    shards: list[ShardSpec] = Field(
        default_factory=lambda: [ShardSpec(name="s0"), ShardSpec(name="s1")], min_length=1, max_length=1024
    )


def embedded_default(data_dir: str = "./search-data") -> SearchConfig:
    """`sluice search serve` with no config: 2 local shards × 1 replica, hash sharding, open;
    queries read the local replicas' indexes in the router's process (local_reads)."""
    return SearchConfig(search=SearchSettings(data_dir=data_dir, local_reads=True))


def cross_check(cfg: SearchConfig) -> list[tuple[KeyPath, str]]:
    found: list[tuple[KeyPath, str]] = []
    names: dict[str, int] = {}
    for i, s in enumerate(cfg.shards):
        if s.name in names:
            found.append((("shards", i, "name"), f"shard {s.name!r} is already defined (shards[{names[s.name]}])"))
        names.setdefault(s.name, i)
        if s.archive is not None and s.replicas:
            found.append((("shards", i, "replicas"), "a cold shard (archive = ...) has no replicas: replicas = []"))
        if s.archive is None and not s.replicas:
            found.append((("shards", i, "replicas"), "a shard needs at least one replica (or an archive)"))
        if s.archive is not None and (cfg.search.sharding is not Sharding.CONTENT or s.default):
            found.append(
                (
                    ("shards", i, "archive"),
                    "a cold shard is read-only: only under content sharding, and not the default shard",
                )
            )
        remotes = [r for r in s.replicas if r != LOCAL]
        if len(set(remotes)) < len(remotes):
            found.append((("shards", i, "replicas"), "a remote replica is listed twice"))
    slots: dict[int, str] = {}
    for name in cfg.search.range_fields:
        other = slots.setdefault(range_slot(name), name)
        if other != name:
            found.append((("search", "range_fields"), f"{name!r} and {other!r} share a value slot: rename one"))
    if cfg.search.cool_at >= cfg.search.hot_at:
        found.append(
            (
                ("search", "cool_at"),
                f"must be below hot_at ({cfg.search.hot_at}): the band between them is the hysteresis",
            )
        )
    content = cfg.search.sharding is Sharding.CONTENT
    if content:
        if not cfg.search.content_field:
            found.append((("search", "sharding"), 'content sharding needs content_field = "<field>"'))
        defaults = [i for i, s in enumerate(cfg.shards) if s.default]
        if len(defaults) != 1:
            found.append(
                (("shards",), f"content sharding needs exactly one shard with default = true (found {len(defaults)})")
            )
        owner: dict[str, str] = {}
        for i, s in enumerate(cfg.shards):
            for v in s.values:
                if v in owner:
                    found.append((("shards", i, "values"), f"value {v!r} already goes to shard {owner[v]!r}"))
                owner.setdefault(v, s.name)
    else:
        for i, s in enumerate(cfg.shards):
            if s.values or s.default:
                found.append((("shards", i, "values" if s.values else "default"), 'only for sharding = "content"'))
    return found


def parse_config(text: str, source: str = "<search config>") -> SearchConfig:
    data, lines = parse_toml(text, source, SearchConfigError)
    cfg = validate(SearchConfig, data, source=source, lines=lines, error=SearchConfigError)
    found = cross_check(cfg)
    if found:
        raise SearchConfigError(report(source, lines, found))
    return cfg


def load_config(path: str | Path) -> SearchConfig:
    text, p = read_text(path, "search config", SearchConfigError)
    return parse_config(text, str(p))
