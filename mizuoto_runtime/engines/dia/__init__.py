"""Dia (Nari Labs, 1.6B): the adapter over transformers' own Dia and DAC code (`engine`), its
folder layout (`checkpoint`), its constants (`config`), the published shapes (`published`) and
the tiny-checkpoint writer (`tiny`). Nothing is imported here, so each part is imported only where
it is used."""
