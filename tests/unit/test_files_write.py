"""`python3 -m zenvllm.runtime files write` (runtime/commands_files.py), run as the
instances role runs it, on real files: what it writes, what it leaves, what it refuses."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from support.cli import reported, runtime


def write(files: list[dict] | str, *args: str) -> subprocess.CompletedProcess[str]:
    stdin = files if isinstance(files, str) else json.dumps({"files": files})
    return runtime("files", "write", *args, stdin=stdin)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


def files_in(tmp: Path) -> list[dict]:
    return [
        {"path": str(tmp / "site-0.env"), "content": "A=1\nKEY=secret\n", "mode": "0600"},
        {
            "path": str(tmp / "site-0.service"),
            "content": "[Service]\nExecStart=x\n",
            "mode": "0644",
        },
        {"path": str(tmp / "site-0.sh"), "content": "#!/bin/sh\nexec x\n", "mode": "0750"},
    ]


def test_files_are_written_with_their_modes_then_nothing_changes(tmp_path):
    files = files_in(tmp_path)
    assert reported(write(files)) == [f["path"] for f in files]
    for f in files:
        path = Path(f["path"])
        assert path.read_text() == f["content"]
        assert mode(path) == int(f["mode"], 8)
    assert reported(write(files)) == []


def test_only_a_file_that_differs_is_written_and_dry_run_writes_nothing(tmp_path):
    files = files_in(tmp_path)
    reported(write(files))
    env, unit, script = (Path(f["path"]) for f in files)
    env.write_text("A=2\n")
    script.chmod(0o755)
    before = unit.stat().st_ino
    assert reported(write(files, "--dry-run")) == [str(env), str(script)]
    assert env.read_text() == "A=2\n" and mode(script) == 0o755
    assert reported(write(files)) == [str(env), str(script)]
    assert env.read_text() == files[0]["content"] and mode(env) == 0o600
    assert mode(script) == 0o750
    assert unit.stat().st_ino == before  # untouched: not replaced


def test_a_longer_or_shorter_file_on_the_host_is_replaced(tmp_path):
    """A new plan's run script shorter than the host's (e2e's rollout) or longer."""
    files = files_in(tmp_path)
    reported(write(files))
    for content in ("#!/bin/sh\n", "#!/bin/sh\n" + "# a longer script\n" * 200):
        changed = [{**files[2], "content": content}]
        assert reported(write(changed)) == [files[2]["path"]]
        assert Path(files[2]["path"]).read_text() == content
        assert reported(write(changed)) == []


def test_dry_run_on_a_fresh_host_names_every_file(tmp_path):
    files = files_in(tmp_path / "etc")
    assert reported(write(files, "--dry-run")) == [f["path"] for f in files]
    assert not (tmp_path / "etc").exists()


def test_bad_input_is_refused_and_nothing_is_reported(tmp_path):
    good = files_in(tmp_path)[0]
    cases = {
        "not json": "files[",
        "relative": json.dumps({"files": [good, {**good, "path": "etc/x.env"}]}),
        "bad mode": json.dumps({"files": [good, {**good, "mode": "644"}]}),
        "no content": json.dumps({"files": [good, {"path": good["path"], "mode": "0644"}]}),
        "no parent": json.dumps(
            {"files": [good, {**good, "path": str(tmp_path / "missing" / "x.env")}]}
        ),
    }
    said = {}
    for name, stdin in cases.items():
        done = write(stdin)
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        assert done.stdout == "" and "Traceback" not in done.stderr, name
        said[name] = done.stderr
    assert "is not absolute" in said["relative"]
    assert "'644' is not four octal digits" in said["bad mode"]
    assert "files[1].content" in said["no content"]
    assert f"{tmp_path / 'missing'} is not a directory" in said["no parent"]
    assert list(tmp_path.iterdir()) == []  # not even the good file of a refused set


def test_stdin_over_its_limit_is_refused_with_the_limit(tmp_path):
    big = json.dumps({"files": [{"path": str(tmp_path / "x"), "content": "x" * (5 << 20)}]})
    done = write(big)
    assert done.returncode == 2 and "more than 4,194,304 bytes" in done.stderr
    assert list(tmp_path.iterdir()) == []
