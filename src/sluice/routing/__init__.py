"""Routing: model registry, router, worker pool, rollout, and the autoscaling policy.

This package sits between the gateway and the workers (DESIGN.md). The autoscaling part:
  scaling_settings.py     the one typed source of the thresholds, cool-downs, bounds, warm pool
  warm_pool_schedule.py   the warm pool's size by time of day, in a timezone
  scaling_decision.py     what the policy reads (an observation) and returns (a decision)
  scaling_policy.py       the policy itself: pure, on an injected clock
  keda_scaledobject.py    the Kubernetes driver: the same settings as a KEDA ScaledObject
"""
