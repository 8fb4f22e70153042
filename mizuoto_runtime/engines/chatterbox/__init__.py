"""Chatterbox (Resemble AI, MIT) over the `chatterbox-tts` package: voice prompt, T3 talker,
S3Gen decoder (issue 34)."""
