"""Model blocks that more than one engine uses (M46, M53: the KV caches of autoregressive LMs,
`kv_cache`). An engine's own model code stays in its package under `engines/`."""
