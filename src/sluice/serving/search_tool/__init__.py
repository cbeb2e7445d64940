"""The Messages API search server tool: searches run by the gateway (docs/SEARCH.md)."""
