"""OmniVoice: the adapter over the `omnivoice` package (`engine`) and the tiny-checkpoint writer
(`tiny`). Nothing is imported here, so each part is imported only where it is used."""
