"""Run the project's playbooks the way an operator does, and read the recap.

Ansible's home, temp files and config stay inside the checkout (.cache/ansible),
so runs do not depend on, or leave anything in, the user's ~/.ansible.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from zenvllm import __version__
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


def build_collection(where: Path, version: str | None = None) -> Path:
    """The collection's tarball as `make collection` builds it (the planner zipapp into
    the instances role, then `ansible-galaxy collection build`), into where/dist. With a
    version: as a release of that version would ship it (a copy of ansible/ whose
    galaxy.yml and planner zipapp say so), for the tests of an upgrade."""
    source = ANSIBLE_DIR
    if version is not None:
        source = where / f"ansible-{version}"
        shutil.copytree(ANSIBLE_DIR, source, symlinks=False)
        galaxy = source / "galaxy.yml"
        galaxy.write_text(re.sub(r"(?m)^version: .*$", f"version: {version}", galaxy.read_text()))
    zipapp = shipped.write_zipapp(source / "roles" / "zenvllm_instances" / "files" / "zenvllm.pyz")
    if version is not None:
        stamp_zipapp(zipapp, version)
    built = where / "dist"
    galaxy_run("build", str(source), "--output-path", str(built), "--force")
    (tarball,) = built.glob(f"zenvllm-cpu-{version or '*'}.tar.gz")
    return tarball


def stamp_zipapp(zipapp: Path, version: str) -> None:
    """Rewrite a planner zipapp as release VERSION's: its mark and zenvllm.__version__."""
    with zipfile.ZipFile(zipapp) as archive:
        members = [(info, archive.read(info)) for info in archive.infolist()]
    buffer = io.BytesIO()
    buffer.write(shipped.HEADER.replace(__version__.encode(), version.encode()))
    with zipfile.ZipFile(buffer, "w") as archive:
        for info, content in members:
            if info.filename == "zenvllm/__init__.py":
                content = content.replace(f'"{__version__}"'.encode(), f'"{version}"'.encode())
            archive.writestr(info, content)
    zipapp.write_bytes(buffer.getvalue())


def galaxy_run(*args: str, environ: dict[str, str] | None = None) -> None:
    done = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", *args],
        env=environ or env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def install_collection(where: Path) -> Path:
    """The collection as an operator gets it: built, installed with
    `ansible-galaxy collection install --offline` into where/collections."""
    tarball = build_collection(where)
    # --force: the checkout is zenvllm.cpu too (scripts/ansible_collections on sys.path),
    # which ansible-galaxy would take for this collection installed already.
    galaxy_run("install", "--offline", "--force", "-p", str(where / "collections"), str(tarball))
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
    timeout: float = 1800,
    cpus: str = "",
    environ: dict[str, str] | None = None,
) -> Run:
    """ansible-playbook from ansible/, extra vars passed as JSON (types kept); with cpus
    (a CPU list), confined to those CPUs, so the planner on localhost sees only them;
    `environ` on top of env() (DOCKER_HOST, ANSIBLE_REMOTE_TEMP...). The one way the
    tests run a playbook and wait for it."""
    proc = subprocess.run(
        playbook_argv(*args, extra_vars=extra_vars, playbook_file=playbook_file, cpus=cpus),
        cwd=ANSIBLE_DIR,
        env=env() | (environ or {}),
        # Ansible refuses a non-blocking stdin, which a test run started in the
        # background may hand down: no playbook here reads it.
        stdin=subprocess.DEVNULL,
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
        stdin=subprocess.DEVNULL,  # as playbook(): Ansible refuses a non-blocking one
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def task_runs(output: str, task: str) -> list[tuple[int, str]]:
    """Where each run of the task whose banner names `task` starts in ansible-playbook's
    output, and what it printed under its banner."""
    # The banner, "TASK [role : <task>] ***"; a retry's line names the task too.
    starts = [m.start() for m in re.finditer(re.escape(task) + r"\]", output)]
    return [(at, output[at:].split("]", 1)[1].split("TASK [", 1)[0]) for at in starts]


def changed_tasks(output: str) -> list[str]:
    """Names of the tasks that reported a change (for readable failures)."""
    tasks, current = [], None
    for line in output.splitlines():
        if line.startswith(("TASK [", "RUNNING HANDLER [")):
            current = line.split("[", 1)[1].rsplit("]", 1)[0]
        elif line.startswith("changed:") and current and current not in tasks:
            tasks.append(current)
    return tasks
