"""The docs' commands, as the tests run them: a fenced block right after a
`<!-- tested: NAME -->` comment is the block named NAME. It may sit in README.md or in
any page under docs/ (the OpenStack steps live in docs/how-to/openstack.md); the name
must be unique across all of them. A docs edit that drops, renames or duplicates a
tested block fails the test that runs it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BLOCK = re.compile(r"<!-- tested: (?P<name>[\w-]+) -->\n\s*```\w*\n(?P<body>.*?)\n\s*```", re.S)


def pages(root: Path = ROOT) -> list[Path]:
    """README.md and every Markdown page under docs/, in a stable order."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def block(name: str, sources: list[Path] | None = None) -> str:
    """The commands of the block NAME, dedented (blocks may sit in a list item)."""
    found = [
        (path, m["body"])
        for path in sources or pages()
        for m in BLOCK.finditer(path.read_text())
        if m["name"] == name
    ]
    where = ", ".join(str(path) for path, _ in found) or "none"
    assert len(found) == 1, f"{len(found)} blocks tagged 'tested: {name}' ({where}), not 1"
    lines = found[0][1].splitlines()
    indent = min(len(x) - len(x.lstrip()) for x in lines if x.strip())
    return "\n".join(x[indent:] for x in lines) + "\n"
