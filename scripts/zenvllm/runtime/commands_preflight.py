"""`python3 -m zenvllm.runtime preflight --deployment D [--file F]... [--profile P]
[--compile-cache DIR] [--address A --base-port B --port N...]`: before the instances role
writes or starts anything, whether its plan would take what is the operator's: an
instance file or a seccomp profile zenvllm did not write, a compile cache directory it
did not make, a planned port another service listens on.

One process on the host for all of it, where the role ran a module per file and per
port (a grep, a `docker ps`, a wait_for each: 0.2 s of CPU and a connection apiece,
on every run). Exit 2 with every refusal, each naming the thing and the fix.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from zenvllm.core import gate
from zenvllm.core.errors import UserError
from zenvllm.runtime import compile_dirs
from zenvllm.runtime.engine import Cli

# The first lines zenvllm writes in an instance's env file, run script and unit
# (templates/instance.*.j2), and the comment of its seccomp profile.
INSTANCE_HEADER = re.compile(rb"^# (zenvllm instance|Environment of) ", re.MULTILINE)
PROFILE_MARK = re.compile(rb'"comment": "zenvllm: ')
# The label each instance's container carries with its port (core/container.py).
DEPLOYMENT_LABEL, PORT_LABEL = "zenvllm.deployment", "zenvllm.port"


def foreign(path: Path, mark: re.Pattern[bytes]) -> bool:
    """Something is at path and it is not zenvllm's: not a regular file, or one without
    the mark in its first MiB (zenvllm's files are far smaller)."""
    if not os.path.lexists(path):
        return False
    try:
        data = gate.read_bytes(path, gate.SMALL, "")
    except (gate.InputError, OSError):
        return True
    return mark.search(data) is None


def listening(address: str, port: int) -> bool:
    """Something accepts a connection there (a refusal or no answer within 1 s: free)."""
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


def own_ports(deployment: str) -> set[int]:
    """The ports this deployment's containers hold (theirs to take over); none when the
    engine is not installed yet (check mode on a fresh host) or does not answer."""
    label = f"label={DEPLOYMENT_LABEL}={deployment}"
    try:
        shown = Cli().run("ps", "--filter", label, "--format", f'{{{{.Label "{PORT_LABEL}"}}}}')
    except (UserError, subprocess.TimeoutExpired):
        return set()
    if shown.returncode != 0:
        return set()
    return {int(line) for line in shown.stdout.split() if line.isdigit()}


def refusals(
    files: Iterable[Path],
    profile: Path | None,
    deployment: str,
    held: Iterable[int],
    where: str,
    base_port: int,
    compile_cache: Path | None = None,
) -> list[str]:
    """Every refusal, in the order the role gave them: the instance files, the
    planned ports another service holds, the seccomp profile, the compile cache."""
    said = []
    theirs = [str(p) for p in files if foreign(p, INSTANCE_HEADER)]
    if theirs:
        said.append(
            f"{', '.join(theirs)} exist(s) and zenvllm did not write them (no zenvllm header); "
            "zenvllm never replaces a file it does not manage. Move them away, or choose "
            "another zenvllm_instances_deployment name."
        )
    said += [
        f"Port {port} on {where} is already in use by something other than deployment "
        f"{deployment}: stop it, or move the instances with zenvllm_instances_base_port "
        f"(now {base_port})."
        for port in held
    ]
    if profile is not None and foreign(profile, PROFILE_MARK):
        said.append(
            f"{profile} exists and zenvllm did not write it; zenvllm never replaces a file "
            "it does not manage. Move it away, or give zenvllm_instances_seccomp_profile "
            "another path."
        )
    if compile_cache is not None:
        said += [r for r in [compile_dirs.foreign(compile_cache)] if r]
    return said


def run(args: argparse.Namespace) -> int:
    fix = "give a TCP port, e.g. --port 8001"
    ports = [gate.whole_text(p, "--port", 1, 65535, fix) for p in args.port]
    base_port = gate.whole_text(args.base_port, "--base-port", 0, 65535, fix)
    mine = own_ports(args.deployment) if ports else set()
    held = [p for p in ports if p not in mine and listening(args.address, p)]
    profile = Path(args.profile) if args.profile else None
    files = [Path(f) for f in args.file]
    cache = Path(args.compile_cache) if args.compile_cache else None
    said = refusals(files, profile, args.deployment, held, args.address, base_port, cache)
    for line in said:
        print(line, file=sys.stderr)
    return 2 if said else 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "preflight", help="refuse a plan that would take an operator's file or port"
    )
    p.add_argument("--deployment", required=True, help="the deployment's name")
    p.add_argument("--file", action="append", default=[], help="a file the plan writes")
    p.add_argument("--profile", default="", help="the seccomp profile the plan installs")
    p.add_argument("--compile-cache", default="", help="the compile cache directory, if kept")
    p.add_argument("--address", default="127.0.0.1", help="where the instances listen")
    p.add_argument("--base-port", default="0", help="zenvllm_instances_base_port, for the fix")
    p.add_argument("--port", action="append", default=[], help="a port the plan listens on")
    p.set_defaults(func=run)
