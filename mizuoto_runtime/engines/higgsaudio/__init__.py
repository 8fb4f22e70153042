"""Higgs Audio v2: the adapter over transformers' `higgs_audio_v2` and `higgs_audio_v2_tokenizer`
(`engine`), the folder layout (`checkpoint`), the published shapes (`published`), the prompt text
(`config`) and the tiny-checkpoint writer (`tiny`). Nothing is imported here, so each part is
imported only where it is used."""
