"""A deployment's revisions on a host (core/revisions.py, runtime/revisions.py): a rollout
records its plan pending and marks it deployed; a rerun records nothing; a failed rollout
stays pending and a rollback returns to what served before it; the oldest go, never the
serving one. The engine's side of a rollback (its image kept, its tag restored) runs for
real in tests/ansible/test_e2e.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from zenvllm.core import revisions
from zenvllm.core.errors import UserError
from zenvllm.core.revisions import DEPLOYED, PENDING, Revision
from zenvllm.runtime import revisions as files


def plan(image: str) -> dict:
    return {"models": [{"served_name": "m"}], "instances": [{"name": "d-0", "image": image}]}


def rev(number: int, status: str = DEPLOYED, image: str = "a") -> Revision:
    return Revision(number, status, "2026-11-28T00:00:00Z", "0.1.0", plan(image))


def test_a_rerun_records_nothing_and_a_change_the_next_number():
    kept = [rev(1, image="a")]
    assert revisions.to_record(kept, plan("a")) == 0
    assert revisions.to_record(kept, plan("b")) == 2
    assert revisions.to_record([], plan("a")) == 1
    # A failed attempt of the same plan is tried again, as a new record.
    assert revisions.to_record([*kept, rev(2, PENDING, "b")], plan("b")) == 3


def test_a_rollback_goes_back_one_or_to_what_served_before_a_failed_rollout():
    assert revisions.rollback_target([rev(1), rev(2), rev(3)]).number == 2
    failed = [rev(1), rev(2, image="b"), rev(3, PENDING, "broken")]
    assert revisions.rollback_target(failed).number == 2
    assert revisions.rollback_target(failed, asked=1).number == 1
    with pytest.raises(UserError, match="revision 7 is not kept on this host \\(kept: 1, 2, 3\\)"):
        revisions.rollback_target(failed, asked=7)
    with pytest.raises(UserError, match="no earlier deployed revision"):
        revisions.rollback_target([rev(1)])


def test_the_oldest_are_pruned_but_never_the_serving_one():
    kept = [rev(1), *(rev(n, PENDING) for n in range(2, 9))]
    assert revisions.to_prune(kept, keep=3) == [2, 3, 4, 5]  # 1 serves: it stays
    assert revisions.to_prune([rev(n) for n in range(1, 4)], keep=5) == []


def test_begin_done_and_rollback_on_disk(tmp_path):
    where = tmp_path / "revisions"
    first = files.begin(where, plan("a"), "img:1", "", [str(tmp_path)])
    assert first is not None and first.status == PENDING
    assert files.done(where).status == DEPLOYED
    assert files.begin(where, plan("a"), "img:1", "", []) is None  # a rerun
    assert files.done(where) is None
    files.begin(where, plan("b"), "img:2", "", [])
    files.done(where)
    files.begin(where, plan("broken"), "img:3", "", [])  # fails: never done
    (tmp_path / "config.json").write_text("{}")  # revision 1's model is still there
    assert files.rollback(where).number == 2
    assert files.rollback(where, 1).plan == plan("a")
    back = files.begin(where, plan("a"), "img:1", "", [])
    assert back is not None and (back.number, back.rollback_of) == (4, 1)
    assert sorted(p.name for p in where.iterdir()) == [
        ".zenvllm-output",
        "1.json",
        "2.json",
        "3.json",
        "4.json",
    ]


def test_a_rollback_refuses_a_revision_whose_model_is_gone(tmp_path):
    where = tmp_path / "revisions"
    files.begin(where, plan("a"), "img:1", "", [str(tmp_path / "gone")])
    files.done(where)
    files.begin(where, plan("b"), "img:2", "", [])
    files.done(where)
    with pytest.raises(UserError, match=r"revision 1.s model at .*/gone is no longer on this host"):
        files.rollback(where)


def test_a_directory_zenvllm_did_not_make_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("theirs\n")
    with pytest.raises(UserError, match="zenvllm did not make it"):
        files.begin(tmp_path, plan("a"), "img:1", "", [])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_the_verbs_speak_json_to_ansible_and_exit_2_on_bad_input(tmp_path):
    where = tmp_path / "r"
    runtime = [sys.executable, "-m", "zenvllm.runtime", "revision"]

    def verb(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
        return subprocess.run([*runtime, *args], input=stdin, capture_output=True, text=True)

    done = verb("begin", "--dir", str(where), "--image", "img:1", stdin=json.dumps(plan("a")))
    assert json.loads(done.stdout) == {"changed": True, "revision": 1}, done.stderr
    assert json.loads(verb("done", "--dir", str(where)).stdout) == {"changed": True, "revision": 1}
    listed = verb("list", "--dir", str(where)).stdout
    assert listed.startswith("* revision 1 (deployed; ") and "model m" in listed
    bad = verb("begin", "--dir", str(where), stdin="[1, 2")
    assert bad.returncode == 2 and "the plan on stdin" in bad.stderr and not bad.stdout
    none = verb("rollback", "--dir", str(where))
    assert none.returncode == 2 and "no earlier deployed revision" in none.stderr
