"""What a Docker seccomp profile lets a container do, and the engine's own default profile.

A profile's rules carry conditions (architectures, capabilities, a minimum
kernel) that the engine resolves when it creates a container. `effective`
resolves them the way moby does (`profiles/seccomp/seccomp_linux.go`: every
included capability must be held, any excluded one drops the rule), so two
profiles can be compared by what they allow, not by how they are written.

`engine_default_profile` fetches the default profile of the running engine's
exact version: Debian's docker.io is built from the same source package as
golang-github-docker-docker-dev, which ships `profiles/seccomp/default.json`.
It is cached under $ZENVLLM_CACHE; `apt-get download` fetches it once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

NUMA_CALLS = frozenset({"get_mempolicy", "set_mempolicy", "mbind", "migrate_pages", "move_pages"})
SOURCE_PACKAGE = "golang-github-docker-docker-dev"
DEFAULT_JSON = "usr/share/gocode/src/github.com/docker/docker/profiles/seccomp/default.json"


def _kernel(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:2])


def applies(rule: dict, arch: str, caps: frozenset[str], kernel: tuple[int, ...]) -> bool:
    inc, exc = rule.get("includes") or {}, rule.get("excludes") or {}
    if inc.get("arches") and arch not in inc["arches"]:
        return False
    if exc.get("arches") and arch in exc["arches"]:
        return False
    if inc.get("caps") and not all(c in caps for c in inc["caps"]):
        return False
    if exc.get("caps") and any(c in caps for c in exc["caps"]):
        return False
    return not (inc.get("minKernel") and _kernel(inc["minKernel"]) > kernel)


def effective(
    profile: dict, arch: str, caps: set[str] | frozenset[str], kernel: tuple[int, ...]
) -> dict[str, frozenset[tuple]]:
    """syscall -> the (action, errno, argument filters) that apply to a container like this."""
    out: dict[str, set[tuple]] = {}
    for rule in profile["syscalls"]:
        if not applies(rule, arch, frozenset(caps), kernel):
            continue
        verdict = (
            rule["action"],
            rule.get("errnoRet"),
            json.dumps(rule.get("args") or [], sort_keys=True),
        )
        for name in rule["names"]:
            out.setdefault(name, set()).add(verdict)
    return {name: frozenset(v) for name, v in out.items()}


def default_errno(profile: dict) -> int:
    # No defaultErrnoRet means EPERM (1), as runc applies it.
    return profile.get("defaultErrnoRet", 1)


# Docker's default capability set (moby oci/caps/defaults.go), for comparing
# what an ordinary container may do, besides zenvllm's --cap-drop ALL --cap-add SYS_NICE.
DOCKER_DEFAULT_CAPS = frozenset(
    [
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_FSETID",
        "CAP_FOWNER",
        "CAP_MKNOD",
        "CAP_NET_RAW",
        "CAP_SETGID",
        "CAP_SETUID",
        "CAP_SETFCAP",
        "CAP_SETPCAP",
        "CAP_NET_BIND_SERVICE",
        "CAP_SYS_CHROOT",
        "CAP_KILL",
        "CAP_AUDIT_WRITE",
    ]
)


def compare(shipped: dict, default: dict, arch: str, caps: set[str], kernel: tuple[int, ...]):
    """(calls only the shipped profile allows, calls it treats differently from the default)."""
    ours, theirs = effective(shipped, arch, caps, kernel), effective(default, arch, caps, kernel)
    added = {n for n in ours if n not in theirs}
    changed = {n for n in theirs if ours.get(n) != theirs[n]}
    return added, changed


def engine_package_version() -> str | None:
    """The Debian source version the running docker.io was built from (binNMU suffix dropped)."""
    done = subprocess.run(
        ["dpkg-query", "-W", "-f=${source:Version}", "docker.io"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def engine_default_profile(cache: Path, version: str) -> dict:
    """The engine's default seccomp profile for this docker.io version (cached)."""
    target = cache / "seccomp" / f"docker-{version}-default.json"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="zenvllm-seccomp-") as tmp:
            subprocess.run(
                ["apt-get", "download", f"{SOURCE_PACKAGE}={version}"],
                cwd=tmp,
                check=True,
                capture_output=True,
            )
            deb = next(Path(tmp).glob("*.deb"))
            subprocess.run(["dpkg-deb", "-x", str(deb), f"{tmp}/x"], check=True)
            staged = target.with_suffix(".tmp")
            shutil.copyfile(Path(tmp) / "x" / DEFAULT_JSON, staged)
            os.replace(staged, target)  # never a half-written cache entry
    return json.loads(target.read_text())
