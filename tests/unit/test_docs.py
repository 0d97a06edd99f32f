"""The docs as a newcomer meets them: README is a short front door, every relative
link in every tracked Markdown file lands on a file (and a heading, for an
`#anchor` into Markdown), and each role has a README in one shape.

The rule for dates in README: a date (YYYY-MM-DD) may appear on one line only, the
headline figure (the line that starts with `**Measured:**` and gives a ratio such as
`1.79x`). Dated results and the log of what each issue changed live in
docs/benchmarks.md and CHANGELOG.md; README names no issue number at all."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
ROLES = sorted(p for p in (REPO / "ansible" / "roles").iterdir() if p.is_dir())
# Every Markdown file git tracks, and each role's README (checked even if one went missing).
TRACKED = subprocess.run(
    ["git", "-C", str(REPO), "ls-files", "-z", "*.md"], capture_output=True, text=True, check=True
).stdout.split("\0")
PAGES = sorted({*(REPO / f for f in TRACKED if f), *(role / "README.md" for role in ROLES)})

FENCE = re.compile(r"^ *(```|~~~).*?^ *\1", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")
COMMENT = re.compile(r"<!--.*?-->", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
ISSUE = re.compile(r"\bissues?\s+\d+", re.I)
MARKERS = "## Role Variables\n\n<!-- BEGIN generated: variables -->\n"
END = "<!-- END generated: variables -->\n"


def prose(text: str) -> str:
    """The text without code blocks, inline code and comments (links there are not links)."""
    return CODE.sub("", COMMENT.sub("", FENCE.sub("", text)))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for m in HEADING.finditer(FENCE.sub("", path.read_text())):
        base = slug(m[2])
        name, n = base, 0
        while name in found:
            n += 1
            name = f"{base}-{n}"
        found.add(name)
    return found


def links(path: Path) -> list[str]:
    return LINK.findall(prose(path.read_text()))


def test_readme_is_a_short_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines; move the rest under docs/"


def test_readme_keeps_the_two_commands_ci_runs():
    # .ci/run proves what README tells a new user: `make test` on a clean checkout.
    text = README.read_text()
    assert re.search(r"^make deploy MODEL=\S+ +# ", text, re.M), (
        "README lost `make deploy MODEL=...`"
    )
    assert re.search(r"^make test +# ", text, re.M), "README lost `make test`"
    assert re.search(r"^make test$", (REPO / ".ci" / "run").read_text(), re.M)


def test_readme_has_no_issue_log():
    hits = [line for line in README.read_text().splitlines() if ISSUE.search(line)]
    assert not hits, f"README names issues (their log belongs in CHANGELOG.md): {hits}"
    headings = [m[2] for m in HEADING.finditer(README.read_text())]
    assert not [h for h in headings if re.search(r"status|open items|results", h, re.I)], headings


def test_readme_dates_only_its_headline_figure():
    dated = [line for line in README.read_text().splitlines() if DATE.search(line)]
    assert len(dated) <= 1, f"dated lines in README (results go to docs/benchmarks.md): {dated}"
    for line in dated:
        assert line.startswith("**Measured:**") and re.search(r"\d\.\d+x", line), line


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    assert page.is_file(), f"{page.relative_to(REPO)} is missing"
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto: ...
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading '#{anchor}' in {dest.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_the_link_checker_sees_what_it_must():
    assert slug("Real-shape results (`make bench`, 0.5 B and 1.5 B, 2026-11-23)") == (
        "real-shape-results-make-bench-05-b-and-15-b-2026-11-23"
    )
    assert slug("What changes when a `zenvllm_router` group exists") == (
        "what-changes-when-a-zenvllm_router-group-exists"
    )
    text = "[a](x.md) `[b](y.md)`\n```\n[c](z.md)\n```\n![d](img/p.png#top)"
    assert LINK.findall(prose(text)) == ["x.md", "img/p.png#top"]


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_each_role_has_a_readme_in_one_shape(role):
    readme = role / "README.md"
    assert readme.is_file(), f"{role.name} has no README.md"
    text = readme.read_text()
    assert text.startswith(f"# {role.name}\n"), f"{role.name}/README.md starts with another title"
    for section in ("## Requirements", "## Dependencies", "## Example Playbook"):
        assert f"\n{section}\n" in text, f"{role.name}/README.md lacks '{section}'"
    assert text.count(MARKERS) == 1 and text.count(END) == 1, (
        f"{role.name}/README.md: the variables section must be the generated markers"
    )
    assert text.index(MARKERS) < text.index(END)
    assert "absent" in text, f"{role.name}/README.md does not say how `absent` works"


def test_the_map_names_every_module_of_the_package():
    design = (REPO / "docs" / "explanation" / "design.md").read_text()
    mapped = design.split("## Map of the code", 1)[1]
    package = REPO / "scripts" / "zenvllm"
    modules = sorted(
        str(p.relative_to(package))
        for p in package.rglob("*.py")
        if p.name != "__init__.py" or p.parent == package
    )
    missing = [m for m in modules if f"`{m}`" not in mapped]
    assert not missing, f"docs/explanation/design.md's map lacks {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_page_points_at_a_tracker_its_reader_cannot_open(page):
    """The project's issue numbers live in a tracker outside the repository: a page says
    what was asked instead (upstream projects' issues, linked, are fine)."""
    text = COMMENT.sub("", page.read_text())
    hits = re.findall(r"\bissues? #?\d+", text, re.I)
    assert not hits, f"{page.name} names the project's issues: {hits}"


MACHINE_ROW = re.compile(
    r"^\| \[(?P<run>[\w./-]+)\]\(bench/[^)]+\) \| (?P<date>[\d-]+) \| (?P<machine>[^|]+) "
    r"\| (?P<says>[^|]+) \|$",
    re.M,
)


def recorded_dirs(bench: Path) -> list[Path]:
    """Each run's directory: docs/bench's own, and those of a directory that only groups
    runs (avx2-view: the runs under the AVX2 view, apart from the real CPUs')."""
    found = []
    for d in (p for p in bench.iterdir() if p.is_dir()):
        grouped = [c for c in d.iterdir() if c.is_dir() and (c / "results.json").exists()]
        found += grouped if grouped and not (d / "results.json").exists() else [d]
    return found


def test_every_recorded_run_names_its_machine_once_and_what_its_file_says():
    """benchmarks.md's machine table: one row per docs/bench run, whose last column is
    what the run's own results.json says of its CPU and whose date is the file's."""
    rows = {m["run"]: m for m in MACHINE_ROW.finditer((REPO / "docs/benchmarks.md").read_text())}
    bench = REPO / "docs" / "bench"
    runs = sorted(str(d.relative_to(bench)) for d in recorded_dirs(bench))
    assert sorted(rows) == runs, f"machine table rows {sorted(rows)} != runs {runs}"
    for run, row in rows.items():
        results = REPO / "docs" / "bench" / run / "results.json"
        if not results.exists():
            assert row["says"].startswith("no results.json"), row[0]
            continue
        meta = json.loads(results.read_text())["meta"]
        cpu = meta["host"].split(", ")[0]
        assert row["says"].strip() == f"`{cpu}`", f"{run}: the file says {cpu!r}: {row[0]}"
        assert meta["date"].startswith(row["date"]), f"{run}: dated {meta['date']}: {row[0]}"


def test_the_avx2_view_run_gives_the_repeats_its_files_hold():
    """The AVX2-view README's table of auto / stock per repeat, against both runs' files."""
    page = REPO / "docs" / "bench" / "avx2-view" / "qwen0.5b-avx2-view" / "README.md"
    rows = re.findall(
        r"^\| \[[^\]]+\]\(((?:[^)]*/)?)table\.md\)[^|]*\| (\d+) \| ([^|]+) \|$",
        page.read_text(),
        re.M,
    )
    assert len(rows) == 2, rows
    for where, repeats, ratios in rows:
        runs = json.loads((page.parent / where / "results.json").read_text())["runs"]
        tok = {(r["config"], r["repeat"]): r["output_tok_s"] for r in runs}
        want = [f"{tok['auto', k] / tok['stock', k]:.3f}x" for k in range(1, int(repeats) + 1)]
        assert ratios.strip().split(", ") == want, (where, ratios, want)
