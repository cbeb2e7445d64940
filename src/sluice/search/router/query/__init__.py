"""One search across the shards: rounds, replica choice and failover, the shard query client, the merge's statistics and the result cache."""
