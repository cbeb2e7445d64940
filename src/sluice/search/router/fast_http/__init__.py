"""The query path's HTTP: the shard client (aiohttp) and the search route as plain ASGI in front of FastAPI."""
