"""The docs are a test: every shell block README, the tutorial and the how-tos tell an
operator to type is run by a test as written (tagged `<!-- tested: NAME -->`, a test
naming NAME: support/readme.py runs it) or labelled `<!-- needs: WHAT -->` with what no
test machine has, at most five labels in all. The blocks of the planner's own pages run
here, on this machine, as written but for their placeholders (support/readme.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, require
from support import readme
from support.tiny_model import ensure_tiny_model

from zenvllm.deploy import shipped

# Blocks not yet tested nor labelled, per page: this may only go down (to none).
UNTESTED: dict[str, int] = {}
BIN = Path(sys.executable).parent


def test_every_shell_block_is_tested_as_written_or_labelled():
    blocks = readme.shell_blocks()
    tests = "\n".join(p.read_text() for p in (REPO / "tests").rglob("*.py"))
    tagged = [b for b in blocks if b.tested]
    never = [b for b in tagged if not re.search(rf"[\"']{b.tested}[\"']", tests)]
    assert not never, f"tagged, and no test names them: {never}"
    labels = [b for b in blocks if b.needs]
    assert len(labels) <= 5, [b.where for b in labels]
    for b in labels:  # what is missing here, named
        assert re.search(r"\b(a real|no test machine|second socket)\b", b.needs), b
    neither: dict[str, int] = {}
    for b in blocks:
        if not b.tested and not b.needs:
            page = b.where.rsplit(":", 1)[0]
            neither[page] = neither.get(page, 0) + 1
    assert neither == UNTESTED, f"blocks neither tested nor labelled, per page: {neither}"


def test_the_block_finder_sees_tags_labels_and_bare_blocks(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "<!-- tested: a-b -->\n```sh\nx\n```\n\n1. step\n   <!-- needs: a real cloud -->\n"
        "   ```sh\n   y\n   ```\n```bash\nz\n```\n```text\nnot a shell block\n```\n"
    )
    found = [(b.tested, b.needs) for b in readme.shell_blocks([page])]
    assert found == [("a-b", ""), ("", "a real cloud"), ("", "")]


@pytest.fixture
def operator_path(tmp_path):
    """PATH with the venv's zenvllm first, as `make venv` or the wheel gives an operator."""
    return os.environ | {"PATH": f"{BIN}:{os.environ['PATH']}"}


def test_the_plan_a_host_commands_run_as_written(operator_path, tmp_path):
    model = ensure_tiny_model()
    done = in_a_private_etc(
        readme.written("plan-a-host", {"/models/llama": str(model)}), operator_path, tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    plan = json.loads(done.stdout[done.stdout.index("\n{") :].split("\n}\n")[0] + "\n}")
    assert plan["model"]["name"] == model.name and plan["instances"]
    assert "host: flavor epyc-9454-24c-96g" in done.stdout  # the flavor's plan
    assert "vllm-openai" in done.stdout  # doctor's table of targets
    # calibrate wrote its file, into this test's /etc only.
    assert json.loads((tmp_path / "upper" / "zenvllm" / "calibration.json").read_text())


def test_the_calibrate_commands_run_as_written(operator_path, tmp_path):
    planner = shipped.write_zipapp(tmp_path / "zenvllm.pyz")
    text = readme.written(
        "calibrate",
        {"/srv/models/m": str(ensure_tiny_model()), "/opt/zenvllm/lib/zenvllm.pyz": str(planner)},
    )
    done = in_a_private_etc(text, operator_path, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    kept = json.loads((tmp_path / "upper" / "zenvllm" / "calibration.json").read_text())
    assert kept["nodes"] and kept["cpus"] == os.cpu_count()


def test_the_tutorial_plan_runs_as_written(tmp_path):
    """From the checkout's root, as the tutorial says: .venv/bin/zenvllm."""
    require((REPO / ".venv" / "bin" / "zenvllm").exists(), "no .venv in the checkout (make venv)")
    model = ensure_tiny_model()
    done = readme.run("tutorial-plan", {"/srv/models/Qwen2.5-1.5B-Instruct": str(model)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"model: {model.name}" in done.stdout and "vllm-openai" in done.stdout


def in_a_private_etc(text: str, env: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    """The block in a mount namespace of its own whose /etc is an overlay on this
    machine's: it writes /etc/zenvllm as written, and the machine's /etc stays as it was."""
    require(os.geteuid() == 0 and shutil.which("unshare"), "a private /etc needs root")
    upper, work = tmp_path / "upper", tmp_path / "work"
    upper.mkdir()
    work.mkdir()
    overlay = f"lowerdir=/etc,upperdir={upper},workdir={work}"
    script = f'mount -t overlay overlay -o {overlay} /etc && exec bash -euo pipefail -c "$0"'
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", script, text],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
