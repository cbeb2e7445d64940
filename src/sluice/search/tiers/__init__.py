"""Index tiers: hot (a replica's index in memory, `--memory`), warm (on local disk, the default),
cold (a read-only archive in S3-compatible object storage, fetched on first query, kept under a
disk budget)."""
