"""A role's variables, written once: each with its default, type, help and description,
from which reference.py writes the role's `defaults/main.yml` and
`meta/argument_specs.yml` and the variable reference.

A Variable is `<role>_<name>`; its default is a value, a playbook-wide variable's
(`inherit`, e.g. `zenvllm_state`) or a Jinja expression over the inventory
(`role_default`). The instances role's are the deployment request's options under its
names (deploy/role_instances.py, with `asked`) plus its own; every other role has only
its own (`own`), in deploy/role_<name>.py. Nothing here runs on a host.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from zenvllm.core.options import Spec, kind_of

ROLLOUT = "Rollout"  # every role's state, last


@dataclass(frozen=True)
class Variable:
    """One variable of a role, its prefix + name: a request option or the role's own."""

    name: str
    spec: Spec  # its help, section, flag, choices and limits (the request's, for an option)
    default: Any  # the Python default, the variable's type
    kind: str  # str, int, float, bool, list, dict or count (core/request.py's kind)
    help: str  # why, as the defaults' comment above it (and the instances' reference)
    inherit: str = ""  # the playbook-wide variable the role's default follows
    role_default: Any = None  # the role's default when not the Python one (Jinja or a value)
    role_only: bool = False  # the role's business: not part of a request
    secret: bool = False  # never shown (no_log), never in a request
    description: str = ""  # argument_specs' words, when not made from help
    type: str = ""  # argument_specs' type, when not the kind's (path, float of a whole number)
    elements: str = ""  # a list's elements, when not str

    @property
    def value(self) -> object:
        """The role's default: its own (a Jinja expression or a value), a playbook-wide
        variable's, or the Python one."""
        if self.role_default is not None:
            return self.role_default
        if self.inherit:
            return f"{{{{ {self.inherit} | default({jinja_literal(plain(self.default))}) }}}}"
        return plain(self.default)


@dataclass(frozen=True)
class Role:
    """A role's variables in its defaults' order, and what its argument specs say of it."""

    name: str  # the role's directory, and its variables' prefix
    source: str  # where its variables are written (the generated files' notice names it)
    short_description: str
    description: tuple[str, ...]  # argument_specs' paragraphs after the notice
    variables: tuple[Variable, ...]
    intro: str = ""  # the defaults' opening comment

    @property
    def prefix(self) -> str:
        return self.name + "_"


def jinja_literal(value: object) -> str:
    """A value as a Jinja literal inside a double-quoted YAML string: single quotes."""
    return f"'{value}'" if isinstance(value, str) else json.dumps(value)


def plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def own(
    name: str,
    default: Any,
    help: str,
    section: str,
    *,
    inherit: str = "",
    role_default: Any = None,
    secret: bool = False,
    description: str = "",
    type: str = "",
    elements: str = "",
    **limits: Any,
) -> Variable:
    """An option only the role uses: its default, help (the comment above it, "" for
    none), section and limits; `description` when its argument spec says more or
    otherwise."""
    spec = Spec(help=help, section=section, **limits)
    return Variable(
        name,
        spec,
        default,
        kind_of(spec, default),
        help,
        inherit=inherit,
        role_default=role_default,
        role_only=True,
        secret=secret,
        description=description,
        type=type,
        elements=elements,
    )


STATE_HELP = "present, or absent: removes only what present made. Follows zenvllm_state."
STATE_DESCRIPTION = (
    "present makes what the role manages; absent removes only what it made. Defaults to "
    "zenvllm_state."
)


def state(help: str = STATE_HELP, description: str = STATE_DESCRIPTION) -> Variable:
    """A role's `<role>_state`: present or absent, following zenvllm_state."""
    return own(
        "state",
        "present",
        help,
        ROLLOUT,
        inherit="zenvllm_state",
        description=description,
        choices=("present", "absent"),
    )
