"""CosyVoice 2 and CosyVoice 3 (FunAudioLLM, Apache-2.0) in our own model code (issue 22).

Modules: `config` (the yaml read as data), `checkpoint` (loading a published folder), `lm` (Qwen2
speech-token LM, RAS sampling, token loop), `flow` (+ `unet`, `dit`: flow matching), `hift`
(vocoder), `tokenizer`, `pipeline` (synthesis steps), `reference` (stages for
``mizuoto check-reference``)."""
