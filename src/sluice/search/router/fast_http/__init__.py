"""The query path's search route as plain ASGI in front of FastAPI (the shard client is router/shard_http.py)."""
