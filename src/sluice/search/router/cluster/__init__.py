"""The router's view of the deployment: shards, replicas, write heads, placement."""
