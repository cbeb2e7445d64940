"""The fleet layer: which model, version and worker serve a request, how that changes, and
how many workers there should be. One folder per concept, each importing only those below it
(tests/unit/test_layering.py checks the floors):

    fleet/       the running fleet of one gateway: its workers (members), per-version tokenizers,
                 local replicas, the local autoscaler, reloads, the operator's status view
    scaling/     the autoscaling policy (pure, injected clock), its observation of the fleet,
                 the exported scaling signal, and its Kubernetes form (a KEDA ScaledObject)
    dispatch/    per request: weighted sticky version choice, prefix-affinity worker choice,
                 the worker pool, circuit breakers, health polling, retries and migration
    state/       live weights and rollout progress shared across gateways (memory or Redis),
                 the follower, rollouts with automatic rollback, which replicas should run
    quota/       per-model token quotas per tier (memory or Redis Lua)
    fleet_file/  the fleet file: schema, loading with line numbers, the registry (ids, aliases,
                 checked reloads), the fleet of one today's settings describe, the typed
                 autoscaling and breaker numbers
    errors.py    the fleet layer's errors, used by every floor

Pure components with injected clocks; no HTTP. routing/ imports worker/, engine/ (hashing,
config), models/ (tokenizers) and the leaves, never api/, serving/ or gateway/; it loads
without torch. docs/FLEET.md, docs/DEPLOY.md.
"""
