"""The one way zenvllm runs one of its own playbooks: the ansible-playbook command line
and the environment it runs in.

ansible-playbook is the one beside this Python (the deploy extra installs it there),
else the first on PATH; the playbook is a path under the collection's directory,
where the caller runs it (ansible.cfg names its inventory and roles relative to it).
Ansible's home and temp files go where the caller says, never ~/.ansible, and its
output has no colour. The bench's gateway deploys with it; the tests run every
playbook with it.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from zenvllm import __version__
from zenvllm.core.errors import UserError
from zenvllm.deploy import data

# Nothing is on PyPI under zenvllm's name yet: the wheel comes from `make package`.
WHEEL = f"dist/zenvllm-{__version__}-py3-none-any.whl"
INSTALL = f"install zenvllm's deploy extra (make package; pip install '{WHEEL}[deploy]')"
BENCH_EXTRA = f"make venv in a checkout, or pip install '{WHEEL}[bench]'"
MISSING = f"zenvllm's playbooks need ansible-playbook; {INSTALL}"


def binary(missing: str = MISSING) -> str:
    """ansible-playbook beside this Python, else on PATH; else a UserError: `missing`."""
    exe = Path(sys.executable).parent / "ansible-playbook"
    found = str(exe) if exe.exists() else shutil.which("ansible-playbook")
    if not found:
        raise UserError(missing)
    return found


def command(playbook: str, *args: str, cpus: str = "", missing: str = MISSING) -> list[str]:
    """`ansible-playbook PLAYBOOK ARGS...`, the arguments in the caller's order (a later
    `-e` wins); with `cpus` (a CPU list) under `taskset`, so the planner it runs on
    localhost sees only those CPUs. `missing`: what to say when there is no
    ansible-playbook."""
    argv = [binary(missing), playbook, *args]
    return ["taskset", "--cpu-list", cpus, *argv] if cpus else argv


def environment(home: Path, ansible_dir: Path = data.ANSIBLE, **more: str) -> dict[str, str]:
    """This process's environment with Ansible's config from `ansible_dir`, its home and
    local temp files under `home`, no colour; `more` on top (ANSIBLE_REMOTE_TEMP,
    DOCKER_HOST...)."""
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(ansible_dir / "ansible.cfg"),
        "ANSIBLE_HOME": str(home),
        "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
        "ANSIBLE_NOCOLOR": "1",
        **more,
    }
