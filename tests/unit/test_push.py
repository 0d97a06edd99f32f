"""`zenvllm build --push`: how a reference names its registry, and what a failed push
says (the engines' own words, as docker 20.10 and podman 4.3 said them here). The
push itself runs for real in tests/image/test_registry.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from zenvllm.image import push


@pytest.mark.parametrize(
    ("ref", "registry"),
    [
        ("127.0.0.1:5000/zenvllm/vllm-openai:0.32.0", "127.0.0.1:5000"),
        ("registry.example.com/zenvllm/zen:0.32.0", "registry.example.com"),
        ("localhost/zenvllm/zen", "localhost"),
        ("[::1]:5000/zenvllm/zen:1", "[::1]:5000"),
        ("zenvllm/vllm-openai:0.32.0", "docker.io"),
        ("debian", "docker.io"),
    ],
)
def test_the_registry_of_a_reference_is_read_as_the_engines_read_it(ref, registry):
    assert push.registry_of(ref) == registry


@pytest.mark.parametrize(
    ("words", "fix"),
    [
        ("no basic auth credentials", "docker login 127.0.0.1:5000"),
        ("unauthorized: authentication required", "docker login 127.0.0.1:5000"),
        (
            'Get "https://127.0.0.1:5000/v2/": x509: certificate signed by unknown authority',
            "/etc/docker/certs.d/127.0.0.1:5000/ca.crt",
        ),
        ("http: server gave HTTP response to HTTPS client", "plain HTTP"),
        ("dial tcp 127.0.0.1:5000: connect: connection refused", "check the name and port"),
    ],
)
def test_a_failed_push_names_the_registry_the_words_and_the_fix(words, fix):
    tag = "127.0.0.1:5000/zenvllm/vllm-openai:0.32.0"
    message = push.failure_message("docker", tag, ["Preparing\n", words + "\n"])
    assert f"to 127.0.0.1:5000 failed: {words}. Fix: " in message
    assert fix in message
    assert message.endswith(f"`docker push {tag}` sends it without building again")


def test_podman_is_told_its_own_trust_directory_and_login():
    tag = "10.0.0.1:5000/zenvllm/zen:1"
    assert "/etc/containers/certs.d/10.0.0.1:5000/ca.crt" in push.failure_message(
        "podman", tag, ["x509: certificate signed by unknown authority"]
    )
    said = (
        "Error: trying to reuse blob sha256:6aac at destination: checking whether a blob "
        "sha256:6aac exists in 10.0.0.1:5000/zenvllm/zen: unauthorized: authentication required"
    )
    assert "`podman login 10.0.0.1:5000`" in push.failure_message("podman", tag, [said])
    assert push.push_argv("podman", tag, Path("d")) == ["push", "--digestfile", "d", tag]
    assert push.push_argv("docker", tag, Path("d")) == ["push", tag]
