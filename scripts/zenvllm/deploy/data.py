"""Where the files the CLI reads besides its code live: the Dockerfile templates and
build.yaml (`dockerfiles/`), and the Ansible roles and playbook (`ansible/`).

Both are package data, found with importlib.resources the same way everywhere: in a
checkout `scripts/zenvllm/dockerfiles` and `scripts/zenvllm/ansible` are links to the
top-level directories (an editable install imports from there), and a wheel or sdist
carries copies of them (pyproject.toml lists them as package data).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

# Installed packages are directories on disk (pip unpacks wheels), so a Path serves
# the Jinja2 loader and the subprocesses that read these files.
ROOT = Path(str(files("zenvllm")))
DOCKERFILES = ROOT / "dockerfiles"
ANSIBLE = ROOT / "ansible"
BUILD_CONFIG = DOCKERFILES / "build.yaml"
# The instances role's seccomp profile: the bench runs the planner's layouts under it.
SECCOMP_PROFILE = ANSIBLE / "roles" / "zenvllm_instances" / "files" / "seccomp-numa.json"
