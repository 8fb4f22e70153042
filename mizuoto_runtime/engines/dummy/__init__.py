"""The dummy engine: a tiny unphased engine with no checkpoint, for the runtime's tests."""
