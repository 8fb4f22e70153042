"""VibeVoice: the adapter over transformers' VibeVoice classes (`engine`), its folder layout
(`checkpoint`), the published configurations (`published`) and the tiny-checkpoint writer (`tiny`).
Nothing is imported here, so each part is imported only where it is used."""
