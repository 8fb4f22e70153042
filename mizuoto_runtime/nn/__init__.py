"""Blocks more than one native engine uses (issue 22): a Qwen2/Qwen3-style decoder with its KV
caches, rotary embeddings, RMSNorm, conformer pieces, weight-norm folding, mel and kaldi fbank
features on ``torch.stft``, and the safe checkpoint reader. Each module holds one concept."""
