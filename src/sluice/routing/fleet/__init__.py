"""The running fleet of one gateway: members, versions, local replicas, the autoscaler, reloads, status."""
