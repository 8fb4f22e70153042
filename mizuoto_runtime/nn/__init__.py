"""Model blocks that more than one engine uses (issue 22): a Qwen2/Qwen3-style decoder with its
KV caches (`kv_cache`: the peak of a growing cache, M46, and the static `BufferCache`, M53),
rotary embeddings, RMSNorm, conformer pieces, weight-norm folding, mel and kaldi fbank features
on ``torch.stft``, and the safe checkpoint reader; the vocoders' and codecs' blocks (issue 32):
Snake / SnakeBeta, causal and reflect-padded convs, HiFi-GAN / BigVGAN residual blocks, the VITS
WaveNet and the ConvNeXt block. An engine's own model code stays in its package under `engines/`."""
