"""Model blocks that more than one engine uses (issue 22): a Qwen2/Qwen3-style decoder with its KV
caches (M46, M53: `kv_cache`), rotary embeddings, RMSNorm, conformer pieces, weight-norm folding,
mel and kaldi fbank features on ``torch.stft``, and the safe checkpoint reader. Each module holds
one concept; an engine's own model code stays in its package under `engines/`."""
