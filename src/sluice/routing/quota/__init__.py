"""Per-model token quotas per tier: the rules, a memory store and a Redis store."""
