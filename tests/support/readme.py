"""README's commands, as the tests run them: a fenced block right after a
`<!-- tested: NAME -->` comment is the block named NAME. A README edit that drops or
renames a tested block fails the test that runs it."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"<!-- tested: (?P<name>[\w-]+) -->\n\s*```\w*\n(?P<body>.*?)\n\s*```", re.S)


def block(name: str, readme: Path = README) -> str:
    """The commands of README's block NAME, dedented (blocks may sit in a list item)."""
    found = [m["body"] for m in BLOCK.finditer(readme.read_text()) if m["name"] == name]
    assert len(found) == 1, f"README has {len(found)} blocks tagged 'tested: {name}', not 1"
    lines = found[0].splitlines()
    indent = min(len(x) - len(x.lstrip()) for x in lines if x.strip())
    return "\n".join(x[indent:] for x in lines) + "\n"
