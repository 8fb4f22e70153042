"""The demo engine: its model code (`model`), the engine (`engine`) and its checkpoint writer
(`tiny`). Nothing is imported here, so each part is imported only where it is used."""
