"""The docs' commands, as the tests run them: a fenced block right after a
`<!-- tested: NAME -->` comment is the block named NAME. It may sit in README.md or in
any page under docs/ (the OpenStack steps live in docs/how-to/openstack.md); the name
must be unique across all of them. A docs edit that drops, renames or duplicates a
tested block fails the test that runs it."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
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


# A tested block runs as written, with one exception, the placeholders: a test may name
# strings of the block (a host name, a port, a model's path) and its own value for each.
# Each must occur in the block, so a docs edit that drops one fails the test; anything
# else in the block runs as the reader would type it (docs/development.md, "The docs are
# a test").
def written(name: str, placeholders: Mapping[str, str] | None = None) -> str:
    """Block NAME with each placeholder replaced by the test's value."""
    text = block(name)
    for placeholder, value in (placeholders or {}).items():
        assert placeholder in text, f"block {name} no longer holds the placeholder {placeholder!r}"
        text = text.replace(placeholder, value)
    return text


def run(
    name: str,
    placeholders: Mapping[str, str] | None = None,
    *,
    cwd: Path = ROOT,
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """Block NAME run by bash (-e, -u, pipefail) in cwd: its output, never raised."""
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", written(name, placeholders)],
        cwd=cwd,
        env=dict(env) if env is not None else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# What an operator is told to type: README, the tutorial and the how-tos. Each shell block
# there is tagged `<!-- tested: NAME -->` (and a test runs NAME) or labelled
# `<!-- needs: WHAT -->` with what no test machine has.
OPERATOR_PAGES = [
    README,
    ROOT / "docs" / "tutorial.md",
    *sorted((ROOT / "docs/how-to").glob("*.md")),
]
SHELL = re.compile(
    r"(?P<pre>(?:<!--(?P<comment>[^>]*)-->\s*\n)?)[ \t]*```(?:sh|bash|console|shell)\n", re.S
)


@dataclass(frozen=True)
class ShellBlock:
    where: str  # page:line
    tested: str  # the name it is tagged with, or ""
    needs: str  # what it needs that no test machine has, or ""


def shell_blocks(pages: list[Path] | None = None) -> list[ShellBlock]:
    found = []
    for page in pages or OPERATOR_PAGES:
        text = page.read_text()
        for m in SHELL.finditer(text):
            comment = (m["comment"] or "").strip()
            line = text[: m.start()].count("\n") + 1
            found.append(
                ShellBlock(
                    f"{page.relative_to(ROOT) if page.is_relative_to(ROOT) else page}:{line}",
                    comment.removeprefix("tested:").strip()
                    if comment.startswith("tested:")
                    else "",
                    comment.removeprefix("needs:").strip() if comment.startswith("needs:") else "",
                )
            )
    return found
