"""Language-model helpers shared by engines (M46, M53)."""
