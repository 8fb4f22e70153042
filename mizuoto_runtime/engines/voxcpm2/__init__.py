"""VoxCPM 2: the adapter over the `voxcpm` package (`engine`) and the tiny-checkpoint writer
(`tiny`). Nothing is imported here, so each part is imported only where it is used."""
