"""The router's view of the deployment: shards, replicas, write heads, placement; and the
keep-alive HTTP client that its queries and health polls reach replicas with."""
