"""Qwen3-TTS: the adapter over the `qwen-tts` package (`engine`), our lean talker loop (`loop`),
its transformers 5.x adaptations (`compat`), LoRA adapters (`lora`) and the tiny-checkpoint
writer (`tiny`). Nothing is imported here, so each part is imported only where it is used."""
