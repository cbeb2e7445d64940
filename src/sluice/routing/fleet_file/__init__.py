"""The fleet file: schema, loading with line numbers, the registry, and its typed settings."""
