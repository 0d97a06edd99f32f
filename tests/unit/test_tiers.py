"""`make test`'s runner (scripts/test_tiers.sh) against a stand-in make: each tier timed
against its share of the budget, a tier over its share named, a failure still failing."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNNER = REPO / "scripts" / "test_tiers.sh"


def run(
    tmp_path: Path, *tiers: str, script: str, background: str = ""
) -> subprocess.CompletedProcess:
    make = tmp_path / "make"
    make.write_text(f'#!/bin/bash\ncase "$2" in\n{script}\nesac\n')
    make.chmod(0o755)
    return subprocess.run(
        ["bash", str(RUNNER), *tiers],
        cwd=tmp_path,
        env={"MAKE": str(make), "PATH": "/usr/bin:/bin", "BACKGROUND": background},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_tier_over_its_share_is_named_but_does_not_fail_the_run(tmp_path):
    done = run(tmp_path, "slow=0", "quick=5", "free", script="test-slow) sleep 1.2;;")
    assert done.returncode == 0, done.stdout
    # bash's SECONDS counts whole seconds: 1.2 s shows as 1 or 2 (3 on a loaded machine,
    # where the instant tiers may take a second too).
    assert re.search(r"^==> tier slow: passed in 0m[123]s \(share 0m0s\)$", done.stdout, re.M)
    assert re.search(r"^==> tier quick: passed in 0m[01]s \(share 5m0s\)$", done.stdout, re.M)
    assert re.search(r"^==> tier free: passed in 0m[01]s$", done.stdout, re.M)  # no share
    assert re.search(r"^  all +0m[1-5]s +of 5m0s$", done.stdout, re.M), done.stdout
    assert re.search(
        r"over its share of the time budget: slow \(0m[123]s > 0m0s\)$", done.stdout, re.M
    )
    assert "quick (" not in done.stdout.split("over its share")[1]
    assert done.stdout.rstrip().endswith("make test: every tier passed")


def test_a_failed_tier_fails_the_run_and_the_next_tier_still_runs(tmp_path):
    done = run(tmp_path, "broken=3", "after=3", script="test-broken) exit 1;;")
    assert done.returncode == 1
    assert "==> tier after: passed" in done.stdout
    assert "over its share" not in done.stdout
    assert "make test: not passed: broken" in done.stdout


def test_a_background_job_runs_beside_the_tiers_between_its_two(tmp_path):
    """Started when its first tier ends, a job overlaps the tiers after (the jobs and the
    tiers each write when they start or end) until the tier it is for, which waits for
    it; a failure is shown and fails nothing."""
    trace = tmp_path / "trace"
    script = (
        f"test-prep) echo prep-start >>{trace}; sleep 2; echo prep-end >>{trace}; exit 3;;\n"
        f"test-early) sleep 1; echo early-end >>{trace};;\n"
        f"test-*) echo $2 >>{trace};;"
    )
    jobs = "prep:one:three early:one:two"
    done = run(tmp_path, "one", "two", "three", script=script, background=jobs)
    assert done.returncode == 0, done.stdout
    steps = trace.read_text().split()
    assert steps.index("test-one") < steps.index("prep-start") < steps.index("prep-end")
    assert steps.index("test-two") < steps.index("prep-end") < steps.index("test-three")
    assert steps.index("early-end") < steps.index("test-two")  # tier two waited for it
    assert "==> background early: passed in" in done.stdout
    assert "==> background prep: started" in done.stdout
    assert "(log: .cache/background-prep.log)" in done.stdout
    assert re.search(
        r"^==> background prep: failed in 0m[23]s, waited for 0m[01]s$", done.stdout, re.M
    )
    assert done.stdout.index("background prep: failed") < done.stdout.index("tier three: started")
    assert done.stdout.rstrip().endswith("make test: every tier passed")


def test_a_background_job_after_dash_runs_beside_the_first_tier(tmp_path):
    """AFTER "-": the job starts before the first tier and overlaps it; the tier it is
    for waits for it."""
    trace = tmp_path / "trace"
    script = (
        f"test-base) echo base-start >>{trace}; sleep 2; echo base-end >>{trace};;\n"
        f"test-one) sleep 1; echo one-end >>{trace};;\n"
        f"test-*) echo $2 >>{trace};;"
    )
    done = run(tmp_path, "one", "two", script=script, background="base:-:two")
    assert done.returncode == 0, done.stdout
    steps = trace.read_text().split()
    assert steps.index("base-start") < steps.index("one-end") < steps.index("base-end")
    assert steps.index("base-end") < steps.index("test-two")
    assert done.stdout.index("background base: started") < done.stdout.index("tier one: started")
