"""Model blocks that more than one engine uses (issue 22): a Qwen2/Qwen3-style decoder with its
KV caches (`kv_cache`: the peak of a growing cache, M46, and the static `BufferCache`, M53),
rotary embeddings, RMSNorm, conformer pieces, weight-norm folding, mel and kaldi fbank features
on ``torch.stft``, and the safe checkpoint reader. An engine's own model code stays in its
package under `engines/`."""
