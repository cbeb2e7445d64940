"""The query path's HTTP: the shard client (asyncio + httptools) and the search route as plain ASGI in front of FastAPI."""
