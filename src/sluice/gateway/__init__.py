"""Policy between the API and the engines: keys and tenants, rate limits, admission, coalescing."""
