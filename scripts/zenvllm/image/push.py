"""`zenvllm build --push`: send the built tag to its registry with the engine's own CLI.

Credentials are the engine client's own (`docker login`, DOCKER_CONFIG; `podman
login`, REGISTRY_AUTH_FILE): zenvllm never sees a password. A failed push names the
registry, the engine's words and the fix. The reading of a reference and of a failure
are pure; `push` is the one side effect.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections import deque
from contextlib import ExitStack
from pathlib import Path

from zenvllm.core import gate
from zenvllm.core.errors import UserError
from zenvllm.runtime.engine import DOCKER_NAME, PODMAN_NAME, Cli

DOCKER_HUB = "docker.io"
# Where each engine looks for a registry's CA (read at each push: no restart needed).
CERTS_D = {DOCKER_NAME: "/etc/docker/certs.d", PODMAN_NAME: "/etc/containers/certs.d"}
WHERE_LOGINS = {
    DOCKER_NAME: "DOCKER_CONFIG/config.json, default ~/.docker",
    PODMAN_NAME: "REGISTRY_AUTH_FILE, default $XDG_RUNTIME_DIR/containers/auth.json",
}
_DIGEST = re.compile(r"digest: (sha256:[0-9a-f]{64})")

# What the engines say, by cause (lower case; docker 20 to 28 and podman 4 were read).
_TLS = ("x509", "certificate", "tls:")
_PLAIN_HTTP = ("http response to https client",)
_AUTH = ("unauthorized", "authentication required", "no basic auth credentials", "denied")
_UNREACHABLE = (
    "connection refused",
    "no such host",
    "i/o timeout",
    "no route to host",
    "network is unreachable",
)


def registry_of(ref: str) -> str:
    """The registry of an image reference, read as the engines read it: the first part
    when it has a dot or a port or is localhost, else Docker Hub."""
    first, sep, _ = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return DOCKER_HUB


def fix_for(kind: str, registry: str, words: str) -> str:
    """The fix for a failed push, from the engine's own words."""
    said = words.lower()
    if any(w in said for w in _PLAIN_HTTP):
        return (
            f"{registry} answers in plain HTTP: serve it over TLS (an engine pushes only "
            "to TLS registries unless told the registry is insecure)"
        )
    if any(w in said for w in _TLS):
        return (
            f"make {kind} trust the registry's CA: put it at "
            f"{CERTS_D[kind]}/{registry}/ca.crt (as root, on every machine that pushes "
            "or pulls)"
        )
    if any(w in said for w in _AUTH):
        return (
            f"log in with `{kind} login {registry}` (the engine keeps the credentials, in "
            f"{WHERE_LOGINS[kind]}) as a user who may push to that repository"
        )
    if any(w in said for w in _UNREACHABLE):
        return f"no registry answers at {registry}: check the name and port in --tag"
    return f"fix what the engine says, then `{kind} push` the tag again"


def failure_message(kind: str, tag: str, lines: list[str]) -> str:
    # The engines end with their error; the lines before it are progress ("Preparing").
    said = [x.strip() for x in lines if x.strip()]
    words = said[-1][-600:] if said else "no output"
    registry = registry_of(tag)
    return (
        f"the push of {tag} to {registry} failed: {words}. Fix: "
        f"{fix_for(kind, registry, words)}. The image is built and tagged {tag} "
        f"here; `{kind} push {tag}` sends it without building again"
    )


def push_argv(kind: str, tag: str, digestfile: Path) -> list[str]:
    # docker prints the digest it pushed; podman writes it only where told.
    extra = ["--digestfile", str(digestfile)] if kind == PODMAN_NAME else []
    return ["push", *extra, tag]


def push(kind: str, binary: str, tag: str, log: Path | None = None) -> str | None:
    """Push `tag` with the engine's CLI, its output to `log` (appended) or the terminal;
    the manifest digest the registry now holds (None if the engine did not say)."""
    tail: deque[str] = deque(maxlen=50)
    with ExitStack() as stack:
        sink = stack.enter_context(log.open("a")) if log else sys.stderr
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="zenvllm-push-")))
        argv = push_argv(kind, tag, tmp / "digest")
        with Cli(binary).started(*argv, out=subprocess.PIPE) as proc:
            for raw in proc.stdout:  # type: ignore[union-attr]
                line = raw.decode(errors="replace")
                sink.write(line)
                tail.append(line)
        if proc.returncode != 0:
            raise UserError(failure_message(kind, tag, list(tail)))
        written = gate.read_text(tmp / "digest", gate.SYSFS, "", optional=True)
        if written:
            return written.strip()
    found = [m.group(1) for m in map(_DIGEST.search, tail) if m]
    return found[-1] if found else None
