"""F5-TTS: the adapter over the `f5-tts` package (`engine`), the import of its model modules
without its trainer (`upstream`) and the tiny-checkpoint writer (`tiny`). Nothing is imported
here, so each part is imported only where it is used."""
