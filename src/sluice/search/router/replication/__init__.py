"""Keeping replicas current and alive: the health poller, catch-up and compaction, local
replica processes, hot shards."""
