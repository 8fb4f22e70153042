"""Write the README's fit table (issue 35): every engine's published models, built on the meta
device from their published configs, placed on cards of 6 to 24 GB beside nothing, an SDXL
UNet and a Flux fp8 model (`mizuoto_runtime.app.fit`).

    python tools/fit_table.py          # rewrite the table between the README's markers
    python tools/fit_table.py --check  # exit 1 when the README's table is not what it would write

Run it with every engine installed (tools/install.sh): an engine it cannot build is an error.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN = "<!-- fit table: written by tools/fit_table.py, do not edit -->"
END = "<!-- end of fit table -->"


def section() -> str:
    """The README's table, as the runtime computes it now."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from mizuoto_runtime.app import fit

    models, missing = fit.installed_models()
    if missing:
        raise SystemExit(f"cannot build every published model here: {missing}")
    return fit.table_markdown(models)


def replaced(text: str, table: str) -> str:
    """`text` with what lies between the markers replaced by `table`."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{README}: the markers {BEGIN!r} and {END!r} are missing")
    return text[: start + len(BEGIN)] + "\n\n" + table + "\n" + text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the README's table is current")
    args = parser.parse_args(argv)
    text = README.read_text(encoding="utf-8")
    new = replaced(text, section())
    if args.check:
        if new != text:
            print(f"{README}: the fit table is stale; run python tools/fit_table.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
