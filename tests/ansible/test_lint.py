"""Lint is part of the tests: yamllint and ansible-lint (production profile, offline)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from support.ansible_run import ANSIBLE_DIR, BIN, env

pytestmark = pytest.mark.ansible

ROLES = sorted(p.name for p in (ANSIBLE_DIR / "roles").iterdir())


def test_yamllint_is_clean():
    proc = subprocess.run(
        [str(BIN / "yamllint"), "--strict", "."],
        cwd=ANSIBLE_DIR,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ansible_lint_production_profile_is_clean():
    proc = subprocess.run(
        [str(BIN / "ansible-lint"), "--offline", "--profile", "production", "--nocolor"],
        cwd=ANSIBLE_DIR,
        env=env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "Profile 'production' was required, and it passed" in proc.stdout + proc.stderr


@pytest.mark.parametrize("role", ROLES)
def test_every_default_has_a_typed_described_argument_spec(role):
    defaults = yaml.safe_load((ANSIBLE_DIR / "roles" / role / "defaults/main.yml").read_text())
    specs = yaml.safe_load((ANSIBLE_DIR / "roles" / role / "meta/argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    assert set(options) == set(defaults)
    for name, spec in options.items():
        assert name.startswith(role + "_"), name
        assert spec.get("type") and len(spec.get("description", "")) > 20, name


def test_shipped_seccomp_profile_is_the_generators_output():
    proc = subprocess.run(
        [sys.executable, "tools/seccomp_profile.py"],
        cwd=ANSIBLE_DIR,
        capture_output=True,
        text=True,
        check=True,
    )
    shipped = (ANSIBLE_DIR / "roles/zenvllm_instances/files/seccomp-numa.json").read_text()
    assert proc.stdout == shipped
    profile = json.loads(shipped)
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    unconditional = {
        name
        for rule in profile["syscalls"]
        if rule["action"] == "SCMP_ACT_ALLOW" and not rule.get("includes") and not rule.get("args")
        for name in rule["names"]
    }
    for call in ("get_mempolicy", "set_mempolicy", "mbind", "migrate_pages", "move_pages"):
        assert call in unconditional
    # Still the default's restrictions: no namespace or mount calls without CAP_SYS_ADMIN.
    assert not {"mount", "unshare", "setns", "bpf", "ptrace"} & unconditional
