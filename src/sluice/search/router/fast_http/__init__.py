"""The query path's HTTP, lean: the client to shards and the search route in front of FastAPI."""
