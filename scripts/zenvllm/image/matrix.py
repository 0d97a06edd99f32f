"""The compatibility matrix: which pinned versions may be built together.

Pure functions over the `matrix:` mapping of dockerfiles/build.yaml. Each
package has rows `{versions, needs, reason}`; a pin must fall in one row, and
that row's `needs` must hold for the other pins of the same image. A refusal
names the pin, what it needs, and the range the matrix does support.
"""

from __future__ import annotations

from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from zenvllm.core.errors import ConfigError


def parse_version(name: str, text: str) -> Version:
    try:
        return Version(str(text))
    except InvalidVersion as err:
        raise ConfigError(f"pin {name}={text} is not a version (e.g. 2.13.0.1)") from err


def spec(text: str) -> SpecifierSet:
    try:
        return SpecifierSet(str(text))
    except InvalidSpecifier as err:
        raise ConfigError(f"matrix specifier {text!r} is malformed") from err


def contains(specifier: str, version: Version) -> bool:
    # A local label (+cpu) must not hide a version from ==2.13.0 or <2.14.
    return spec(specifier).contains(version, prereleases=True)


def row_for(matrix: dict[str, Any], name: str, version: Version) -> dict[str, Any] | None:
    return next((r for r in matrix.get(name, []) if contains(r["versions"], version)), None)


def broken_needs(row: dict[str, Any], pins: dict[str, str]) -> list[tuple[str, str, str]]:
    """(package, needed spec, pinned version) for each need the other pins break."""
    broken = []
    for other, needed in (row.get("needs") or {}).items():
        if other in pins and not contains(needed, parse_version(other, pins[other])):
            broken.append((other, needed, pins[other]))
    return broken


def supported(matrix: dict[str, Any], name: str, pins: dict[str, str]) -> list[dict[str, Any]]:
    """Rows of `name` whose needs the other pins satisfy."""
    return [r for r in matrix.get(name, []) if not broken_needs(r, pins)]


def _ranges(rows: list[dict[str, Any]]) -> str:
    return " or ".join(f"{r['versions']}" for r in rows) or "none"


def check(matrix: dict[str, Any], pins: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Return the matrix row of every pin, or raise ConfigError naming the fix.

    Only packages the matrix knows are checked; `pins` holds just the image's own.
    """
    rows: dict[str, dict[str, Any]] = {}
    for name, text in pins.items():
        if name not in matrix:
            continue
        version = parse_version(name, text)
        row = row_for(matrix, name, version)
        if row is None:
            raise ConfigError(
                f"{name} {text} is not in the compatibility matrix; "
                f"supported {name} versions: {_ranges(matrix[name])}. "
                f"Pick one with --pin {name}=VERSION or add a row to dockerfiles/build.yaml"
            )
        broken = broken_needs(row, pins)
        if broken:
            other, needed, have = broken[0]
            ok = supported(matrix, name, pins)
            named = {k for r in matrix[name] for k in (r.get("needs") or {})}
            others = ", ".join(f"{k} {v}" for k, v in pins.items() if k in named)
            why = str(row["reason"]).rstrip(".")
            head = f"{name} {text} needs {other} {needed} but {other} is pinned to {have} ({why})."
            if ok:
                raise ConfigError(
                    f"{head} With {others} the matrix supports {name} {_ranges(ok)}; "
                    f"use --pin {name}=<a version in that range> or change the {other} pin"
                )
            raise ConfigError(
                f"{head} No {name} version in the matrix works with {others}; "
                f"pin {other} to {needed} (--pin {other}=VERSION)"
            )
        rows[name] = row
    return rows
