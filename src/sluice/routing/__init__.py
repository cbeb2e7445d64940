"""The fleet layer: which model, version and worker serve a request, how that changes, and
how many workers there should be.

    fleet_schema / fleet_file / toml_lines   the fleet file: schema, loading, line numbers
    default_fleet                            the fleet of one that today's settings describe
    registry                                 model ids and aliases → models; checked reloads
    version_router                           weighted sticky version choice; pins
    worker_picker / worker_pool              prefix affinity under a load bound; worker states
    circuit_breaker                          per-worker ejection and recovery
    quota / quota_memory / quota_redis       per-model token quotas per tier
    rollout / rollout_health                 gradual shift, automatic rollback, drain
    rollout_driver                           runs rollouts through the shared state (CAS)
    routing_state / routing_state_redis      live weights and rollout progress, shared
    state_follower                           every gateway follows the shared state
    router                                   the request-time composition of the above
    scaling_settings                         the one typed source of the autoscaling numbers
    warm_pool_schedule                       the warm pool's size by time of day
    scaling_decision / scaling_policy        the autoscaling policy: pure, on an injected clock
    keda_scaledobject                        the same settings as a Kubernetes KEDA ScaledObject

Pure components with injected clocks; no HTTP. routing/ imports engine/ (hashing, config) and
the leaves (types, config, errors), never api/, serving/ or gateway/. docs/FLEET.md, docs/DEPLOY.md.
"""
