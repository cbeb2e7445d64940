from __future__ import annotations

import pytest

from sluice.search.errors import SearchConfigError
from sluice.search.index.ranking import Ranking
from sluice.search.router.config import Sharding, embedded_default, parse_config


def test_embedded_default_is_two_local_shards():
    cfg = embedded_default()
    assert [s.name for s in cfg.shards] == ["s0", "s1"] and all(s.replicas == ["local"] for s in cfg.shards)
    assert cfg.search.sharding is Sharding.HASH and not cfg.search.api_keys
    assert cfg.search.ranking is Ranking.EXACT  # every match scored (index/ranking.py)


def test_ranking_is_exact_or_pruned():
    assert parse_config('[search]\nranking = "pruned"\n').search.ranking is Ranking.PRUNED
    with pytest.raises(SearchConfigError) as exc:
        parse_config('[search]\nranking = "fast"\n', "r.toml")
    assert exc.value.problems[0].startswith("r.toml:2: search.ranking:") and "exact, pruned" in exc.value.problems[0]


def test_every_problem_is_reported_with_file_and_line():
    text = """[search]
sharding = "content"
shard_deadline_ms = "soon"
hedge = true

[[shards]]
name = "a"
replicas = ["local", "nowhere"]
values = ["x"]

[[shards]]
name = "a"
values = ["x"]
"""
    with pytest.raises(SearchConfigError) as exc:
        parse_config(text, "search.toml")
    got = exc.value.problems
    assert any(p.startswith("search.toml:3: search.shard_deadline_ms:") for p in got), got
    assert any(p.startswith("search.toml:8: shards[0].replicas:") and "nowhere" in p for p in got), got


def test_cross_checks():
    text = """[search]
sharding = "content"
content_field = "section"
[[shards]]
name = "a"
values = ["x"]
default = true
[[shards]]
name = "a"
values = ["x"]
"""
    with pytest.raises(SearchConfigError) as exc:
        parse_config(text, "f.toml")
    msgs = "\n".join(exc.value.problems)
    assert "f.toml:9: shards[1].name: shard 'a' is already defined" in msgs
    assert "f.toml:10: shards[1].values: value 'x' already goes to shard 'a'" in msgs
    with pytest.raises(SearchConfigError) as exc:
        parse_config('[[shards]]\nname = "a"\nvalues = ["x"]\n', "h.toml")
    assert exc.value.problems == ['h.toml:3: shards[0].values: only for sharding = "content"']
    with pytest.raises(SearchConfigError) as exc:
        parse_config("[search]\nunknown = 1\n", "u.toml")
    assert exc.value.problems[0].startswith("u.toml:2: search.unknown:")
