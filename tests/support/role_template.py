"""A role's template rendered on the controller as Ansible renders it (its own templar),
with the role's defaults and vars, and overrides as `-e` gives them: for tests that
check what a template makes (the planner's gate, promtool) without a play."""

from __future__ import annotations

from pathlib import Path

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import init_plugin_loader
from ansible.template import Templar, trust_as_template

MANAGED = "Ansible managed"
# The collection's own filters (zenvllm.cpu.*): the checkout's, scripts/ansible_collections
# on sys.path (the editable install's), as ansible-playbook finds them.
init_plugin_loader()


def variables(role: Path, **overrides) -> dict:
    found: dict = {}
    for part in ("defaults", "vars"):
        path = role / part / "main.yml"
        if path.is_file():
            found |= yaml.safe_load(path.read_text()) or {}
    found |= overrides
    trusted = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in found.items()}
    lone = {"groups": {}, "hostvars": {}, "inventory_hostname": "localhost"}
    return lone | {"role_path": str(role), "ansible_managed": MANAGED} | (trusted)


def render(role: Path, template: str, **overrides) -> str:
    templar = Templar(loader=DataLoader(), variables=variables(role, **overrides))
    return templar.template(trust_as_template((role / "templates" / template).read_text()))
