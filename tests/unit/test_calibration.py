"""`zenvllm calibrate`: a real measurement here, and figures that change the plan."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest
from support.cli import zenvllm
from support.tiny_model import ensure_tiny_model

from zenvllm.core.calibration import Calibration, NodeFigure, StepFigure, apply, parse
from zenvllm.core.errors import UserError
from zenvllm.core.host import GIB
from zenvllm.core.model import Model, read_model
from zenvllm.core.plan import Policy, make_plan
from zenvllm.core.topology import read_host
from zenvllm.runtime import calibrate

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "hosts" / "epyc-9654-nps4"


def calibration_for(root: Path, per_core_gbs: float) -> Calibration:
    host = read_host(root)
    nodes = {n.id: NodeFigure(len(n.cpus), per_core_gbs * len(n.cpus)) for n in host.nodes}
    return Calibration(
        cpu_model=host.cpu_name,
        cpus=len(host.allowed_cpus),
        measured_at="2026-11-23T00:00:00+00:00",
        method="test figures",
        core_alone_gbs=per_core_gbs * 2,
        nodes=nodes,
    )


def plan_with(tmp_path: Path, cal: Calibration | None, *extra: str) -> dict:
    args = ["plan", "--json", "--root", str(FIXTURE), "--model-size-gib", "6", *extra]
    if cal is not None:
        path = tmp_path / f"cal-{cal.nodes[0].gbs}.json"
        path.write_text(cal.to_json())
        args += ["--calibration", str(path)]
    done = zenvllm(*args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_two_calibrations_give_two_layouts(tmp_path):
    slow = plan_with(tmp_path, calibration_for(FIXTURE, 2.0))
    fast = plan_with(tmp_path, calibration_for(FIXTURE, 12.0))
    # 6 GiB of weights in a 50 ms step need 65 cores at 2 GB/s (over the 64 cap: one
    # instance per 24-core node) and 11 at 12 GB/s (two 12-core instances per node).
    assert (len(slow["instances"]), len(fast["instances"])) == (4, 8)
    assert {len(i["omp_cpus"]) for i in slow["instances"]} == {24}
    assert {len(i["omp_cpus"]) for i in fast["instances"]} == {12}
    assert (
        "~2 GB/s per core" in slow["notes"][0]
        and "measured by zenvllm calibrate" in slow["notes"][0]
    )
    assert "~12 GB/s per core" in fast["notes"][0]


def test_without_a_calibration_the_plan_says_its_figure_is_a_default(tmp_path):
    plan = plan_with(tmp_path, None)
    assert "~4 GB/s per core" in plan["notes"][0]
    assert "spec-sheet default" in plan["notes"][0] and "zenvllm calibrate" in plan["notes"][0]


def test_a_calibration_of_another_cpu_is_ignored_with_a_warning(tmp_path):
    other = calibration_for(REPO / "tests/fixtures/hosts/vm-milan-8vcpu-avx2", 20.0)
    plan = plan_with(tmp_path, other)
    assert "~4 GB/s per core" in plan["notes"][0]  # the default stays
    assert any("ignored: it was measured on" in w for w in plan["warnings"])


@pytest.mark.parametrize(
    "text",
    ["not json", "[]", '{"format": 2}', '{"format": 1, "nodes": {}}', "{}"],
)
def test_a_broken_calibration_file_is_refused_by_name(tmp_path, text):
    path = tmp_path / "cal.json"
    path.write_text(text)
    done = zenvllm("plan", "--root", str(FIXTURE), "--calibration", str(path))
    assert done.returncode == 2 and done.stdout == ""
    assert f"calibration file {path}" in done.stderr and "zenvllm calibrate" in done.stderr


def test_a_fixture_or_flavor_never_reads_the_hosts_calibration(tmp_path, monkeypatch):
    path = tmp_path / "calibration.json"
    path.write_text(calibration_for(FIXTURE, 3.0).to_json())
    monkeypatch.setattr(calibrate, "DEFAULT_PATH", str(path))
    assert calibrate.read(None, live=False) == (None, "")
    cal, source = calibrate.read(None, live=True)
    assert source == str(path) and cal.per_core_gbs == pytest.approx(3.0)


def test_apply_uses_the_slowest_nodes_share_per_core():
    cal = calibration_for(FIXTURE, 5.0)
    slow_node = {**cal.nodes, 1: NodeFigure(cal.nodes[1].cores, cal.nodes[1].gbs / 2)}
    cal = Calibration(**{**cal.__dict__, "nodes": slow_node})
    policy, warning = apply(Policy(), cal, read_host(FIXTURE), "f")
    assert warning == "" and policy.core_bandwidth_gbs == pytest.approx(2.5)
    assert parse(cal.to_json(), "f") == cal


def test_calibrate_measures_this_host_and_the_plan_quotes_it(tmp_path):
    out = tmp_path / "cal.json"
    done = zenvllm("calibrate", "--out", str(out), "--seconds", "0.3")
    assert done.returncode == 0, done.stderr
    cal = parse(out.read_text(), str(out))
    host = read_host()
    assert cal.cpu_model == host.cpu_name
    assert cal.cpus == len(host.allowed_cpus)
    assert set(cal.nodes) == {n for n in calibrate.usable_cores(host)}
    assert all(f.gbs > 0.1 and f.cores >= 1 for f in cal.nodes.values())
    assert cal.core_alone_gbs > 0.1
    # Read only too, every node and one core alone, as a decode step reads.
    assert cal.read_alone_gbs > 0.1 and all(f.read_gbs > 0.1 for f in cal.nodes.values())
    assert f"{cal.read_alone_gbs:.1f} GB/s reading" in done.stdout
    assert f"{cal.per_core_gbs:.1f} GB/s per core" in done.stdout
    plan = zenvllm("plan", "--json", "--model-size-gib", "1", "--calibration", str(out))
    assert plan.returncode == 0, plan.stderr
    notes = json.loads(plan.stdout)["notes"]
    assert f"~{round(cal.per_core_gbs, 2):g} GB/s per core" in notes[0]


def test_calibrate_never_replaces_a_file_it_did_not_write(tmp_path):
    out = tmp_path / "notes.json"
    out.write_text('{"mine": true}\n')
    done = zenvllm("calibrate", "--out", str(out), "--seconds", "0.3")
    assert done.returncode == 2 and out.read_text() == '{"mine": true}\n'
    assert f"--out {out} exists and is not a calibration zenvllm wrote" in done.stderr
    with pytest.raises(UserError):
        parse(out.read_text(), str(out))


def test_a_step_timed_on_the_model_sets_its_bandwidth_and_only_its():
    host = read_host(FIXTURE)
    six = Model("six", 6 * GIB)
    ms = six.weight_bytes / 2e9 / 24 * 1000  # 2 GB/s per core over a 24-core node
    cal = Calibration(
        **{
            **calibration_for(FIXTURE, 12.0).__dict__,
            "steps": (StepFigure("six", six.weight_bytes, 24, ms),),
        }
    )
    assert parse(cal.to_json(), "f") == cal
    for model, gbs in ((six, 2.0), (Model("other", 6 * GIB), 12.0), (Model("six", GIB), 12.0)):
        policy, warning = apply(Policy(), cal, host, "f", model)
        assert warning == "" and policy.core_bandwidth_gbs == pytest.approx(gbs)
    policy, _ = apply(Policy(), cal, host, "f", six)
    assert "reading the 6.44 GB of six's weights once took" in policy.bandwidth_source
    slow = make_plan(host, six, policy)
    fast = make_plan(host, six, apply(Policy(), cal, host, "f", Model("six", 6 * GIB + 1))[0])
    assert (len(slow.instances), len(fast.instances)) == (4, 8)  # as two calibrations


def test_split_shares_every_byte_once_in_order():
    spans = [("a", 8, 108), ("b", 16, 17), ("c", 100, 160)]
    for parts in (1, 2, 3, 7, 200):
        shares = calibrate.split(spans, parts)
        sizes = [sum(e - s for _, s, e in share) for share in shares]
        assert len(shares) <= parts and max(sizes) - min(sizes) <= max(1, 161 // parts)
        flat = [span for share in shares for span in share]
        assert sum(sizes) == 161 and flat[0][:2] == ("a", 8) and flat[-1][::2] == ("c", 160)
        assert all(a[2] == b[1] for a, b in itertools.pairwise(flat) if a[0] == b[0])


def test_calibrate_times_a_models_weight_read_and_the_plan_quotes_it(tmp_path):
    model_dir, out = ensure_tiny_model(), tmp_path / "cal.json"
    done = zenvllm("calibrate", "--out", str(out), "--seconds", "0.3", "--model", str(model_dir))
    assert done.returncode == 0, done.stderr
    (step,) = parse(out.read_text(), str(out)).steps
    first_node = next(iter(calibrate.usable_cores(read_host()).values()))
    assert step.fits(read_model(model_dir)) and step.cores == len(first_node) and step.ms > 0
    assert f"{step.ms:.1f} ms by {step.cores} core(s)" in done.stdout
    plan = zenvllm("plan", "--json", "--model", str(model_dir), "--calibration", str(out))
    assert plan.returncode == 0, plan.stderr
    note = json.loads(plan.stdout)["notes"][0]
    assert f"~{round(step.per_core_gbs, 2):g} GB/s per core" in note and "reading the" in note


def test_calibrate_refuses_a_model_that_is_not_one_before_measuring(tmp_path):
    out = tmp_path / "cal.json"
    done = zenvllm("calibrate", "--out", str(out), "--model", str(tmp_path))
    assert done.returncode == 2 and not out.exists()
    assert f"--model {tmp_path}: no config.json" in done.stderr


def test_copies_that_did_not_run_at_once_are_measured_again_then_refused():
    """Each node's cores copy at once: windows apart (a CPU taken for seconds) would sum
    two cores' speeds alone, so that measurement is taken again, and after TRIES the
    machine is named as too busy to measure."""
    apart = [(0.0, 2.0, 44e9), (2.1, 4.1, 43e9)]
    together = [(0.0, 2.0, 23e9), (0.05, 2.05, 23.5e9)]
    tries = iter([apart, together])
    got = calibrate.measure([0, 1], 1, 2.0, run=lambda work, jobs, timeout: next(tries))
    assert got == 46.5
    assert calibrate.measure([0], 1, 2.0, run=lambda *_: [(0.0, 2.0, 44e9)]) == 44.0  # alone
    calls = []

    def never_together(work, jobs, timeout):
        calls.append(jobs)
        return apart

    with pytest.raises(UserError, match=r"CPUs \[0, 1\] did not run at once in 3 tries"):
        calibrate.measure([0, 1], 1, 2.0, run=never_together)
    assert len(calls) == calibrate.TRIES


def test_a_file_without_read_only_figures_still_plans_and_one_with_some_is_refused():
    """Files zenvllm wrote before it measured reading hold no read figures: they parse
    as unmeasured (0) and write back without them; half of them is a broken file."""
    cal = calibration_for(FIXTURE, 5.0)
    text = cal.to_json()
    assert "read_" not in text and parse(text, "f") == cal and cal.per_core_read_gbs == 0
    read = replace(
        cal,
        nodes={n: replace(f, read_gbs=f.gbs * 1.5) for n, f in cal.nodes.items()},
        read_alone_gbs=14.0,
    )
    assert parse(read.to_json(), "f") == read and read.per_core_read_gbs == pytest.approx(7.5)
    half = json.loads(read.to_json())
    del half["nodes"]["1"]["read_gbs"]
    with pytest.raises(UserError, match="only some of them are here"):
        parse(json.dumps(half), "f")
    # The planner keeps the copy's figure, on which its model was fitted.
    policy, _ = apply(Policy(), read, read_host(FIXTURE), "f")
    assert policy.core_bandwidth_gbs == pytest.approx(5.0)


def test_reading_is_measured_by_reading_on_this_host():
    got = calibrate.measure([min(read_host().allowed_cpus)], 8 << 20, 0.2, work=calibrate.read_rate)
    assert got > 0.1
