"""Figures in README and docs/ say where they come from (issue 46).

A measured figure links its recorded run (docs/bench/<run>/, docs/benchmarks.md,
docs/images/), names the test that asserts or prints it, cites the public document it
comes from, or says it was not recorded. What a test can hold:

- every docs/bench/... and docs/images/... path a page names exists;
- README's headline figure, and every ratio and tok/s figure in a README sentence that
  links a recorded run, is the value in that run's results.json, of the date and on
  the CPU generation the run recorded;
- each ratio (`1.68x`) or `tok/s` figure in README's prose sits in a sentence that links
  a recorded run or docs/benchmarks.md, or names a test;
- in docs/, a section with such a figure links a recorded run or benchmarks.md, names a
  test, cites a public source or says "not recorded";
- a run the bench recorded since it learnt the CPU generation (2026-11-25) names it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from zenvllm.bench.catalogue import ACCEPTANCE_RATIO, NEAR_BEST

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
BENCH = DOCS / "bench"
# Generated, or the recorded runs themselves.
GENERATED = {DOCS / "reference" / "cli.md", DOCS / "reference" / "variables.md"}
PAGES = [
    README,
    REPO / "CHANGELOG.md",
    REPO / "ansible" / "README.md",
    *sorted(DOCS.rglob("*.md")),
]
PROSE_PAGES = [
    p
    for p in sorted(DOCS.rglob("*.md"))
    if p not in GENERATED
    and not p.is_relative_to(BENCH)
    and not p.is_relative_to(DOCS / "images")
    # A bench's own table beside its results.json (a run kept in docs/test-runs): its
    # figures are the run's, checked by bench.check.
    and not (p.name == "table.md" and (p.parent / "results.json").exists())
]

FENCE = re.compile(r"^ *(```|~~~).*?^ *\1", re.M | re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?\s*\)")
RECORDED_PATH = re.compile(r"docs/(?:bench|images)/[\w.{},*/-]*")
FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?:x\b| (?:output )?tok/s)")
RATIO = re.compile(r"(?<![\w.])(\d+\.\d+)x\b")
TOK_S = re.compile(
    r"(?<![\w.])(\d+(?:\.\d+)?)(?= (?:output )?tok/s)|(\d+(?:\.\d+)?) against (?=\d)"
)
TEST = re.compile(r"tests/[\w/]+\.py")
SOURCE = re.compile(r"not recorded|ZD-\d+|announcement|https?://|installation guide", re.I)
# "AMD EPYC (Zen 4), 2 CPUs, ...": the generation, or the raw family and model.
GENERATION = re.compile(
    r"\((Zen \d|[A-Z][\w /-]+(?:Rapids|Lake|Forest)[\w-]*|family \d+ model \d+)\)"
)
SINCE = "2026-11-25T11:12"  # core/generations.py: the bench names the generation from here
# The bench's goals (1.3x stock, 0.95x the best), not measurements.
GOALS = {str(ACCEPTANCE_RATIO), str(NEAR_BEST)}


def without_code_blocks(text: str) -> str:
    return COMMENT.sub("", FENCE.sub("", text))


def figures(text: str) -> list[str]:
    """The measured ratios and tok/s figures of prose (inline code and goals left out)."""
    found = FIGURE.finditer(CODE.sub("", text))
    return [m[0] for m in found if not (m[0].endswith("x") and m[1] in GOALS)]


def sentences(text: str) -> list[str]:
    """README's prose in sentences: paragraphs and list items joined, then cut after a
    full stop that ends a sentence."""
    out: list[str] = []
    for block in re.split(r"\n\s*\n|\n(?=\s*- )", without_code_blocks(text)):
        flat = " ".join(block.split())
        out += re.split(r"(?<=[.!?])\s+(?=[A-Z(\[*`])", flat)
    return [s for s in out if s]


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) per `#`/`##` section of a page, code blocks removed."""
    parts = re.split(r"^(#{1,2} .*)$", without_code_blocks(text), flags=re.M)
    return [("(top)", parts[0]), *zip(parts[1::2], parts[2::2], strict=True)]


def recorded_links(text: str) -> list[str]:
    """The recorded runs or result pages a piece of Markdown links."""
    return [t for t in LINK.findall(text) if re.search(r"bench/|benchmarks\.md|images/", t)]


def expand(path: str) -> list[str]:
    """`figures.{json,md}` -> both names."""
    m = re.search(r"\{([^}]*)\}", path)
    if not m:
        return [path]
    return [p for alt in m[1].split(",") for p in expand(path[: m.start()] + alt + path[m.end() :])]


def run_of(link: str) -> Path:
    """docs/bench/<run>/table.md (or results.json, summary.csv, the directory) -> the run."""
    path = (REPO / link).resolve()
    return path if path.is_dir() else path.parent


def results(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())


def matches(figure: str, value: float) -> bool:
    """`1.68` against 1.681: equal to the figure's own precision."""
    decimals = len(figure.partition(".")[2])
    return abs(float(figure) - value) <= 0.5 * 10**-decimals + 1e-9


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_recorded_run_a_page_names_exists(page):
    missing = []
    for found in RECORDED_PATH.findall(page.read_text()):
        for name in expand(found.rstrip(".,:;")):
            if "*" in name:
                if not list(REPO.glob(name)):
                    missing.append(name)
            elif not (REPO / name).exists():
                missing.append(name)
    assert not missing, (
        f"{page.relative_to(REPO)} names recorded files that do not exist: {missing}"
    )


def headline() -> str:
    lines = [line for line in README.read_text().splitlines() if line.startswith("**Measured:**")]
    assert len(lines) == 1, "README has no single `**Measured:**` headline"
    return lines[0]


def test_the_readme_headline_is_the_recorded_run_it_links():
    line = headline()
    runs = [link for link in LINK.findall(line) if link.startswith("docs/bench/")]
    assert runs, f"the headline links no recorded run under docs/bench: {line}"
    run = run_of(runs[0])
    found = results(run)
    summary = {row["config"]: row for row in found["summary"]}
    planner = summary[found["verdict"]["planner"]]
    ratio = RATIO.search(line)
    assert ratio and matches(ratio[1], planner["ratio"]), (
        f"the headline's ratio is not {run.name}'s planner/stock ratio {planner['ratio']}"
    )
    pair = re.search(r"(\d+(?:\.\d+)?) against (\d+(?:\.\d+)?) tok/s", line)
    assert pair, "the headline gives no `N against M tok/s`"
    assert float(pair[1]) == planner["output_tok_s"], (pair[1], planner["output_tok_s"])
    assert float(pair[2]) == summary["stock"]["output_tok_s"], (pair[2], summary["stock"])
    assert found["meta"]["date"][:10] in line, f"the headline's date is not {run.name}'s"
    generation = GENERATION.search(found["meta"]["host"])
    assert generation, f"{run.name}'s results.json names no CPU generation: {found['meta']['host']}"
    assert generation[1] in line, f"the headline does not name {run.name}'s CPU {generation[1]}"


def test_readme_figures_equal_the_run_their_sentence_links():
    wrong = []
    for sentence in sentences(README.read_text()):
        runs = [run_of(t) for t in LINK.findall(sentence) if t.startswith("docs/bench/")]
        if len(runs) != 1:
            continue
        summary = results(runs[0])["summary"]
        text = CODE.sub("", sentence)
        for figure in RATIO.findall(text):
            if not any(matches(figure, row["ratio"]) for row in summary):
                wrong.append(f"{figure}x is no ratio of {runs[0].name}")
        for pair in TOK_S.findall(text):
            figure = pair[0] or pair[1]
            if not any(float(figure) == row["output_tok_s"] for row in summary):
                wrong.append(f"{figure} tok/s is no output of {runs[0].name}")
    assert not wrong, "; ".join(wrong)


def test_each_readme_figure_sits_in_a_sentence_with_its_source():
    bare = []
    for sentence in sentences(README.read_text()):
        if not figures(sentence):
            continue
        if not (recorded_links(sentence) or TEST.search(sentence)):
            bare.append(sentence)
    assert not bare, (
        "README figures without a link to docs/bench, docs/benchmarks.md or docs/images, "
        f"or a named test, in their sentence: {bare}"
    )


@pytest.mark.parametrize("page", PROSE_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_each_docs_section_with_figures_says_where_they_come_from(page):
    bare = []
    for heading, body in sections(page.read_text()):
        if not figures(body):
            continue
        if not (recorded_links(body) or TEST.search(body) or SOURCE.search(body)):
            bare.append(heading)
    assert not bare, (
        f"{page.relative_to(REPO)}: sections with ratios or tok/s figures and no recorded "
        f"run, test, source or 'not recorded' label: {bare}"
    )


def runs_since_generations() -> list[Path]:
    """The recorded runs made since the bench writes the CPU generation (older ones
    name only the brand; docs/benchmarks.md says which)."""
    found = sorted(p.parent for p in BENCH.rglob("results.json"))
    return [run for run in found if results(run)["meta"]["date"] >= SINCE]


@pytest.mark.parametrize("run", runs_since_generations(), ids=lambda p: p.name)
def test_a_run_recorded_since_the_bench_knew_generations_names_its_cpu(run):
    meta = results(run)["meta"]
    assert GENERATION.search(meta["host"]), f"{run.name}: no CPU generation in {meta['host']!r}"


def test_some_recorded_run_is_recent_enough_to_be_checked():
    assert runs_since_generations(), "no run under docs/bench since the generation is recorded"


def test_the_figure_checks_see_what_they_must():
    assert expand("docs/images/figures.{json,md}") == [
        "docs/images/figures.json",
        "docs/images/figures.md",
    ]
    assert figures("made 1.75x and 267.0 output tok/s, 2 x 1 CPU, vLLM 0.32, goal 1.3x") == [
        "1.75x",
        "267.0 output tok/s",
    ]
    assert sentences("A 1.5x run ([r](docs/bench/x/table.md)).\nNext one 2.0x.") == [
        "A 1.5x run ([r](docs/bench/x/table.md)).",
        "Next one 2.0x.",
    ]
    assert GENERATION.search("AMD EPYC (Zen 4), 2 CPUs")[1] == "Zen 4"
    assert GENERATION.search("Intel Xeon (Skylake-SP/Cascade Lake), 2 CPUs")
    assert not GENERATION.search("AMD EPYC, 2 CPUs, 1 NUMA node(s), 24 GiB")
    assert not GENERATION.search("Intel(R) Xeon(R) Processor, 2 CPUs, 1 NUMA node(s)")
    assert matches("1.86", 1.865) and not matches("1.68", 1.69)
