"""Run the project's playbooks the way an operator does, and read the recap.

Ansible's home, temp files and config stay inside the checkout (.cache/ansible),
so runs do not depend on, or leave anything in, the user's ~/.ansible.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from zenvllm.deploy import playbooks, shipped

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = REPO / "ansible"
BIN = Path(sys.executable).parent


def planner_zipapp(where: Path) -> Path:
    """The planner zipapp for zenvllm_planner, at where/zenvllm.pyz, made once:
    edits to the checkout during a run do not change what the hosts run."""
    zipapp = where / "zenvllm.pyz"
    if not zipapp.exists():
        shipped.write_zipapp(zipapp)
    return zipapp


def install_collection(where: Path) -> Path:
    """The collection as an operator gets it: `make collection` (the planner zipapp into
    the instances role, then `ansible-galaxy collection build`), installed with
    `ansible-galaxy collection install --offline` into where/collections."""
    shipped.write_zipapp(ANSIBLE_DIR / "roles" / "zenvllm_instances" / "files" / "zenvllm.pyz")
    galaxy = [str(BIN / "ansible-galaxy"), "collection"]
    built = where / "dist"

    def run(*args: str) -> None:
        done = subprocess.run([*galaxy, *args], env=env(), capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr

    run("build", str(ANSIBLE_DIR), "--output-path", str(built), "--force")
    (tarball,) = built.glob("zenvllm-cpu-*.tar.gz")
    run("install", "--offline", "-p", str(where / "collections"), str(tarball))
    return where / "collections"


RECAP = re.compile(
    r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)"
    r"\s+failed=(?P<failed>\d+)",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Run:
    rc: int
    output: str
    recap: dict[str, dict[str, int]]

    def changed(self) -> int:
        return sum(h["changed"] for h in self.recap.values())

    def failed(self) -> int:
        return sum(h["failed"] + h["unreachable"] for h in self.recap.values())

    def failures(self) -> str:
        """Each failed task with its message, wherever it is in a long output: for an
        assertion's message, with the output's end."""
        tasks = re.split(r"\n(?=TASK \[)", self.output)
        failed = [t[:3000] for t in tasks if re.search(r"^(fatal|failed): ", t, re.M)]
        return "\n".join(failed) + "\n...\n" + self.output[-3000:]


def env() -> dict[str, str]:
    home = REPO / ".cache" / "ansible"
    home.mkdir(parents=True, exist_ok=True)
    return playbooks.environment(
        home,
        ANSIBLE_DIR,
        ANSIBLE_FORCE_COLOR="0",
        PYTHONDONTWRITEBYTECODE="1",
        # The gateway's generated keys and CA copies, never in the user's ~/.config.
        ZENVLLM_SECRETS_DIR=str(REPO / ".cache" / "secrets"),
        PATH=f"{BIN}:{os.environ.get('PATH', '')}",
    )


def playbook_argv(*args: str, extra_vars: dict | None, playbook_file: str, cpus: str) -> list[str]:
    """The package's command line (zenvllm.deploy.playbooks), extra vars last as JSON."""
    extra = ["-e", json.dumps(extra_vars)] if extra_vars else []
    return playbooks.command(playbook_file, *args, *extra, cpus=cpus)


def playbook(
    *args: str,
    extra_vars: dict | None = None,
    playbook_file: str = "playbooks/deploy.yml",
    timeout: int = 1800,
    cpus: str = "",
) -> Run:
    """ansible-playbook from ansible/, extra vars passed as JSON (types kept); with cpus
    (a CPU list), confined to those CPUs, so the planner on localhost sees only them."""
    proc = subprocess.run(
        playbook_argv(*args, extra_vars=extra_vars, playbook_file=playbook_file, cpus=cpus),
        cwd=ANSIBLE_DIR,
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return finished(proc.returncode, proc.stdout + proc.stderr)


def finished(rc: int, output: str) -> Run:
    recap = {
        m["host"]: {k: int(m[k]) for k in ("ok", "changed", "unreachable", "failed")}
        for m in RECAP.finditer(output)
    }
    return Run(rc, output, recap)


def start_playbook(
    *args: str, extra_vars: dict | None = None, playbook_file: str = "playbooks/deploy.yml"
) -> subprocess.Popen:
    """ansible-playbook in the background, in a session of its own (a test cuts it
    short by killing it and what it started)."""
    return subprocess.Popen(
        playbook_argv(*args, extra_vars=extra_vars, playbook_file=playbook_file, cpus=""),
        cwd=ANSIBLE_DIR,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def changed_tasks(output: str) -> list[str]:
    """Names of the tasks that reported a change (for readable failures)."""
    tasks, current = [], None
    for line in output.splitlines():
        if line.startswith(("TASK [", "RUNNING HANDLER [")):
            current = line.split("[", 1)[1].rsplit("]", 1)[0]
        elif line.startswith("changed:") and current and current not in tasks:
            tasks.append(current)
    return tasks
