"""Install engines into an existing Python environment without moving anything it has (issue 14
item 1, issue 11 item 3). Standard library only; run it with the environment's own Python.

    python tools/engine_env.py constraints constraints-engines.txt > c.txt
        Constraints for `pip install --no-deps -c c.txt -r requirements/<engine>.txt`: every
        installed distribution at its installed version, then the tested version of each
        package the environment does not have yet. pip then installs only what is missing, and
        refuses (installs nothing) when an engine needs another version of something installed.
    python tools/engine_env.py snapshot > before.txt
        What is installed, one `name==version` a line (names normalized as pip does), and what
        `pip check` says already (``#pip-check <line>``: the environment's own problems).
    python tools/engine_env.py verify before.txt requirements/*.txt
        Fails unless every package of `before.txt` is still installed at its version (additions
        only), and `pip check` reports nothing new but the lines the requirement files accept
        (``#! pip-check-accepts: <start of a pip check line>``: an upstream package's declared
        dependency that its inference does not import, or its pin that the tests overrule).
"""
from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ACCEPT = "#! pip-check-accepts:"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> dict[str, str]:
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(normalize(name), dist.version)
    return found


def read_pins(path: Path) -> dict[str, list[str]]:
    """Each package's pin lines. A pin may end in an environment marker
    (``budoux==0.9.0; python_version < "3.11"``) where the tested version needs a newer Python
    than the pack supports; pip evaluates the marker, so a name may have several lines."""
    pins: dict[str, list[str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement, _, marker = (part.strip() for part in line.partition(";"))
            name, sep, version = requirement.partition("==")
            if not sep:
                raise SystemExit(f"{path}: {line!r} is not an exact pin (name==version)")
            pin = f"{normalize(name)}=={version.strip()}" + (f"; {marker}" if marker else "")
            pins.setdefault(normalize(name), []).append(pin)
    return pins


def constraints(pins_file: Path, have: dict[str, str]) -> list[str]:
    lines = [f"{name}=={version}" for name, version in sorted(have.items())]
    lines += [pin for name, pinned in sorted(read_pins(pins_file).items()) if name not in have for pin in pinned]
    return lines


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Packages of `before` that are gone or at another version in `after`."""
    problems = []
    for name, version in sorted(before.items()):
        if name not in after:
            problems.append(f"removed {name}=={version}")
        elif after[name] != version:
            problems.append(f"changed {name} {version} -> {after[name]}")
    return problems


def accepted(requirement_files: list[Path]) -> list[str]:
    return [line[len(ACCEPT):].strip() for path in requirement_files
            for line in path.read_text(encoding="utf-8").splitlines() if line.startswith(ACCEPT)]


def unaccepted(pip_check: str, accepts: list[str]) -> list[str]:
    """`pip check` lines not covered by an accepted start. pip writes ``<name> <version> requires
    ...`` / ``<name> <version> has requirement ...``; accepts leave the version out."""
    prefixes = [a.lower() for a in accepts]
    problems = []
    for line in pip_check.splitlines():
        line = line.strip()
        if not line or line == "No broken requirements found.":
            continue
        unversioned = re.sub(r"^(\S+) \S+ (requires|has requirement) ", r"\1 \2 ", line).lower()
        if not any(unversioned.startswith(p) for p in prefixes):
            problems.append(line)
    return problems


CHECK = "#pip-check "


def pip_check() -> list[str]:
    done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def read_snapshot(path: Path) -> tuple[dict[str, str], list[str]]:
    """(packages, pip check lines) of a snapshot."""
    packages, checks = {}, []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith(CHECK):
            checks.append(line[len(CHECK):])
        elif line:
            name, _, version = line.partition("==")
            packages[normalize(name)] = version
    return packages, checks


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "constraints":
        print("\n".join(constraints(Path(argv[1]), installed())))
        return 0
    if argv == ["snapshot"]:
        print("\n".join([f"{n}=={v}" for n, v in sorted(installed().items())] + [CHECK + c for c in pip_check()]))
        return 0
    if len(argv) >= 2 and argv[0] == "verify":
        (before, checked), after = read_snapshot(Path(argv[1])), installed()
        problems = changes(before, after)
        new = "\n".join(line for line in pip_check() if line not in checked)
        problems += [f"pip check: {line}" for line in unaccepted(new, accepted([Path(p) for p in argv[2:]]))]
        added = sorted(set(after) - set(before))
        print(f"added {len(added)} packages: {', '.join(f'{n}=={after[n]}' for n in added)}")
        print(f"kept {len(before)} packages at their versions" if not problems else "\n".join(problems))
        return 1 if problems else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
