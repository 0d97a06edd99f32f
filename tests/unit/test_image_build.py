"""Engine choice and build command lines (pure), and the base image's skip logic."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from zenvllm.core.errors import UserError
from zenvllm.image import baseimage, build
from zenvllm.runtime import engine as edge


def test_buildkit_build_line_uses_host_network_and_the_base_image():
    engine = edge.Engine("docker", "/usr/bin/docker", True)
    argv = build.build_argv(
        engine, Path("ctx"), "t:1", "host", "zenvllm/debian:bookworm", Path("iid")
    )
    assert argv[:6] == ["/usr/bin/docker", "build", "--network", "host", "--tag", "t:1"]
    assert "--progress" in argv and argv[-1] == "ctx"
    assert "BASE_IMAGE=zenvllm/debian:bookworm" in argv
    assert build.build_env(engine)["DOCKER_BUILDKIT"] == "1"


def test_legacy_and_podman_lines():
    legacy = edge.Engine("docker", "docker", False)
    assert "--progress" not in build.build_argv(legacy, Path("c"), "t", "host", None, Path("i"))
    assert build.build_env(legacy)["DOCKER_BUILDKIT"] == "0"
    podman = edge.Engine("podman", "podman", True)
    argv = build.build_argv(podman, Path("c"), "t", "host", None, Path("i"), no_cache=True)
    assert "nofile=20000:20000" in argv and "--no-cache" in argv
    assert argv[argv.index("--format") + 1] == "docker"  # OCI format drops HEALTHCHECK
    # podman's --iidfile says "sha256:<hex>", its inspect just "<hex>": one form for both.
    assert build.bare_id("sha256:3b6a\n") == build.bare_id("3b6a") == "3b6a"


def test_a_pre_23_client_has_buildkit_built_in(monkeypatch):
    monkeypatch.setattr(
        edge, "docker_candidates", lambda: ["/usr/local/bin/docker", "/usr/bin/docker"]
    )
    monkeypatch.setattr(edge, "has_buildkit", lambda b: b == "/usr/bin/docker")
    assert edge.choose_engine() == edge.Engine("docker", "/usr/bin/docker", True)
    assert edge.choose_engine(builder="legacy") == edge.Engine(
        "docker", "/usr/local/bin/docker", False
    )


def test_buildkit_demanded_but_absent_is_a_user_error(monkeypatch):
    monkeypatch.setattr(edge, "docker_candidates", lambda: ["/usr/local/bin/docker"])
    monkeypatch.setattr(edge, "has_buildkit", lambda b: False)
    assert not edge.choose_engine().buildkit
    with pytest.raises(UserError, match="no docker client here has BuildKit"):
        edge.choose_engine(builder="buildkit")
    with pytest.raises(UserError, match="--engine 'lxc' is not one of"):
        edge.choose_engine("lxc")


def test_base_image_is_not_remade_when_the_tag_exists(monkeypatch, tmp_path):
    monkeypatch.setattr(baseimage, "image_exists", lambda engine, tag: True)

    def boom(*a, **k):
        raise AssertionError("debootstrap must not run")

    monkeypatch.setattr(baseimage, "make_tarball", boom)
    assert baseimage.ensure_base_image(cache=tmp_path) == "zenvllm/debian:bookworm"


def test_two_makers_of_the_base_image_at_once_make_it_once(monkeypatch, tmp_path):
    """`make test` makes it beside a tier that may ask for it too: the second waits for
    the first and finds the image made."""
    made, imported, tags = [], [], set()

    def debootstrap(suite, mirror, dest):
        made.append(dest)
        time.sleep(0.3)  # long enough for the other maker to arrive meanwhile
        dest.write_bytes(b"tar")

    monkeypatch.setattr(baseimage, "image_exists", lambda engine, tag: tag in tags)
    monkeypatch.setattr(baseimage, "make_tarball", debootstrap)
    monkeypatch.setattr(
        baseimage, "import_tarball", lambda e, t, tag: (imported.append(tag), tags.add(tag))
    )
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda _: baseimage.ensure_base_image(cache=tmp_path), range(2)))
    assert got == ["zenvllm/debian:bookworm"] * 2
    assert len(made) == 1 and imported == ["zenvllm/debian:bookworm"], (made, imported)


def test_base_image_imports_the_cached_tarball_without_debootstrap(monkeypatch, tmp_path):
    tarball = baseimage.tarball_path("bookworm", tmp_path)
    tarball.parent.mkdir(parents=True)
    tarball.write_bytes(b"tar")
    imported = []
    monkeypatch.setattr(baseimage, "image_exists", lambda engine, tag: False)
    monkeypatch.setattr(baseimage, "make_tarball", lambda *a: pytest.fail("debootstrap ran"))
    monkeypatch.setattr(baseimage, "import_tarball", lambda e, t, tag: imported.append((t, tag)))
    baseimage.ensure_base_image(cache=tmp_path)
    assert imported == [(tarball, "zenvllm/debian:bookworm")]


def test_a_target_builds_from_the_same_context_path_every_time(tmp_path):
    # BuildKit keys its copy of a local context by path: a new path per build
    # is one more full copy in its cache.
    with build.context_dir(tmp_path, "zen") as first:
        pass
    with build.context_dir(tmp_path, "zen") as second:
        assert second == first == tmp_path / "contexts" / "zen"
    with build.context_dir(tmp_path, "vllm-openai") as other:
        assert other != first


def test_builds_of_one_target_with_other_builders_do_not_take_turns(tmp_path):
    """The image tier builds vllm-openai with BuildKit, the legacy builder and podman at
    once: one context each, so none waits for another's whole build."""
    engines = [
        edge.Engine("docker", "docker", True),
        edge.Engine("docker", "docker", False),
        edge.Engine("podman", "podman", True),
    ]
    names = [build.context_name("vllm-openai", e) for e in engines]
    assert names == ["vllm-openai", "vllm-openai.legacy", "vllm-openai.podman"]
    held = threading.Event()

    def hold_the_others() -> None:
        with build.context_dir(tmp_path, names[1]), build.context_dir(tmp_path, names[2]):
            held.set()

    with build.context_dir(tmp_path, names[0]):
        other = threading.Thread(target=hold_the_others)
        other.start()
        assert held.wait(10), "a build with another builder waited for this one"
    other.join()


def test_an_unwritable_context_cache_names_the_way_out(tmp_path):
    (tmp_path / "contexts").write_text("a file where a directory should be")
    with pytest.raises(UserError, match="set ZENVLLM_CACHE"), build.context_dir(tmp_path, "zen"):
        pass
