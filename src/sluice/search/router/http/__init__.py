"""The router's HTTP surface: the FastAPI routes, the ASGI front, keys, bounded bodies and answers."""
