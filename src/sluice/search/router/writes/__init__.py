"""Writes: bulk bodies planned per shard, and each shard's write log sequenced and replicated."""
