"""Per request: version choice, worker choice, the worker pool, breakers, health, failover."""
