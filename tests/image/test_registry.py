"""Images through a real registry: `zenvllm build --push` to a TLS registry with basic auth
(Debian's docker-registry, tests/support/registry.py), pulled back by the engine, and
the provenance labels every image carries.

The registry is addressed by this machine's non-loopback IP: dockerd counts 127.0.0.0/8
as insecure and would verify no certificate there. The push is the cost: the whole
vllm-openai image (about 3 GB) goes to the registry over the local stack; the build
before it is a layer-cache hit. Logins live in temporary DOCKER_CONFIG directories,
never in ~/.docker.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO, require, require_tool
from support import engine, readme, registry

from zenvllm.core.errors import UserError
from zenvllm.image import push

pytestmark = pytest.mark.image

REPOSITORY = "zenvllm/vllm-openai"
MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
BIN = Path(sys.executable).parent  # the venv's zenvllm, first on an operator's PATH
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@pytest.fixture(scope="module", autouse=True)
def _engine():
    require(engine.engine_ready(), "no container engine answers (run `make engine`)")
    require_tool("openssl")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("registry")


@pytest.fixture(scope="module")
def image(workdir) -> tuple[str, str]:
    """zenvllm/vllm-openai:0.32.0 built as test_build.py builds it (a cache hit): tag, ID."""
    tag, seconds = engine.build("vllm-openai", workdir / "build.log")
    print(f"vllm-openai build: {seconds:.1f} s")
    return tag, engine.image_id(tag)


@pytest.fixture(scope="module")
def hosts() -> tuple[str, str]:
    address = registry.host_address()
    require(address is not None, "this machine has no non-loopback IPv4 address")
    return address, "127.0.0.1"  # type: ignore[return-value]


@pytest.fixture(scope="module")
def reg(workdir, hosts):
    with registry.running(workdir, hosts) as running:
        yield running


def build_push(ref: str, config: Path, log: Path) -> subprocess.CompletedProcess:
    """`zenvllm build --target vllm-openai --tag REF --push` with logins from `config`."""
    return subprocess.run(
        [*engine.build_args("vllm-openai"), "--tag", ref, "--push", "--log", str(log)],
        env=registry.client_env(config),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def client(config: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return engine.docker(*args, check=False, timeout=timeout, env=registry.client_env(config))


def test_the_registry_demands_tls_with_its_ca_and_credentials(reg):
    assert reg.request("/v2/").status == 200
    anonymous = reg.request("/v2/", auth=False)
    assert anonymous.status == 401 and anonymous.headers["Www-Authenticate"].startswith("Basic")
    assert reg.request("/v2/_catalog", auth=False).status == 401
    wrong = registry.Registry(reg.hosts, reg.port, reg.user, "not-it", reg.ca, reg.log)
    assert wrong.request("/v2/").status == 401
    # The machine's own CAs do not vouch for it, and plain HTTP gets no API at all.
    with pytest.raises(urllib.error.URLError) as refused:
        urllib.request.urlopen(f"https://{reg.address}/v2/", timeout=10)
    assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)
    with pytest.raises(urllib.error.HTTPError) as plain:
        urllib.request.urlopen(f"http://{reg.address}/v2/", timeout=10)
    assert plain.value.code == 400  # "Client sent an HTTP request to an HTTPS server."


def test_a_push_without_login_exits_2_naming_the_registry_and_the_fix(reg, image, workdir):
    ref = f"{reg.address}/{REPOSITORY}:no-login"
    done = build_push(ref, workdir / "no-login", workdir / "no-login.log")
    try:
        assert done.returncode == 2, done.stderr
        said = done.stderr
        assert f"the push of {ref} to {reg.address} failed: " in said
        assert "no basic auth credentials" in said  # the engine's own words
        assert f"`docker login {reg.address}`" in said
        assert engine.image_id(ref) == image[1]  # built and tagged, just not pushed
        tags = reg.request(f"/v2/{REPOSITORY}/tags/list")
        assert tags.status == 404 or "no-login" not in json.loads(tags.body)["tags"]
    finally:
        engine.docker("image", "rm", ref, check=False)


def test_a_push_to_a_registry_whose_ca_is_not_trusted_names_where_the_ca_goes(
    image, workdir, hosts
):
    with registry.running(workdir / "untrusted", hosts, trust=False) as untrusted:
        ref = f"{untrusted.address}/{REPOSITORY}:untrusted"
        done = build_push(ref, workdir / "untrusted-config", workdir / "untrusted.log")
        engine.docker("image", "rm", ref, check=False)
    assert done.returncode == 2, done.stderr
    assert "x509" in done.stderr and "certificate signed by unknown authority" in done.stderr
    assert f"/etc/docker/certs.d/{untrusted.address}/ca.crt" in done.stderr


def test_build_push_then_pull_back_the_same_image(reg, image, workdir):
    """registry.md's steps 1 and 2 as written: the engine's trust of the registry's CA
    (the fixture's removed first), the login from a password file, `zenvllm build --push`;
    then what the registry holds, and the engine's pull of it."""
    image_id = image[1]
    config = workdir / "logged-in"
    config.mkdir()
    shutil.copyfile(reg.ca, workdir / "registry-ca.crt")
    (workdir / "registry-password").write_text(reg.password)
    trust = registry.CERTS_DIRS[0] / reg.address  # the fixture's, removed when it stops
    shutil.rmtree(trust)
    operator = {**registry.client_env(config), "PATH": f"{BIN}:{os.environ['PATH']}"}
    done = readme.run("registry-trust", {"REG": reg.address}, cwd=workdir, env=operator)
    assert done.returncode == 0, done.stderr
    assert (trust / "ca.crt").read_bytes() == reg.ca.read_bytes()
    ref = f"{reg.address}/{REPOSITORY}:0.32.0"

    start = time.monotonic()
    placeholders = {"REG": reg.address, "USER": reg.user}
    done = readme.run("registry-push", placeholders, cwd=workdir, env=operator, timeout=900)
    took = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    assert json.loads((config / "config.json").read_text())["auths"].keys() == {reg.address}
    assert done.stdout.strip().splitlines()[-1] == ref
    assert engine.image_id(ref) == image_id  # the same image as the default tag: a cache hit
    size = engine.docker("image", "inspect", "--format", "{{.Size}}", ref).stdout.strip()
    print(f"build --push of {int(size) / 1e9:.2f} GB to {reg.address}: {took:.1f} s")
    pushed = re.search(rf"build: pushed {re.escape(ref)} (sha256:[0-9a-f]{{64}})", done.stderr)
    assert pushed, done.stderr
    digest = pushed.group(1)

    # What the registry holds: the repository, the tag, a manifest of that digest whose
    # config is this very image (an image ID is its config's digest), every layer.
    assert REPOSITORY in reg.catalog()
    assert reg.json(f"/v2/{REPOSITORY}/tags/list")["tags"] == ["0.32.0"]
    reply = reg.request(f"/v2/{REPOSITORY}/manifests/0.32.0", accept=MANIFEST)
    assert reply.status == 200 and reply.headers["Docker-Content-Digest"] == digest
    manifest = json.loads(reply.body)
    assert manifest["config"]["digest"] == image_id
    for layer in manifest["layers"]:
        blob = reg.request(f"/v2/{REPOSITORY}/blobs/{layer['digest']}", method="HEAD")
        assert (blob.status, int(blob.headers["Content-Length"])) == (200, layer["size"])
    smallest = min(manifest["layers"], key=lambda layer: layer["size"])
    for blob in (manifest["config"], smallest):  # content, not just names: hash them here
        body = reg.request(f"/v2/{REPOSITORY}/blobs/{blob['digest']}").body
        assert f"sha256:{hashlib.sha256(body).hexdigest()}" == blob["digest"]

    # Without credentials the registry refuses the pull too.
    anonymous = client(workdir / "anonymous", "pull", ref, timeout=120)
    assert anonymous.returncode != 0
    assert "no basic auth credentials" in anonymous.stderr, anonymous.stderr

    # The engine's own pull (its layers are still here under the default tag, so the
    # engine fetches the manifest and config and finds every layer present).
    assert client(config, "image", "rm", ref).returncode == 0
    assert engine.docker("image", "inspect", ref, check=False).returncode != 0
    start = time.monotonic()
    pulled = client(config, "pull", ref)
    print(f"pull back: {time.monotonic() - start:.2f} s")
    assert pulled.returncode == 0, pulled.stderr
    assert f"Digest: {digest}" in pulled.stdout
    assert engine.image_id(ref) == image_id
    digests = engine.docker("image", "inspect", "--format", "{{json .RepoDigests}}", ref).stdout
    assert f"{reg.address}/{REPOSITORY}@{digest}" in json.loads(digests)
    engine.docker("image", "rm", ref, check=False)  # the default tag keeps the image


def test_podman_pushes_through_the_same_code_with_its_own_login_and_trust(
    reg, workdir, monkeypatch
):
    # The small base image, not vllm-openai: the podman path, without a second 3 GB push.
    podman = require_tool("podman")
    base = "localhost/zenvllm/debian:bookworm"
    auth = workdir / "podman-auth.json"  # podman's logins, never the user's
    auth.write_text('{"auths": {}}')
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(auth))  # for push(), which inherits it
    env = dict(os.environ)

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [podman, *args], input=stdin, env=env, capture_output=True, text=True, check=False
        )

    require(run("image", "exists", base).returncode == 0, f"podman has no {base}")
    ref = f"{reg.address}/zenvllm/debian:podman"
    assert run("tag", base, ref).returncode == 0
    try:
        with pytest.raises(UserError, match=re.escape(f"`podman login {reg.address}`")):
            push.push("podman", podman, ref)
        login = run("login", reg.address, "-u", reg.user, "--password-stdin", stdin=reg.password)
        assert login.returncode == 0, login.stderr
        digest = push.push("podman", podman, ref)
    finally:
        run("image", "rm", ref)
    reply = reg.request("/v2/zenvllm/debian/manifests/podman", accept=f"{MANIFEST}, {OCI_MANIFEST}")
    assert reply.status == 200 and reply.headers["Docker-Content-Digest"] == digest


def _git(*args: str) -> str:
    env = {**os.environ, "TZ": "UTC"}  # dates in UTC, as the label has them
    return subprocess.run(
        ["git", "-C", str(REPO), *args], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_image_carries_its_provenance_as_oci_labels(image):
    labels = engine.image_config(image[0])["Labels"]
    oci = {k.removeprefix("org.opencontainers.image."): v for k, v in labels.items()}
    # Derived here with git itself: the last commit of what goes into the image.
    sources = [
        "dockerfiles",
        "scripts/zenvllm/__init__.py",
        "scripts/zenvllm/core",
        "scripts/zenvllm/runtime",
    ]
    revision = _git("log", "-1", "--format=%H", "--", *sources)
    rfc3339 = "--date=format-local:%Y-%m-%dT%H:%M:%SZ"
    created = _git("log", "-1", rfc3339, "--format=%cd", "--", *sources)
    if os.environ.get("SOURCE_DATE_EPOCH"):
        created = time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(os.environ["SOURCE_DATE_EPOCH"]))
        )
    assert oci["revision"] == revision
    assert oci["created"] == created
    assert oci["source"].startswith("https://")
    assert oci["licenses"] == "Apache-2.0"
    assert oci["base.name"] == "zenvllm/debian:bookworm"
    assert labels["io.zenvllm.pin.vllm"] == "0.32.0"
