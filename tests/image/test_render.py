"""Rendered Dockerfiles: structure pinned by golden facts, hadolint-clean, refusals atomic.

No engine needed. The goldens pin what matters (stage names, the FROM chain,
labels, user, entrypoint), not whole files, so comments can change freely.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, require_tool
from support.cli import zenvllm

from zenvllm.core.errors import UserError
from zenvllm.image import render

TARGETS = ("vllm-openai", "zen", "pace")
SOURCES = ("wheel", "source")
ENV = {"PATH": "/usr/bin:/bin"}  # over the test's own: render runs no tool of the venv


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, current = [], ""
    for line in dockerfile.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            word, _, rest = current.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            current = ""
    return out


def stages(dockerfile: str) -> list[tuple[str, str]]:
    """(stage name, what it is FROM)."""
    found = []
    for word, args in instructions(dockerfile):
        if word == "FROM":
            m = re.fullmatch(r"(\S+) AS (\S+)", args)
            assert m, f"unnamed stage: FROM {args}"
            found.append((m.group(2), m.group(1)))
    return found


def context(target: str, source: str = "wheel", buildkit: bool = False, **kw) -> render.Context:
    request = render.Request(target, source=source, buildkit=buildkit, **kw)
    return render.render(render.load_config(), request)


@pytest.mark.parametrize("buildkit", (False, True))
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("target", TARGETS)
def test_stage_chain_has_a_build_stage_where_the_venv_is_copied(target, source, buildkit):
    """A build stage, whose venv the runtime copies, except where the builder can mount and
    vLLM comes from wheels: there the runtime stage installs in place (one write)."""
    dockerfile = context(target, source, buildkit).files["Dockerfile"]
    in_place = buildkit and source == "wheel"
    build = [] if in_place else [("build", "os")]
    assert stages(dockerfile) == [
        ("os", "${BASE_IMAGE}"),
        *build,
        ("runtime", "os"),
        (target, "runtime"),
    ]
    assert ("ARG", "BASE_IMAGE=zenvllm/debian:bookworm") in instructions(dockerfile)
    runtime = dockerfile.split("AS runtime\n", 1)[1].split("\nFROM ", 1)[0]
    assert ("COPY --from=build /opt/venv /opt/venv" in runtime) is not in_place
    if in_place:
        # uv on a tmpfs, the wheels and constraints mounted: no layer keeps them, and the
        # mount points the builder leaves are removed.
        words = instructions(runtime)
        assert not [a for w, a in words if w == "COPY"]
        install = next(a for w, a in words if w == "RUN" and "uv pip install" in a)
        assert install.startswith("--mount=type=tmpfs,target=/opt/uv ")
        assert "--mount=type=bind,source=wheelhouse,target=/tmp/wheelhouse" in install
        assert "rm -df /opt/uv /tmp/wheelhouse /tmp/zenvllm" in runtime


@pytest.mark.parametrize("target", TARGETS)
def test_release_stage_labels_user_health_and_entrypoint(target):
    ctx = context(target)
    release = instructions(ctx.files["Dockerfile"].split(f"AS {target}\n", 1)[1])
    words = dict(release)
    resolved = render.resolve(render.load_config(), target, {}, None)
    for name, version in resolved.pins.items():
        assert f'io.zenvllm.pin.{name}="{version}"' in words["LABEL"]
    assert 'io.zenvllm.isa="runtime dispatch' in words["LABEL"]
    assert f'io.zenvllm.target="{target}"' in words["LABEL"]
    assert words["USER"] == "10001"  # numeric: resolvable by any runtime
    assert words["ENTRYPOINT"] == '["/opt/venv/bin/python", "-m", "zenvllm.runtime.launcher"]'
    assert words["HEALTHCHECK"].endswith(
        'CMD ["/opt/venv/bin/python", "-m", "zenvllm.runtime.health"]'
    )
    assert [w for w, _ in release][-1] == "ENTRYPOINT"


def test_runtime_preloads_are_checked_at_build_time_before_ld_preload_is_set():
    dockerfile = context("vllm-openai").files["Dockerfile"]
    runtime = dockerfile.split("AS runtime\n", 1)[1].split("\nFROM ", 1)[0]
    check = runtime.index('test -f "$lib"')
    assert "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4" in runtime[:check]
    assert "/opt/venv/lib/libiomp5.so" in runtime[:check]
    assert check < runtime.index("LD_PRELOAD=")
    # VLLM_TARGET_DEVICE would force the builtin CPU platform over pace-vllm's plugin.
    assert "VLLM_TARGET_DEVICE=" not in dockerfile.split("AS runtime\n", 1)[1]


def test_the_build_drops_cuda_era_packages_and_fixes_vllm_metadata():
    ctx = context("vllm-openai")
    assert ctx.files["overrides.txt"].splitlines() == [
        f"{n}; sys_platform == 'never'"
        for n in ("torchvision", "torchaudio", "torchcodec", "triton")
    ]
    dockerfile = ctx.files["Dockerfile"]
    assert "vllm-0.32.0+cpu.dist-info" in dockerfile and "Name: vllm" in dockerfile
    assert "--compile-bytecode" in dockerfile


def test_zen_installs_zentorch_under_the_stack_constraints():
    ctx = context("zen")
    release = ctx.files["Dockerfile"].split("AS zen\n", 1)[1]
    assert "-c /etc/zenvllm/constraints.txt zentorch==2.13.0.1" in release
    assert "VLLM_ZENTORCH_WEIGHT_PREPACK=1" in release
    assert "TORCHINDUCTOR_FREEZING" not in release  # breaks vLLM 0.32's compiled mode
    assert "torch==2.13.0+cpu" in ctx.files["constraints.txt"]


@pytest.mark.parametrize("target", TARGETS)
def test_no_syntax_line_no_heredoc_and_mounts_only_with_buildkit(target):
    for buildkit in (False, True):
        for source in SOURCES:
            dockerfile = context(target, source, buildkit).files["Dockerfile"]
            assert "# syntax" not in dockerfile
            assert "<<" not in dockerfile
            assert ("--mount=" in dockerfile) is buildkit


def test_source_install_uses_the_matrix_isa_rule():
    new = context("vllm-openai", "source").files["Dockerfile"]
    assert "ARG VLLM_CPU_X86=true" in new and "VLLM_CPU_AVX512BF16" not in new
    old = context("vllm-openai", "source", pins={"vllm": "0.10.1", "torch": "2.13.0"})
    assert "VLLM_CPU_AVX512BF16=1" in old.files["Dockerfile"]


def test_source_install_builds_the_vllm_projects_own_sdist_checked_by_its_hash():
    config = render.load_config()
    dockerfile = context("vllm-openai", "source").files["Dockerfile"]
    url = "https://files.pythonhosted.org/packages/source/v/vllm/vllm-0.32.0.tar.gz"
    assert f"curl -fsSL --retry 3 -o /tmp/vllm.tar.gz {url}" in dockerfile
    assert f'echo "{config["vllm_sdists"]["0.32.0"]}  /tmp/vllm.tar.gz" | sha256sum -c -' in (
        dockerfile
    )
    assert "git clone" not in dockerfile
    # A version with no recorded hash is refused before anything is rendered.
    with pytest.raises(UserError, match=r"no SHA-256 recorded for the vllm 0\.32\.1 sdist"):
        context("vllm-openai", "source", pins={"vllm": "0.32.1"})


def test_wheelhouse_decides_between_local_wheels_and_the_torch_index(tmp_path):
    wheel = tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"wheel")
    local = context("vllm-openai", wheelhouse=tmp_path)
    assert local.copies[f"wheelhouse/{wheel.name}"] == wheel
    assert "download.pytorch.org" not in local.files["Dockerfile"]
    assert (
        "--extra-index-url https://download.pytorch.org/whl/cpu"
        in (context("vllm-openai").files["Dockerfile"])
    )


def test_override_template_replaces_a_block(tmp_path):
    override = tmp_path / "site.j2"
    override.write_text(
        '{% extends parent_template %}{% block footer %}LABEL site="acme"\n{% endblock %}'
    )
    dockerfile = context("zen", override=override).files["Dockerfile"]
    assert 'LABEL site="acme"' in dockerfile
    assert stages(dockerfile)[-1] == ("zen", "runtime")


def hadolint(dockerfile_text: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """hadolint (the venv's, else one on PATH) over a rendered Dockerfile."""
    binary = (
        require_tool("hadolint")
        if not (Path(sys.executable).parent / "hadolint").exists()
        else str(Path(sys.executable).parent / "hadolint")
    )
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(dockerfile_text)
    return subprocess.run(
        [binary, "--config", str(REPO / "dockerfiles" / "hadolint.yaml"), str(dockerfile)],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize("buildkit", [False, True])
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("target", TARGETS)
def test_hadolint_passes(target, source, buildkit, tmp_path):
    done = hadolint(context(target, source, buildkit).files["Dockerfile"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("buildkit", [False, True])
def test_the_llama_cpp_peer_renders_hadolint_clean_for_this_cpu(buildkit, tmp_path):
    """`zenvllm render --target llamacpp`: the bench's peer, compiled for this CPU."""
    from zenvllm.core.topology import read_host
    from zenvllm.image import peers

    config = render.load_config()
    cpu = peers.cpu_key(read_host().flags)
    ctx = peers.render_peer(config, render.Request(target="llamacpp", buildkit=buildkit), cpu)
    done = hadolint(ctx.files["Dockerfile"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert stages(ctx.files["Dockerfile"])[-1][0] == "llamacpp"
    assert ("--mount=type=cache" in ctx.files["Dockerfile"]) == buildkit
    assert ctx.tag.endswith(f"-{cpu}")


@pytest.mark.parametrize("buildkit", [False, True])
def test_the_infinity_peer_renders_hadolint_clean_from_wheels(buildkit, tmp_path):
    """`zenvllm render --target infinity`: the embedding bench's peer, torch from the
    torch CPU index when no wheelhouse is given."""
    from zenvllm.image import peers

    config = render.load_config()
    ctx = peers.render_peer(config, render.Request(target="infinity", buildkit=buildkit), "k")
    done = hadolint(ctx.files["Dockerfile"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert stages(ctx.files["Dockerfile"])[-1][0] == "infinity"
    assert ctx.tag == f"zenvllm/infinity:{config['peers']['infinity']['version']}"


def test_cli_render_writes_a_complete_context(tmp_path):
    out = tmp_path / "ctx"
    done = zenvllm("render", "--target", "zen", "--output", str(out), env=ENV)
    assert done.returncode == 0, done.stderr
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {"Dockerfile", "image.json", "constraints.txt", "overrides.txt"} <= names
    shipped = {"zenvllm/runtime/launcher.py", "zenvllm/core/plan.py", "zenvllm/core/topology.py"}
    assert shipped <= names
    # Only the core and runtime layers: the image never runs the image or bench code.
    package = {n for n in names if n.startswith("zenvllm/")}
    assert {n.split("/")[1] for n in package if n.count("/") == 2} == {"core", "runtime"}
    assert json.loads((out / "image.json").read_text())["pins"]["zentorch"] == "2.13.0.1"
    assert [p.name for p in tmp_path.iterdir()] == ["ctx"]  # no temp dirs left


def test_cli_refuses_a_ruled_out_pin_and_writes_nothing(tmp_path):
    out = tmp_path / "ctx"
    done = zenvllm(
        "render", "--target", "zen", "--pin", "zentorch=2.14.0.1", "--output", str(out), env=ENV
    )
    assert done.returncode == 2
    assert "zentorch 2.14.0.1 needs torch >=2.14.0,<2.15" in done.stderr
    assert "supports zentorch >=2.13.0.0,<2.14" in done.stderr
    assert done.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_cli_render_replaces_a_context_it_made_whole_with_normal_permissions(tmp_path):
    out = tmp_path / "ctx"

    def run_render() -> subprocess.CompletedProcess:
        return zenvllm("render", "--target", "vllm-openai", "--output", str(out), env=ENV)

    assert run_render().returncode == 0
    first = (out / "Dockerfile").stat().st_ino
    done = run_render()  # nobody changed it: zenvllm's to replace, whole
    assert done.returncode == 0, done.stderr
    assert (out / "Dockerfile").stat().st_ino != first
    assert (out / ".zenvllm-output").is_file() and out.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in tmp_path.iterdir()] == ["ctx"]
    (out / "mine.txt").write_text("mine")  # once changed, it is no longer zenvllm's alone
    done = run_render()
    assert done.returncode == 2 and "changed since (added mine.txt)" in done.stderr
    assert (out / "mine.txt").read_text() == "mine"


def test_build_configuration_passes_yamllint():
    yamllint = Path(sys.executable).parent / "yamllint"
    if not yamllint.exists():
        yamllint = Path(require_tool("yamllint"))
    files = sorted(str(p) for p in (REPO / "dockerfiles").glob("*.yaml"))
    done = subprocess.run(
        [str(yamllint), "--strict", "-c", str(REPO / "ansible" / ".yamllint"), *files],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_source_edited_in_place_after_a_render_leaves_the_context_whole(tmp_path):
    """Small files are copied, not linked: an edit in place of the source (same inode)
    must not change the context behind its manifest, or the next render would refuse."""
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "corp.crt").write_text("A\n")
    out = tmp_path / "ctx"

    def render_() -> subprocess.CompletedProcess:
        return zenvllm("render", "--extra-ca-certs", str(certs), "--output", str(out), env=ENV)

    assert render_().returncode == 0
    with (certs / "corp.crt").open("r+") as f:
        f.write("B")
    done = render_()
    assert done.returncode == 0, done.stderr
    assert (out / "certs" / "corp.crt").read_text() == "B\n"
