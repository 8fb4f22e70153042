"""Fish Speech (OpenAudio S1-mini, Fish Audio S2-Pro): our own model code, equal to upstream's
numbers on its reference data (``../shared/fixtures/fishspeech``)."""
