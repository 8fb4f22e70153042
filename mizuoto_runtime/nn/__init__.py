"""Model blocks that more than one engine uses (issues 22, 32): a Qwen2/Qwen3-style decoder with
its KV caches (`kv_cache`: the peak of a growing cache, M46, and the static `BufferCache`, M53),
rotary embeddings in both layouts (halves and adjacent pairs, the table in the engine's dtype),
RMSNorm, the SwiGLU feed-forward, the timestep embedding, conformer pieces, weight-norm folding,
mel and kaldi fbank features on ``torch.stft``, the run dtypes by name, and the safe checkpoint
reader; the vocoders' and codecs' blocks: Snake / SnakeBeta, causal and reflect-padded convs,
HiFi-GAN / BigVGAN residual blocks, the VITS WaveNet and the ConvNeXt block. An engine's own
model code stays in its package under `engines/`."""
