"""gRPC channel/server options shared by both ends."""

from __future__ import annotations

# Prompts travel as token ids (4-5 bytes each in a packed field): 64 MiB fits a 1M-token prompt.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# A Stream call merges many requests' outputs (or starts) into one message up to this size, so
# the merge never makes a message too large (one request's own can still be up to the maximum).
MERGE_MESSAGE_BYTES = 4 * 1024 * 1024

SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
]

CLIENT_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # detect a vanished worker host within ~30 s even when no call is active
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # a restarted worker (same address) is found within a second: gRPC's default reconnect
    # backoff grows to 120 s, which would keep a recovered worker unused for minutes
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]
