"""The search router: sharding, replica choice, failover, hedging, exact merge, cache, metrics."""
