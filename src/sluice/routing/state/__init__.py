"""Live routing state shared across gateways, and the rollouts that move it."""
