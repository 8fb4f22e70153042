"""What the text frontend's errors say to install: a module of its own, so the language modules
read it without importing the frontend's package (which imports them: no cycle)."""
from __future__ import annotations


def install_hint() -> str:
    from ... import install_hint as hint

    return f"install them with: {hint('gptsovits')}"
