"""Global statistics at the router: what it remembers of each shard's (stats_cache.py) and the
one-round search that needs no statistics round for new terms (one_round.py)."""
