"""Global statistics at the router: what it remembers of each shard's (stats_cache.py), the
one-round search that needs no statistics round for new terms (one_round.py), and wildcard
expansion over every shard (wildcards.py)."""
