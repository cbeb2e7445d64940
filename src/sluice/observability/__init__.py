"""Prometheus metrics, tracing and structured logs."""
