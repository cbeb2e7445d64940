"""One search across the shards: its rounds, replica choice and failover, the shard query
client, the statistics behind an exact merge, and the result cache."""
